"""`diagtrain run`: real jobs, wrapped without changing them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pandas as pd
import pytest

from conftest import JOB_TIMEOUT_S, USER_SCRIPT, Run, diagtrain_run, load_trace, processes_with, torchrun

USAGE = 2


@pytest.fixture(scope="module")
def user_run(tmp_path_factory) -> Run:
    out = tmp_path_factory.mktemp("user") / "run"
    return diagtrain_run(out, "--profile-steps", "2-3", "--telemetry-interval", "0.2", "--",
                         *torchrun(2), str(USER_SCRIPT), env={"STEPS": "6", "STEP_SLEEP": "0.1"})


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
    assert len(run.text(0, "steps.jsonl").splitlines()) == 3


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


def _wait_for_step(out, rank: int, step: int) -> None:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    beat = out / f"ranks/{rank}/heartbeat"
    while time.monotonic() < deadline:
        try:
            if json.loads(beat.read_text())["step"] >= step:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"rank {rank} never reached step {step}")


@pytest.mark.parametrize("args,message", [
    ([], "no command given"),
    (["--"], "no command given"),
    (["--profile-steps", "3-1", "--", "true"], "--profile-steps '3-1': the range ends before it starts"),
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


def test_two_torchrun_agents_are_two_hosts(tmp_path):
    out = tmp_path / "run"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    agents = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "diagtrain.profiler.cli", "run", "--out", str(out), "--",
               sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}",
               "--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}", str(USER_SCRIPT)]
        agents.append(subprocess.Popen(cmd, env={**os.environ, "STEPS": "3"},
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    for agent in agents:
        _, err = agent.communicate(timeout=JOB_TIMEOUT_S)
        assert agent.returncode == 0, err[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    hostname = socket.gethostname()
    hosts = {h["name"]: h for h in manifest["hosts"]}
    assert set(hosts) == {hostname, f"{hostname}-2"}
    assert sorted(r for h in hosts.values() for r in h["ranks"]) == [0, 1]
    assert all(len(h["ranks"]) == 1 for h in hosts.values())
    assert manifest["status"] == "ok" and manifest["world_size"] == 2
    for name in hosts:
        assert (out / "hosts" / name / "console.log").exists()
        assert (out / "hosts" / name / "telemetry.jsonl").exists()
    table = pd.read_parquet(out / "telemetry.parquet")
    assert set(table["host"]) == set(hosts)
