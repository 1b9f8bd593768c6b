"""`diagtrain export RUN --perfetto OUT` (issue 52): one trace of every rank, held to the Trace Event Format's rules.

Chromium 156 (Debian's, the browser this machine's tests drive) no longer has chrome://tracing (ERR_FAILED: the
trace viewer is gone in favour of Perfetto), and no build of Perfetto's UI installs from a package registry, so the
file is checked against the format's rules as Perfetto's JSON importer and the old viewer apply them: every event's
phase and fields, durations, metadata, and flows whose two ends each lie on a slice of their lane.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pandas as pd
import pytest

from recorded import copy_run
from diagtrain.profiler.analyzer.analyze import analyze
from diagtrain.profiler.export.perfetto import COLLECTIVES, FINDINGS, STEPS, ExportError, export

PHASES = {"X", "M", "s", "f", "i", "C"}
METADATA = {"process_name", "process_sort_index", "process_labels", "thread_name", "thread_sort_index"}


def format_problems(doc: dict) -> list[str]:
    """What breaks the Trace Event Format in ``doc`` (empty when it loads as it should)."""
    problems, slices, flows = [], defaultdict(list), defaultdict(dict)
    if not isinstance(doc.get("traceEvents"), list):
        return ["no traceEvents array"]
    for i, e in enumerate(doc["traceEvents"]):
        where = f"event {i} ({e.get('name')!r})"
        if e.get("ph") not in PHASES:
            problems.append(f"{where}: phase {e.get('ph')!r}")
            continue
        if not (isinstance(e.get("pid"), int) and isinstance(e.get("tid"), int)):
            problems.append(f"{where}: pid and tid must be integers")
        if not isinstance(e.get("name"), str) or not e["name"]:
            problems.append(f"{where}: no name")
        if e["ph"] == "M":
            if e["name"] not in METADATA or not isinstance(e.get("args"), dict):
                problems.append(f"{where}: metadata {e['name']!r} without args")
            continue
        if not isinstance(e.get("ts"), (int, float)):
            problems.append(f"{where}: ts is not a number")
            continue
        if e["ph"] == "X":
            if not isinstance(e.get("dur"), (int, float)) or e["dur"] < 0:
                problems.append(f"{where}: dur {e.get('dur')!r}")
            else:
                slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
        if e["ph"] in "sf":
            if "id" not in e or "cat" not in e:
                problems.append(f"{where}: a flow needs an id and a category")
            elif e["ph"] in flows[(e["cat"], e["id"])]:
                problems.append(f"{where}: flow {e['id']} has two {e['ph']!r} ends")
            else:
                flows[(e["cat"], e["id"])][e["ph"]] = e
    for key, ends in flows.items():
        if set(ends) != {"s", "f"}:
            problems.append(f"flow {key}: only its {set(ends)} end")
            continue
        for end in ends.values():  # bound to the slice that encloses it on its lane
            if not any(a <= end["ts"] <= b for a, b in slices[(end["pid"], end["tid"])]):
                problems.append(f"flow {key}: its {end['ph']!r} end lies on no slice of pid {end['pid']} tid {end['tid']}")
    return problems


@pytest.fixture(scope="module")
def straggler_run(tmp_path_factory):
    run = copy_run("compare-straggler", tmp_path_factory.mktemp("export") / "run")
    analyze(run, run, ["json"], workers=1)
    return run


def read(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())


def test_every_rank_every_step_the_collectives_their_flows_and_the_findings(straggler_run, tmp_path):
    done = export(straggler_run, tmp_path / "run.json.gz")
    doc = read(done.path)
    assert format_problems(doc) == []
    events = doc["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"} and done.ranks == 2 and done.events == len(events)
    order = {e["pid"]: e["args"]["sort_index"] for e in events if e["name"] == "process_sort_index"}
    assert order == {0: 0, 1: 1}
    steps = Counter(e["pid"] for e in events if e["ph"] == "X" and e["tid"] == STEPS)
    assert steps == {0: 30, 1: 30}  # every step, profiled or not
    assert any(e["name"] == "step 10 (profiled)" for e in events if e["ph"] == "X")
    assert min(e["ts"] for e in events if e["ph"] == "X" and e["tid"] == STEPS) == 0.0  # from the run's first step
    profiled = [e for e in events if e["ph"] == "X" and e["tid"] in (1, 2) and e["pid"] == 1]
    assert profiled and {e["tid"] for e in profiled} == {1, 2}  # rank 1's compute and communication in step 10
    # A flow for every call of the profiled step in which a rank waited for the other (the analysis' last_rank),
    # from the last to arrive to the one that waited: rank 1, the straggler, came last more often.
    calls = pd.read_parquet(straggler_run / "analysis" / "collectives.parquet")
    waited = calls[(calls["wait_us"] > 0) & (calls["last_rank"] != calls["rank"])]
    starts = Counter(e["pid"] for e in events if e["ph"] == "s")
    ends = Counter(e["pid"] for e in events if e["ph"] == "f")
    assert sum(starts.values()) == len(waited) > 0
    assert starts == Counter(waited["last_rank"].astype(int)) and ends == Counter(waited["rank"].astype(int))
    assert starts[1] > starts[0]
    calls = [e for e in events if e["ph"] == "X" and e["tid"] == COLLECTIVES]
    assert {e["pid"] for e in calls} == {0, 1} and all("#" in e["name"] for e in calls)
    # The straggler finding over its steps on rank 1: a slice per run of consecutive steps it names.
    found = [e for e in events if e["ph"] == "X" and e["tid"] == FINDINGS and "straggler" in e["name"]]
    assert found and {e["pid"] for e in found} == {1} and all(e["name"] == "error: straggler" for e in found)
    assert found[0]["args"]["explanation"].startswith("rank 1")


def test_a_selection_of_ranks_and_steps(straggler_run, tmp_path):
    doc = read(export(straggler_run, tmp_path / "some.json", ranks={1}, steps={10, 11, 12}).path)
    assert format_problems(doc) == []
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in doc["traceEvents"]} == {1}
    assert sorted(e["name"] for e in slices if e["tid"] == STEPS) == ["step 10 (profiled)", "step 11", "step 12"]
    assert not [e for e in doc["traceEvents"] if e["ph"] in "sf"]  # rank 0, which waited, is not in it
    with pytest.raises(ExportError, match="no steps of the ranks and steps asked for"):
        export(straggler_run, tmp_path / "none.json", ranks={7})


def test_the_checker_catches_what_breaks_the_format():
    bad = {"traceEvents": [{"ph": "X", "name": "a", "pid": 0, "tid": 0, "ts": 5, "dur": -1},
                           {"ph": "s", "name": "w", "cat": "c", "id": 1, "pid": 0, "tid": 0, "ts": 100},
                           {"ph": "Q", "name": "q", "pid": 0, "tid": 0, "ts": 1}]}
    found = format_problems(bad)
    assert any("dur -1" in p for p in found) and any("phase 'Q'" in p for p in found)
    assert any("only its {'s'} end" in p for p in found)


@pytest.mark.jobs
def test_the_command_line(straggler_run, tmp_path):
    out = tmp_path / "cli.json.gz"
    proc = subprocess.run([sys.executable, "-m", "diagtrain.profiler.cli", "export", str(straggler_run), "--perfetto",
                           str(out), "--steps", "10-12"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "2 ranks" in proc.stderr and "ui.perfetto.dev" in proc.stderr and format_problems(read(out)) == []
    bad = subprocess.run([sys.executable, "-m", "diagtrain.profiler.cli", "export", str(straggler_run), "--perfetto",
                          str(out), "--ranks", "3-1"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--ranks '3-1'" in bad.stderr and "Traceback" not in bad.stderr
