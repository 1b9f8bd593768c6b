"""dataloader_stall: steps where a rank waits for its next batch far longer than usual.

The wait is the step's data phase: recorded by the job's StepRecorder or the always-on counters
(time in a DataLoader iterator's ``__next__``), else read from the profiler's own DataLoader spans
(``enumerate(DataLoader)#..__next__``) in the profiled steps.
"""

from __future__ import annotations

from diagtrain.profiler.analyzer.judge.detectors.base import Steady, steady, time_range
from diagtrain.profiler.util.text import ranges
from diagtrain.profiler.analyzer.judge.findings import Finding
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.util.settings import section, setting


@section("dataloader_stall")
class DataloaderStall:
    """When a rank's wait for its next batch is long enough, and often enough, to be a stall."""

    stall_factor: float = setting(3.0, "a data phase this many times the run's typical one is a stall...")
    # Data workers starved by a busy host hand batches over a few ms late (18 ms against 3 ms in a
    # clean run with workers on a crowded 2-core machine here).
    min_stall_ms: float = setting(20.0, "...and at least this long: a busy host makes batches a few ms late")
    min_stall_share: float = setting(0.05, "...and this share of the median step, so that it costs the step something")
    min_steps: int = setting(2, "a single slow batch (a cold cache) is not worth a finding")


SETTINGS = (DataloaderStall, Steady)


def detect(tables: Tables) -> list[Finding]:
    """Ranks whose data phase stands far above the run's typical one in several steps."""
    s = DataloaderStall.active()
    steps = steady(tables.steps)
    if "data_ms" not in steps or steps["data_ms"].isna().all():
        return []
    typical = float(steps["data_ms"].median())
    threshold = max(s.stall_factor * typical, s.min_stall_ms, s.min_stall_share * float(steps["wall_ms"].median()))
    findings = []
    for rank, rows in steps[steps["data_ms"] >= threshold].groupby("rank"):
        if len(rows) < s.min_steps:
            continue
        stalled = sorted(int(step) for step in rows["step"])
        every = _period(stalled)
        per_stall = float(rows["data_ms"].median())
        findings.append(Finding(
            kind="dataloader_stall", severity="warning", ranks=[int(rank)], steps=stalled,
            time_range=time_range(rows),
            explanation=(
                f"rank {rank} waits {per_stall:.0f} ms for data in steps {ranges(stalled)}"
                + (f" (every {every} steps)" if every else "")
                + f", against {typical:.1f} ms typically; the other ranks wait for it at the next collective."
            ),
            suggestion="Give the data loader more workers or prefetching (num_workers, prefetch_factor, "
                       "pin_memory), and check that rank's storage or preprocessing for periodic slow reads.",
            metrics={"observed_ms": per_stall, "expected_ms": typical, "threshold_ms": threshold, "period_steps": every,
                     "source": "phases", "time_source": "host"},  # the host's data phase; priced on the device where timed
            evidence=[{"type": "steps", "rank": int(rank), "step": int(step), "data_ms": round(float(d), 3)}
                      for step, d in zip(rows["step"], rows["data_ms"])][:20],
            impact_ms=float((rows["data_ms"] - typical).sum() / steps["step"].nunique()),
        ))
    return findings


def _period(steps: list[int]) -> int | None:
    gaps = {b - a for a, b in zip(steps, steps[1:])}
    return gaps.pop() if len(gaps) == 1 and len(steps) >= 2 else None
