"""The step-record cache (read/step_cache.py): an analysis with it gives exactly what a full read of
steps.jsonl gives, and reads only what was appended since the last one."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diagtrain.profiler.analyzer.per_rank import load
from diagtrain.profiler.analyzer.read import run_read, step_cache
from diagtrain.profiler.analyzer.read.discover import discover
from diagtrain.profiler.analyzer.read.inputs import Inputs
from diagtrain.profiler.analyzer.read.step_cache import read_steps, read_steps_cached
from diagtrain.profiler.analyzer.run import tables


def record(step: int, rank: int = 0, **changes) -> dict:
    """A step record as a real job writes it (copied from tests/scripts/user_ddp.py's run under
    ``diagtrain run``), moved to ``step``."""
    start = 1795672561.4 + step * 0.01
    found = {"schema_version": 1, "rank": rank, "step": step, "start": start, "end": start + 0.004,
             "duration_ms": 4.028 + step % 3, "phases_ms": {"forward": 1.624, "backward": 1.232 + step % 5 / 10,
                                                            "optimizer": 0.14},
             "phase_comm_ms": {"forward": 0.968, "backward": 0.518, "optimizer": 0.0}, "cpu_ms": 3.623,
             "comm_ms": 1.485, "comm_calls": 3, "runq_ms": 0.301, "page_faults": 106 + step,
             "rss_bytes": 324214784 + step, "peak_mem_bytes": 324214784, "mem_source": "rss_peak"}
    found.update(changes)
    return {k: v for k, v in found.items() if v is not ...}  # ``...``: leave the field out


def varied(step: int, rank: int = 0) -> dict:
    """Records whose columns differ from line to line: a phase only some steps have, counters missing or
    not numbers (None in the table), point-to-point calls, a memory kind, ints and floats mixed."""
    changes = {}
    if step % 4 == 0:
        changes["phases_ms"] = {"data": 2, "forward": 1.5, "backward": 3.0, "optimizer": 0.1}
    if step % 3 == 0:
        changes.update(page_faults="many", rss_bytes=..., gpu_peak_since="step", gpu_peak_bytes=1 << 30)
    if step % 5 == 0:
        changes["p2p"] = {"first": ["send", 1], "send": {"1": 2}, "recv": {"1": step % 3 + 1}}
    return record(step, rank, **changes)


def lines(records: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def same_as_full(path: Path, cache: Path, rank: int = 0) -> int:
    """Read ``path`` through the cache, check it against a full read; the lines the cached read parsed."""
    cached, full = read_steps_cached(path, rank, cache), read_steps(path, rank)
    pd.testing.assert_frame_equal(cached.table, full.table, check_like=True)
    assert (cached.phases, cached.lines, cached.repeated, cached.p2p) == (full.phases, full.lines, full.repeated, full.p2p)
    assert (cached.bad_count, cached.impossible_count) == (full.bad_count, full.impossible_count)
    assert cached.bad_lines[:3] == full.bad_lines[:3] and cached.impossible[:3] == full.impossible[:3]
    return cached.parsed


def step_tables(run: Path, cache_root: Path | None) -> tuple:
    """read_step_records' table, phases, point-to-point calls, skipped inputs and health notes."""
    inputs, notes = Inputs(), []
    frame, phases, p2p = run_read.read_step_records(run_read.rank_folders(run, inputs), inputs, notes, cache_root)
    return frame, phases, p2p, inputs.skipped, notes


def assert_same_tables(run: Path, cache_root: Path) -> None:
    cached, full = step_tables(run, cache_root), step_tables(run, None)
    pd.testing.assert_frame_equal(cached[0], full[0])
    assert cached[1:] == full[1:]


def test_a_run_that_grew_is_read_from_where_the_last_analysis_left_it(tmp_path):
    path, cache = tmp_path / "steps.jsonl", tmp_path / "cache"
    path.write_text(lines([varied(s) for s in range(1, 41)]))
    assert same_as_full(path, cache) == 40
    append(path, lines([varied(s) for s in range(41, 48)]))
    # The 7 new lines, and the last line of before: held back, as a full read judges a last line apart.
    assert same_as_full(path, cache) == 8
    assert same_as_full(path, cache) == 1  # nothing new: only the last line again
    state = json.loads((cache / step_cache.STATE_FILE).read_text())
    assert state["number"] == state["lines"] == 46
    assert [p["rows"] for p in state["parts"]] == [46]  # a small last file takes the new rows in


def test_rows_appended_to_a_large_cache_go_to_a_file_of_their_own(tmp_path, monkeypatch):
    monkeypatch.setattr(step_cache, "SMALL_PART_ROWS", 30)  # as if 30 rows were many
    path, cache = tmp_path / "steps.jsonl", tmp_path / "cache"
    path.write_text(lines([varied(s) for s in range(1, 41)]))
    same_as_full(path, cache)
    for first in (41, 48, 55):
        append(path, lines([varied(s) for s in range(first, first + 7)]))
        same_as_full(path, cache)
    state = json.loads((cache / step_cache.STATE_FILE).read_text())
    assert [p["rows"] for p in state["parts"]] == [39, 21]  # 7 rows in a file of their own, then 7 more twice in it
    assert sorted(p.name for p in cache.glob("rows-*")) == sorted(p["file"] for p in state["parts"])


def test_the_wrapper_adds_new_lines_to_the_cache_without_reading_its_rows_back(tmp_path, monkeypatch):
    monkeypatch.setattr(step_cache, "SMALL_PART_ROWS", 30)
    path, cache = tmp_path / "steps.jsonl", tmp_path / "cache"
    path.write_text(lines([varied(s) for s in range(1, 41)]))
    assert step_cache.extend_cache(path, 0, cache) == 40  # no cache yet: the whole file
    first = json.loads((cache / step_cache.STATE_FILE).read_text())["parts"][0]["file"]
    append(path, lines([varied(s) for s in range(41, 48)]))
    assert step_cache.extend_cache(path, 0, cache) == 7  # the held-back line and 6 new ones: not the last
    assert step_cache.extend_cache(path, 0, cache) == 0
    append(path, lines([varied(s) for s in range(48, 50)]))
    assert step_cache.extend_cache(path, 0, cache) == 2
    state = json.loads((cache / step_cache.STATE_FILE).read_text())
    # The 39 rows' file untouched; the rows since in one small file that took the later ones in.
    assert [p["rows"] for p in state["parts"]] == [39, 9] and state["parts"][0]["file"] == first
    assert same_as_full(path, cache) == 1  # the final analysis parses only the last line


def test_a_step_recorded_again_while_the_job_runs_is_read_as_a_full_read(tmp_path):
    path, cache = tmp_path / "steps.jsonl", tmp_path / "cache"
    path.write_text(lines([varied(s) for s in range(1, 21)]))
    step_cache.extend_cache(path, 0, cache)
    append(path, lines([varied(s) for s in (21, 5, 22)]))  # step 5 again: its cached row must be replaced
    # The cache keeps every record in file order, the repeated one too: the read decides which row stays.
    assert step_cache.extend_cache(path, 0, cache) == 3  # the held-back line and two new: no full read
    assert [p["rows"] for p in json.loads((cache / step_cache.STATE_FILE).read_text())["parts"]] == [22]
    assert same_as_full(path, cache) == 1
    found = read_steps_cached(path, 0, cache)
    assert found.repeated == 1 and list(found.table["step"]) == list(range(1, 23))


def test_the_same_steps_table_notes_and_skipped_inputs_as_a_full_read(tmp_path):
    run, cache_root = tmp_path / "run", tmp_path / "cache"
    for rank in (0, 1):
        (run / "ranks" / str(rank)).mkdir(parents=True)
        bad = ["not json", json.dumps(record(7, rank=rank, duration_ms=1e18))]
        (run / "ranks" / str(rank) / "steps.jsonl").write_text(
            lines([record(s, rank=rank) for s in range(1, 6)]) + "\n".join(bad) + "\n" + lines([varied(6, rank)]))
    assert_same_tables(run, cache_root)
    for rank in (0, 1):
        append(run / "ranks" / str(rank) / "steps.jsonl", lines([record(3, rank=rank)] + [varied(s, rank) for s in range(8, 12)])
               + '{"rank": 0, "step": 12, "start"')
    assert_same_tables(run, cache_root)
    frame, _, p2p, skipped, notes = step_tables(run, cache_root)
    assert sorted(frame["step"].unique()) == [1, 2, 3, 4, 5, 6, 8, 9, 10, 11]
    assert p2p[0][10] == {"first": ["send", 1], "send": {1: 2}, "recv": {1: 2}}  # peers are ranks again
    assert [n["check"] for n in notes] == ["impossible_values", "repeated_steps"] * 2
    assert "1 of its 13 lines are not step records" in skipped[0].reason


def test_a_cut_last_line_is_left_out_until_it_is_complete(tmp_path):
    path, cache = tmp_path / "steps.jsonl", tmp_path / "cache"
    cut = json.dumps(record(11))
    path.write_text(lines([record(s) for s in range(1, 11)]) + cut[:30])
    same_as_full(path, cache)
    assert len(read_steps_cached(path, 0, cache).table) == 10
    append(path, cut[30:] + "\n")
    assert same_as_full(path, cache) == 1 and len(read_steps(path, 0).table) == 11
    append(path, "{broken\n")  # a bad complete last line: a full read leaves it out...
    same_as_full(path, cache)
    append(path, lines([record(12)]))  # ...until a line follows it: then it is a bad line
    assert same_as_full(path, cache) == 2 and read_steps(path, 0).bad_count == 1


def test_a_step_recorded_again_later_replaces_its_row(tmp_path, monkeypatch):
    monkeypatch.setattr(step_cache, "SMALL_PART_ROWS", 10)  # the cached rows' file is not rewritten
    path, cache = tmp_path / "steps.jsonl", tmp_path / "cache"
    path.write_text(lines([varied(s) for s in range(1, 21)]))
    same_as_full(path, cache)
    append(path, lines([record(4, phases_ms={"forward": 1}), record(5, duration_ms=99.0), record(21), record(22)]))
    assert same_as_full(path, cache) == 5
    found = read_steps_cached(path, 0, cache)
    rows = found.table.set_index("step")
    assert found.repeated == 2 and rows.loc[5, "wall_ms"] == 99.0
    # The new record's columns, in the old place: step 4 recorded no data phase the second time.
    assert found.table["step"].iloc[3] == 4 and pd.isna(rows.loc[4, "data_ms"]) and rows.loc[4, "forward_ms"] == 1
    assert found.p2p[5]["recv"] == {1: 3}  # its earlier p2p stays, as in a full read
    state = json.loads((cache / step_cache.STATE_FILE).read_text())
    # Nothing cached is written again: the new records follow in a file of their own (19 + the held-back line and 3).
    assert [p["rows"] for p in state["parts"]] == [19, 4]
    assert sorted(p.name for p in cache.glob("rows-*")) == sorted(p["file"] for p in state["parts"])
    assert same_as_full(path, cache) == 1  # and the rows read back from them are the new ones


def test_problems_before_and_after_the_cached_part_add_up(tmp_path):
    path, cache = tmp_path / "steps.jsonl", tmp_path / "cache"
    early = ["not json", "[1, 2]", json.dumps(record(3, rank=1)), "{}", json.dumps(record(4, duration_ms=-1))]
    path.write_text(lines([record(1), record(2)]) + "\n".join(early) + "\n" + lines([record(5)]))
    same_as_full(path, cache)
    late = ["nope", json.dumps(record(7, end=0)), json.dumps(record(8, phases_ms={"forward": 1e30}))]
    append(path, "\n".join(late) + "\n" + lines([record(9)]))
    assert same_as_full(path, cache) == 5
    found = read_steps_cached(path, 0, cache)
    assert (found.bad_count, found.impossible_count, found.lines) == (5, 3, 12)
    assert found.bad_lines[:3] == ["line 3: Expecting value: line 1 column 1 (char 0)", "line 4: not a step record (list)",
                               "line 5: a record of rank 1 in rank 0's folder"]


def test_a_replaced_shrunk_or_edited_file_is_read_whole(tmp_path):
    path, cache = tmp_path / "steps.jsonl", tmp_path / "cache"
    path.write_text(lines([record(s) for s in range(1, 31)]))
    same_as_full(path, cache)
    other = tmp_path / "new.jsonl"
    other.write_text(lines([record(s, duration_ms=7.0) for s in range(1, 11)]))
    os.replace(other, path)  # shorter, and another inode
    assert same_as_full(path, cache) == 10
    append(path, lines([record(s, duration_ms=7.0) for s in range(11, 61)]))
    assert same_as_full(path, cache) == 51
    with open(path, "r+") as f:  # the same inode and length, other bytes at its start only (26 KB before its end)
        f.write(json.dumps(record(1, duration_ms=8.0)))
    assert same_as_full(path, cache) == 60
    append(path, lines([record(61)]))
    with open(path, "r+") as f:
        f.truncate(path.stat().st_size // 2)  # shrunk in place: shorter than what the cache holds
    assert same_as_full(path, cache) > 1


def test_a_cache_of_another_version_or_damaged_is_not_used(tmp_path):
    path, cache = tmp_path / "steps.jsonl", tmp_path / "cache"
    path.write_text(lines([record(s) for s in range(1, 21)]))
    same_as_full(path, cache)
    state_file = cache / step_cache.STATE_FILE
    state = json.loads(state_file.read_text())
    state_file.write_text(json.dumps({**state, "version": step_cache.CACHE_VERSION + 1}))
    assert same_as_full(path, cache) == 20
    assert json.loads(state_file.read_text())["version"] == step_cache.CACHE_VERSION  # and written anew
    (cache / state["parts"][0]["file"]).write_bytes(b"not parquet")
    assert same_as_full(path, cache) == 20
    assert same_as_full(path, cache) == 1


def test_a_cache_that_cannot_be_written_does_not_stop_the_analysis(tmp_path):
    run = tmp_path / "run"
    (run / "ranks" / "0").mkdir(parents=True)
    (run / "ranks" / "0" / "steps.jsonl").write_text(lines([varied(s) for s in range(1, 11)]))
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache folder would go")
    assert_same_tables(run, blocked)
    assert read_steps_cached(run / "ranks" / "0" / "steps.jsonl", 0, step_cache.cache_dir(blocked, 0)).parsed == 10
    assert blocked.read_text() == "a file where the cache folder would go"


@pytest.mark.jobs
def test_a_real_run_analyzed_again_after_it_grew(user_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(user_run.out, run)
    cache_root = run / "analysis" / "cache"
    inputs, _ = discover(run)
    results = load.load(inputs, cache_root, workers=1)[0]

    def steps(cached: bool) -> pd.DataFrame:
        built = tables.build(run, results, None, cache_root if cached else None)
        return built.steps, built.phases, built.notes, built.skipped

    first = steps(True)
    pd.testing.assert_frame_equal(first[0], steps(False)[0])
    assert first[1:] == steps(False)[1:]
    for rank in (0, 1):
        path = run / "ranks" / str(rank) / "steps.jsonl"
        last = json.loads(path.read_text().splitlines()[-1])
        append(path, lines([{**last, "step": last["step"] + k, "start": last["start"] + k, "end": last["end"] + k}
                            for k in range(1, 4)]))
        assert read_steps_cached(path, rank, step_cache.cache_dir(cache_root, rank)).parsed == 4
    again = steps(True)
    pd.testing.assert_frame_equal(again[0], steps(False)[0])
    assert again[1:] == steps(False)[1:] and len(again[0]) == len(first[0]) + 6


LINES = st.one_of(
    st.builds(lambda s: json.dumps(varied(s)), st.integers(1, 30)),  # steps repeat: 30 of them, many lines
    st.builds(lambda s, ms: json.dumps(record(s, duration_ms=ms)), st.integers(1, 30),
              st.sampled_from([-1, 1e30, 5, 7.5])),
    st.sampled_from(["", "not json", "[1]", "{}", '{"rank": 0, "st', json.dumps(record(3, rank=1)), "\u00e9\u00e8"]),
)


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(lines=st.lists(LINES, min_size=1, max_size=60), endings=st.sampled_from(["\n", "\r\n", "\r"]),
       cuts=st.lists(st.one_of(st.floats(0, 1), st.integers(0, 59)), max_size=6), junk=st.booleans(),
       live=st.lists(st.booleans(), min_size=1, max_size=7))
def test_any_file_appended_in_any_pieces_reads_as_a_full_read(lines, endings, cuts, junk, live):
    """Cut anywhere (a fraction of the bytes) or after a line (an integer: the line's number); lines
    ended as on Linux, Windows or old Macs (a lone \\r: every line is one as the reader splits them,
    none as the cache's offsets do); bytes not UTF-8 at the end; rows cached in files of 8. After each
    piece the cache is brought up to date as the wrapper does while the job runs (extend_cache) or read
    as an analysis reads it (``live``, in turns); the last read is always an analysis'."""
    ends = [len(endings.join(lines[:i + 1]) + endings) for i in range(len(lines))]
    data = (endings.join(lines) + endings).encode() + (b"\xff\xfe" if junk else b"")
    at = sorted({min(len(data), ends[c % len(ends)]) if isinstance(c, int) else int(c * len(data)) for c in cuts})
    small, step_cache.SMALL_PART_ROWS = step_cache.SMALL_PART_ROWS, 8
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path, cache = Path(tmp) / "steps.jsonl", Path(tmp) / "cache"
            path.write_bytes(b"")
            done = 0
            for i, end in enumerate([*at, len(data)]):
                with open(path, "ab") as f:
                    f.write(data[done:end])
                done = end
                if live[i % len(live)]:
                    step_cache.extend_cache(path, 0, cache)
                else:
                    same_as_full(path, cache)
            same_as_full(path, cache)
    finally:
        step_cache.SMALL_PART_ROWS = small
