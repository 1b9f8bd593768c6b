"""What detectors share: steady-state steps, peer groups, and step ranges in words."""

from __future__ import annotations

import pandas as pd

from diagtrain.profiler.analyzer.tables import Tables
from diagtrain.profiler.stats import binomial_tail

# Warm-up rule: step 1 carries start-up (process-group init, allocator growth, first-call
# compilation) and is left out of every statistic, as long as three or more steps remain.
WARMUP_STEPS = 1
MIN_STEADY_STEPS = 3


def steady(steps: pd.DataFrame) -> pd.DataFrame:
    """The steps after warm-up (all of them if too few would be left)."""
    if steps.empty:
        return steps
    later = steps[steps["step"] > WARMUP_STEPS]
    return later if later["step"].nunique() >= MIN_STEADY_STEPS else steps


def peer_groups(tables: Tables, ranks: list[int]) -> list[list[int]]:
    """Ranks doing the same work: the same pipeline stage of a reference trainer, else all ranks."""
    mesh = (tables.trainer or {}).get("mesh") or {}
    pp = int(mesh.get("pp") or 1)
    if pp <= 1:
        return [sorted(ranks)]
    per_stage = len(ranks) // pp if len(ranks) % pp == 0 else None
    if not per_stage:
        return [sorted(ranks)]
    # Mesh order pp, dp, tp: stage s holds ranks s*dp*tp ... (s+1)*dp*tp-1.
    return [sorted(r for r in ranks if r // per_stage == s) for s in range(pp)]


def stage_of(tables: Tables, rank: int) -> int | None:
    """The pipeline stage coordinate of ``rank`` in a reference trainer's mesh, if any."""
    mesh = (tables.trainer or {}).get("mesh") or {}
    dp, tp = int(mesh.get("dp") or 1), int(mesh.get("tp") or 1)
    return rank // (dp * tp) if mesh.get("pp", 1) > 1 else None


def ranges(steps: list[int]) -> str:
    """[3, 4, 5, 9] → '3-5, 9'."""
    steps = sorted(set(int(s) for s in steps))
    parts, start = [], None
    for i, s in enumerate(steps):
        if start is None:
            start = s
        if i + 1 == len(steps) or steps[i + 1] != s + 1:
            parts.append(str(start) if start == s else f"{start}-{s}")
            start = None
    return ", ".join(parts)


def time_range(steps: pd.DataFrame) -> tuple[float, float] | None:
    """Unix-time span of these step rows."""
    if steps.empty or "start" not in steps:
        return None
    return float(steps["start"].min()), float(steps["end"].max())


LATE_MS = 1.0  # arriving this much after the first rank of the group counts as late
PERSISTENTLY_LATE = 0.6  # late at this share of its collectives: the delay is on its comm path
# ... and by this much on average: ranks sharing a busy host arrive a few ms apart by turns.
MIN_LATENESS_MS = 5.0
# ... and this many times later than the other ranks usually are: on a busy host every rank is
# late by turns (a clean 4-rank run here: 9 ms against the others' 3 ms).
LATENESS_RATIO = 4.0
# ... and last more often than chance would make it (1 in group-size), at this significance: with
# 4 ranks and 4 collectives, chance alone makes some rank last 3 times of 4 in one run of five.
LATE_ALPHA = 0.05


def late_arrivals(collectives: pd.DataFrame) -> pd.DataFrame:
    """Per rank: collectives seen, share at which it arrived last and late, mean lateness (ms)."""
    if collectives.empty or "group" not in collectives:
        return pd.DataFrame(columns=["rank", "collectives", "late", "late_share", "lateness_ms", "chance", "p_value"])
    table = collectives[collectives["ranks_seen"] > 1].copy()
    table["lateness_ms"] = (table["ts"] - table.groupby(["group", "op", "seq"])["ts"].transform("min")) / 1e3
    table["late"] = (table["last_rank"] == table["rank"]) & (table["lateness_ms"] >= LATE_MS)
    table["chance"] = 1.0 / table["ranks_seen"]
    out = table.groupby("rank").agg(collectives=("late", "size"), late=("late", "sum"), late_share=("late", "mean"),
                                    lateness_ms=("lateness_ms", "mean"), chance=("chance", "mean")).reset_index()
    out["p_value"] = [binomial_tail(int(k), int(n), p) for k, n, p in zip(out["late"], out["collectives"], out["chance"])]
    return out


def persistently_late(collectives: pd.DataFrame) -> set[int]:
    """Ranks that arrive last at most of their collectives."""
    late = late_arrivals(collectives)
    return set(int(r) for r in late.loc[is_persistently_late(late), "rank"])


def is_persistently_late(late: pd.DataFrame) -> pd.Series:
    """Rows of ``late_arrivals`` whose rank is late at most collectives, and by more than noise."""
    others = [late["lateness_ms"].drop(index=i).median() if len(late) > 1 else 0.0 for i in late.index]
    return ((late["late_share"] >= PERSISTENTLY_LATE) & (late["lateness_ms"] >= MIN_LATENESS_MS)
            & (late["lateness_ms"] >= LATENESS_RATIO * pd.Series(others, index=late.index))
            & (late["p_value"] < LATE_ALPHA))
