"""Shared helpers: run real multi-process trainer jobs and read what they wrote."""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

from diagtrain.profiler.analyzer.read.stderr_errors import PROCESS_DEATHS, parse_errors

# A trainer job that has not finished by then is stuck; the suite must not wait forever.
JOB_TIMEOUT_S = 240

JOBS_MARKER = "jobs"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{JOBS_MARKER}: starts processes (real multi-process jobs, the CLI, a browser, "
                            "a Dask cluster); `pytest -m 'not jobs'` runs the rest, in-process, in about a minute")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """A test not marked ``jobs`` that starts a process fails, naming itself: the quick set stays quick.

    Covers the test, its fixtures of every scope (set up inside its first test) and their teardown."""
    if item.get_closest_marker(JOBS_MARKER) is not None:
        yield
        return
    import multiprocessing.process

    def refuse(*args, **kwargs):
        pytest.fail(f"{item.nodeid} starts a process: mark it @pytest.mark.{JOBS_MARKER} (tests/conftest.py)",
                    pytrace=False)

    spawn, start = subprocess.Popen._execute_child, multiprocessing.process.BaseProcess.start
    subprocess.Popen._execute_child, multiprocessing.process.BaseProcess.start = refuse, refuse
    try:
        yield
    finally:
        subprocess.Popen._execute_child, multiprocessing.process.BaseProcess.start = spawn, start

# A shell without job control starts a background command with SIGINT ignored, and every child inherits
# that: `diagtrain run` then leaves Ctrl-C ignored, as it should under nohup, and each test that sends one
# waits out JOB_TIMEOUT_S. The tests send it on purpose, so it is restored for what they start.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@dataclass
class Run:
    """A finished trainer job and its run directory."""

    out: Path
    returncode: int
    stderr: str
    stdout: str = ""

    def steps(self, rank: int) -> list[dict]:
        lines = (self.out / "ranks" / str(rank) / "steps.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]

    def losses(self, rank: int = 0) -> list[float]:
        return [r["loss"] for r in self.steps(rank)]

    def parameters(self, rank: int) -> dict:
        return json.loads((self.out / "ranks" / str(rank) / "parameters.json").read_text())

    def json(self, name: str):
        return json.loads((self.out / name).read_text())

    def traces(self, rank: int) -> list[Path]:
        return sorted((self.out / "ranks" / str(rank)).glob("trace-*.json.gz"))

    @property
    def manifest(self) -> dict:
        return self.json("manifest.json")

    def text(self, rank: int, name: str) -> str:
        return (self.out / "ranks" / str(rank) / name).read_text()


def load_trace(path: Path) -> dict:
    with gzip.open(path) as f:
        return json.load(f)


def phase(records: list[dict], name: str) -> list[float]:
    """One phase's time (ms) per step."""
    return [r["phases_ms"].get(name, 0.0) for r in records]


def train(out: Path | None, *args: str, nproc: int = 2, check: bool = True, cwd: Path | None = None) -> Run:
    """Run ``diagtrain train`` for real (torch.distributed.run, gloo) and wait for it.

    With ``out=None`` the launcher picks the run directory, and the one it announces is used.
    """
    cmd = [sys.executable, "-m", "diagtrain.profiler.cli", "train", "--nproc", str(nproc), *args]
    if out is not None:
        cmd += ["--out", str(out)]
    env = {k: v for k, v in os.environ.items() if k != "DIAGTRAIN_RUN_DIR"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=JOB_TIMEOUT_S, env=env, cwd=cwd)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    announced = re.search(r"^diagtrain: run directory (.+)$", proc.stderr, re.MULTILINE)
    return Run(Path(announced.group(1)) if out is None else out, proc.returncode, proc.stderr)


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory) -> Run:
    """The single-process loss curve every data-parallel strategy must follow."""
    cwd = tmp_path_factory.mktemp("single")
    return train(None, "--strategy", "ddp", "--steps", "6", nproc=1, cwd=cwd)


USER_SCRIPT = Path(__file__).parent / "scripts" / "user_ddp.py"


def torchrun(nproc: int, *extra: str) -> list[str]:
    """A torchrun command line, as a user would type it."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *extra]


def diagtrain_run(out: Path, *args: str, env: dict | None = None, check: bool = True) -> Run:
    """``diagtrain run --out OUT ARGS...`` for real; ARGS holds options, ``--`` and the command."""
    cmd = [sys.executable, "-m", "diagtrain.profiler.cli", "run", "--out", str(out), *args]
    full_env = {k: v for k, v in os.environ.items() if k != "DIAGTRAIN_RUN_DIR"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=JOB_TIMEOUT_S,
                          env={**full_env, "OMP_NUM_THREADS": "1", **(env or {})})
    run = Run(out, proc.returncode, proc.stderr, proc.stdout)
    if check and proc.returncode != 0:
        if died_in_teardown(run):
            warnings.warn(f"{out}: a rank died in Python's teardown after every rank's script ended with code 0 "
                          "(torch's process-group threads); its records are complete")
        else:
            raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return run


def on_training(findings: list[dict]) -> list[dict]:
    """The findings about the training: all but crash_at_exit, which says how a process ended, and
    which torch's rare teardown crash (see died_in_teardown) adds to any run at random."""
    return [f for f in findings if f["kind"] != "crash_at_exit"]


def died_in_teardown(run: Run) -> bool:
    """A rank's script ended with code 0 and the rank then died in C++ as Python shut down, the others ending
    with code 0 too or stopped by the launcher for it, every rank having recorded the same last step: the rare
    teardown crash of torch's gloo threads (pytorch/pytorch#179291), not a failure of what a test checks."""
    try:
        exits = run.manifest["rank_exits"]
        world = run.manifest["world_size"]
        last = {int(r): run.steps(int(r))[-1]["step"] for r in exits}
    except (OSError, KeyError, ValueError, IndexError):
        return False
    ended = [e.get("code") == 0 for e in exits.values()]
    stopped = [e.get("code") == 0 or e.get("reason") == "terminated" for e in exits.values()]
    if len(exits) != world or not any(ended) or not all(stopped) or len(set(last.values())) != 1:
        return False
    try:
        return any(said_dying(run, int(r)) for r, x in exits.items() if x.get("code") == 0)
    except OSError:
        return False


def said_dying(run: Run, rank: int) -> bool:
    """Whether ``rank``'s last words are its process's death in C++, by the analyzer's own reading of them
    (libstdc++'s abort, faulthandler's dump)."""
    return any(e.kind in PROCESS_DEATHS for e in parse_errors(run.text(rank, "stderr.log").splitlines()))


def wait_until(condition, what: str, timeout: float = JOB_TIMEOUT_S) -> None:
    """Poll ``condition()`` until it is true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def heartbeat_step(out: Path, rank: int) -> int:
    """The last step the rank's heartbeat reports (0 before its first)."""
    try:
        return json.loads((out / "ranks" / str(rank) / "heartbeat").read_text())["step"]
    except (OSError, ValueError):
        return 0
@pytest.fixture(scope="session")
def user_run(tmp_path_factory) -> Run:
    """A 2-rank torchrun job of a script that knows nothing of diagtrain, steps 2-3 profiled, not analyzed.

    The one small real run directory the run tests check and the bad-input corpus is made from.
    """
    out = tmp_path_factory.mktemp("user") / "run"
    return diagtrain_run(out, "--profile-steps", "2-3", "--telemetry-interval", "0.2", "--no-analyze", "--",
                         *torchrun(2), str(USER_SCRIPT), env={"STEPS": "6", "STEP_SLEEP": "0.1"})


def processes_with(marker: str) -> list[int]:
    """Live processes whose environment has TEST_MARKER=marker (what a test's job left behind)."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("TEST_MARKER") == marker:
                found.append(proc.pid)
        except psutil.Error:
            pass
    return found


# A 4-rank DDP job, steps 4-5 profiled, with and without rank 2 made 80 ms slow in forward: the
# runs the dashboard's tests open (not analyzed yet, so the browser test sees the analysis run first).
DASHBOARD_STEPS = 8
DASHBOARD_TRAINER = ["--strategy", "ddp", "--nproc", "4", "--steps", str(DASHBOARD_STEPS)]
DASHBOARD_STRAGGLER = "straggler:rank=2,ms=80"


def dashboard_run(out: Path, *inject: str) -> Path:
    diagtrain_run(out, "--profile-steps", "4-5", "--no-analyze", "--", sys.executable, "-m", "diagtrain.profiler.cli",
                  "train", *DASHBOARD_TRAINER, *inject)
    return out


@pytest.fixture(scope="session")
def ddp_4_ranks(tmp_path_factory) -> Path:
    """The clean dashboard run: also test_strategies' DDP job under `diagtrain run`, which needs a clean
    4-rank DDP run with a profiled window and would otherwise start the same job again."""
    return dashboard_run(tmp_path_factory.mktemp("dashboard") / "clean")


@pytest.fixture(scope="session")
def dashboard_runs(tmp_path_factory, ddp_4_ranks) -> dict[str, Path]:
    straggler = dashboard_run(tmp_path_factory.mktemp("dashboard") / "straggler", "--inject", DASHBOARD_STRAGGLER)
    return {"straggler": straggler, "clean": ddp_4_ranks}


# GPipe with one microbatch: the two stages work strictly by turns, so each idles half of the pass
# whatever else the host runs (the formula gives (p-1)/(m+p-1) = 1/2). Step 1 (shape inference,
# start-up) is left out: steps 2-3 are profiled.
PIPELINE = ["--strategy", "pp", "--nproc", "2", "--steps", "3", "--dim", "128", "--schedule", "gpipe",
            "--microbatches", "1"]


@pytest.fixture(scope="session")
def pipeline_job(tmp_path_factory) -> Run:
    """The README's main command, small: ``diagtrain run --profile-steps 2-3 -- diagtrain train`` of a
    2-stage pipeline, analyzed at the end; its console output is kept (the plan and console tests read it)."""
    out = tmp_path_factory.mktemp("plan") / "pp"
    return diagtrain_run(out, "--profile-steps", "2-3", "--", sys.executable, "-m", "diagtrain.profiler.cli", "train",
                         *PIPELINE)


# gloo's own timeout, with no watchdog: rank 1 skips step 3's loss all-reduce and rank 0 waits in it until
# --pg-timeout; the job fails on its own.
PG_TIMEOUT_S = 5


@pytest.fixture(scope="session")
def gloo_timeout_run(tmp_path_factory) -> Run:
    """A 2-rank reference-trainer job that gloo's timeout ends (not ``diagtrain run``): the fault injector's
    and the stderr reader's tests both read it."""
    return train(tmp_path_factory.mktemp("gloo_timeout") / "run", "--strategy", "ddp", "--steps", "5",
                 "--pg-timeout", str(PG_TIMEOUT_S), "--inject", "hang:rank=1,step=3", check=False)


USER_SCRIPTS = Path(__file__).resolve().parents[1] / "benchmarks" / "user_scripts"


@pytest.fixture(scope="session")
def slow_rank_ddp(tmp_path_factory) -> tuple[Path, dict]:
    """The accuracy suite's plain DDP script over a DataLoader, 2 ranks, 6 steps, steps 3-5 profiled, rank 1
    sleeping 80 ms before every forward; analyzed. The run directory and its report: the user-script, ledger
    and transfer-time tests all read this one job."""
    from diagtrain.profiler.analyzer.analyze import analyze

    out = tmp_path_factory.mktemp("slow_rank") / "run"
    diagtrain_run(out, "--profile-steps", "3-5", "--no-analyze", "--", *torchrun(2), str(USER_SCRIPTS / "ddp_loader.py"),
                  "--slow-rank", "1", "--slow-ms", "80", "--steps", "6")
    return out, analyze(out, out, ["json"], workers=1)



# A 2-rank DDP job whose rank 1 sleeps STRAGGLER_MS in forward in steps 4-6, steps 2-7 profiled, with a hang
# watchdog of HANG_TIMEOUT_S armed: test_critical_path reads its path and what removing the straggler saves,
# test_hang that steps far slower than their peers' but far below the timeout never trigger the watchdog.
STRAGGLER_MS = 300  # far above what the shared 2-core machine's noise does to one step (tens of ms)
HANG_TIMEOUT_S = 3  # far above a tiny model's step (ms) on a busy host, and each hang test waits it out
STRAGGLER_JOB_MARKER = uuid.uuid4().hex  # its TEST_MARKER: what it left behind is found by processes_with


@pytest.fixture(scope="session")
def straggler_job(tmp_path_factory) -> tuple[Run, dict]:
    """The job and its report (`diagtrain analyze` into the run's sibling analysis/, one worker)."""
    out = tmp_path_factory.mktemp("critical") / "run"
    run = diagtrain_run(out, "--hang-timeout", str(HANG_TIMEOUT_S), "--profile-steps", "2-7", "--no-analyze", "--",
                        sys.executable, "-m", "diagtrain.profiler.cli", "train", "--strategy", "ddp", "--nproc", "2",
                        "--steps", "8", "--inject", f"straggler:rank=1,ms={STRAGGLER_MS},steps=4-6",
                        env={"TEST_MARKER": STRAGGLER_JOB_MARKER})
    proc = subprocess.run([sys.executable, "-m", "diagtrain.profiler.cli", "analyze", str(out), "--workers", "1",
                           "--out", str(out.parent / "analysis")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return run, json.loads((out.parent / "analysis" / "report.json").read_text())


@pytest.fixture(scope="session")
def late_hook_job(tmp_path_factory) -> tuple[Path, dict]:
    """ddp_loader.py on 2 ranks, rank 0's DDP comm hook waiting 40 ms before each all-reduce, 60 steps, steps 3-6
    profiled, not analyzed by the run: the run directory and its report (analyzed after). test_live judges it
    live as it ran, test_user_scripts reads the final verdict: one job for both."""
    from diagtrain.profiler.analyzer.analyze import analyze

    out = tmp_path_factory.mktemp("late_hook") / "run"
    diagtrain_run(out, "--profile-steps", "3-6", "--no-analyze", "--", *torchrun(2), str(USER_SCRIPTS / "ddp_loader.py"),
                  "--hook-delay-rank", "0", "--hook-delay-ms", "40", "--steps", "60")
    return out, analyze(out, out, ["json"], workers=1)
