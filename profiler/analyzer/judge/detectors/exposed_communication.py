"""exposed_communication: the share of step time spent in communication that nothing overlaps."""

from __future__ import annotations

from diagtrain.profiler.util.settings import section, setting
from diagtrain.profiler.analyzer.judge.detectors.base import Steady, steady_columns
from diagtrain.profiler.analyzer.judge.findings import UPPER_BOUND, Candidate
from diagtrain.profiler.analyzer.run.tables import Tables


@section("exposed_communication")
class ExposedCommunication:
    """How much of the step communication that nothing overlaps must take to be reported, and when it is a warning."""

    info_share: float = setting(0.2, "reported from a fifth of the step on")
    warn_share_gpu: float = setting(0.5, "on GPU, half the step waiting on the network is worth fixing first")
    top_collectives: int = setting(3, "the longest collectives named in the finding")


SETTINGS = (ExposedCommunication, Steady)


def detect(tables: Tables) -> list[Candidate]:
    """One finding when communication nothing overlaps takes a good share of the profiled steps."""
    s = ExposedCommunication.active()
    steps = steady_columns(tables.steps, ("rank", "step", "wall_ms", "exposed_comm_ms"))
    if "exposed_comm_ms" not in steps or steps["exposed_comm_ms"].isna().all():
        return []
    profiled = steps[steps["exposed_comm_ms"].notna()]
    share = float((profiled["exposed_comm_ms"] / profiled["wall_ms"]).median())
    if share < s.info_share:
        return []
    # On CPU (gloo) toy runs communication dominates by construction: informative, not a defect,
    # and no saving is claimed for it (nothing in the job can overlap what the host itself blocks on).
    severity = "warning" if tables.on_gpu and share >= s.warn_share_gpu else "info"
    exposed_ms = float(profiled["exposed_comm_ms"].median())
    top = _top_collectives(tables, s.top_collectives)
    saving = (f"; overlapping it would save up to {exposed_ms:.0f} ms per step" if tables.on_gpu else
              "; on CPU (gloo) a small model's step is mostly communication by design, so no saving is claimed")
    return [Candidate(
        kind="exposed_communication", severity=severity, ranks=sorted(int(r) for r in profiled["rank"].unique()),
        steps=sorted(int(s) for s in profiled["step"].unique()),
        explanation=(f"{share:.0%} of the profiled step time ({exposed_ms:.0f} ms per step, median over ranks and "
                     f"steps) is communication that no computation overlaps{saving}"
                     + (f". The longest collectives: {', '.join(top)}." if top else ".")),
        suggestion=("Overlap it: larger DDP buckets or FSDP prefetching (forward/backward prefetch), fewer "
                    "and larger collectives, or a higher compute-to-communication ratio (batch size per rank)."),
        metrics={"observed_share": share, "threshold_share": s.info_share, "warn_share": s.warn_share_gpu,
                 "exposed_ms_per_step": exposed_ms, UPPER_BOUND: True},
        evidence=[{"type": "collective_summary", "op": t} for t in top],
        impact_ms=exposed_ms if tables.on_gpu else None,
    )]


def _top_collectives(tables: Tables, count: int) -> list[str]:
    """The ``count`` collectives that took the most time, each as its time per profiled step on each rank
    that calls it."""
    c = tables.collectives
    profiled_steps = tables.steps.loc[tables.steps["exposed_comm_ms"].notna(), "step"].nunique()  # all the traces hold
    if c.empty or not profiled_steps:
        return []
    group = c["pg_desc"].fillna(c["pg"]).astype(str).replace("?", "an unknown group")
    labelled = c.assign(label=c["op"] + " on " + group)
    totals = labelled.groupby("label").agg(dur=("dur", "sum"), ranks=("rank", "nunique"))
    top = totals.nlargest(count, "dur")
    return [f"{label} ({dur / ranks / profiled_steps / 1e3:.0f} ms per step on each of its {ranks} ranks)"
            for label, dur, ranks in zip(top.index, top["dur"], top["ranks"])]
