"""`diagtrain run`: real jobs, wrapped without changing them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid

import pandas as pd
import psutil
import pytest

from conftest import (USER_SCRIPT, died_in_teardown, diagtrain_run, heartbeat_step, load_trace, processes_with,
                      said_dying, torchrun, wait_until)
from diagtrain.profiler.run_dir import read_hosts

pytestmark = pytest.mark.jobs  # every test here starts processes (tests/conftest.py)

USAGE = 2


def test_manifest_of_a_foreign_command(user_run):
    m = user_run.manifest
    assert m["status"] == "ok" and m["exit_code"] == 0
    assert m["world_size"] == 2 and m["strategy"] is None and m["injected"] == []
    assert m["exit_codes"] == {"0": 0, "1": 0}
    assert m["command"][-1] == str(USER_SCRIPT)
    assert [h["ranks"] for h in m["hosts"]] == [[0, 1]]
    assert m["hosts"][0]["hostname"] == socket.gethostname()
    assert m["ended_at"] >= m["started_at"] > 0
    assert m["versions"]["torch"].startswith("2.")


def test_steps_from_optimizer_hooks_in_a_script_that_knows_nothing(user_run):
    for rank in (0, 1):
        lines = user_run.text(rank, "steps.jsonl").splitlines()
        records = [json.loads(line) for line in lines]
        assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
        assert all("optimizer" in r["phases_ms"] for r in records)
        # Steps 2.. span one iteration each, including the 0.1 s sleep after optimizer.step().
        assert all(r["duration_ms"] >= 100 for r in records[1:])
        assert json.loads(user_run.text(rank, "heartbeat"))["step"] == 6


def test_traces_with_distributed_info_and_communication(user_run):
    for rank in (0, 1):
        [path] = user_run.traces(rank)
        trace = load_trace(path)
        assert trace["distributedInfo"]["rank"] == rank and trace["distributedInfo"]["backend"] == "gloo"
        names = {e.get("name") for e in trace["traceEvents"]}
        assert {"ProfilerStep#2", "ProfilerStep#3", "gloo:all_reduce"} <= names
        assert "ProfilerStep#4" not in names


def test_logs_flight_recorder_and_exit_record_per_rank(user_run):
    for rank in (0, 1):
        stdout = user_run.text(rank, "stdout.log")
        assert f"rank {rank} finished" in stdout
        # Set before the process group started: NCCL would write its INFO log there on a GPU.
        assert f"NCCL_DEBUG_FILE={user_run.out}/ranks/{rank}/nccl.log" in stdout
        assert "TORCH_FR_BUFFER_SIZE=20000" in stdout
        assert f"rank {rank} says goodbye on stderr" in user_run.text(rank, "stderr.log")
        entries = json.loads(user_run.text(rank, "flight_recorder.json"))["entries"]
        assert any(e["profiling_name"] == "gloo:all_reduce" for e in entries)
        assert json.loads(user_run.text(rank, "exit.json"))["code"] == 0
        info = json.loads(user_run.text(rank, "rank.json"))
        assert info["rank"] == rank and info["world_size"] == 2 and info["torch"].startswith("2.")
    # The job's output still reaches the terminal.
    assert "rank 0 finished" in user_run.stdout and "rank 1 finished" in user_run.stdout


def test_telemetry_for_every_rank(user_run):
    table = pd.read_parquet(user_run.out / "telemetry.parquet")
    processes = table[table["kind"] == "process"]
    assert set(processes["rank"]) == {0, 1}
    assert (processes["rss_bytes"] > 10 * 2**20).all()
    assert (table["kind"] == "host").sum() >= 2
    assert "sampling CPU and memory of each rank with psutil" in user_run.stderr
    assert user_run.stderr.count("no NVIDIA GPU telemetry") == 1


def test_plain_python_script_is_rank_zero_and_its_exit_code_is_kept(tmp_path):
    run = diagtrain_run(tmp_path / "run", "--", sys.executable, str(USER_SCRIPT),
                        env={"STEPS": "3", "EXIT_CODE": "3"}, check=False)
    assert run.returncode == 3
    m = run.manifest
    assert m["status"] == "failed" and m["exit_code"] == 3 and m["exit_codes"] == {"0": 3}
    records = run.steps(0)
    assert len(records) == 3
    for record in records:
        # The counters of a job without a process group: nothing communicated, and that was measured.
        assert record["comm_ms"] == 0 and record["comm_calls"] == 0 and record["cpu_ms"] > 0
        assert {"forward", "backward", "optimizer"} <= set(record["phases_ms"])


def test_a_failing_rank_is_named_with_its_error(tmp_path):
    run = diagtrain_run(tmp_path / "run", "--", *torchrun(2), str(USER_SCRIPT),
                        env={"STEPS": "6", "FAIL_RANK": "1", "FAIL_STEP": "3"}, check=False)
    assert run.returncode != 0
    m = run.manifest
    assert m["status"] == "failed" and m["exit_code"] == run.returncode
    failed = m["rank_exits"]["1"]
    assert failed["code"] == 1 and "injected failure on rank 1 at step 3" in failed["exception"]
    assert f"{USER_SCRIPT}:" in failed["where"]
    assert len(run.text(1, "steps.jsonl").splitlines()) == 2
    assert not died_in_teardown(run)  # an exception in training is never taken for a teardown crash


@pytest.mark.parametrize("silent,ranks,said", [
    ("0", [1], ": terminate called without an active exception. The launcher"),
    ("1", [0, 1], " without a message (every rank's script ended with code 0)"),
])
def test_a_rank_that_dies_after_its_script_ended_is_a_crash_at_exit_not_in_training(tmp_path, silent, ranks, said):
    """Gloo's threads can abort a rank while Python shuts down, after the script returned: the
    launcher calls the job failed, and the report says the training itself finished. Killed there
    without a word, no rank can be singled out."""
    for attempt in range(3):
        run = diagtrain_run(tmp_path / f"run{attempt}", "--profile-steps", "none", "--", *torchrun(2), str(USER_SCRIPT),
                            env={"STEPS": "3", "TEARDOWN_CRASH_RANK": "1", "TEARDOWN_SILENT": silent}, check=False)
        # torch's own teardown crash (what died_in_teardown excuses) can strike a rank before or beside the
        # injected death: the case this test asks about did not happen, so it is run again.
        if [r for r in (0, 1) if said_dying(run, r)] == ([1] if silent == "0" else []):
            break
    assert run.returncode == 1  # torchrun's, kept
    assert run.manifest["status"] == "failed" and run.manifest["rank_exits"]["1"]["code"] == 0
    stderr = run.text(1, "stderr.log")
    assert ("terminate called without an active exception" in stderr) == (silent == "0")
    # faulthandler is off once the exit record is written: its dump in teardown crashed itself.
    assert "Fatal Python error" not in stderr
    first = run.json("report.json")["findings"][0]
    assert first["kind"] == "crash_at_exit" and first["ranks"] == ranks and first["severity"] == "error"
    assert (f"{'rank 1' if len(ranks) == 1 else 'ranks 0, 1'}'s script ended with code 0 after step 3, then "
            f"{'its process' if len(ranks) == 1 else 'their processes'} died while Python shut down{said}") in first["explanation"]
    assert not [f for f in run.json("report.json")["findings"] if f["kind"] in ("crash", "hang")]
    # What lets the suite's fixtures live with torch's rare teardown crash; a silent death is not excused.
    assert died_in_teardown(run) == (silent == "0")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_everything_and_keeps_what_was_collected(tmp_path, signum):
    marker = uuid.uuid4().hex
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "diagtrain.profiler.cli", "run", "--out", str(out), "--",
           *torchrun(2), str(USER_SCRIPT)]
    env = {**os.environ, "STEPS": "100000", "STEP_SLEEP": "0.05", "TEST_MARKER": marker}
    wrapper = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_step(out, rank=1, step=3)
        wrapper.send_signal(signum)
        _, stderr = wrapper.communicate(timeout=60)
    finally:
        wrapper.kill()
    assert wrapper.returncode != 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    for rank in (0, 1):
        records = [json.loads(line) for line in (out / f"ranks/{rank}/steps.jsonl").read_text().splitlines()]
        assert len(records) >= 3
        reason = json.loads((out / f"ranks/{rank}/exit.json").read_text())["reason"]
        assert reason == ("interrupted" if signum == signal.SIGINT else "terminated")
    assert (out / "telemetry.parquet").exists()
    assert processes_with(marker) == []
    [host] = manifest["hosts"]
    assert host["interrupted"]["signal"] == signal.Signals(signum).name
    findings = json.loads((out / "report.json").read_text())["findings"]
    assert not [f for f in findings if f["kind"] in ("hang", "crash")], findings


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_while_ranks_wait_in_a_collective_is_not_a_hang(tmp_path, signum):
    """Stopped mid-step, a rank waits in an all-reduce its peer has not reached: what used to read as a hang."""
    marker, out = uuid.uuid4().hex, tmp_path / "run"
    cmd = [sys.executable, "-m", "diagtrain.profiler.cli", "run", "--out", str(out), "--",
           *torchrun(2), str(USER_SCRIPT)]
    env = {**os.environ, "STEPS": "100", "STEP_SLEEP": "0.05", "PAUSE_RANK": "1", "PAUSE_STEP": "3",
           "PAUSE_S": "120", "TEST_MARKER": marker}
    wrapper = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_step(out, rank=0, step=2)
        _wait_for_step(out, rank=1, step=2)
        time.sleep(1.0)  # rank 0 is in step 3's all-reduce; rank 1 sleeps before it
        wrapper.send_signal(signum)
        wrapper.communicate(timeout=60)
    finally:
        wrapper.kill()
    assert processes_with(marker) == []
    # The state that made the verdict "CRITICAL hang" on interrupted runs: a collective one rank
    # entered and the other never did.
    assert json.loads((out / "analysis/hang.json").read_text())["blocked"]
    report = json.loads((out / "report.json").read_text())
    assert report["run"]["status"] == "interrupted"
    assert not [f for f in report["findings"] if f["kind"] in ("hang", "crash")], report["findings"]
    first = report["findings"][0]
    assert first["kind"] == "interrupted" and first["severity"] == "info"
    assert f"was stopped by {signal.Signals(signum).name}" in first["explanation"]
    assert "not a hang" in first["explanation"]


def test_the_job_does_not_outlive_a_killed_wrapper(tmp_path):
    """SIGKILL of the wrapper: its command dies with it, and so do processes orphaned below it."""
    marker, out = uuid.uuid4().hex, tmp_path / "run"
    cmd = [sys.executable, "-m", "diagtrain.profiler.cli", "run", "--out", str(out), "--",
           "sh", "-c", "sleep 300 & sleep 300"]
    wrapper = subprocess.Popen(cmd, env={**os.environ, "TEST_MARKER": marker}, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: len([p for p in processes_with(marker) if _name(p) == "sleep"]) == 2, "both sleeps")
        wrapper.kill()
        wrapper.wait(timeout=10)
        wait_until(lambda: processes_with(marker) == [], "the job's processes to end", timeout=15)
    finally:
        wrapper.kill()
    assert json.loads((out / "hosts" / socket.gethostname() / "host.json").read_text())["status"] == "running"
    [host] = read_hosts(out)  # what the analyzer and the next wrapper see: the wrapper is gone
    assert host["status"] == "abandoned" and host["last_seen"] is not None


WRAPPER_FAULT = """
import sys
from pathlib import Path
from rich.console import Console
from diagtrain.profiler.collect.launcher import Collection
from diagtrain.profiler.rank import BOOTSTRAP_DIR


class BrokenWatchdog:  # a fault inside the wrapper itself, in its main loop
    def check(self):
        raise RuntimeError("wrapper fault injected by the test")


collection = Collection(Path(sys.argv[1]), ["sleep", "300"], [], [], 0.2, Console(stderr=True, soft_wrap=True),
                        BOOTSTRAP_DIR)
collection.watchdog = BrokenWatchdog()
sys.exit(collection.run())
"""


def test_a_failing_wrapper_still_ends_its_record_and_stops_the_job(tmp_path):
    marker, out = uuid.uuid4().hex, tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", WRAPPER_FAULT, str(out)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "TEST_MARKER": marker})
    assert proc.returncode == 1
    assert "internal error: RuntimeError: wrapper fault injected by the test; stopping the job" in proc.stderr
    [host] = json.loads((out / "manifest.json").read_text())["hosts"]
    assert host["status"] == "failed" and host["ended_at"] is not None
    assert host["wrapper_error"] == "RuntimeError: wrapper fault injected by the test"
    assert processes_with(marker) == []


def _name(pid: int) -> str | None:
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return None


def _wait_for_step(out, rank: int, step: int) -> None:
    wait_until(lambda: heartbeat_step(out, rank) >= step, f"rank {rank} to reach step {step}")


@pytest.mark.parametrize("args,message", [
    ([], "no command given"),
    (["--"], "no command given"),
    (["--profile-steps", "3-1", "--", "true"], "--profile-steps '3-1': the range ends before it starts"),
    (["--profile-steps", "auto", "--profile-steps", "3-4", "--", "true"],
     "--profile-steps 'auto' cannot be combined with other windows"),
    (["--profile-steps", "sometimes", "--", "true"], "--profile-steps 'sometimes' is not a step range"),
    (["--out", "/proc/diagtrain-nope", "--", "true"], "--out /proc/diagtrain-nope: cannot write there"),
    (["--telemetry-interval", "0", "--", "true"], "--telemetry-interval must be positive"),
])
def test_bad_input_is_a_usage_error(tmp_path, args, message):
    proc = subprocess.run([sys.executable, "-m", "diagtrain.profiler.cli", "run", *args],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == USAGE
    assert message in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_command_that_does_not_exist(tmp_path):
    run = diagtrain_run(tmp_path / "run", "--", "diagtrain-no-such-program", check=False)
    assert run.returncode == 127
    assert "cannot start 'diagtrain-no-such-program'" in run.stderr
    assert run.manifest["status"] == "failed"


def test_the_users_own_sitecustomize_still_runs(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, pathlib\npathlib.Path(os.environ['SITE_MARKER']).write_text('ran')\n")
    marker = tmp_path / "marker"
    run = diagtrain_run(tmp_path / "run", "--", sys.executable, str(USER_SCRIPT),
                        env={"STEPS": "2", "PYTHONPATH": str(site), "SITE_MARKER": str(marker)})
    assert marker.read_text() == "ran"
    assert len(run.text(0, "steps.jsonl").splitlines()) == 2


def test_a_second_run_into_a_finished_runs_folder_is_refused(user_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(user_run.out, out)
    (out / "notes.txt").write_text("mine")
    steps_before = (out / "ranks/0/steps.jsonl").read_text()
    proc = subprocess.run([sys.executable, "-m", "diagtrain.profiler.cli", "run", "--out", str(out), "--", "true"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == USAGE
    assert "already holds a finished run (status ok)" in proc.stderr and "--replace" in proc.stderr
    assert (out / "ranks/0/steps.jsonl").read_text() == steps_before  # nothing mixed in
    replaced = diagtrain_run(out, "--replace", "--no-analyze", "--", "true")
    assert replaced.manifest["command"] == ["true"] and not (out / "ranks").exists()
    assert (out / "notes.txt").read_text() == "mine"  # only the run's own files were removed


def test_who_may_join_a_run_folder(tmp_path):
    from diagtrain.profiler.collect import manifest
    from diagtrain.profiler.util import processes

    job = ["torchrun", "--nnodes=2", "--node-rank=0", "train.py"]
    assert manifest.occupied_by(tmp_path, job) is None  # empty
    host = tmp_path / "hosts" / "node-a"
    host.mkdir(parents=True)
    record = {"name": "node-a", "hostname": socket.gethostname(), "process": processes.identity(), "status": "running",
              "command": ["torchrun", "--nnodes=2", "--node-rank=1", "train.py"]}
    (host / "host.json").write_text(json.dumps(record))
    assert manifest.occupied_by(tmp_path, job) is None  # another host of this job, still running: join
    # Hosts' commands may differ (per-node arguments, a wrapper script): a running run is joined.
    assert manifest.occupied_by(tmp_path, ["sh", "-c", "torchrun train.py"]) is None
    dead = subprocess.Popen(["sleep", "60"])
    gone = processes.identity(dead.pid)
    dead.kill()
    dead.wait()
    (host / "host.json").write_text(json.dumps({**record, "process": gone}))
    assert "wrapper is gone" in manifest.occupied_by(tmp_path, job)
    elsewhere = {**gone, "boot_id": "another-machine"}
    (host / "host.json").write_text(json.dumps({**record, "hostname": "elsewhere", "process": elsewhere,
                                                "started_at": time.time()}))
    assert manifest.occupied_by(tmp_path, job) is None  # a wrapper on another machine cannot be asked
    (host / "host.json").write_text(json.dumps({**record, "status": "ok"}))
    assert "already holds a finished run" in manifest.occupied_by(tmp_path, job)
