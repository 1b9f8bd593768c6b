"""Where ranks load besides here: local worker processes (one rank each), or an executor of a Dask
cluster (cluster.py). Either way each task is :func:`pipeline.load_rank` and only its results come back."""

from __future__ import annotations

import ctypes
import signal
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from queue import Empty, SimpleQueue
from typing import Any, Callable

from diagtrain.profiler.analyzer.per_rank.pipeline import load_rank, skipped_by
from diagtrain.profiler.analyzer.per_rank.result import RankResult
from diagtrain.profiler.analyzer.read.discover import RankInput
from diagtrain.profiler.analyzer.read.inputs import Skipped
from diagtrain.profiler.util.bounded_read import display

WORKER_DIED = "the process reading it died (killed, or out of memory)"
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
PROGRESS_TICK_S = 0.25  # while ranks load in workers, progress is reported at least this often
POOL_MIN_BYTES = 4 << 20  # compressed traces below this parse in ~0.3 s: starting workers would cost more


@dataclass
class Cluster:
    """Worker processes of a cluster that load ranks (a Dask cluster's, cluster.py): tasks go to
    ``executor``; an exception of a ``lost`` type means every process that ran the task died."""

    executor: Executor
    lost: tuple[type[BaseException], ...]
    where: str  # for progress: " on the Dask cluster at tcp://..."


def load_on(executor: Executor, lost: tuple[type[BaseException], ...], inputs: list[RankInput], cache_root: Path,
            progress: Callable[[int], None], reading: dict[str, Any] | None = None,
            ) -> tuple[list[RankResult], list[Skipped], list[RankInput]]:
    """:func:`load_rank` of every input as a task on ``executor`` (with the reading settings ``reading``): the
    results, the inputs skipped, and those whose worker died (a ``lost`` exception: this input, or another one
    beside it, killed it)."""
    results, skipped, died = [], [], []
    # Each task says when it ends, into one queue: waiting on all the pending futures at once instead installs a
    # waiter on each of them for every rank that finishes (O(ranks^2): 2.6 s of this process' CPU at 1,024 ranks,
    # taken from the workers on a machine with as many cores as workers).
    finished: SimpleQueue[Future] = SimpleQueue()
    futures = {executor.submit(load_rank, item, cache_root, reading): item for item in inputs}
    for future in futures:
        future.add_done_callback(finished.put)
    while futures:
        try:
            # A tick even while no rank finishes: the caller's progress is where it may stop (Ctrl-C).
            future = finished.get(timeout=PROGRESS_TICK_S)
        except Empty:
            progress(len(inputs) - len(futures))
            continue
        item = futures.pop(future)  # its result is no longer held here once taken
        try:
            results.append(future.result())
        except lost:
            died.append(item)
        except Exception as e:  # noqa: BLE001 - the guard: one bad input is skipped, never the run
            skipped += skipped_by(item, e)
        progress(len(inputs) - len(futures))
    return results, skipped, died


def worth_a_pool(inputs: list[RankInput], workers: int) -> bool:
    """Whether loading ``inputs`` in worker processes beats loading them here, one after the other."""
    if workers <= 1 or len(inputs) <= 1:
        return False
    size = 0
    for item in inputs:
        for f in item.files:
            try:
                size += f.stat().st_size
            except OSError:
                pass  # its loader reports it
    return size >= POOL_MIN_BYTES


class Pool(ProcessPoolExecutor):
    """Workers that leave Ctrl-C to the analysis, which stops them at once (not after every queued rank)."""

    def __init__(self, workers: int) -> None:
        super().__init__(max_workers=workers, initializer=_worker_start)

    def __exit__(self, exc_type: type | None, *exc: object) -> bool | None:
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            self.shutdown(wait=False, cancel_futures=True)
            for process in list((self._processes or {}).values()):  # the running ones: no use finishing them
                process.terminate()
        return super().__exit__(exc_type, *exc)


def _worker_start() -> None:
    """In each worker: Ctrl-C is the analysis' to handle, and the worker ends with it even if it is killed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:  # Linux: SIGKILL this worker when its parent dies; elsewhere, a killed analysis may leave it waiting
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def load_alone(item: RankInput, cache_root: Path, reading: dict[str, Any] | None = None) -> RankResult | list[Skipped]:
    """:func:`load_rank` of ``item`` in a worker of its own: its results, or why it was skipped."""
    try:
        with Pool(1) as pool:
            return pool.submit(load_rank, item, cache_root, reading).result()
    except BrokenProcessPool:
        return [Skipped(display(item.files[0]), WORKER_DIED)]
    except Exception as e:  # noqa: BLE001 - the guard, as in load()
        return skipped_by(item, e)
