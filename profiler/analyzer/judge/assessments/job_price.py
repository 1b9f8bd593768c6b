"""What time every rank lost together cost the job: the job-level findings priced and judged by one rule.

A job-level detector (input_bound, periodic_stall, slow_startup) proposes a candidate with the time the
job lost to it (``lost_ms``: over the steady steps, or once for the start-up) and its pattern. Priced here
as the ranks' causes are (judge/assessments/ledger_price.py): the impact is that time per steady step, the severity
cost.severity's rule on its share of the steady steps' time (the start-up's, of the wall time).
"""

from __future__ import annotations

from diagtrain.profiler.analyzer.judge.assessments.ledger_price import INTERMITTENT, Cost, severity
from diagtrain.profiler.analyzer.judge.detectors.base import job_totals, steady_job_steps
from diagtrain.profiler.analyzer.judge.findings import UPPER_BOUND, Finding
from diagtrain.profiler.analyzer.judge.verdict import JOB_PRICE, Assessed, Assessment
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.util.settings import values
from diagtrain.profiler.util.text import ranges

# The kinds priced here, and the one priced against the wall time (it is no part of the steps).
JOB_KINDS = ("input_bound", "periodic_stall", "slow_startup")
ONCE = "slow_startup"


def priced(findings: list[Finding], t: Tables) -> Assessed:
    """Each job-level candidate's price per steady step, share and severity."""
    c = Cost.active()
    out = Assessed()
    steps = steady_job_steps(t)
    if steps.empty:
        return out
    steady_ms = float(steps["time_ms"].sum())
    totals = job_totals(t) if any(f.kind == ONCE for f in findings) else None
    for i, f in enumerate(findings):
        lost = f.metrics.get("lost_ms")
        if f.kind not in JOB_KINDS or lost is None:
            continue
        whole = totals.wall_s * 1e3 if f.kind == ONCE and totals is not None else steady_ms
        share = lost / whole if whole > 0 else 0.0
        per_step = lost / len(steps)
        says = {"says": "job_price", "lost_ms": lost, "share": share, "job_s": whole / 1e3, "steady_steps": len(steps),
                "pattern": f.metrics.get("pattern"), "step_ranges": ranges(f.steps) if f.steps else "",
                "once": f.kind == ONCE}
        metrics = {"share_of_run": share, "lost_ms_per_step": per_step, "lost_s": round(lost / 1e3, 4),
                   "impact_source": "job_ledger"}
        if f.kind not in c.validated_kinds.split(","):
            metrics[UPPER_BOUND] = True  # a price not yet held against a clean twin: claimed as a bound
        out.add(i, Assessment(JOB_PRICE, metrics=metrics,
                              # Once is no pattern: by the rule of a cause that came and went.
                              severity=severity(share, INTERMITTENT if f.kind == ONCE else f.metrics["pattern"], c),
                              impact_ms=per_step,
                              prices=True, settings=values(c), says=says))
    return out
