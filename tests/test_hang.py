"""Real hangs on CPU: the watchdog stops them, and the verdict names rank, collective and line."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import HANG_TIMEOUT_S, JOB_TIMEOUT_S, STRAGGLER_JOB_MARKER, processes_with

pytestmark = pytest.mark.jobs  # every test here starts processes (tests/conftest.py)

MAX_EXTRA_S = 30  # the bar: stopped within the hang timeout plus this


def run_hanging(out: Path, *trainer: str) -> tuple[subprocess.CompletedProcess, float, dict]:
    marker = uuid.uuid4().hex
    cmd = [sys.executable, "-m", "diagtrain.profiler.cli", "run", "--out", str(out), "--hang-timeout", str(HANG_TIMEOUT_S),
           "--", sys.executable, "-m", "diagtrain.profiler.cli", "train", "--nproc", "2", "--steps", "6", *trainer]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=JOB_TIMEOUT_S,
                          env={**os.environ, "TEST_MARKER": marker})
    elapsed = time.monotonic() - started
    assert processes_with(marker) == [], "processes left behind"
    report = json.loads((out / "report.json").read_text())
    return proc, elapsed, report


def the_finding(report: dict, kind: str) -> dict:
    [finding] = [f for f in report["findings"] if f["kind"] == kind]
    return finding


@pytest.fixture(scope="module")
def skipped_collective(tmp_path_factory):
    """The job of a rank that skips step 3's loss all-reduce, by (strategy, rank), each run once for the module."""
    made = {}

    def job(strategy: str, rank: int) -> tuple[Path, subprocess.CompletedProcess, float, dict]:
        if (strategy, rank) not in made:
            out = tmp_path_factory.mktemp(f"hang-{strategy}") / "run"
            made[strategy, rank] = (out, *run_hanging(out, "--strategy", strategy, "--inject", f"hang:rank={rank},step=3"))
        return made[strategy, rank]
    return job


@pytest.mark.parametrize("strategy,rank", [("ddp", 1), ("fsdp", 0)])
def test_a_rank_that_skips_a_collective(skipped_collective, strategy, rank):
    run, proc, elapsed, report = skipped_collective(strategy, rank)
    assert proc.returncode == 124 and elapsed < HANG_TIMEOUT_S + MAX_EXTRA_S + 15  # hung and stopped; + start-up
    assert json.loads((run / "manifest.json").read_text())["status"] == "hung"
    f = the_finding(report, "hang")
    other = 1 - rank
    assert f["ranks"] == [rank] and f["severity"] == "critical"
    assert f"rank {rank} never entered all_reduce #3 on the metrics group; rank {other} has waited in it since" in f["explanation"]
    assert "reference_trainers/train.py:" in f["explanation"]  # the line of code it is at
    assert report["findings"][0]["kind"] == "hang"
    for r in (0, 1):
        assert (run / f"ranks/{r}/stacks.txt").read_text().startswith("Thread MainThread")
    assert_dashboard_hang_view(run, rank, other)


def assert_dashboard_hang_view(run_dir: Path, rank: int, other: int) -> None:
    """The dashboard's Hang tab: the blocking collective first, then each rank's stack."""
    from diagtrain.dashboard import data, hang

    run = data.load(run_dir)
    assert hang.stopped(run)
    rows, columns = hang.flight_recorder(run)
    first = rows[0]  # the earliest collective some rank never entered
    assert (first["group"], first["op"], first["seq"], first["missing"]) == ("metrics", "all_reduce", 3, str(rank))
    assert (first[f"r{other}"], first[f"r{rank}"]) == (hang.ENTERED, hang.MISSING)
    assert {"rank 0", "rank 1"} <= {c["name"] for c in columns}
    stacks = {s["rank"]: s for s in hang.stacks(run)}
    assert set(stacks) == {0, 1} and "Thread MainThread (main)" in stacks[rank]["text"]
    assert "reference_trainers/train.py" in stacks[rank]["text"]


def test_a_pipeline_stage_that_never_receives(tmp_path):
    proc, _, report = run_hanging(tmp_path / "run", "--strategy", "pp", "--inject", "stuck:rank=0,step=3")
    assert proc.returncode != 0
    f = the_finding(report, "hang")
    assert f["ranks"] == [0] and "faults.py" in f["explanation"] and "(_stuck_in_user_code)" in f["explanation"]
    assert "rank 1 waits in torch/distributed/pipelining/" in f["explanation"]


def test_a_rank_stuck_in_user_code_before_a_collective(tmp_path):
    proc, _, report = run_hanging(tmp_path / "run", "--strategy", "ddp", "--inject", "stuck:rank=1,step=3")
    f = the_finding(report, "hang")
    assert f["ranks"] == [1] and "rank 1 never entered all_reduce" in f["explanation"]
    assert "(_stuck_in_user_code)" in f["explanation"]


def test_a_crash_names_the_rank_its_error_and_what_the_others_waited_in(tmp_path):
    proc, _, report = run_hanging(tmp_path / "run", "--strategy", "ddp", "--inject", "crash:rank=1,step=3")
    assert proc.returncode != 0
    assert json.loads((tmp_path / "run/manifest.json").read_text())["status"] == "failed"
    f = the_finding(report, "crash")
    assert f["ranks"] == [1]
    assert "rank 1 crashed with RuntimeError: injected crash at step 3" in f["explanation"]
    assert "rank 0 was waiting in all_reduce" in f["explanation"]


def test_steps_that_keep_coming_never_trigger_the_watchdog(straggler_job):
    """Rank 1's steps 4-6 take 300 ms more than rank 0's, which waits for it in every one: slow, never stuck."""
    run, report = straggler_job
    assert run.returncode == 0 and "hang:" not in run.stderr
    assert processes_with(STRAGGLER_JOB_MARKER) == []
    assert not [f for f in report["findings"] if f["kind"] in ("hang", "crash")]


def test_dumps_made_outside_diagtrain(skipped_collective, tmp_path):
    run = tmp_path / "run"  # a copy: its flight-recorder dumps are moved out of it
    shutil.copytree(skipped_collective("ddp", 1)[0], run)
    external = tmp_path / "fr"
    external.mkdir()
    for rank in (0, 1):
        dump = json.loads((run / f"ranks/{rank}/flight_recorder.json").read_text())
        if rank == 0:  # NCCL writes pickles to TORCH_FR_DUMP_TEMP_FILE<rank>
            (external / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump))
        else:
            (external / f"nccl_trace_rank_{rank}.json").write_text(json.dumps(dump))
        (run / f"ranks/{rank}/flight_recorder.json").unlink()
    (external / "README").write_text("not a dump")
    proc = subprocess.run([sys.executable, "-m", "diagtrain.profiler.cli", "analyze", str(run), "--format", "json",
                           "--flight-recorder", str(external), "--quiet"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    f = the_finding(json.loads((run / "report.json").read_text()), "hang")
    assert "rank 1 never entered all_reduce #3 on the metrics group" in f["explanation"]


def test_ranks_that_disagree_on_a_collective(tmp_path):
    script = Path(__file__).parent / "scripts" / "mismatch.py"
    cmd = [sys.executable, "-m", "diagtrain.profiler.cli", "run", "--out", str(tmp_path / "run"), "--hang-timeout",
           str(HANG_TIMEOUT_S), "--", sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node=2", str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    assert proc.returncode != 0
    report = json.loads((tmp_path / "run/report.json").read_text())
    f = report["findings"][0]
    assert f["kind"] == "collective_mismatch" and f["ranks"] == [0]
    assert "8 vs 4" in f["explanation"]
    # The aborted rank's Python stack still reached its log (faulthandler).
    assert "mismatch.py\", line 9" in (tmp_path / "run/ranks/0/stderr.log").read_text()

