"""`diagtrain run [options] -- CMD ...`: run any training command and collect what every rank did.

The wrapper changes nothing in the command. It puts a bootstrap sitecustomize on PYTHONPATH
(see :mod:`diagtrain.profiler.inrank`) so each rank instruments itself, samples telemetry beside
the job, shows progress, forwards Ctrl-C and SIGTERM to the whole process tree, leaves no process
behind, writes manifest.json, and exits with the command's exit code.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

from rich.console import Console

from diagtrain.profiler import manifest, process_tree, telemetry, watchdog
from diagtrain.profiler.inrank import HOST_ENV, WRAPPER_PID_ENV
from diagtrain.profiler.progress import Progress
from diagtrain.profiler.rank_files import RankIndex
from diagtrain.profiler.run_dir import RUN_DIR_ENV, check_writable, default_run_dir
from diagtrain.profiler.step_ranges import PROFILE_STEPS_ENV, format_step_ranges, parse_step_ranges

EXIT_USAGE = 2
EXIT_NOT_FOUND = 127  # what a shell returns for a command it cannot find
SHUTDOWN_GRACE_S = 10.0  # after Ctrl-C: time for ranks to write their exit records and dumps
HUNG_GRACE_S = 3.0  # a hung rank blocked in C++ cannot run its SIGTERM handler: do not wait long
LEFTOVER_GRACE_S = 3.0  # after the command ends: time for stray processes to exit on SIGTERM
SETTLE_S = 1.0  # after the command ends: time for the ranks' log tees to drain before any signal
POLL_S = 0.25
ON_HANG = ("dump-and-kill", "dump-and-wait")
EXIT_HUNG = 124  # what `timeout` returns: used when a killed hung job still exited 0
BOOTSTRAP_DIR = Path(__file__).resolve().parent / "bootstrap"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``diagtrain run``."""
    p = subparsers.add_parser(
        "run",
        help="run any training command and collect steps, traces, logs and telemetry per rank",
        usage="diagtrain run [options] -- CMD ...",
        description="Run CMD (torchrun ..., diagtrain train ..., python script.py) unchanged and collect, "
        "for every rank: steps.jsonl, heartbeat, PyTorch Profiler traces of the asked steps, stdout and "
        "stderr, NCCL_DEBUG log, flight recorder dump; beside the job: telemetry (NVML, or psutil). "
        "Exit code: the command's (130 if interrupted).",
        epilog="example: diagtrain run --profile-steps 5-6 -- torchrun --nproc-per-node 4 train.py",
    )
    p.add_argument("--out", metavar="DIR", help="run directory (default runs/<UTC time>-<strategy or command>)")
    p.add_argument("--profile-steps", action="append", default=[], metavar="A-B",
                   help="profile steps A to B in every rank (repeatable; steps count from 1)")
    p.add_argument("--telemetry-interval", type=float, default=telemetry.DEFAULT_INTERVAL_S, metavar="SECONDS",
                   help=f"seconds between telemetry samples (default {telemetry.DEFAULT_INTERVAL_S})")
    p.add_argument("--hang-timeout", type=float, default=watchdog.DEFAULT_HANG_TIMEOUT_S, metavar="SECONDS",
                   help="a hang is no rank finishing a step for this long while all are alive "
                   f"(default {watchdog.DEFAULT_HANG_TIMEOUT_S:.0f})")
    p.add_argument("--on-hang", choices=ON_HANG, default="dump-and-kill",
                   help="on a hang: dump stacks and flight recorder, analyze, then stop the job (default) or leave it")
    p.add_argument("--no-analyze", action="store_true", help="do not analyze the run when it ends")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    p.set_defaults(handler=run_command)


def run_command(args: argparse.Namespace, argv: list[str]) -> int:
    """Validate, start the command, collect until it ends; return its exit code."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    if not command:
        return _usage(err, "no command given: diagtrain run [options] -- CMD ...")
    try:
        windows = parse_step_ranges(args.profile_steps)
    except ValueError as e:
        return _usage(err, f"--profile-steps {e}")
    if args.telemetry_interval <= 0:
        return _usage(err, "--telemetry-interval must be positive")
    if args.hang_timeout <= 0:
        return _usage(err, "--hang-timeout must be positive")
    out = Path(args.out or default_run_dir(_label(command))).resolve()
    try:
        check_writable(out)
    except OSError as e:
        return _usage(err, f"--out {out}: cannot write there ({e.strerror or e})")
    collection = Collection(out, command, argv, windows, args.telemetry_interval, err)
    collection.watchdog = watchdog.Watchdog(collection.ranks, collection.host_dir.name, args.hang_timeout)
    collection.kill_on_hang = args.on_hang == "dump-and-kill"
    code = collection.run()
    if not args.no_analyze:
        _analyze(out, err)
    return code


def _analyze(out: Path, err: Console) -> None:
    """Analyze what was collected; a failed analysis is reported and never changes the exit code."""
    from diagtrain.profiler.analyzer.command import analyze_and_print
    from diagtrain.profiler.analyzer import default_workers

    if not any(out.glob("ranks/*/rank.json")) and not any(out.glob("ranks/*/trace-*")):
        return  # no rank ever started: nothing to analyze
    try:
        analyze_and_print(out, out, ["md", "json", "html"], default_workers(), err)
    except Exception as e:  # noqa: BLE001 - the run's data is safe on disk; `diagtrain analyze` can retry
        err.print(f"diagtrain: analysis failed ({type(e).__name__}: {e}); run `diagtrain analyze {out}`", markup=False)


def _usage(err: Console, message: str) -> int:
    err.print(f"diagtrain run: error: {message}", markup=False)
    return EXIT_USAGE


def _label(command: list[str]) -> str:
    """The run directory's suffix: the reference trainer's strategy, else the program's name."""
    if "--strategy" in command[:-1]:
        return command[command.index("--strategy") + 1]
    for token in reversed(command):
        if token.endswith(".py"):
            return Path(token).stem
    return Path(command[0]).name


def _is_log_tee(proc, out: Path) -> bool:
    try:
        return proc.name() == "tee" and any(arg.startswith(str(out)) for arg in proc.cmdline())
    except Exception:  # noqa: BLE001 - the process is gone or unreadable: not one of ours
        return False


class Collection:
    """One wrapped run on this host."""

    def __init__(self, out: Path, command: list[str], argv: list[str], windows: list, interval: float,
                 err: Console) -> None:
        self.out, self.command, self.err = out, command, err
        self.say(f"run directory {out}")
        self.host_dir = manifest.claim_host_dir(out, socket.gethostname())
        self.started_at = time.time()
        self.record = manifest.host_record(self.host_dir, command, ["diagtrain", "run", *argv], self.started_at)
        self.env = self._child_env(windows)
        self.interrupted: int | None = None
        self.hung = False
        self.grace_s = SHUTDOWN_GRACE_S
        self.watchdog: watchdog.Watchdog | None = None
        self.kill_on_hang = True
        self.console_log = open(self.host_dir / "console.log", "ab")
        self.ranks = RankIndex(out)
        self.sampler = telemetry.TelemetrySampler(out, self.host_dir, self.host_dir.name, interval, self.say)
        self.record["telemetry_source"] = self.sampler.source
        self.record["driver"] = self.sampler.driver

    def say(self, message: str) -> None:
        self.err.print(f"diagtrain: {message}", markup=False)

    def _child_env(self, windows: list) -> dict[str, str]:
        env = dict(os.environ)
        env[RUN_DIR_ENV] = str(self.out)
        env[WRAPPER_PID_ENV] = str(os.getpid())
        env[HOST_ENV] = self.host_dir.name
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BOOTSTRAP_DIR), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"  # rank output reaches the logs as it happens
        if windows:
            env[PROFILE_STEPS_ENV] = format_step_ranges(windows)
        return env

    def run(self) -> int:
        manifest.write_host(self.host_dir, self.record)
        manifest.write(self.out)
        process_tree.become_subreaper()
        try:
            child = process_tree.start(self.command, self.env, subprocess.PIPE, subprocess.PIPE)
        except OSError as e:
            self.say(f"cannot start {self.command[0]!r}: {e.strerror or e}")
            return self._finish(EXIT_NOT_FOUND, "failed")
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        self.sampler.start()
        try:
            with Progress(self.ranks, Console(stderr=True, soft_wrap=True)) as progress:
                pumps = [self._pump(child.stdout, sys.stdout.buffer, progress),
                         self._pump(child.stderr, sys.stderr.buffer, progress)]
                code = self._wait(child, progress)
                leftovers = process_tree.stop_all(LEFTOVER_GRACE_S, keep=child.pid, settle_s=SETTLE_S)
                for pump in pumps:
                    pump.join(timeout=LEFTOVER_GRACE_S)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            self.sampler.stop()
        if leftovers:
            self.say(f"killed {len(leftovers)} process(es) the command left behind: {leftovers}")
        return self._finish(code, self._status(code))

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.interrupted is not None:  # a second Ctrl-C: stop waiting
            process_tree.send(process_tree.descendants(), signal.SIGKILL)
            return
        self.interrupted = signum
        self.say(f"{signal.Signals(signum).name}: stopping the job (again to kill it at once)")
        process_tree.send(self._job_processes(), signum)

    def _job_processes(self) -> list:
        """The command's processes, without the ranks' log tees: they must drain to the end."""
        return [p for p in process_tree.descendants() if not _is_log_tee(p, self.out)]

    def _wait(self, child: subprocess.Popen, progress: Progress) -> int:
        deadline = None
        while True:
            code = process_tree.wait_quietly(child, POLL_S)
            progress.update()
            if code is not None:
                return code
            if not self.hung and self.watchdog is not None:
                self._check_hang()
            if self.interrupted is not None:
                deadline = deadline or time.monotonic() + self.grace_s
                if time.monotonic() > deadline:
                    self.say(f"the job did not stop within {self.grace_s:.0f}s; killing it")
                    process_tree.stop_all(LEFTOVER_GRACE_S, keep=child.pid)

    def _check_hang(self) -> None:
        stall = self.watchdog.check()
        if stall is None:
            return
        self.hung = True
        steps = ", ".join(f"rank {r}: {s}" for r, s in sorted(stall.last_steps.items()))
        self.say(f"hang: no rank has finished a step for {stall.seconds:.0f}s (last steps {steps}); "
                 "dumping stacks and flight recorder")
        answered = self.watchdog.request_dumps()
        missing = sorted(set(stall.last_steps) - set(answered))
        if missing:
            self.say(f"no state dump from ranks {missing}")
        if self.kill_on_hang:
            self.say("stopping the hung job (--on-hang dump-and-wait leaves it running)")
            process_tree.send(self._job_processes(), signal.SIGTERM)
            self.interrupted = signal.SIGTERM  # from here on, shut down like after a SIGTERM
            self.grace_s = HUNG_GRACE_S

    def _pump(self, source: IO[bytes], sink: IO[bytes], progress: Progress) -> threading.Thread:
        """Copy the command's output to the terminal (above the progress table) and console.log."""
        def copy() -> None:
            for line in iter(source.readline, b""):
                self.console_log.write(line)
                if progress.live is not None:
                    progress.print(line.decode(errors="replace"))
                else:
                    sink.write(line)
                    sink.flush()
            source.close()

        thread = threading.Thread(target=copy, daemon=True)
        thread.start()
        return thread

    def _status(self, code: int) -> str:
        if self.hung:
            return "hung"
        if self.interrupted is not None:
            return "interrupted"
        return "ok" if code == 0 else "failed"

    def _finish(self, code: int, status: str) -> int:
        if code < 0:  # killed by a signal: report it the way shells do
            code = 128 - code
        if status == "interrupted" and code == 0:
            code = 128 + (self.interrupted or signal.SIGINT)
        if status == "hung" and code == 0:
            code = EXIT_HUNG
        self.console_log.close()
        telemetry.write_parquet(self.out)
        self.record.update(status=status, exit_code=code, ended_at=time.time())
        manifest.write_host(self.host_dir, self.record)
        result = manifest.write(self.out)
        self.say(f"{result['status']} (exit code {code}); run directory {self.out}")
        return code
