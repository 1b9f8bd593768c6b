"""What `diagtrain run` sets up inside each rank before user code runs.

Started from the bootstrap sitecustomize. A process is a rank when the launcher gave it ``RANK``
(torchrun and most launchers do), or, with no launcher, when it is the command `diagtrain run`
started itself. Launcher agents and helper processes of a rank (data-loader workers, compile
workers) are left alone.

Per rank it writes ``rank.json`` (who and where), tees stdout and stderr to files, points NCCL's
debug log and the flight recorder at the rank's folder, arms the optimizer-step hooks
(:mod:`diagtrain.profiler.rank.step_hooks`) and, at exit, writes ``exit.json`` and the flight
recorder dump.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import traceback
from pathlib import Path
from typing import Any

from diagtrain.profiler.rank import OWN_CODE
from diagtrain.profiler.run_dir import (
    HOST_ENV,
    RUN_DIR_ENV,
    SCHEMA_VERSION,
    WRAPPER_PID_ENV,
    rank_dir,
    write_json_atomic,
)

RANK_PID_ENV = "DIAGTRAIN_RANK_PID"  # set by a rank, so that its child processes know they are not ranks
# Programs that start ranks rather than being one (names of scripts, or modules after -m).
LAUNCHERS = {"torchrun", "torch.distributed.run", "torch.distributed.launch", "diagtrain", "diagtrain.profiler.cli"}
# Flight-recorder entries kept per process: several steps of a 3D run's collectives.
FR_BUFFER_ENTRIES = "20000"
SIGTERM_EXIT_CODE = 128 + signal.SIGTERM
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def identify_rank(env: os._Environ | dict = os.environ) -> int | None:
    """This process's global rank if it is a rank, else None (agents, helpers, other tools)."""
    owner = env.get(RANK_PID_ENV)
    if owner and owner != str(os.getpid()):
        return None
    if "RANK" in env:
        return int(env["RANK"])
    if env.get(WRAPPER_PID_ENV) == str(os.getppid()) and not _is_launcher():
        return 0
    return None


def _is_launcher(pid: int | str = "self") -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        if pid != "self":
            return False
        argv = [sys.executable, *sys.argv]
    # python [-u ...] -m MODULE | python SCRIPT | SCRIPT: the program is within the first tokens.
    return any(os.path.basename(token) in LAUNCHERS for token in argv[:4])


def start() -> None:
    """Instrument this process if it is a rank of a `diagtrain run` job."""
    run_dir = os.environ.get(RUN_DIR_ENV)
    if run_dir and os.environ.get(WRAPPER_PID_ENV):
        die_with_parent()
    rank = identify_rank() if run_dir else None
    if rank is None:
        return
    os.environ[RANK_PID_ENV] = str(os.getpid())
    folder = rank_dir(run_dir, rank)
    folder.mkdir(parents=True, exist_ok=True)
    _point_collective_logs(folder)
    _tee_output(folder)
    write_json_atomic(folder / "rank.json", describe_rank(rank))
    recorder = _ExitRecorder(folder)
    recorder.install()
    # A C++ abort (gloo's EnforceNotMet, a CUDA error) skips atexit; this at least puts the
    # Python stacks of every thread into stderr.log.
    recorder.user_faulthandler = faulthandler.is_enabled()
    faulthandler.enable(all_threads=True)
    from diagtrain.profiler.rank import state_dump, step_hooks

    state_dump.install(folder)
    step_hooks.arm(Path(run_dir), rank)


def die_with_parent() -> bool:
    """Be killed with the process that started this one, when that is safe to ask; True if asked.

    The job must not outlive the wrapper, and a launcher killed outright cannot stop its workers.
    Linux sends the parent-death signal when the parent *thread* ends, so it is asked only when
    the parent starts processes from its main thread: a launcher we know (torchrun, diagtrain),
    or a parent with a single thread. Anything else is left to the wrapper's reaper.
    """
    parent = os.getppid()
    if not (_is_launcher(parent) or _threads(parent) == 1):
        return False
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:  # the parent died before the request: nobody would send it
        os.kill(os.getpid(), signal.SIGKILL)
    return True


def _threads(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("Threads:")), None)
    except (OSError, ValueError):
        return None


def describe_rank(rank: int) -> dict[str, Any]:
    """Who this rank is and where it runs; torch facts are added once torch is imported."""
    env = os.environ
    return {
        "schema_version": SCHEMA_VERSION,
        "rank": rank,
        "local_rank": int(env.get("LOCAL_RANK", rank if "RANK" not in env else 0)),
        "node_rank": int(env.get("GROUP_RANK", 0)),
        "world_size": int(env.get("WORLD_SIZE", 1)),
        "hostname": socket.gethostname(),
        "host": env.get(HOST_ENV) or socket.gethostname(),
        "pid": os.getpid(),
        "argv": sys.argv,
        "started_at": time.time(),
        "utc_offset_s": time.localtime().tm_gmtoff,  # turns the local times in log lines into Unix times
        "python": sys.version.split()[0],
    }


def _point_collective_logs(folder: Path) -> None:
    """NCCL's debug log and the flight recorder, set before any process group starts."""
    os.environ.setdefault("NCCL_DEBUG", "INFO")
    os.environ["NCCL_DEBUG_FILE"] = str(folder / "nccl.log")
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", FR_BUFFER_ENTRIES)


def _tee_output(folder: Path) -> None:
    """Copy fd 1 and 2 to stdout.log and stderr.log through `tee` processes.

    A separate process, not a thread: it drains the pipe to the end even when the rank dies
    abruptly, which is when the last lines matter most. ``tee -i`` ignores SIGINT so that the
    rank's final words after a Ctrl-C still arrive.
    """
    tee = shutil.which("tee")
    if tee is None:
        print("diagtrain: no `tee` on this machine; rank output is not saved to files", file=sys.stderr)
        return
    for fd, name, stream in ((1, "stdout.log", sys.stdout), (2, "stderr.log", sys.stderr)):
        if stream is not None:
            stream.flush()
        original = os.dup(fd)
        proc = subprocess.Popen([tee, "-i", "-a", str(folder / name)], stdin=subprocess.PIPE,
                                stdout=original, close_fds=True)
        os.close(original)
        os.dup2(proc.stdin.fileno(), fd)
        proc.stdin.close()


def user_frame(frames: traceback.StackSummary) -> str | None:
    """``file:line (function)`` of the innermost frame in the user's code, not in libraries."""
    libraries = {sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")}
    libraries.add(OWN_CODE)  # diagtrain's own frames (a signal handler, a step hook)
    ours = [f for f in frames if not any(f.filename.startswith(lib) for lib in libraries)]
    frame = (ours or frames or [None])[-1]
    return None if frame is None else f"{frame.filename}:{frame.lineno} ({frame.name})"


def _without_own_frames(tb: Any) -> Any:
    """``tb`` without its innermost entries in diagtrain's code (the signal handler that raised, a step hook)."""
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    keep = len(entries)
    while keep > 1 and entries[keep - 1].tb_frame.f_code.co_filename.startswith(OWN_CODE):
        keep -= 1
    if entries and keep < len(entries):
        entries[keep - 1].tb_next = None
    return entries[0] if entries else None


class _ExitRecorder:
    """Writes ``exit.json`` (code and cause) and the flight recorder dump when the rank ends."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.record: dict[str, Any] = {"code": 0, "reason": "returned"}
        self.sigint_at: float | None = None  # when the first SIGINT came
        # A SIGINT or SIGTERM has been acted on: later ones are not. A launcher forwards the wrapper's
        # signal again (torchrun answers a SIGINT with a SIGTERM to every worker), and a second stop
        # must not cut the exit record, the dumps or a window's trace export short.
        self.stopping = False
        self.exiting = False  # the exit record and dumps are being written
        self.user_faulthandler = False  # the job turned faulthandler on itself: leave it on at exit

    def install(self) -> None:
        self._sys_exit = sys.exit
        sys.exit = self._exit
        self._excepthook = sys.excepthook
        sys.excepthook = self._on_exception
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, self._on_sigterm)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self._on_sigint)
        atexit.register(self._at_exit)

    def _exit(self, code: Any = None) -> None:
        self.record = {"code": code if isinstance(code, int) else (0 if code is None else 1), "reason": "sys.exit",
                       "time": time.time()}
        self._sys_exit(code)

    def _on_exception(self, exc_type: type, exc: BaseException, tb: Any) -> None:
        interrupted = issubclass(exc_type, KeyboardInterrupt)
        # The cause first, in one assignment: launchers often send a second SIGINT, which can
        # interrupt this hook itself.
        self.record = {
            "code": 128 + signal.SIGINT if interrupted else 1,
            "reason": "interrupted" if interrupted else "exception",
            "exception": f"{exc_type.__name__}: {exc}"[:2000],
            "time": (interrupted and self.sigint_at) or time.time(),  # when it happened: the dumps at exit take a while
        }
        try:
            tb = _without_own_frames(tb)  # a Ctrl-C is raised in our SIGINT handler: show the user's line last
            self.record["where"] = user_frame(traceback.extract_tb(tb))
        finally:
            self._excepthook(exc_type, exc, tb)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        # Remembered here because a launcher's second SIGINT can interrupt the excepthook
        # before it records the first one.
        if self.stopping or self.exiting:
            return  # already on its way out: let the last records (a profiled window) be written
        self.sigint_at = self.sigint_at or time.time()
        self.stopping = True
        signal.default_int_handler(signum, frame)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self.stopping or self.exiting:
            return
        self.stopping = True
        self.record = {"code": SIGTERM_EXIT_CODE, "reason": "terminated", "time": time.time()}
        raise SystemExit(SIGTERM_EXIT_CODE)

    def _at_exit(self) -> None:
        from diagtrain.profiler.rank import flight_recorder, state_dump

        self.exiting = True
        try:
            state_dump.write_process_groups(self.folder)
            flight_recorder.dump(self.folder / "flight_recorder.json")
        except Exception as e:  # noqa: BLE001 - a failed dump must not hide the exit record
            self.record["flight_recorder_error"] = f"{type(e).__name__}: {e}"
        from diagtrain.profiler.rank import trouble

        if self.record["reason"] == "returned" and self.sigint_at:
            self.record = {**self.record, "code": 128 + signal.SIGINT, "reason": "interrupted", "time": self.sigint_at}
        warnings = trouble.recorded()
        try:
            write_json_atomic(self.folder / "exit.json", {"time": time.time(), **self.record,
                                                          **({"warnings": warnings} if warnings else {})})
        except OSError as e:
            trouble.warn(self.folder, "exit.json", f"exit.json not written ({trouble.reason(e)})")
        # What runs after this is the interpreter's teardown, where a Python stack says nothing, and
        # faulthandler's all-threads dump of a C++ abort there crashes itself: SIGABRT became SIGSEGV.
        if not self.user_faulthandler:
            faulthandler.disable()
