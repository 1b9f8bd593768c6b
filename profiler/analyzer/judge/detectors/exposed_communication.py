"""exposed_communication: the share of step time spent in communication that nothing overlaps."""

from __future__ import annotations

from typing import Any

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
    exposed_ms = float(profiled["exposed_comm_ms"].median())
    top = _top_collectives(tables, s.top_collectives)
    return [Candidate(
        kind="exposed_communication", ranks=sorted(int(r) for r in profiled["rank"].unique()),
        steps=sorted(int(s) for s in profiled["step"].unique()),
        facts={"share": share, "exposed_ms": exposed_ms, "on_gpu": tables.on_gpu, "top": top},
        metrics={"observed_share": share, "threshold_share": s.info_share, "warn_share": s.warn_share_gpu,
                 "exposed_ms_per_step": exposed_ms, UPPER_BOUND: True},
        evidence=[{"type": "collective_summary", **t} for t in top],
    )]


def _top_collectives(tables: Tables, count: int) -> list[dict[str, Any]]:
    """The ``count`` collectives that took the most time: each its op and group, and its time per profiled step on
    each of the ranks that call it."""
    c = tables.collectives
    profiled_steps = tables.steps.loc[tables.steps["exposed_comm_ms"].notna(), "step"].nunique()  # all the traces hold
    if c.empty or not profiled_steps:
        return []
    group = c["pg_desc"].fillna(c["pg"]).astype(str).replace("?", "an unknown group")
    labelled = c.assign(label=c["op"] + " on " + group)
    totals = labelled.groupby("label").agg(dur=("dur", "sum"), ranks=("rank", "nunique"))
    top = totals.nlargest(count, "dur")
    return [{"op": label, "ms_per_step": float(dur / ranks / profiled_steps / 1e3), "ranks": int(ranks)}
            for label, dur, ranks in zip(top.index, top["dur"], top["ranks"])]
