"""Nothing in a run directory can crash or fool the analysis: a corpus of bad inputs.

Every file of one small real run directory (the session's ``user_run``, plus the files a hang or a
reference trainer adds) is in turn truncated, emptied, replaced by another type, by binary garbage,
by a directory, a FIFO or a symlink (dangling, looping, to a device), made unreadable and made
huge, and the analysis runs in-process on the result. Every case: no exception, both ranks still
analyzed, no detector failing, and each file the analysis reads as data that became unusable is
listed under ``skipped`` by name with a reason.
"""

from __future__ import annotations

import gzip
import importlib
import json
import os
import pickle
import random
import shutil
import tracemalloc
import zlib
from pathlib import Path

import pytest

from conftest import on_training
from diagtrain.profiler.analyzer.report import document as report
from diagtrain.profiler.analyzer.analyze import analyze
from diagtrain.profiler.analyzer.read.flight_records import read_dump
from diagtrain.profiler.util import bounded_read
from diagtrain.profiler.util.bounded_read import InputError, display, gunzip

FIXTURES = Path(__file__).parent / "fixtures"
HUGE = 8 << 30  # sparse: over every size limit, without using the disk
# What the analysis reads as structured data (a bad one must be skipped), by path in the run.
DATA_FILES = ["manifest.json", "trainer.json", "telemetry.parquet", "ranks/0/rank.json", "ranks/0/steps.jsonl",
              "ranks/0/TRACE", "ranks/0/flight_recorder.json", "ranks/0/exit.json", "ranks/0/process_groups.json",
              "ranks/0/stacks.json", "ranks/0/parameters.json"]
LOGS = ["ranks/0/stderr.log", "ranks/0/nccl.log"]  # read as text: any bytes are a (strange) log
NOT_READ = ["ranks/0/stdout.log", "ranks/0/heartbeat", "hosts/HOST/host.json", "hosts/HOST/console.log",
            "hosts/HOST/telemetry.jsonl"]  # the analysis never opens these: only no crash is asked


def _truncate(p: Path) -> None:
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])


def _garbage(p: Path) -> None:
    p.write_bytes(random.Random(p.name).randbytes(4096))


def _replace(p: Path, make) -> None:
    p.unlink()
    make(p)


# What is written into the file: its content is wrong.
CONTENT = {
    "truncated": _truncate,
    "emptied": lambda p: p.write_bytes(b""),
    "another type": lambda p: p.write_text("[0]\n"),
    "binary garbage": _garbage,
}
# What the name is made to be: opening or reading it fails, or it must not be read at all.
REPLACED = {
    "a directory": lambda p: _replace(p, Path.mkdir),
    "a FIFO": lambda p: _replace(p, os.mkfifo),
    "a dangling symlink": lambda p: _replace(p, lambda q: q.symlink_to(q.parent / "no-such-file")),
    "a symlink loop": lambda p: _replace(p, lambda q: q.symlink_to(q.name)),
    "a symlink to a device": lambda p: _replace(p, lambda q: q.symlink_to("/dev/zero")),
    "unreadable": lambda p: p.chmod(0),
    "huge": lambda p: os.truncate(p, HUGE),
}
MUTATIONS = {**CONTENT, **REPLACED}
# Mutations after which the file still holds valid content of its kind.
HARMLESS = {("ranks/0/steps.jsonl", "truncated"), ("ranks/0/steps.jsonl", "emptied"),
            *((log, m) for log in LOGS for m in CONTENT)}


@pytest.fixture(scope="module")
def base(user_run, tmp_path_factory) -> Path:
    """A copy of the real run with the files a hang and a reference trainer add, analyzed once (cache warm)."""
    return make_base(user_run.out, tmp_path_factory.mktemp("corpus") / "run")


def make_base(source: Path, run: Path) -> Path:
    """Copy the real run ``source`` to ``run``, add a hang's and a trainer's files, analyze it once."""
    shutil.copytree(source, run, symlinks=True)
    shutil.copy(FIXTURES / "logs" / "nccl_info_8rank.log", run / "ranks/0/nccl.log")
    frames = [{"file": __file__, "line": 1, "function": "train", "code": "dist.all_reduce(t)"}]
    (run / "ranks/0/stacks.json").write_text(json.dumps(
        {"time": 1.0, "reason": "signal", "threads": [{"ident": 1, "name": "MainThread", "main": True, "frames": frames}]}))
    (run / "trainer.json").write_text(json.dumps({"strategy": "ddp", "mesh": {"pp": 1, "dp": 2, "tp": 1},
                                                  "n_microbatches": None, "stage_layers": None}))
    for rank in (0, 1):
        (run / f"ranks/{rank}/parameters.json").write_text(json.dumps(
            {"rank": rank, "stages": [0], "parameters": [{"name": "0.weight", "local_numel": 2048}]}))
    clean = analyze(run, run, ["json"], workers=1)
    assert clean["skipped"] == [] and [r["rank"] for r in clean["ranks"]] == [0, 1]
    return run


def _resolve(run: Path, name: str) -> Path:
    if "TRACE" in name:
        return next((run / "ranks/0").glob("trace-*.json.gz"))
    if "HOST" in name:
        return next((run / "hosts").iterdir()) / Path(name).name
    return run / name


class Mutated:
    """Mutate files of the run; put the originals back (same mtime: the analysis cache stays valid)."""

    def __init__(self, paths: list[Path], keep: Path) -> None:
        self.paths, self.keep = paths, keep

    def __enter__(self) -> list[Path]:
        for i, path in enumerate(self.paths):
            shutil.copy2(path, self.keep / f"{i}-{path.name}")
        return self.paths

    def __exit__(self, *exc: object) -> None:
        for i, path in enumerate(self.paths):
            if path.is_symlink() or path.is_file() or path.is_fifo():
                path.unlink()
            elif path.is_dir():
                shutil.rmtree(path)
            shutil.copy2(self.keep / f"{i}-{path.name}", path)


def check(doc: dict) -> None:
    """What every case must give: the untouched rank 1 in full, no detector down, text that encodes."""
    ranks = {r["rank"]: r for r in doc["ranks"]}
    assert set(ranks) <= {0, 1} and ranks[1]["steps"] == 6 and ranks[1]["compute_us"], \
        "the untouched rank was not analyzed in full"
    assert not [h for h in doc["health"] if h["check"] == "detector"], doc["health"]
    report.markdown(doc).encode("utf-8")
    json.dumps(doc)


def skipped_reason(doc: dict, path: Path) -> str | None:
    return next((s["reason"] for s in doc["skipped"] if s["path"] == display(path)), None)


def analyze_with(base: Path, keep: Path, names: list[str], mutation: str) -> tuple[dict, list[Path]]:
    paths = [_resolve(base, n) for n in names]
    with Mutated(paths, keep):
        for path in paths:
            MUTATIONS[mutation](path)
        return analyze(base, base, ["json"], workers=1), paths


def assert_skipped(doc: dict, names: list[str], paths: list[Path], mutation: str) -> None:
    for name, path in zip(names, paths):
        if name in DATA_FILES + LOGS and (name, mutation) not in HARMLESS:
            why = skipped_reason(doc, path)
            assert why and len(why) > 5 and "Traceback" not in why, f"{name} as {mutation}: {doc['skipped']}"


# The files a rank's presence rests on, each made bad alone: the rest of rank 0 must still be used.
ALONE = ["ranks/0/TRACE", "ranks/0/steps.jsonl", "ranks/0/flight_recorder.json"]


@pytest.mark.jobs
@pytest.mark.parametrize("name", ALONE)
@pytest.mark.parametrize("mutation", CONTENT)
def test_one_file_with_bad_content(base, tmp_path, name, mutation):
    doc, paths = analyze_with(base, tmp_path, [name], mutation)
    check(doc)
    assert_skipped(doc, [name], paths, mutation)
    rank0 = next(r for r in doc["ranks"] if r["rank"] == 0)
    if name != "ranks/0/steps.jsonl":
        assert rank0["steps"] == 6  # its step records, whatever became of its trace or dump
    if name != "ranks/0/TRACE":
        assert rank0["compute_us"]  # its trace


@pytest.mark.jobs
@pytest.mark.parametrize("mutation", MUTATIONS)
def test_every_file_made_bad_at_once(base, tmp_path, mutation):
    """Every file of rank 0 and of the run made bad together: each one named, rank 1 analyzed in full."""
    names = DATA_FILES + LOGS + NOT_READ
    doc, paths = analyze_with(base, tmp_path, names, mutation)
    check(doc)
    if mutation == "unreadable" and os.geteuid() == 0:
        assert doc["skipped"] == []  # root reads a file of mode 000: nothing was bad
        return
    assert_skipped(doc, names, paths, mutation)
    never_opened = {display(p) for p in paths[-len(NOT_READ):]}
    assert not [s for s in doc["skipped"] if s["path"] in never_opened]
    expected = {"a FIFO": "not a regular file (a FIFO)", "a symlink to a device": "character device",
                "a symlink loop": "Too many levels of symbolic links", "a dangling symlink": "No such file",
                "huge": "over the", "truncated": "ends early (truncated?)", "a directory": "a directory",
                "binary garbage": "not a PyTorch Profiler trace"}
    if mutation in expected:
        assert expected[mutation] in skipped_reason(doc, paths[DATA_FILES.index("ranks/0/TRACE")])


def _steps_lines(run: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (run / f"ranks/{rank}/steps.jsonl").read_text().splitlines()]


def _write_lines(path: Path, records: list) -> None:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))


def _gzip_json(path: Path, doc: dict) -> None:
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)


def _trace_doc(run: Path) -> dict:
    with gzip.open(_resolve(run, "ranks/0/TRACE")) as f:
        return json.load(f)


# The cases that stopped `diagtrain analyze` before (the list), each written as it was seen.
def _pg_config_as_dict(run: Path) -> Path:
    doc = _trace_doc(run)
    doc["distributedInfo"]["pg_config"] = {"0": {"pg_name": "0", "ranks": [0, 1]}}
    path = _resolve(run, "ranks/0/TRACE")
    _gzip_json(path, doc)
    return path


def _fr_with_wrong_types(run: Path) -> Path:
    path = run / "ranks/0/flight_recorder.json"
    doc = json.loads(path.read_text())
    doc["pg_config"] = {"0": {"name": "0", "ranks": "[0, 1]"}}
    doc["entries"][0]["collective_seq_id"] = "three"
    doc["entries"][1]["process_group"] = 7
    doc["entries"].append("not an entry")
    path.write_text(json.dumps(doc))
    return path


def _steps_with_garbage_in_the_middle(run: Path) -> Path:
    path = run / "ranks/0/steps.jsonl"
    records = _steps_lines(run, 0)
    records[1]["duration_ms"] = "slow"
    records[2]["rank"] = [0]
    _write_lines(path, records[:3] + ["\x00\x01garbage{{{"] + records[3:])
    return path


def _manifest_list(run: Path) -> Path:
    (run / "manifest.json").write_text("[]")
    return run / "manifest.json"


def _manifest_wrong_fields(run: Path) -> Path:
    path = run / "manifest.json"
    doc = json.loads(path.read_text())
    doc.update(hosts="vm", world_size=10**30, mesh=[2], injected={"kind": 1}, status=3)
    path.write_text(json.dumps(doc))
    return path


def _rank_json_list(run: Path) -> Path:
    (run / "ranks/0/rank.json").write_text("[0]")
    return run / "ranks/0/rank.json"


def _gzip_bomb(run: Path) -> Path:
    path = _resolve(run, "ranks/0/TRACE")
    path.write_bytes(gzip.compress(b" " * (1 << 20)) * 200)  # 200 MiB of blanks in 200 KiB (200 gzip members)
    return path


def _non_utf8_name(run: Path) -> Path:
    trace = _resolve(run, "ranks/0/TRACE")
    bad = Path(os.fsdecode(bytes(trace.parent) + b"/trace-\xff\xfe.json.gz"))
    bad.write_bytes(b"not gzip")
    return bad


def _deep_json(run: Path) -> Path:
    path = run / "ranks/0/exit.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    return path


def _unsafe_pickle(run: Path) -> Path:
    path = run / "ranks/0/flight_recorder.json"
    path.write_bytes(pickle.dumps({"entries": [Marker(str(run / "PWNED"))]}))
    return path


class Marker:
    """Unpickling this with pickle's own loader would create a file: the proof that code ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


SPECIAL = {"pg_config as a dict": _pg_config_as_dict, "flight recorder with wrong types": _fr_with_wrong_types,
           "steps.jsonl with garbage in the middle": _steps_with_garbage_in_the_middle,
           "manifest.json holding a list": _manifest_list, "manifest.json with wrong fields": _manifest_wrong_fields,
           "rank.json holding [0]": _rank_json_list, "a gzip bomb": _gzip_bomb, "a non-UTF-8 file name": _non_utf8_name,
           "JSON nested 100,000 deep": _deep_json, "a pickle that would run code": _unsafe_pickle}
MUST_SKIP = {"manifest.json holding a list", "manifest.json with wrong fields", "rank.json holding [0]",
             "a gzip bomb", "a non-UTF-8 file name", "JSON nested 100,000 deep", "a pickle that would run code",
             "flight recorder with wrong types", "steps.jsonl with garbage in the middle"}


@pytest.mark.jobs
@pytest.mark.parametrize("case", SPECIAL)
def test_the_cases_that_stopped_the_analysis(base, tmp_path, case):
    keep = tmp_path / "keep"
    shutil.copytree(base / "ranks/0", keep / "ranks0")
    for name in ("manifest.json",):
        shutil.copy2(base / name, keep / name)
    try:
        path = SPECIAL[case](base)
        doc = analyze(base, base, ["md", "json"], workers=1)
        check(doc)
        (base / "report.md").read_text(encoding="utf-8")
        if case in MUST_SKIP:
            assert skipped_reason(doc, path), (case, doc["skipped"])
        if case == "a pickle that would run code":
            assert not (base / "PWNED").exists()
            assert "unsafe pickle" in skipped_reason(doc, path) and "pathlib" in skipped_reason(doc, path)
        if case == "a non-UTF-8 file name":
            assert "trace-\\xff\\xfe.json.gz" in (base / "report.md").read_text()
        if case == "steps.jsonl with garbage in the middle":
            assert doc["ranks"][0]["steps"] == 6 - 2  # the two bad records; the garbage line was never one
            assert "3 of its 7 lines are not step records" in skipped_reason(doc, path)
    finally:
        shutil.rmtree(base / "ranks/0")
        shutil.copytree(keep / "ranks0", base / "ranks/0", copy_function=shutil.copy2)
        shutil.copy2(keep / "manifest.json", base / "manifest.json")


@pytest.fixture(params=["isal", "zlib"])
def inflater(request, monkeypatch):
    """Each gzip inflater bounded_read can use: ISA-L (a dependency, so it must import) and zlib, its fallback."""
    module = importlib.import_module("isal.isal_zlib") if request.param == "isal" else zlib
    monkeypatch.setattr(bounded_read, "_inflate", module)
    return request.param


def test_a_gzip_bomb_takes_memory_of_its_limit_not_of_its_size(tmp_path, inflater):
    bomb = tmp_path / "bomb.gz"
    bomb.write_bytes(gzip.compress(bytes(1 << 20)) * 1024)  # 1 GiB unpacked from 1 MiB (1024 gzip members)
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match="decompression bomb"):
            gunzip(bomb.read_bytes(), 4 << 30, bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 100 << 20  # the 64 MiB floor and one chunk, not 1 GiB (nor twice that)


def test_gzip_members_padding_and_truncation(tmp_path, inflater):
    one = gzip.compress(b'{"a": ') + gzip.compress(b"1}")
    assert bytes(gunzip(one + bytes(512), 1 << 20)) == b'{"a": 1}'
    with pytest.raises(InputError, match="truncated"):
        gunzip(one[:-5], 1 << 20)
    with pytest.raises(InputError, match="limit"):
        gunzip(gzip.compress(bytes(4096)), 1024)
    corrupt = bytearray(gzip.compress(os.urandom(4096)))
    corrupt[20:40] = bytes(20)
    with pytest.raises(InputError, match="not valid gzip"):
        gunzip(corrupt, 1 << 20)


def test_a_large_trace_unpacks_the_same_with_either_inflater(inflater):
    """Many output chunks and input pieces: the bytes are zlib's, whichever inflater unpacked them."""
    data = gzip.compress(random.Random(0).randbytes(3 << 20) * 2, compresslevel=1)
    assert bytes(gunzip(data, 64 << 20)) == gzip.decompress(data)


def test_nccls_own_pickled_dump_still_reads():
    dump = read_dump(FIXTURES / "flight_recorder" / "nccl_trace_rank_0")
    assert [e["profiling_name"] for e in dump["entries"]] == ["gloo:all_reduce", "gloo:broadcast", "gloo:all_gather"]
    assert dump["entries"][0]["process_group"] == ("0", "default_pg") and dump["malformed_entries"] == 0


@pytest.mark.jobs
def test_impossible_step_times_are_flagged_and_blame_nobody(base, tmp_path):
    path = base / "ranks/1/steps.jsonl"
    records = _steps_lines(base, 1)
    records[3]["duration_ms"] = 1e18
    records[4]["duration_ms"] = -250.0
    records[5]["phases_ms"]["optimizer"] = -1e18
    with Mutated([path], tmp_path):
        _write_lines(path, records)
        doc = analyze(base, base, ["json"], workers=1)
    [note] = [h for h in doc["health"] if h["check"] == "impossible_values"]
    assert "rank 1: 3 step records with impossible values" in note["message"] and "1e+18" in note["message"]
    assert not [f for f in on_training(doc["findings"])
                if 1 in f["ranks"] and f["severity"] in ("warning", "error", "critical")]
    assert doc["ranks"][1]["steps"] == 3 and doc["ranks"][1]["step_time_median_us"] < 10e6


@pytest.mark.jobs
def test_impossible_event_times_are_left_out(base, tmp_path):
    path = _resolve(base, "ranks/0/TRACE")
    doc = _trace_doc(base)
    spans = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    for e in spans[:10]:
        e["dur"] = 1e18
    for e in spans[10:20]:
        e["dur"] = -5
    with Mutated([path], tmp_path):
        _gzip_json(path, doc)
        report_doc = analyze(base, base, ["json"], workers=1)
    assert any("20 events with impossible times" in h["message"] for h in report_doc["health"])
    assert report_doc["ranks"][0]["compute_us"] < 60e6  # a minute, not 1e18 µs
    doc["traceEvents"] = [{**e, "dur": -1} if e.get("ph") == "X" else e for e in doc["traceEvents"]]
    with Mutated([path], tmp_path):
        _gzip_json(path, doc)
        report_doc = analyze(base, base, ["json"], workers=1)
    assert "every event has an impossible time" in skipped_reason(report_doc, path)


@pytest.mark.jobs
def test_a_window_cut_before_its_first_step_ended(base, tmp_path):
    """A Ctrl-C during a profiled window: one rank's trace holds no finished step. Its empty step
    table made every rank's step times objects, and the analysis stopped at the first join."""
    path = _resolve(base, "ranks/0/TRACE")
    doc = _trace_doc(base)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep")]
    with Mutated([path], tmp_path):
        _gzip_json(path, doc)
        report_doc = analyze(base, base, ["json"], workers=1)
    assert report_doc["ranks"][0]["profiled_steps"] == 0 and report_doc["ranks"][1]["profiled_steps"] == 2


@pytest.mark.jobs
@pytest.mark.parametrize("what", ["ranks/0 a file", "ranks a file"])
def test_a_rank_folder_that_is_not_a_folder(base, tmp_path, what):
    target = base / what.split()[0]
    shutil.move(target, tmp_path / "kept")
    try:
        target.write_text("not a folder")
        doc = analyze(base, base, ["json"], workers=1)
        assert not [h for h in doc["health"] if h["check"] == "detector"]
        report.markdown(doc)
    finally:
        target.unlink()
        shutil.move(tmp_path / "kept", target)


@pytest.mark.jobs
def test_unreadable_ranks_come_back_from_worker_processes(base, tmp_path):
    """The pool path (several ranks, several workers) skips a bad rank exactly as the in-process one."""
    traces = [_resolve(base, "ranks/0/TRACE"), next((base / "ranks/1").glob("trace-*.json.gz"))]
    with Mutated([traces[0]], tmp_path):
        _garbage(traces[0])
        doc = analyze(base, base, ["json"], workers=2)
    assert "not a PyTorch Profiler trace" in skipped_reason(doc, traces[0])
    check(doc)
