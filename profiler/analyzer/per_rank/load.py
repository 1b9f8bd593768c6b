"""Load every rank's traces: here one after the other, in local worker processes when they are big (one
rank per worker, pool.py), or on a Dask cluster (cluster.py); only summaries come back.

Each way runs :func:`pipeline.load_rank` on each input (read.discover finds them): it reads one
rank, writes its timeline spans and its results to ``analysis/cache/<key>/`` (cache.py), and returns
the per-step breakdown and the collectives. A rank whose inputs did not change is taken from that
cache without reading its traces again.
"""

from __future__ import annotations

import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Callable

from diagtrain.profiler.analyzer.per_rank import jobs
from diagtrain.profiler.analyzer.per_rank.pipeline import load_rank, skipped_by
from diagtrain.profiler.analyzer.per_rank.reading import in_force
from diagtrain.profiler.analyzer.per_rank.pool import WORKER_DIED, Cluster, Pool, load_alone, load_on, worth_a_pool
from diagtrain.profiler.analyzer.per_rank.result import RankResult
from diagtrain.profiler.analyzer.read.discover import RankInput
from diagtrain.profiler.analyzer.read.inputs import Skipped
from diagtrain.profiler.util.bounded_read import display


def load(inputs: list[RankInput], cache_root: Path, workers: int,
         progress: Callable[[str], None] = lambda _: None,
         cluster: Cluster | None = None) -> tuple[list[RankResult], list[Skipped]]:
    """Analyze each rank input on ``cluster`` when given, else in local worker processes when the traces
    are big enough to pay for them, else here one after the other; unreadable inputs and copies of one
    rank's trace are skipped. Every way runs :func:`load_rank`, so every way gives the same results.
    Inputs of different jobs raise :class:`~diagtrain.profiler.analyzer.per_rank.jobs.MixedJobs`."""
    results, skipped = [], []
    started, reading = time.monotonic(), in_force()  # the workers are handed the settings this analysis reads with
    if cluster is not None:
        results, skipped, died = load_on(cluster.executor, cluster.lost, inputs, cache_root,
                                         lambda done: progress(_loaded(done, len(inputs), started, cluster.where)),
                                         reading)
        # the scheduler already gave each of these to other workers (distributed.scheduler.allowed-failures)
        skipped += [Skipped(display(item.files[0]), WORKER_DIED) for item in died]
    elif not worth_a_pool(inputs, workers):
        for done, item in enumerate(inputs, 1):
            try:
                results.append(load_rank(item, cache_root, reading))
            except Exception as e:  # noqa: BLE001 - the guard: one bad input is skipped, never the run
                skipped += skipped_by(item, e)
            progress(_loaded(done, len(inputs), started))
    else:
        with Pool(min(workers, len(inputs))) as pool:
            results, skipped, died = load_on(pool, (BrokenProcessPool,), inputs, cache_root,
                                             lambda done: progress(_loaded(done, len(inputs), started)), reading)
        for item in died:  # each alone, so only the input that kills its worker is lost
            result = load_alone(item, cache_root, reading)
            if isinstance(result, RankResult):
                results.append(result)
            else:
                skipped += result
    jobs.check_one_job(results)
    return _resolve_duplicates(sorted(results, key=lambda r: (r.rank, r.key)), skipped)


def _loaded(done: int, total: int, started: float, where: str = "") -> str:
    """The progress line while ranks load: how many, where, and how fast."""
    elapsed = time.monotonic() - started
    rate = f" ({done / elapsed:.1f} ranks/s)" if done and elapsed > 0 else ""
    return f"loaded {done}/{total} ranks{where}{rate}"


def _resolve_duplicates(results: list[RankResult], skipped: list[Skipped]) -> tuple[list[RankResult], list[Skipped]]:
    skipped = skipped + [s for r in results for s in r.skipped]  # bad windows of ranks otherwise read
    kept: dict[int, RankResult] = {}
    unranked = [r for r in results if r.rank < 0]
    for result in [r for r in results if r.rank >= 0]:
        if result.rank in kept:
            skipped.append(Skipped(", ".join(result.files),
                                   f"claims rank {result.rank}, which {', '.join(kept[result.rank].files)} already claims"))
        else:
            kept[result.rank] = result
    order = " (traces without a rank take the free ranks in name order)" if len(unranked) > 1 else ""
    for result in unranked:  # traces without rank facts: the lowest free rank each, in name order
        result.rank = next(r for r in range(len(results) + 1) if r not in kept)
        result.warnings = [f"{w}; analyzed as rank {result.rank}{order}" for w in result.warnings]
        result.steps["rank"] = result.rank
        result.collectives["rank"] = result.rank
        result.segments["rank"] = result.rank
        kept[result.rank] = result
    return sorted(kept.values(), key=lambda r: r.rank), skipped
