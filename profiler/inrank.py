"""What `diagtrain run` sets up inside each rank before user code runs.

Started from the bootstrap sitecustomize. A process is a rank when the launcher gave it ``RANK``
(torchrun and most launchers do), or, with no launcher, when it is the command `diagtrain run`
started itself. Launcher agents and helper processes of a rank (data-loader workers, compile
workers) are left alone.

Per rank it writes ``rank.json`` (who and where), tees stdout and stderr to files, points NCCL's
debug log and the flight recorder at the rank's folder, arms the optimizer-step hooks
(:mod:`diagtrain.profiler.torch_hooks`) and, at exit, writes ``exit.json`` and the flight
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

from diagtrain.profiler.run_dir import RUN_DIR_ENV, SCHEMA_VERSION, rank_dir, write_json_atomic

WRAPPER_PID_ENV = "DIAGTRAIN_WRAPPER_PID"
HOST_ENV = "DIAGTRAIN_HOST"  # the wrapper's host folder name; two agents on one machine differ
RANK_PID_ENV = "DIAGTRAIN_RANK_PID"  # set by a rank, so that its child processes know they are not ranks
# Programs that start ranks rather than being one (names of scripts, or modules after -m).
LAUNCHERS = {"torchrun", "torch.distributed.run", "torch.distributed.launch", "diagtrain", "diagtrain.profiler.cli"}
# Flight-recorder entries kept per process: several steps of a 3D run's collectives.
FR_BUFFER_ENTRIES = "20000"
SIGTERM_EXIT_CODE = 128 + signal.SIGTERM


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


def _is_launcher() -> bool:
    try:
        argv = Path("/proc/self/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        argv = [sys.executable, *sys.argv]
    # python [-u ...] -m MODULE | python SCRIPT | SCRIPT: the program is within the first tokens.
    return any(os.path.basename(token) in LAUNCHERS for token in argv[:4])


def start() -> None:
    """Instrument this process if it is a rank of a `diagtrain run` job."""
    run_dir = os.environ.get(RUN_DIR_ENV)
    rank = identify_rank() if run_dir else None
    if rank is None:
        return
    os.environ[RANK_PID_ENV] = str(os.getpid())
    folder = rank_dir(run_dir, rank)
    folder.mkdir(parents=True, exist_ok=True)
    _point_collective_logs(folder)
    _tee_output(folder)
    write_json_atomic(folder / "rank.json", describe_rank(rank))
    _ExitRecorder(folder).install()
    # A C++ abort (gloo's EnforceNotMet, a CUDA error) skips atexit; this at least puts the
    # Python stacks of every thread into stderr.log.
    faulthandler.enable(all_threads=True)
    from diagtrain.profiler import state_dump, torch_hooks

    state_dump.install(folder)
    torch_hooks.arm(Path(run_dir), rank)


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
    ours = [f for f in frames if not any(f.filename.startswith(lib) for lib in libraries)]
    frame = (ours or frames or [None])[-1]
    return None if frame is None else f"{frame.filename}:{frame.lineno} ({frame.name})"


class _ExitRecorder:
    """Writes ``exit.json`` (code and cause) and the flight recorder dump when the rank ends."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.record: dict[str, Any] = {"code": 0, "reason": "returned"}
        self.sigint_seen = False

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
        self.record = {"code": code if isinstance(code, int) else (0 if code is None else 1), "reason": "sys.exit"}
        self._sys_exit(code)

    def _on_exception(self, exc_type: type, exc: BaseException, tb: Any) -> None:
        interrupted = issubclass(exc_type, KeyboardInterrupt)
        # The cause first, in one assignment: launchers often send a second SIGINT, which can
        # interrupt this hook itself.
        self.record = {
            "code": 128 + signal.SIGINT if interrupted else 1,
            "reason": "interrupted" if interrupted else "exception",
            "exception": f"{exc_type.__name__}: {exc}"[:2000],
        }
        try:
            self.record["where"] = user_frame(traceback.extract_tb(tb))
        finally:
            self._excepthook(exc_type, exc, tb)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        # Remembered here because a launcher's second SIGINT can interrupt the excepthook
        # before it records the first one.
        self.sigint_seen = True
        signal.default_int_handler(signum, frame)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.record = {"code": SIGTERM_EXIT_CODE, "reason": "terminated"}
        raise SystemExit(SIGTERM_EXIT_CODE)

    def _at_exit(self) -> None:
        from diagtrain.profiler import flight_recorder, state_dump

        try:
            state_dump.write_process_groups(self.folder)
            flight_recorder.dump(self.folder / "flight_recorder.json")
        except Exception as e:  # noqa: BLE001 - a failed dump must not hide the exit record
            self.record["flight_recorder_error"] = f"{type(e).__name__}: {e}"
        if self.record["reason"] == "returned" and self.sigint_seen:
            self.record = {**self.record, "code": 128 + signal.SIGINT, "reason": "interrupted"}
        write_json_atomic(self.folder / "exit.json", {**self.record, "time": time.time()})
