"""Trace health, checked before anything is concluded from the traces."""

from __future__ import annotations

from diagtrain.profiler.analyzer.load import RankResult
from diagtrain.profiler.analyzer.tables import Tables

CLOCK_SKEW_MS = 50.0  # ProfilerStep#N starting this far apart on different ranks: clocks disagree


def check(tables: Tables, results: list[RankResult]) -> list[dict]:
    """Problems with the inputs, each ``{check, severity, message}``; empty when all is well."""
    notes = []

    def note(check: str, message: str, severity: str = "warning") -> None:
        notes.append({"check": check, "severity": severity, "message": message})

    ranks = {r.rank for r in results}
    world = tables.world_size
    if world and results and len(ranks) < world:
        missing = sorted(set(range(world)) - ranks)
        shown = ", ".join(map(str, missing[:20])) + (" ..." if len(missing) > 20 else "")
        note("missing_ranks", f"traces for {len(ranks)} of {world} ranks; missing: {shown}",
             "info" if len(ranks) < world / 2 else "warning")
    for field, label in (("steps", "profiled steps"), ("collectives", "collectives")):
        counts = {r.rank: len(getattr(r, field)) for r in results}
        if len(set(counts.values())) > 1:
            note(f"uneven_{field}", f"ranks traced different numbers of {label}: "
                 + ", ".join(f"rank {k}: {v}" for k, v in sorted(counts.items())[:16]))
    if results and not all(r.record_shapes for r in results):
        note("record_shapes", "record_shapes was off in some traces: collective sizes and bandwidth are unknown there", "info")
    if results and not all(r.profile_memory for r in results):
        note("profile_memory", "profile_memory was off in some traces: memory over time is not available from them", "info")
    for r in results:
        for message in r.health:
            note("events", f"rank {r.rank}: {message}")
        for message in r.warnings:
            note("rank_from_name", message, "info")
    for rank, shift in sorted(tables.clock_shifts_us.items()):
        note("clocks", f"rank {rank} is on another host; its clock was shifted by {shift / 1e3:+.1f} ms to line "
             "up the end times of its collectives", "info")
    skew = _clock_skew(tables)
    if skew is not None and skew > CLOCK_SKEW_MS:
        note("clocks", f"the same profiled step starts up to {skew:.0f} ms apart across ranks: clocks may not line up")
    return notes


def _clock_skew(tables: Tables) -> float | None:
    steps = tables.steps
    if "trace_start" not in steps or steps["trace_start"].isna().all():
        return None
    spread = steps.dropna(subset=["trace_start"]).groupby("step")["trace_start"].agg(lambda s: s.max() - s.min())
    return float(spread.max() * 1e3) if len(spread) else None
