"""exposed_communication: the share of step time spent in communication that nothing overlaps."""

from __future__ import annotations

from diagtrain.profiler.analyzer.detectors.base import steady
from diagtrain.profiler.analyzer.findings import Finding
from diagtrain.profiler.analyzer.tables import Tables

INFO_SHARE = 0.2  # reported from a fifth of the step on
WARN_SHARE_GPU = 0.5  # on GPU, half the step waiting on the network is worth fixing first
TOP_COLLECTIVES = 3


def detect(tables: Tables) -> list[Finding]:
    steps = steady(tables.steps)
    if "exposed_comm_ms" not in steps or steps["exposed_comm_ms"].isna().all():
        return []
    profiled = steps[steps["exposed_comm_ms"].notna()]
    share = float((profiled["exposed_comm_ms"] / profiled["wall_ms"]).median())
    if share < INFO_SHARE:
        return []
    # On CPU (gloo) toy runs communication dominates by construction: informative, not a defect.
    severity = "warning" if tables.on_gpu and share >= WARN_SHARE_GPU else "info"
    top = _top_collectives(tables)
    return [Finding(
        kind="exposed_communication", severity=severity, ranks=sorted(int(r) for r in profiled["rank"].unique()),
        steps=sorted(int(s) for s in profiled["step"].unique()),
        explanation=(f"{share:.0%} of the profiled step time is communication that no computation overlaps"
                     + (f"; most of it in {', '.join(top)}." if top else ".")),
        suggestion=("Overlap it: larger DDP buckets or FSDP prefetching (forward/backward prefetch), fewer "
                    "and larger collectives, or a higher compute-to-communication ratio (batch size per rank)."),
        metrics={"observed_share": share, "threshold_share": INFO_SHARE, "warn_share": WARN_SHARE_GPU,
                 "exposed_ms_per_step": float(profiled["exposed_comm_ms"].median())},
        evidence=[{"type": "collective_summary", "op": t} for t in top],
        impact_ms=float(profiled["exposed_comm_ms"].median()),
    )]


def _top_collectives(tables: Tables) -> list[str]:
    c = tables.collectives
    if c.empty:
        return []
    group = c["pg_desc"].fillna(c["pg"]).astype(str).replace("?", "an unknown group")
    totals = c.assign(label=c["op"] + " on " + group).groupby("label")["dur"].sum()
    return [f"{label} ({total / 1e3:.0f} ms)" for label, total in totals.nlargest(TOP_COLLECTIVES).items()]
