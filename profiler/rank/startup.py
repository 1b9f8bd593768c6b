"""What `diagtrain run` sets up inside each rank before user code runs.

Started from the bootstrap sitecustomize. A process is a rank when a launcher named it in its
environment (torchrun's ``RANK``, SLURM's or MPI's variables: :mod:`diagtrain.profiler.util.launchers`),
or when it calls ``init_process_group`` with a rank (``torch.multiprocessing.spawn``,
``multiprocessing.Process``: :mod:`.late_ranks`). The command's own Python process
(`diagtrain run -- python train.py`) is rank 0 of a job without a launcher, unless it turns out to
start the ranks itself. Launchers and helper processes of a rank (data-loader workers, compile
workers) are left alone.

Per rank it writes ``rank.json`` (who and where), tees stdout and stderr to files, points NCCL's
debug log at the rank's folder, arms the optimizer-step hooks
(:mod:`diagtrain.profiler.rank.step_hooks`) and, at exit, writes ``exit.json`` and the flight
recorder dump.
"""

from __future__ import annotations

import faulthandler
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from diagtrain.profiler.rank import OWN_CODE
from diagtrain.profiler.rank.process_end import at_process_end
from diagtrain.profiler.run_dir import (
    HOST_ENV,
    RUN_DIR_ENV,
    SCHEMA_VERSION,
    WRAPPER_PID_ENV,
    RankIndex,
    device_env,
    rank_dir,
    write_json_atomic,
)
from diagtrain.profiler.util.launchers import LAUNCHER_PROGRAMS, LaunchedRank, rank_from_env

RANK_PID_ENV = "DIAGTRAIN_RANK_PID"  # set by a rank, so that its child processes know they are not ranks
# Where a process's output goes while its rank is not known: no rank's name, so readers of ranks/ skip it.
PENDING_FOLDER = ".pending-{pid}"
SIGTERM_EXIT_CODE = 128 + signal.SIGTERM
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


@dataclass(frozen=True)
class Role:
    """What a process is to `diagtrain run`, as far as its start tells."""

    launched: LaunchedRank | None = None  # a rank now: a launcher named it
    command_rank: int | None = None  # the command's own process: this rank, if it turns out to be one
    may_join: bool = False  # becomes a rank if it calls init_process_group


HELPER = Role()  # a launcher, or a child of a rank: never instrumented


def identify(env: os._Environ | dict = os.environ) -> Role:
    """This process's role: a rank its launcher named, the command's own process, a process that may
    still join a process group, or a helper (a launcher, a rank's data-loader or compile worker)."""
    owner = env.get(RANK_PID_ENV)
    if (owner and owner != str(os.getpid())) or _is_launcher():
        return HELPER
    launched = rank_from_env(env)
    # Variables `diagtrain run` was itself started with name the command as a whole (srun diagtrain
    # run ...), or nothing at all (a salloc shell's SLURM_PROCID=0): not every process below it.
    if launched is not None and launched != _launched_above_wrapper(env):
        return Role(launched=launched)
    if env.get(WRAPPER_PID_ENV) == str(os.getppid()):
        return Role(command_rank=launched.rank if launched else 0, may_join=True)
    return Role(may_join=True)


def _launched_above_wrapper(env: os._Environ | dict) -> LaunchedRank | None:
    """The rank in the environment the wrapper was started with (on this machine), if any."""
    pid = env.get(WRAPPER_PID_ENV, "")
    if not pid.isdigit() or not _is_launcher(pid):
        return None
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return None
    return rank_from_env(dict(item.split("=", 1) for item in raw.split("\0") if "=" in item))


def _is_launcher(pid: int | str = "self") -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        if pid != "self":
            return False
        argv = [sys.executable, *sys.argv]
    # python [-u ...] -m MODULE | python SCRIPT | SCRIPT: the program is within the first tokens.
    return any(os.path.basename(token) in LAUNCHER_PROGRAMS for token in argv[:4])


def start() -> None:
    """Instrument this process if it is a rank of a `diagtrain run` job, or get ready for it to become one."""
    run_dir = os.environ.get(RUN_DIR_ENV)
    if run_dir and os.environ.get(WRAPPER_PID_ENV):
        die_with_parent()
    role = identify() if run_dir else HELPER
    if role.launched is not None:
        launched = role.launched
        _open(Path(run_dir), rank_dir(run_dir, launched.rank)).bind(
            launched.rank, launched.variables.rank, launched.world_size, launched.local_rank or 0, launched.node_rank)
    elif role.command_rank is not None:
        _open(Path(run_dir), Path(run_dir) / "ranks" / PENDING_FOLDER.format(pid=os.getpid()), role.command_rank)
    if role.may_join or role.launched is not None:
        from diagtrain.profiler.rank import late_ranks

        late_ranks.follow_init_process_group(join=role.may_join)


def join(rank: int, world_size: int | None) -> None:
    """Become rank ``rank`` now (from init_process_group), unless this process is a rank or a helper of one."""
    run_dir = os.environ.get(RUN_DIR_ENV)
    if not run_dir or os.environ.get(RANK_PID_ENV):
        return
    folder = rank_dir(run_dir, rank)
    if _session is None:
        session = _open(Path(run_dir), folder)
    else:
        session = _session
        if session.pid != os.getpid():
            session.adopt(folder)  # a forked child of the command's process: its own files from now on
    local = os.environ.get("LOCAL_RANK", "")
    session.bind(rank, "init_process_group", world_size, int(local) if local.isdigit() else rank, None)


def note_process_group(began: float, ready: float) -> None:
    """Record when this rank's process group began and was ready (rank.json), for the start-up's split."""
    if _session is not None:
        _session.note({"process_group_began_at": began, "process_group_ready_at": ready})


_session: "_Session | None" = None  # this process's instrumentation (a forked child inherits its parent's)


def _open(run_dir: Path, folder: Path, command_rank: int | None = None) -> "_Session":
    global _session
    _session = _Session(run_dir, folder, command_rank)
    return _session


class _Session:
    """diagtrain's instrumentation of one process, installed before its rank may be known.

    Output is teed, the exit recorder and the state-dump thread run, and the step hooks wait for
    torch from the start; the rank's folder, rank.json and step records follow once the rank is known
    (:meth:`bind`). The command's own process writes to a folder of its own until then, moved into
    the rank's folder when it turns out to be a rank (at its first optimizer step, its own
    init_process_group, or its exit with no other rank on the host), removed when its children were
    the ranks: its output is in the host's console.log as well.
    """

    def __init__(self, run_dir: Path, folder: Path, command_rank: int | None = None) -> None:
        from diagtrain.profiler.rank import state_dump, step_hooks

        self.run_dir, self.folder, self.command_rank = run_dir, folder, command_rank
        self.pending = folder if command_rank is not None else None  # the folder of a rank not known yet
        self.pid = os.getpid()
        self.rank: int | None = None
        self.noted: dict[str, float] = {"process_started_at": process_start_time()}  # rank.json's start-up times
        # The wrapper put these in the job's environment already; here for a process whose environment was
        # made anew on the way (a launcher that passes its own), before any process group of its starts.
        os.environ.update(device_env(os.environ))
        folder.mkdir(parents=True, exist_ok=True)
        _tee_output(folder)
        self.exit = _ExitRecorder(self.folder_at_exit)
        self.exit.install()
        # A C++ abort (gloo's EnforceNotMet, a CUDA error) skips atexit; this at least puts the
        # Python stacks of every thread into stderr.log.
        self.exit.user_faulthandler = faulthandler.is_enabled()
        faulthandler.enable(all_threads=True)
        state_dump.install(self.rank_folder)
        self.steps = step_hooks.arm(run_dir, self.claim)

    def rank_folder(self) -> Path | None:
        """The rank's folder, once the rank is known."""
        return self.folder if self.rank is not None else None

    def bind(self, rank: int, rank_from: str, world_size: int | None, local_rank: int, node_rank: int | None) -> None:
        """This process is rank ``rank`` (``rank_from`` says how that is known): its files go to the rank's folder."""
        os.environ[RANK_PID_ENV] = str(os.getpid())
        folder = rank_dir(self.run_dir, rank)
        if self.pending is not None:
            _move_into(self.pending, folder)
            self.pending = None
        self.folder = folder
        _point_nccl_log(folder)
        write_json_atomic(folder / "rank.json",
                          {**describe_rank(rank, rank_from, world_size, local_rank, node_rank), **self.noted})
        self.rank = rank
        self.steps.bind(rank)

    def note(self, times: dict[str, float]) -> None:
        """Start-up times for rank.json: written now where the rank is known, else when it is."""
        self.noted.update(times)
        if self.rank is not None and os.getpid() == self.pid:
            path = self.folder / "rank.json"
            write_json_atomic(path, {**json.loads(path.read_text()), **times})

    def adopt(self, folder: Path) -> None:
        """In a forked child that becomes a rank: its own output, exit record and dump thread."""
        from diagtrain.profiler.rank import state_dump

        self.pid, self.folder, self.command_rank, self.pending = os.getpid(), folder, None, None
        self.noted = {"process_started_at": process_start_time()}
        folder.mkdir(parents=True, exist_ok=True)
        _tee_output(folder)
        self.exit.restart()
        state_dump.install(self.rank_folder)  # the parent's dump thread did not come along

    def claim(self) -> int | None:
        """The command's own process becomes its rank (at its first optimizer step, or at exit), unless
        ranks of this host came first: then it started them. None where it is no rank."""
        if self.rank is None and self.command_rank is not None and os.getpid() == self.pid:
            if RankIndex(self.run_dir).on_host(os.environ.get(HOST_ENV, "")):
                self.command_rank = None  # a launcher of ranks (mp.spawn's parent): for good
            else:
                self.bind(self.command_rank, "the command", None, self.command_rank, None)
        return self.rank

    def folder_at_exit(self) -> Path | None:
        """Where the exit records go: the rank's folder, or None where this process was no rank."""
        if os.getpid() != self.pid:
            return None  # a forked child that never became a rank: its parent writes the records
        if self.claim() is None and self.pending is not None:
            shutil.rmtree(self.pending, ignore_errors=True)
        return self.rank_folder()


def _move_into(source: Path, target: Path) -> None:
    """Move what was written before the rank was known into its folder (open files move along)."""
    target.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        for entry in source.iterdir():
            os.replace(entry, target / entry.name)
        source.rmdir()


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


def describe_rank(rank: int, rank_from: str, world_size: int | None = None, local_rank: int = 0,
                  node_rank: int | None = None) -> dict[str, Any]:
    """Who this rank is and where it runs; torch facts are added once torch is imported."""
    env = os.environ
    return {
        "schema_version": SCHEMA_VERSION,
        "rank": rank,
        "rank_from": rank_from,  # the launcher's variable, init_process_group, or the command itself
        "local_rank": local_rank,
        "node_rank": node_rank or 0,
        "world_size": world_size or 1,
        "hostname": socket.gethostname(),
        "host": env.get(HOST_ENV) or socket.gethostname(),
        "pid": os.getpid(),
        "argv": sys.argv,
        "started_at": time.time(),
        "utc_offset_s": time.localtime().tm_gmtoff,  # turns the local times in log lines into Unix times
        "python": sys.version.split()[0],
    }


def process_start_time() -> float:
    """When this process started (Unix seconds): its start in clock ticks since boot (/proc/self/stat) after the
    boot time; now, where /proc cannot tell."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, counted after the command's name
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


def _point_nccl_log(folder: Path) -> None:
    """NCCL's debug log into the rank's folder, set before NCCL starts (the flight recorder's size is set
    when the process is first instrumented)."""
    os.environ.setdefault("NCCL_DEBUG", "INFO")
    os.environ["NCCL_DEBUG_FILE"] = str(folder / "nccl.log")


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

    def __init__(self, folder: Callable[[], Path | None]) -> None:
        """``folder()``: where the records go when the process ends; None where it was no rank."""
        self.folder = folder
        self.restart()
        self.user_faulthandler = False  # the job turned faulthandler on itself: leave it on at exit

    def restart(self) -> None:
        """Nothing recorded yet (also in a forked child, which inherits its parent's recorder)."""
        self.record: dict[str, Any] = {"code": 0, "reason": "returned"}
        self.sigint_at: float | None = None  # when the first SIGINT came
        # A SIGINT or SIGTERM has been acted on: later ones are not. A launcher forwards the wrapper's
        # signal again (torchrun answers a SIGINT with a SIGTERM to every worker), and a second stop
        # must not cut the exit record, the dumps or a window's trace export short.
        self.stopping = False
        self.exiting = False  # the exit record and dumps are being written
        at_process_end(self._at_exit)

    def install(self) -> None:
        """Take over sys.exit, the excepthook, SIGTERM and SIGINT (where the job has not)."""
        self._sys_exit = sys.exit
        sys.exit = self._exit
        self._excepthook = sys.excepthook
        sys.excepthook = self._on_exception
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, self._on_sigterm)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self._on_sigint)

    def _exit(self, code: Any = None) -> None:
        number = code if isinstance(code, int) else (0 if code is None else 1)
        self.record = {"code": number, "reason": "sys.exit", "time": time.time()}
        exc_type, exc, tb = sys.exc_info()
        if number and exc is not None and not isinstance(exc, SystemExit):
            # sys.exit(1) while handling an exception (torch.multiprocessing.spawn's children): that is the cause.
            self.record = {**self._cause(exc_type, exc), "code": number, "where": user_frame(traceback.extract_tb(tb))}
        self._sys_exit(code)

    def _cause(self, exc_type: type, exc: BaseException) -> dict[str, Any]:
        interrupted = issubclass(exc_type, KeyboardInterrupt)
        return {
            "code": 128 + signal.SIGINT if interrupted else 1,
            "reason": "interrupted" if interrupted else "exception",
            "exception": f"{exc_type.__name__}: {exc}"[:2000],
            "time": (interrupted and self.sigint_at) or time.time(),  # when it happened: the dumps at exit take a while
        }

    def _on_exception(self, exc_type: type, exc: BaseException, tb: Any) -> None:
        # The cause first, in one assignment: launchers often send a second SIGINT, which can
        # interrupt this hook itself.
        self.record = self._cause(exc_type, exc)
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
        if self.exiting:
            return  # a multiprocessing child runs this from its finalizers and again at exit
        self.exiting = True
        try:
            folder = self.folder()
        except Exception as e:  # noqa: BLE001 - the rank's folder could not be made: say so, end as the job would
            print(f"diagtrain: exit record not written: {type(e).__name__}: {e}", file=sys.stderr)
            folder = None
        if folder is None:
            self._leave_faulthandler()
            return
        self._exception_in_flight()
        self._write(folder)
        self._leave_faulthandler()

    def _exception_in_flight(self) -> None:
        """A multiprocessing child's target raised: its finalizers run while the exception leaves."""
        exc_type, exc, tb = sys.exc_info()
        if self.record["reason"] == "returned" and exc is not None and not isinstance(exc, SystemExit):
            self.record = {**self._cause(exc_type, exc), "where": user_frame(traceback.extract_tb(tb))}

    def _write(self, folder: Path) -> None:
        from diagtrain.profiler.rank import flight_recorder, state_dump, trouble

        try:
            state_dump.write_process_groups(folder)
            flight_recorder.dump(folder / "flight_recorder.json")
        except Exception as e:  # noqa: BLE001 - a failed dump must not hide the exit record
            self.record["flight_recorder_error"] = f"{type(e).__name__}: {e}"
        if self.record["reason"] == "returned" and self.sigint_at:
            self.record = {**self.record, "code": 128 + signal.SIGINT, "reason": "interrupted", "time": self.sigint_at}
        warnings = trouble.recorded()
        try:
            write_json_atomic(folder / "exit.json", {"time": time.time(), **self.record,
                                                     **({"warnings": warnings} if warnings else {})})
        except OSError as e:
            trouble.warn(folder, "exit.json", f"exit.json not written ({trouble.reason(e)})")

    def _leave_faulthandler(self) -> None:
        # What runs after this is the interpreter's teardown, where a Python stack says nothing, and
        # faulthandler's all-threads dump of a C++ abort there crashes itself: SIGABRT became SIGSEGV.
        if not self.user_faulthandler:
            faulthandler.disable()
