"""The launcher: runs the training command unchanged and collects beside it until it ends.

It puts the in-rank bootstrap (a sitecustomize, see :mod:`diagtrain.profiler.rank`) on PYTHONPATH
so that each rank instruments itself, samples telemetry, shows progress, watches for hangs,
forwards Ctrl-C, SIGTERM and SIGHUP to the whole process tree, leaves no process behind (not
even when the wrapper itself is killed), keeps its host record and manifest.json up to date on
every way out, and returns the command's exit code. With several hosts in one run directory it
beats a heartbeat and measures its clock against the others (:mod:`.host_link`).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Callable

from rich.console import Console

from diagtrain.profiler.collect import manifest, process_tree, telemetry, watchdog
from diagtrain.profiler.collect.auto_profile import AutoProfiler
from diagtrain.profiler.collect.host_link import HostLink
from diagtrain.profiler.collect.live import LiveDiagnosis
from diagtrain.profiler.collect.profiler_noise import NoiseFilter
from diagtrain.profiler.collect.progress import Progress
from diagtrain.profiler.collect.reaper import Reaper
from diagtrain.profiler.run_dir import (
    HOST_ENV,
    PROFILE_AUTO,
    PROFILE_STEPS_ENV,
    RANK_WARNING,
    RUN_DIR_ENV,
    STEPS_FILE,
    WRAPPER_PID_ENV,
    RankIndex,
    compress_segments,
    device_env,
    rank_dir,
    remove_quietly,
)
from diagtrain.profiler.util.exit_codes import EXIT_FAILED, EXIT_HUNG, EXIT_NOT_FOUND
from diagtrain.profiler.util.launchers import rank_variable_names
from diagtrain.profiler.util.step_ranges import StepRange, format_step_ranges

SHUTDOWN_GRACE_S = 10.0  # after Ctrl-C: time for ranks to write their exit records and dumps
HUNG_GRACE_S = 3.0  # a hung rank blocked in C++ cannot run its SIGTERM handler: do not wait long
LEFTOVER_GRACE_S = 3.0  # after the command ends: time for stray processes to exit on SIGTERM
SETTLE_S = 1.0  # after the command ends: time for the ranks' log tees to drain before any signal
POLL_S = 0.25
# Stopping signals: forwarded to the job. SIGHUP is a closed terminal or ssh session.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _is_log_tee(proc, out: Path) -> bool:
    try:
        return proc.name() == "tee" and any(arg.startswith(str(out)) for arg in proc.cmdline())
    except Exception:  # noqa: BLE001 - the process is gone or unreadable: not one of ours
        return False


def no_rank_message() -> str:
    """What the run says when no process of the command became a rank, naming what was looked for."""
    return (f"no process of the command became a rank, so only host telemetry and console.log were collected: "
            f"diagtrain instruments Python processes that a launcher gave a rank ({rank_variable_names()}), "
            "that call torch.distributed.init_process_group, or that are the command itself (python train.py)")


class Collection:
    """One wrapped run on this host."""

    def __init__(self, out: Path, command: list[str], argv: list[str], windows: list[StepRange] | str,
                 interval: float, err: Console, bootstrap_dir: Path) -> None:
        """``windows``: the step ranges every rank profiles, PROFILE_AUTO, or PROFILE_NONE."""
        self.out, self.command, self.err, self.bootstrap_dir = out, command, err, bootstrap_dir
        self.say(f"run directory {out}")
        self.host_dir, joined = manifest.join(out, socket.gethostname())
        if joined:
            self.say(f"joining the run of {', '.join(joined)} as host {self.host_dir.name}")
        self.started_at = time.time()
        self.env, added = self._child_env(windows)
        self.record = manifest.host_record(self.host_dir, command, ["diagtrain", "run", *argv], self.started_at,
                                           self.env)
        self.record["env_added"] = added
        self.record["profile_steps"] = windows if isinstance(windows, str) else format_step_ranges(windows)
        self.interrupted: int | None = None
        self.ended = False  # the command has exited
        self.interrupted_after: int | None = None  # a signal that came after that: the caller stops too
        self.hung = False
        self.grace_s = SHUTDOWN_GRACE_S
        self.watchdog: watchdog.Watchdog | None = None
        self.kill_on_hang = True
        self.live: LiveDiagnosis | None = None  # live judgement beside the job, when the caller gives one
        self.analysis_follows = False  # the caller analyzes the run after it: its report names the run directory
        self.console_log = open(self.host_dir / "console.log", "ab")
        self.link = HostLink(out, self.host_dir)
        self.others_running: list[str] = []  # hosts still running when this one finished
        self.gone: list[str] = []  # hosts whose wrappers vanished without ending their records
        self.rank_warnings: dict[int, list[dict]] = {}  # rank -> warnings it printed (see rank/trouble.py)
        self.reserve = manifest.reserve_space(self.host_dir)
        self.ranks = RankIndex(out)
        self.auto_profile = AutoProfiler(out, self.ranks, self.host_dir.name, self.say) if windows == PROFILE_AUTO else None
        self.sampler = telemetry.TelemetrySampler(out, self.host_dir, self.host_dir.name, interval, self.say)
        self.record["telemetry_source"] = self.sampler.source
        self.record["driver"] = self.sampler.driver

    def say(self, message: str) -> None:
        self.err.print(f"diagtrain: {message}", markup=False)

    def warn(self, message: str) -> None:
        """Say what went wrong on diagtrain's side, once, and keep it for the manifest."""
        warnings = self.record.setdefault("warnings", [])
        if message not in [w["message"] for w in warnings]:
            warnings.append({"time": round(time.time(), 3), "message": message})
            self.say(f"warning: {message}")

    def _child_env(self, windows: list[StepRange] | str) -> tuple[dict[str, str], dict[str, str]]:
        """The command's environment, and what of PyTorch's it holds because diagtrain added it: in place before
        any process of the job starts, whatever the launch path (mp.spawn's children inherit it too)."""
        env = dict(os.environ)
        added = device_env(env)
        env.update(added)
        env[RUN_DIR_ENV] = str(self.out)
        env[WRAPPER_PID_ENV] = str(os.getpid())
        env[HOST_ENV] = self.host_dir.name
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.bootstrap_dir), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"  # rank output reaches the logs as it happens
        env[PROFILE_STEPS_ENV] = windows if isinstance(windows, str) else format_step_ranges(windows)
        return env, added

    def run(self) -> int:
        """Run the command to its end and collect; the host record is finalized however this ends."""
        # Installed from the start until the record is final: a signal that comes while the job starts
        # stops it, and none can cut the wrapper short before its records are written; a signal
        # already ignored stays so (`nohup diagtrain run ...` survives its terminal).
        previous = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS if signal.getsignal(s) != signal.SIG_IGN}
        code, status = EXIT_FAILED, "failed"  # the wrapper itself failed before the command ended
        try:
            manifest.write_host(self.host_dir, self.record)
            manifest.write(self.out)
            self.link.start()
            code, status = self._run()
        except BaseException as e:  # noqa: BLE001 - the wrapper's own failure: stop the job, keep the records
            self.record["wrapper_error"] = f"{type(e).__name__}: {e}"[:2000]
            self.say(f"internal error: {type(e).__name__}: {e}; stopping the job")
            process_tree.stop_all(LEFTOVER_GRACE_S, keep=-1)
        finally:
            code = self._finish(code, status)  # still under our handlers: a Ctrl-C waits for it
            for s, handler in previous.items():
                signal.signal(s, handler)
        return code

    def _run(self) -> tuple[int, str]:
        process_tree.become_subreaper()
        if self.interrupted is not None:
            return 0, "interrupted"  # before the command started: nothing to stop
        reaper = Reaper(self.out, os.getpid())
        process_tree.exempt(reaper.pid)
        try:
            child = process_tree.start(self.command, self.env, subprocess.PIPE, subprocess.PIPE)
        except OSError as e:
            reaper.release()
            self.say(f"cannot start {self.command[0]!r}: {e.strerror or e}")
            return EXIT_NOT_FOUND, "failed"
        if self.interrupted is not None:  # it came while the command started
            process_tree.send(self._job_processes(), self.interrupted)
        self.sampler.start()
        leftovers = []
        try:
            standing = self.live.standing if self.live is not None else list
            with Progress(self.ranks, Console(stderr=True, soft_wrap=True), standing) as progress:
                pumps = [self._pump(child.stdout, sys.stdout.buffer, progress),
                         self._pump(child.stderr, sys.stderr.buffer, progress)]
                if self.live is not None:  # its lines above the live table on a terminal, plain lines in a log
                    self.live.start(lambda line: progress.print(f"diagtrain: {line}") if progress.live is not None
                                    else self.say(line))
                code = self._wait(child, progress)
                self.ended = True
                leftovers = process_tree.stop_all(LEFTOVER_GRACE_S, keep=child.pid, settle_s=SETTLE_S)
                for pump in pumps:
                    pump.join(timeout=LEFTOVER_GRACE_S)
        finally:
            if self.live is not None:
                self.live.stop()
                self.record["live"] = self.live.summary()
            self.sampler.stop()
            reaper.release()
        if self.sampler.error:
            self.warn(self.sampler.error)
        if leftovers:
            self.say(f"killed {len(leftovers)} process(es) the command left behind: {leftovers}")
        if not self.ranks.on_host(self.host_dir.name):
            self.warn(no_rank_message())
        return code, self._status(code)

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.ended:  # the job is over and its records are being written: stop after them
            self.interrupted_after = signum
            return
        if self.interrupted is not None:  # a second Ctrl-C: stop waiting
            process_tree.send(process_tree.descendants(), signal.SIGKILL)
            return
        self.interrupted = signum
        self.record["interrupted"] = {"signal": signal.Signals(signum).name, "time": time.time()}
        self.say(f"{signal.Signals(signum).name}: stopping the job (again to kill it at once)")
        # SIGHUP (the terminal went away) would kill ranks without a word: they get SIGTERM instead.
        process_tree.send(self._job_processes(), signal.SIGTERM if signum == signal.SIGHUP else signum)

    def _job_processes(self) -> list:
        """The command's processes, without the ranks' log tees: they must drain to the end."""
        return [p for p in process_tree.descendants() if not _is_log_tee(p, self.out)]

    def _wait(self, child: subprocess.Popen, progress: Progress) -> int:
        deadline = None
        while True:
            code = process_tree.wait_quietly(child, POLL_S)
            progress.update()
            if self.auto_profile is not None:
                self.auto_profile.update()
            if code is not None:
                return code
            if not self.hung and self.watchdog is not None:
                self._check_hang()
            if self.interrupted is not None:
                deadline = deadline or time.monotonic() + self.grace_s
                if time.monotonic() > deadline:
                    self.say(f"the job did not stop within {self.grace_s:.0f}s; killing it")
                    # Its SIGTERM came a grace ago: a rank blocked in C++ never runs the handler, and
                    # another SIGTERM and grace would only keep the user waiting. The launcher (the
                    # command itself) is left to see its ranks die and exit as it does; the logs' tees drain.
                    process_tree.send([p for p in self._job_processes() if p.pid != child.pid], signal.SIGKILL)
                    deadline = time.monotonic() + LEFTOVER_GRACE_S  # again only if something outlived that

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
        """Copy the command's output to console.log and, without the profiler's own messages
        (:mod:`.profiler_noise`), to the terminal (above the progress table).

        It must drain the pipe to the end whatever happens to console.log (a full disk): a pipe
        left full would stop the job.
        """
        shown = NoiseFilter()

        def copy() -> None:
            for whole in iter(source.readline, b""):
                self._log_line(whole)
                line = shown(whole)
                if line is None:
                    continue
                if progress.live is not None:
                    progress.print(line.decode(errors="replace"))
                else:
                    sink.write(line)
                    sink.flush()
            source.close()

        thread = threading.Thread(target=copy, daemon=True)
        thread.start()
        return thread

    def _log_line(self, line: bytes) -> None:
        if b"diagtrain: warning: rank " in line:  # a rank's own trouble, kept even if its files were not
            m = RANK_WARNING.search(line.decode(errors="replace").rstrip())
            if m:
                self.rank_warnings.setdefault(int(m.group(1)), []).append({"message": m.group(2)})
        if self.console_log is None:
            return
        try:
            self.console_log.write(line)
        except (OSError, ValueError) as e:
            self.console_log = None
            self.warn(f"console.log is incomplete: cannot write it ({getattr(e, 'strerror', None) or e})")

    def _status(self, code: int) -> str:
        if self.hung:
            return "hung"
        if self.interrupted is not None:
            return "interrupted"
        return "ok" if code == 0 else "failed"

    def _finish(self, code: int, status: str) -> int:
        """End this host's record, rebuild the manifest, and say how this host (and the run) ended."""
        if code < 0:  # killed by a signal: report it the way shells do
            code = 128 - code
        if status == "interrupted":  # what shells and `run --help` say: 128 + the signal (130 after Ctrl-C)
            code = 128 + (self.interrupted or signal.SIGINT)
        if status == "hung" and (code == 0 or self.kill_on_hang):  # stopped by us: its own code says nothing
            code = EXIT_HUNG
        # Each record on its own: one that cannot be written (a full disk) must not stop the others.
        self._best_effort("console.log", self._close_console_log)
        if self.reserve is not None:
            remove_quietly(self.reserve)  # the room kept since the start: the records below fit in it
        if self.rank_warnings:
            self.record["rank_warnings"] = {str(r): w for r, w in sorted(self.rank_warnings.items())}
        self._best_effort("compressed step records", self._compress_segments)  # before the host reads as ended
        if self.auto_profile is not None:  # the traces of a window that ended with the job replace the ones it was for
            self._best_effort("replaced traces", self.auto_profile.remove_replaced)
        self.record.update(status=status, exit_code=code, ended_at=time.time())
        self._best_effort("host.json", lambda: manifest.write_host(self.host_dir, self.record))
        self.others_running, self.gone = self.link.still_running()
        result = self._best_effort("manifest.json", lambda: manifest.write(self.out, self.gone)) or {"status": status}
        self._best_effort("telemetry.parquet", lambda: telemetry.write_parquet(self.out))  # after: it may be large
        self.link.stop()
        if self.others_running:
            self.say(f"this host ({self.host_dir.name}) is done: {status} (exit code {code}); waiting for "
                     f"{', '.join(self.others_running)}: the last host to finish analyzes the run; "
                     f"run directory {self.out}")
        else:
            hosts = result.get("hosts") or []
            each = " (" + ", ".join(f"{h['name']}: {h['status']}" for h in hosts) + ")" if len(hosts) > 1 else ""
            where = "" if self.analysis_follows else f"; run directory {self.out}"  # the report's paths name it
            self.say(f"{result['status']}{each} (exit code {code}){where}")
        return code

    def finish_run(self) -> None:
        """As the host that analyzes: merge every host's telemetry and records again (all have ended since)."""
        telemetry.write_parquet(self.out)
        manifest.write(self.out, self.gone)

    def _compress_segments(self) -> None:
        """Compress every segment this host's ranks closed that live reading left plain (all of them with --no-live)."""
        for rank in self.ranks.on_host(self.host_dir.name):
            compress_segments(rank_dir(self.out, rank) / STEPS_FILE)

    def _close_console_log(self) -> None:
        log, self.console_log = self.console_log, None
        if log is not None:
            log.close()

    def _best_effort(self, what: str, write: Callable[[], Any]) -> Any:
        try:
            return write()
        except Exception as e:  # noqa: BLE001 - the job's result is known: say what is missing and go on
            self.warn(f"{what} not written: {getattr(e, 'strerror', None) or e}")
            return None
