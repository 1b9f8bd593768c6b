"""Live judgement reads the hosts' summaries as groups of value lists (read/row_groups.py), never a dict per row:
its held rows and the windows cut from them are the ones the per-row path built (a dict per row, checked as
host_summary read them, one table of each read's dicts), on randomized summaries full of odd rows: damaged lines,
groups that are none, rows of another length, ranks and steps that are no integers, a rank read from its own file,
a step recorded again (in one read and in a later one), phases first seen later, counters only some rows have,
a name given twice, device timings, numbers of either kind in one column, a NaN."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from diagtrain.profiler.analyzer.read.host_summary import HostSummary
from diagtrain.profiler.analyzer.read.row_groups import Row, rows_of, table_of
from diagtrain.profiler.analyzer.run import live_tables
from diagtrain.profiler.analyzer.run.live_tables import HeldRows

ELSEWHERE = 5  # read from its own file: its rows in the summary are skipped
KEEP = 4


def summary_line(rng: random.Random, step: int) -> str:
    """One summary line of ranks 0-7 at ``step`` (a few of them again at earlier steps), odd now and then."""
    base = ["rank", "step", "start", "end", "wall_ms", "peak_mem_bytes", "runq_ms", "page_faults", "forward_ms"]
    groups: list[Any] = []
    for _ in range(rng.randint(1, 3)):
        names = base + rng.sample(["data_ms", "comm_calls", "device_steps", "flag", "backward_ms"], rng.randint(0, 3))
        if rng.random() < 0.1:
            names = names + ["forward_ms"]  # a name given twice: its last value counts
        rows = []
        for _ in range(rng.randint(0, 6)):
            rank, at = rng.randrange(8), step - rng.choice([0, 0, 0, 1, 3])  # a step recorded again, read later
            values = {"rank": rank, "step": at, "start": at * 0.1, "end": at * 0.1 + 0.05, "wall_ms": 50.0,
                      "peak_mem_bytes": None, "runq_ms": rng.choice([None, None, 0.25]), "page_faults": None,
                      "forward_ms": rng.choice([20.0, 21, 22.5]), "data_ms": rng.choice([1.0, None]),
                      "comm_calls": rng.choice([1, 2, 2.0]), "flag": rng.choice([True, None]), "backward_ms": 40.0,
                      "device_steps": rng.choice([None, [{"step": at - 1, "step_ms": 45.0, "idle_before_ms": 0.5}]])}
            row = [values[n] for n in names]
            odd = rng.random()
            if odd < 0.04:
                row = row[:-1]  # another length than its names
            elif odd < 0.08:
                row[0] = rng.choice(["3", 2.0, None])  # a rank that is no integer
            elif odd < 0.12:
                row[1] = rng.choice(["7", None, 1.5])  # a step that is no integer
            rows.append(row)
        groups.append({"columns": names, "rows": rows})
    odd = rng.random()
    if odd < 0.05:
        groups.append("not a group")
    elif odd < 0.1:
        groups.append({"columns": "rank", "rows": [[1]]})
    text = json.dumps({"groups": groups, "extra": {}})
    if odd > 0.97:
        return text[:len(text) // 2]  # a wrapper killed mid-line: left out
    if odd > 0.94:
        return text.replace("50.0", "NaN", 1)  # json's to read (msgspec refuses it)
    return text


class PerRowReader:
    """The per-row path: each row a dict, checked and held as HostSummary.read did, ranks in the order first seen."""

    def __init__(self) -> None:
        self.ranks: dict[int, dict[int, dict]] = {}  # rank -> step -> row, every step

    def read(self, lines: list[str]) -> list[dict]:
        """The rows one read added, in the order the reader's ranks hold them."""
        added: dict[int, dict[int, dict]] = {}
        for text in lines:
            try:
                line = json.loads(text)
            except ValueError:
                continue
            groups = line.get("groups") if isinstance(line, dict) else None
            for group in groups if isinstance(groups, list) else []:
                columns = group.get("columns") if isinstance(group, dict) else None
                if not (isinstance(columns, list) and isinstance(group.get("rows"), list)):
                    continue
                for values in group["rows"]:
                    if not (isinstance(values, list) and len(values) == len(columns)):
                        continue
                    row = dict(zip(columns, values))
                    rank, step = row.get("rank"), row.get("step")
                    if isinstance(rank, int) and rank != ELSEWHERE and isinstance(step, int):
                        self.ranks.setdefault(rank, {})
                        added.setdefault(rank, {})[step] = row
        for rank, rows in added.items():
            self.ranks[rank].update(rows)
        return [row for rank in self.ranks for row in added.get(rank, {}).values()]


def held_steps(rows: dict[int, dict], keep: int) -> dict[int, dict]:
    """A rank's last ``keep`` steps of ``rows``."""
    return {s: rows[s] for s in sorted(rows)[-keep:]}


@pytest.mark.parametrize("seed", range(6))
def test_a_summarys_rows_read_as_groups_make_the_windows_the_per_row_path_made(tmp_path: Path, seed: int,
                                                                                  monkeypatch: pytest.MonkeyPatch):
    rng = random.Random(seed)
    path = tmp_path / "steps_summary.jsonl"
    summary = HostSummary(path, keep=KEEP)
    summary.elsewhere = {ELSEWHERE}
    reference, held, made = PerRowReader(), HeldRows(), HeldRows()
    per_row: list[list[dict]] = []
    for step in range(1, 16):
        lines = [summary_line(rng, step) for _ in range(rng.randint(0, 2))] + ['{"beat": 1.0}']
        with open(path, "a") as f:
            f.write("".join(line + "\n" for line in lines))
        summary.read()
        rows = [row for steps in summary.ranks.values() for row in steps.added.values()]
        expected = reference.read(lines)
        assert [dict(row) for row in rows] == expected and all(isinstance(row, Row) for row in rows)
        held.add(rows)
        per_row.append(expected)
    with monkeypatch.context() as patch:  # the per-row path's tables: each read's dicts as one frame
        patch.setattr(live_tables, "table_of", pd.DataFrame)
        for rows in per_row:
            made.add(rows)
    for after, last in [(0, 15), (3, 9), (10, 15), (14, 15), (-5, 2)]:
        pd.testing.assert_frame_equal(held.between(after, last), made.between(after, last), check_exact=True)
    for first in (1, 7, 15):
        pd.testing.assert_frame_equal(held.since(first), made.since(first), check_exact=True)
    # Each rank holds its last steps' rows, as dicts hold them, and knows its first and last step.
    assert sorted(summary.ranks) == sorted(reference.ranks)
    for rank, steps in summary.ranks.items():
        kept = held_steps(reference.ranks[rank], KEEP)
        assert {s: dict(row) for s, row in steps.rows.items()} == kept
        assert (steps.first, steps.last_step) == (min(kept), max(kept))


def test_rows_read_back_are_read_as_their_dicts_and_tabled_as_one_frame_of_them():
    groups = [{"columns": ["rank", "step", "x", "x"], "rows": [[1, 2, 3, 4], [5], "no row"]},
              {"columns": ["rank", "step", "y"], "rows": [[0, 1, True], [2, 3, None]]}, {"columns": ["rank"]},
              # names no column can have (a damaged line): the group left out, not the read failed
              {"columns": ["rank", ["step"]], "rows": [[7, 8]]}, {"columns": [{"a": 1}, "step"], "rows": [[7, 8]]}]
    rows = rows_of(groups, {})
    dicts = [{"rank": 1, "step": 2, "x": 4}, {"rank": 0, "step": 1, "y": True}, {"rank": 2, "step": 3, "y": None}]
    assert rows == dicts and [dict(r) for r in rows] == dicts and [{**r} for r in rows] == dicts
    assert rows[0].get("y", "none") == "none" and "x" in rows[0] and len(rows[0]) == 3
    assert list(rows[1]) == ["rank", "step", "y"]
    pd.testing.assert_frame_equal(table_of(rows), pd.DataFrame(dicts), check_exact=True)
    mixed = [*dicts, {"z": 1.5, "rank": 4}]  # a dict's keys too, and a column only some rows have
    pd.testing.assert_frame_equal(table_of([*rows, mixed[-1]]), pd.DataFrame(mixed), check_exact=True)
