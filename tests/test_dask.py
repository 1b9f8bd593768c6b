"""`diagtrain analyze --scheduler`: the ranks load as tasks on a real Dask cluster (a LocalCluster of
worker processes, and a scheduler and a worker started with the `dask` CLI), and the report is the
one the local analysis writes."""

from __future__ import annotations

import json
import os
import shutil
import socket
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from distributed import LocalCluster

from diagtrain.profiler.analyzer.analyze import analyze
from diagtrain.profiler.cli import main
from public_fixtures import HTA_TRACES as TRACES

pytestmark = pytest.mark.jobs  # every test here starts processes (tests/conftest.py)

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
USAGE = 2
DASK_START_S = 60  # a scheduler or worker on a busy 2-core machine is up in seconds; this is for a stuck one


@pytest.fixture(scope="module")
def cluster():
    """Two worker processes of one thread each, the shape `dask worker --nthreads 1` gives a user."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        yield c


@pytest.fixture
def gpu_traces(tmp_path) -> Path:
    """Ranks 0 and 1 of a real 128-rank NCCL job (HTA's test data), one file per rank."""
    folder = tmp_path / "gpu"
    folder.mkdir()
    for r in (0, 1):
        shutil.copy(TRACES / f"sampled_128rank_rank{r}.json.gz", folder)
    return folder


def analyzed_both_ways(path: Path, tmp_path: Path, cluster) -> tuple[dict, dict, list[str]]:
    """The report of the local analysis, the one through the cluster, and the cluster run's progress."""
    local = analyze(path, tmp_path / "local", ["json"], workers=2)
    progress: list[str] = []
    on_dask = analyze(path, tmp_path / "dask", ["json"], workers=2, progress=progress.append,
                      scheduler=cluster.scheduler_address)
    written = [json.loads((tmp_path / d / "report.json").read_text()) for d in ("local", "dask")]
    assert written[0] == json.loads(json.dumps(local)) and written[1] == json.loads(json.dumps(on_dask))
    return written[0], written[1], progress


def load_tasks(cluster) -> int:
    """How many load_rank tasks the cluster's scheduler has finished so far."""
    prefix = cluster.scheduler.task_prefixes.get("load_rank")
    return prefix.state_counts["memory"] if prefix is not None else 0


def test_a_ddp_run_on_a_cluster_reports_as_the_local_analysis(user_run, cluster, tmp_path):
    before = load_tasks(cluster)
    local, on_dask, progress = analyzed_both_ways(user_run.out, tmp_path, cluster)
    assert on_dask == local
    assert [r["rank"] for r in on_dask["ranks"]] == [0, 1] and all(r["steps"] > 0 for r in on_dask["ranks"])
    assert load_tasks(cluster) - before == 2  # one task per rank ran on the workers
    # The workers wrote each rank's tables next to the run; only summaries came back.
    for rank in (0, 1):
        cache = tmp_path / "dask" / "analysis" / "cache" / f"rank-{rank}"
        assert {"spans.parquet", "steps.arrow", "summary.json"} <= {p.name for p in cache.iterdir()}
    assert any(p.startswith(f"loaded 2/2 ranks on the Dask cluster at {cluster.scheduler_address} (")
               for p in progress)  # ranks done / total, and how fast


def test_real_gpu_traces_on_a_cluster_report_as_the_local_analysis(gpu_traces, cluster, tmp_path):
    local, on_dask, _ = analyzed_both_ways(gpu_traces, tmp_path, cluster)
    assert on_dask == local
    assert [r["rank"] for r in on_dask["ranks"]] == [0, 1]
    assert all(r["compute_us"] > 0 and r["idle_us"] > 0 for r in on_dask["ranks"])


def test_a_bad_rank_is_reported_and_the_others_come_back(user_run, cluster, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(user_run.out, run, ignore=shutil.ignore_patterns("analysis", "report.*"))
    bad = sorted((run / "ranks" / "1").glob("trace-*.json.gz"))
    for trace in bad:
        trace.write_bytes(trace.read_bytes()[:2000])  # truncated, as a job killed mid-write leaves it
    code = main(["analyze", str(run), "--format", "json", "--quiet", "--scheduler", cluster.scheduler_address])
    assert code == 0
    report = json.loads((run / "report.json").read_text())
    # Each cut trace is named, and either kept up to its cut or, cut before any event, left out.
    assert {s["path"] for s in report["skipped"]} >= {str(t) for t in bad}
    assert all("ends early" in s["reason"] for s in report["skipped"] if s["path"] in {str(t) for t in bad})
    [rank0] = [r for r in report["ranks"] if r["rank"] == 0]
    assert rank0["compute_us"] > 0  # rank 0's traces were read on the cluster all the same


# A rank of a million events takes seconds to load even on a quiet machine; the other rank, a
# tenth of a second: while the big one is the only task running, it is the one to kill.
BIG_RANK_EVENTS, SMALL_RANK_EVENTS = 1_000_000, 20_000
KILL_WAIT_S = 60  # for the big task to start on a busy 2-core machine


def test_a_worker_killed_mid_task_is_replaced_and_no_rank_is_lost(tmp_path):
    sys.path.insert(0, str(BENCHMARKS))
    from synthetic import write_trace

    run = tmp_path / "run"
    run.mkdir()
    write_trace(run / "rank0.json.gz", 0, 2, BIG_RANK_EVENTS)
    write_trace(run / "rank1.json.gz", 1, 2, SMALL_RANK_EVENTS)
    done: dict = {}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        analysis = threading.Thread(target=lambda: done.update(report=analyze(
            run, tmp_path / "dask", ["json"], workers=2, scheduler=c.scheduler_address)))
        analysis.start()
        killed = kill_the_worker_of_the_last_running_load(c)
        analysis.join(timeout=300)
        # Tasks whose worker died under them: the scheduler ran them again elsewhere.
        retried = c.scheduler.task_prefixes["load_rank"].suspicious
    assert killed and not analysis.is_alive() and "report" in done
    assert retried == 1  # the kill landed mid-task
    report = json.loads((tmp_path / "dask" / "report.json").read_text())
    assert [r["rank"] for r in report["ranks"]] == [0, 1] and not report["skipped"]
    local = analyze(run, tmp_path / "local", ["json"], workers=1)
    assert report == json.loads(json.dumps(local))


def kill_the_worker_of_the_last_running_load(c: LocalCluster) -> int | None:
    """SIGKILL the worker process running the only load_rank task left while another has finished;
    its pid, or None if none was seen running."""
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline:
        try:
            tasks = [t for t in list(c.scheduler.tasks.values()) if t.prefix.name == "load_rank"]
        except RuntimeError:  # the scheduler's dict changed under us: look again
            continue
        running = [t for t in tasks if t.state == "processing" and t.processing_on is not None]
        if len(tasks) == 2 and len(running) == 1 and any(t.state == "memory" for t in tasks):
            pid = running[0].processing_on.pid
            os.kill(pid, signal.SIGKILL)
            return pid
        time.sleep(0.01)
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_scheduler_and_a_worker_started_with_the_dask_cli(gpu_traces, tmp_path):
    bin_dir = Path(sys.executable).parent
    scheduler_file = tmp_path / "scheduler.json"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    dask = [str(bin_dir / "dask")]
    started = [subprocess.Popen([*dask, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                 "--scheduler-file", str(scheduler_file)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        address = wait_for_address(scheduler_file)
        started.append(subprocess.Popen([*dask, "worker", address, "--nthreads", "1", "--no-dashboard"], env=env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        # The address from the environment, as a batch script would set it; the analysis waits for the worker.
        proc = subprocess.run(["diagtrain", "analyze", str(gpu_traces), "--out", str(tmp_path / "dask"),
                               "--format", "json", "--quiet"], env={**env, "DIAGTRAIN_DASK_SCHEDULER": address},
                              capture_output=True, text=True, timeout=120)
    finally:
        for p in reversed(started):
            p.terminate()
            p.wait(timeout=30)
    assert proc.returncode == 0, proc.stderr
    local = analyze(gpu_traces, tmp_path / "local", ["json"], workers=1)
    assert json.loads((tmp_path / "dask" / "report.json").read_text()) == json.loads(json.dumps(local))


def wait_for_address(scheduler_file: Path) -> str:
    from conftest import wait_until

    wait_until(lambda: scheduler_file.exists() and scheduler_file.stat().st_size > 0, "the dask scheduler",
               timeout=DASK_START_S)
    return json.loads(scheduler_file.read_text())["address"]


def test_an_unreachable_scheduler_is_a_usage_error_naming_it(gpu_traces, tmp_path):
    address = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    proc = subprocess.run([sys.executable, "-m", "diagtrain.profiler.cli", "analyze", str(gpu_traces),
                           "--out", str(tmp_path / "out"), "--scheduler", address],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "1s"})
    assert proc.returncode == USAGE
    assert f"cannot reach the Dask scheduler at {address}" in proc.stderr
    assert not (tmp_path / "out" / "report.json").exists()


@pytest.mark.parametrize("address,message", [("head-node", "missing port number"),
                                             ("nonsense://x:1", "unknown address scheme")])
def test_a_malformed_address_is_a_usage_error(gpu_traces, tmp_path, capsys, address, message):
    code = main(["analyze", str(gpu_traces), "--out", str(tmp_path / "out"), "--scheduler", address])
    err = capsys.readouterr().err
    assert code == USAGE and f"--scheduler {address}: not a Dask scheduler address" in err and message in err


def test_without_dask_the_analyzer_runs_and_scheduler_says_how_to_install(gpu_traces, tmp_path):
    # As where dask is not installed: the local analysis works, --scheduler says what to install.
    script = ("import sys; sys.modules['distributed'] = sys.modules['dask'] = None\n"
              "from diagtrain.profiler.cli import main\n"
              f"local = main(['analyze', {str(gpu_traces)!r}, '--out', {str(tmp_path / 'local')!r}, '--quiet'])\n"
              f"sys.exit(local * 10 + main(['analyze', {str(gpu_traces)!r}, '--out', {str(tmp_path / 'dask')!r}, "
              "'--scheduler', 'tcp://127.0.0.1:8786']))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == USAGE, proc.stderr  # the local one 0, the other 2
    assert "Dask is not installed here" in proc.stderr and "pip install 'diagtrain[dask]'" in proc.stderr
    assert (tmp_path / "local" / "report.json").exists()
