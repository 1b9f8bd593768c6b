"""slow_startup: the job took long from its launch to its steady steps, a good share of its wall time.

Read from the job's ledger (run/job_time.py): from the launch to the end of the warm-up steps, less what
those steps would have taken as steady ones, split where the ranks recorded when (the launcher and Python's
start, imports, the process group's set-up, then building the job and its first steps).
"""

from __future__ import annotations

from diagtrain.profiler.analyzer.judge.detectors.base import job_totals
from diagtrain.profiler.analyzer.judge.findings import UPPER_BOUND, Candidate
from diagtrain.profiler.analyzer.run import job_time
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.util.settings import section, setting


@section("slow_startup")
class SlowStartup:
    """When the start-up is long enough, and a large enough share of the run, to be worth a look."""

    min_s: float = setting(60.0, "starting Python, importing torch, a rendezvous and building a model take tens of "
                           "seconds: a start-up shorter than this is not worth a look")
    min_share: float = setting(0.1, "... and at least this share of the run's wall time")


SETTINGS = (SlowStartup,)

# What each segment of the start-up holds, and what shortens it.

def detect(tables: Tables) -> list[Candidate]:
    """One finding when the start-up took ``min_s`` or more and ``min_share`` of the run or more."""
    s = SlowStartup.active()
    totals = job_totals(tables)
    if totals is None:
        return []
    startup = totals.seconds[job_time.STARTUP]
    if startup < s.min_s or startup < s.min_share * totals.wall_s:
        return []
    longest = max(totals.startup, key=totals.startup.get)
    return [Candidate(
        kind="slow_startup", ranks=sorted(int(r) for r in tables.steps["rank"].unique()),
        steps=[],
        time_range=(totals.launched_at, totals.launched_at + startup) if totals.launched_at else None,
        facts={"startup_s": startup, "wall_s": totals.wall_s, "segments_s": dict(totals.startup), "longest": longest},
        metrics={"startup_s": startup, "wall_s": totals.wall_s, "segments_s": dict(totals.startup),
                 "longest": longest, "threshold_s": s.min_s, "lost_ms": startup * 1e3, "pattern": "once",
                 "category": job_time.STARTUP, "source": "job_ledger", UPPER_BOUND: True},
    )]
