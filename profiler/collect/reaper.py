"""The job never outlives its wrapper: a watcher that stops what a vanished wrapper left running.

The command's own process dies with the wrapper (a parent-death signal, see process_tree), and so
do ranks started by a launcher (the in-rank bootstrap asks for the same), but a process the job
started elsewhere in its tree (a shell's background job, a pool worker) would be re-parented to
init and run on. This small process, started by the wrapper in a session of its own, holds the
read end of a pipe whose write end only the wrapper has: end of file without the wrapper's
"done" means the wrapper died, and every process that carries the wrapper's marks in its
environment (``DIAGTRAIN_WRAPPER_PID`` and ``DIAGTRAIN_RUN_DIR``, inherited down the whole job) is
killed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil

from diagtrain.profiler.run_dir import RUN_DIR_ENV, WRAPPER_PID_ENV

DONE = b"done"
KILL_WAIT_S = 5.0


class Reaper:
    """The wrapper's side: start the watcher, and tell it at a normal end that nothing is to be done."""

    def __init__(self, run_dir: Path, wrapper_pid: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", __name__, str(run_dir), str(wrapper_pid)],
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def release(self) -> None:
        """The job has ended under the wrapper's eyes: let the watcher go."""
        try:
            self.proc.stdin.write(DONE)
            self.proc.stdin.close()
            self.proc.wait(timeout=KILL_WAIT_S)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


def job_processes(run_dir: str, wrapper_pid: str) -> list[psutil.Process]:
    """Live processes started under that wrapper for that run directory."""
    found = []
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
        except psutil.Error:
            continue
        if env.get(WRAPPER_PID_ENV) == wrapper_pid and env.get(RUN_DIR_ENV) == run_dir:
            found.append(proc)
    return found


def main(argv: list[str]) -> int:
    run_dir, wrapper_pid = argv
    if sys.stdin.buffer.read() == DONE:  # blocks until the wrapper closes its end, or dies
        return 0
    procs = job_processes(run_dir, wrapper_pid)
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=KILL_WAIT_S)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
