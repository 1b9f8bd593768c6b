"""memory_growth: a rank's memory rises step after step after warm-up, as a leak does.

From the always-on step records: the process's resident memory at each step's end (``rss_bytes``)
and, on a GPU, the caching allocator's allocated bytes (``gpu_allocated_bytes``). A clean job's
memory grows in its first steps (allocator pools, caches, DDP's buckets, the optimizer's state) and
then levels off; a leak keeps adding about the same amount every step. So after warm-up, the
rank's memory must rise at a robust rate (Theil-Sen: the median of the slopes between every two
steps) that is large enough to matter, and rise by a fair share of that rate in most steps: a
one-off jump (a cache filled once) or an allocator's plateau rises in one step or none. The
profiler's own buffers grow the RSS of profiled steps and of the step that builds the trace: those
steps are not judged. Where telemetry knows the GPU's capacity (NVML) or the host's free memory,
the finding says at which step, at this pace, it would be full.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.judge.detectors.base import Steady, steady_columns, time_range
from diagtrain.profiler.analyzer.judge.findings import Candidate
from diagtrain.profiler.analyzer.run.tables import Tables, unix_seconds
from diagtrain.profiler.util.groups import distinct_rows, median_of_others
from diagtrain.profiler.util.settings import section, setting
from diagtrain.profiler.util.units import MIB


@section("memory_growth")
class MemoryGrowth:
    """When a rank's memory rises steadily enough, and by enough, to be a leak."""

    # Clean runs here (DDP, FSDP2, TP x FSDP, pipelines; 2-4 CPU ranks): RSS grows 2-17 MiB a step in steps
    # 1-3, then moves by -6 to +10 MiB a step with no trend (FSDP2 the most, DDP within 2 MiB).
    warmup_steps: int = setting(3, "memory grows in a clean run's first steps (allocator pools, caches, DDP's buckets, "
                                "the optimizer's state) and then levels off: steps up to this one are left out, as "
                                "are steady.warmup_steps")
    min_steps: int = setting(5, "steps after warm-up needed to tell a steady rise from a plateau or a jump")
    min_rate_mib: float = setting(1.0, "a rise below this many MiB a step is allocator and heap noise, and too slow "
                                  "to matter in most runs")
    min_growth_share: float = setting(0.05, "... and it must add this share of the rank's memory at the end of warm-up "
                                      "in the steps judged: a few MiB on a rank holding GiBs is no threat, and two "
                                      "noisy steps of a clean FSDP2 rank (up to 10 MiB each) are not a leak")
    rising_share: float = setting(0.7, "rising in at least this share of its steps: a leak adds memory in nearly every "
                                  "step, a one-off jump or a profiled window's buffers in a few")
    rise_of_rate: float = setting(0.25, "a step counts as rising when it adds at least this share of the fitted rate: "
                                  "a heap's creep of a few pages is not the rise a large jump's slope suggests")
    error_horizon_min: float = setting(60.0, "projected to fill its GPU (or its host's memory, shared with the ranks "
                                       "beside it) within this many minutes of training at its pace: an error, the "
                                       "job will die of it (the planned run length is not known to the analysis)")
    min_unprofiled_steps: int = setting(2, "RSS: rises of steps neither profiled nor right after a profiled window "
                                        "needed to judge (the profiler's own buffers grow in those)")
    max_fit_points: int = setting(256, "a longer run is fitted on this many evenly spaced groups of steps (their "
                                  "medians): Theil-Sen is quadratic in its points")


SETTINGS = (MemoryGrowth, Steady)
# Which memory, the device's first: what a GPU job runs out of.
MEMORIES = ("gpu_allocated_bytes", "rss_bytes")


@dataclass
class Growth:
    """One rank's steady rise of one kind of memory."""

    rank: int
    memory: str  # one of MEMORIES
    steps: list[int]
    start_bytes: float
    end_bytes: float
    own_growth_bytes: float  # the rises of the steps judged (not profiled, nor right after a profiled window)
    rate: float  # bytes a step (Theil-Sen; steps not judged counted at the median of the others' rises)
    rising: int  # steps that rose by rise_of_rate of the rate
    compared: int  # steps compared with the one before
    step_ms: float  # median step time over those steps
    profiled_steps: list[int] = field(default_factory=list)  # whose rise was the profiler's, not judged
    capacity_bytes: float | None = None  # the GPU's memory, or the host's
    steps_left: float | None = None  # at this pace (the host's: with every growing rank on it)
    sharing: int = 1  # ranks whose RSS grows on the same host (their rises together fill it)
    against_peers: bool = False  # judged on its memory less its peers' movements (theirs level off)

    @property
    def per_min(self) -> float | None:
        return self.rate * 60e3 / self.step_ms if self.step_ms > 0 else None


def detect(tables: Tables) -> list[Candidate]:
    """Ranks whose memory rises step after step after warm-up."""
    s = MemoryGrowth.active()
    steps = steady_columns(tables.steps, ("rank", "step", "start", "end", "wall_ms", "profiled", *MEMORIES),
                           at_least=s.min_steps)
    if steps.empty or not any(m in steps for m in MEMORIES):
        return []
    steps = steps[steps["step"] > max(s.warmup_steps, Steady.active().warmup_steps)]
    groups = tables.structure.peer_groups(sorted(int(r) for r in steps["rank"].unique()))
    growths = []
    for memory in [m for m in MEMORIES if m in steps]:
        known = steps[steps[memory].notna()]
        known = known.assign(_peers=peer_level(known, memory, groups))
        growths += [g for rank, rows in known.groupby("rank")
                    if (g := _growth(int(rank), memory, rows, s) or _against_peers(int(rank), memory, rows, s))]
    _capacity(growths, tables)
    by_rank: dict[int, list[Growth]] = {}
    for g in growths:
        by_rank.setdefault(g.rank, []).append(g)
    return [_finding(found, tables, s) for _, found in sorted(by_rank.items())]


def _growth(rank: int, memory: str, rows: pd.DataFrame, s: MemoryGrowth) -> Growth | None:
    """The rank's steady rise of ``memory`` over these steps, if it is one.

    The profiler keeps its events in host memory while it records and builds its trace when the
    window ends: a rank's RSS rises in profiled steps and the step after each window, whatever the
    job does. Those steps' rises are not the job's: for RSS they are left out of the rising steps,
    the series is fitted as if they had risen at the median of the other steps' rises, and the growth
    that must reach ``min_growth_share`` is the other steps' alone.
    """
    rows = rows[rows[memory].notna()].sort_values("step")
    if len(rows) < s.min_steps:
        return None
    x, y = rows["step"].to_numpy(dtype=float), rows[memory].to_numpy(dtype=float)
    per_step = np.diff(y) / np.diff(x)
    profiled = rows["profiled"].fillna(False).to_numpy(dtype=bool) if "profiled" in rows else np.zeros(len(x), bool)
    # A rise that ends in a profiled step, or in the one right after it (the trace is built then).
    touched = (profiled[1:] | profiled[:-1]) if memory == "rss_bytes" else np.zeros(len(per_step), bool)
    own = per_step[~touched]
    if len(own) < s.min_unprofiled_steps:
        return None
    gaps = np.diff(x)
    # What the job itself added, in the steps that can be judged: profiled ones count as adding nothing.
    own_growth = float((own * gaps[~touched]).sum())
    filled = np.where(touched, float(np.median(own)), per_step)
    rate = theil_sen(*_thinned(x, y[0] + np.concatenate([[0.0], np.cumsum(filled * gaps)]), s.max_fit_points))
    start, end = float(y[0]), float(y[-1])
    if not (rate >= s.min_rate_mib * MIB and own_growth >= s.min_growth_share * start and end > start):
        return None
    rising = int((own >= s.rise_of_rate * rate).sum())
    if rising < s.rising_share * len(own):
        return None
    wall = rows["wall_ms"] if "wall_ms" in rows else pd.Series(dtype=float)
    steps = rows["step"].to_numpy(dtype=np.int64)  # as arrays: a long run's rank has hundreds of thousands
    return Growth(rank, memory, steps.tolist(), start, end, own_growth, rate, rising, len(own),
                  float(wall.median()) if wall.notna().any() else math.nan, profiled_steps=steps[1:][touched].tolist())


def peer_level(rows: pd.DataFrame, memory: str, groups: list[list[int]]) -> np.ndarray:
    """Per row, the median of ``memory`` of the other ranks of its peer group in its step (NaN where it has none):
    every rank's at once, not a group-by of its peers for each rank (ranks squared at cluster size)."""
    group_of = {r: i for i, g in enumerate(groups) for r in g}
    group = rows["rank"].map(group_of).fillna(-1).to_numpy(dtype=np.int64)  # no group: peers of each other
    cell, _ = distinct_rows(rows["step"].to_numpy(), group)
    return median_of_others(rows[memory].to_numpy(dtype=float), cell)


def _against_peers(rank: int, memory: str, rows: pd.DataFrame, s: MemoryGrowth) -> Growth | None:
    """The rank's rise once what its peers' memory did step by step (``rows["_peers"]``, peer_level) is taken out,
    where their memory levels off: the heap's and allocator's movements every rank shares (a few MiB either way
    each step) can hide a leak's rise in the steps a rank's own series is judged by, and a rank that rises while
    its peers do not is no warm-up."""
    rows = rows[rows["_peers"].notna()].sort_values("step")
    if len(rows) < s.min_steps:
        return None  # no peers to compare with
    level = rows["_peers"].to_numpy(dtype=float)
    if theil_sen(*_thinned(rows["step"].to_numpy(dtype=float), level, s.max_fit_points)) >= s.min_rate_mib * MIB:
        return None  # they grow too: each is judged on its own series
    found = _growth(rank, memory, rows.assign(**{memory: rows[memory].to_numpy(float) - (level - level[0])}), s)
    if found is not None:
        found.against_peers = True
        found.start_bytes, found.end_bytes = float(rows[memory].iloc[0]), float(rows[memory].iloc[-1])
    return found


def theil_sen(x: np.ndarray, y: np.ndarray) -> float:
    """The median of the slopes between every two points (robust to a few outliers)."""
    i, j = np.triu_indices(len(x), k=1)
    dx = x[j] - x[i]
    keep = dx != 0
    return float(np.median((y[j] - y[i])[keep] / dx[keep])) if keep.any() else 0.0


def _thinned(x: np.ndarray, y: np.ndarray, most: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ``most`` points: the medians of evenly split consecutive groups (all points if fewer)."""
    if len(x) <= most:
        return x, y
    groups = np.array_split(np.arange(len(x)), most)
    return np.array([np.median(x[g]) for g in groups]), np.array([np.median(y[g]) for g in groups])


def _capacity(growths: list[Growth], tables: Tables) -> None:
    """Fill each growth's capacity and steps left from telemetry: the GPU's memory (NVML) for a rank's
    GPU memory, the host's for its RSS (whose headroom every growing rank on the host shares)."""
    t = tables.telemetry
    if t is None or t.empty or "kind" not in t or "mem_total_bytes" not in t:
        return
    t = t.assign(_unix=unix_seconds(t["time"])).sort_values("_unix")
    host_rates: dict[str, float] = {}
    sharing: dict[str, int] = {}
    for g in growths:
        if g.memory == "rss_bytes" and tables.rank_hosts.get(g.rank):
            host = tables.rank_hosts[g.rank]
            host_rates[host] = host_rates.get(host, 0.0) + g.rate
            sharing[host] = sharing.get(host, 0) + 1
    for g in growths:
        if g.memory == "gpu_allocated_bytes" and "rank" in t:
            rows, rate = t[(t["kind"] == "gpu") & (t["rank"] == g.rank)], g.rate
        elif g.memory == "rss_bytes" and "host" in t and tables.rank_hosts.get(g.rank):
            host = tables.rank_hosts[g.rank]
            rows, rate = t[(t["kind"] == "host") & (t["host"] == host)], host_rates[host]
            g.sharing = sharing[host]
        else:
            continue
        rows = rows[rows["mem_total_bytes"].notna()]
        if rows.empty:
            continue
        last = rows.iloc[-1]
        g.capacity_bytes = float(last["mem_total_bytes"])
        used = last.get("mem_used_bytes")
        if used is None or pd.isna(used):
            continue
        g.steps_left = max(0.0, g.capacity_bytes - float(used)) / rate


def _finding(found: list[Growth], tables: Tables, s: MemoryGrowth) -> Candidate:
    lead = found[0]  # the GPU's when it grows: what the job runs out of first
    rank = lead.rank
    rows = tables.steps[(tables.steps["rank"] == rank) & tables.steps["step"].isin(lead.steps)]
    return Candidate(
        kind="memory_growth", ranks=[rank], steps=lead.steps,
        time_range=time_range(rows),
        facts={"growths": [_facts(g, lead) for g in found]},
        metrics={
            "memory": lead.memory,
            "observed_mib_per_step": lead.rate / MIB, "threshold_mib_per_step": s.min_rate_mib,
            "mib_per_min": None if lead.per_min is None else lead.per_min / MIB,
            "start_bytes": lead.start_bytes, "end_bytes": lead.end_bytes, "growth_bytes": lead.end_bytes - lead.start_bytes,
            "own_growth_bytes": lead.own_growth_bytes,
            "growth_share": lead.own_growth_bytes / lead.start_bytes if lead.start_bytes else None,
            "threshold_growth_share": s.min_growth_share,
            "rising_steps": lead.rising, "compared_steps": lead.compared, "threshold_rising_share": s.rising_share,
            "against_peers": lead.against_peers,
            "capacity_bytes": lead.capacity_bytes,
            "projected_full_step": None if lead.steps_left is None else lead.steps[-1] + math.ceil(lead.steps_left),
            "growing": {g.memory: {"mib_per_step": g.rate / MIB, "growth_bytes": g.end_bytes - g.start_bytes,
                                   "capacity_bytes": g.capacity_bytes, "steps_left": g.steps_left} for g in found},
        },
        evidence=[{"type": "steps", "rank": rank, "step": int(r.step), lead.memory: int(getattr(r, lead.memory))}
                  for r in _evidence_rows(rows, lead.memory).itertuples()],
    )


def _facts(g: Growth, lead: Growth) -> dict[str, Any]:
    """One memory's rise, as its words (report/words/memory_growth.py) and its severity's rule read it."""
    return {"memory": g.memory, "bytes_per_step": g.rate, "bytes_per_min": g.per_min,
            "steps": None if g is lead else g.steps,  # the lead's are the finding's
            "last_step": g.steps[-1], "start_bytes": g.start_bytes, "end_bytes": g.end_bytes, "rising": g.rising,
            "compared": g.compared, "against_peers": g.against_peers, "profiled_steps": g.profiled_steps,
            "capacity_bytes": g.capacity_bytes, "steps_left": g.steps_left, "step_ms": g.step_ms, "sharing": g.sharing}


def _evidence_rows(rows: pd.DataFrame, memory: str) -> pd.DataFrame:
    """The first, a middle and the last of the steps: the rise in three numbers."""
    rows = rows[rows[memory].notna()].sort_values("step")
    return rows.iloc[sorted({0, len(rows) // 2, len(rows) - 1})] if len(rows) else rows
