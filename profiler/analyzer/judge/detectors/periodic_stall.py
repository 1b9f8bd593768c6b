"""periodic_stall: every N steps every rank's step takes much longer: a checkpoint, an evaluation, a new shard.

Read from the job's ledger (run/job_time.py): a step's time less what it lost to ranks' excess over their
peers (imbalance) is what every rank lost together. A step where that stands far above the typical step is a
stall; stalls that recur at a fixed interval are a periodic cause of the job's own, which no rank's excess
shows. The part of the step that grew in them (a phase, work outside the phases, the time between steps)
says what it is.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.judge.detectors.base import Steady, steady_job_steps, time_range
from diagtrain.profiler.analyzer.judge.findings import Candidate
from diagtrain.profiler.analyzer.run import job_time
from diagtrain.profiler.util.settings import section, setting
from diagtrain.profiler.util.stats import MAD_TO_SIGMA
from diagtrain.profiler.analyzer.run.tables import Tables


@section("periodic_stall")
class PeriodicStall:
    """When steps that every rank lost time in together, at a fixed interval, are a periodic stall."""

    min_extra_share: float = setting(0.5, "a step this share longer than the typical one, in time every rank lost "
                                     "together, is a stall ...")
    noise_sigmas: float = setting(3.0, "... and longer by this many robust standard deviations of the steady steps")
    min_extra_ms: float = setting(5.0, "... and by at least this much: timer resolution and scheduling jitter")
    min_stalls: int = setting(3, "a period is named once stalls recur at one interval this many times")
    intervals: int = setting(4, "the intervals tried: the most common between two stalls (a long run's noisy stalls "
                             "hold thousands of them, and each is tried at every offset)")
    lattice_share: float = setting(0.75, "... at this share of that interval's steps from the first stall to the "
                                   "last (one stall may hide under a busy host's noise)")


SETTINGS = (PeriodicStall, Steady)

# The parts of a step a stall can grow in, in words (a ledger part: a phase, or the job's own categories).

def detect(tables: Tables) -> list[Candidate]:
    """One finding per run whose shared stalls recur at a fixed interval."""
    s = PeriodicStall.active()
    steps = steady_job_steps(tables)
    if len(steps) < 2 * s.min_stalls:
        return []
    # What every rank lost together, less diagtrain's own trace writing after a profiled window.
    shared = (steps["time_ms"] - steps[job_time.column(job_time.IMBALANCE)]
              - steps[job_time.column(job_time.PROFILER)]).to_numpy()
    typical = float(np.median(shared))
    floor = max(s.min_extra_share * typical, s.min_extra_ms)
    bar = max(floor, s.noise_sigmas * _noise(shared))
    stalled_steps = shared - typical > bar
    # A stall grows one part of the step (a checkpoint the work outside the phases, a new shard the data wait):
    # that part is also weighed against its own noise, not the whole step's. On a busy host a CPU-bound part (a
    # transform in the main process) varies by tens of ms from step to step; that raised the whole step's bar over a
    # checkpoint's and hid it, in a part that is otherwise quiet.
    for part in _parts(steps):
        values = steps[part].to_numpy(dtype=float)
        stalled_steps |= values - np.median(values) > max(floor, s.noise_sigmas * _noise(values))
    stalled = [int(x) for x in steps.loc[stalled_steps, "step"]]
    found = period(stalled, s)
    if found is None:
        return []
    every, stalls = found
    rows = steps[steps["step"].isin(stalls)]
    others = steps[~steps["step"].isin(stalled)]
    normal_ms = float(others["time_ms"].median())
    extra = (rows["time_ms"] - normal_ms).clip(lower=0.0)
    part, grew_ms = _grown_part(rows, others)
    return [Candidate(
        kind="periodic_stall", ranks=sorted(int(r) for r in tables.ledger["rank"].unique()),
        steps=stalls, time_range=time_range(rows),
        facts={"every": every, "stalls": stalls, "stall_ms": float(extra.median()), "typical_ms": normal_ms,
               "part": part, "part_extra_ms": grew_ms},
        metrics={"period_steps": every, "stalls": len(stalls), "stall_ms": float(extra.median()),
                 "typical_ms": normal_ms, "threshold_ms": bar, "part": part, "part_extra_ms": grew_ms,
                 "lost_ms": float(extra.sum()), "pattern": f"every {every} steps", "source": "job_ledger",
                 "unperiodic_stalls": sorted(set(stalled) - set(stalls))},
        evidence=[{"type": "job_steps", "step": int(st), "step_ms": round(float(w), 3)}
                  for st, w in rows[["step", "time_ms"]].head(20).itertuples(index=False)],
    )]


def period(stalled: list[int], s: PeriodicStall | None = None) -> tuple[int, list[int]] | None:
    """The interval and the stalls on it, or None: of every interval between two stalls, with at least
    ``min_stalls`` stalls on it and ``lattice_share`` of its steps from the first to the last, the one whose
    stalls less its missed steps are most (a stall every 5 steps with one hidden, not every 10), then the
    fullest (an odd stall between two of every 4 does not make it every 2)."""
    s = s or PeriodicStall.active()
    best: tuple[tuple[int, float], int, list[int]] | None = None
    gaps = Counter(b - a for a, b in zip(stalled, stalled[1:]) if b - a > 1)
    for every in sorted(g for g, _ in gaps.most_common(s.intervals)):
        for residue in sorted({x % every for x in stalled}):
            on = [x for x in stalled if x % every == residue]
            slots = (on[-1] - on[0]) // every + 1
            score = (2 * len(on) - slots, len(on) / slots)
            if len(on) >= s.min_stalls and len(on) >= s.lattice_share * slots and (best is None or score > best[0]):
                best = (score, every, on)
    return None if best is None else (best[1], best[2])


def _noise(values: np.ndarray) -> float:
    """A robust standard deviation of ``values`` (from their median absolute deviation)."""
    return MAD_TO_SIGMA * float(np.median(np.abs(values - np.median(values))))


def _parts(steps: pd.DataFrame) -> list[str]:
    """The columns of the parts a stall can grow in: each ledger part's shared work, and the time between steps."""
    return [c for c in steps.columns if c.startswith("part_")] + [job_time.column(job_time.BETWEEN)]


def _grown_part(stalls: pd.DataFrame, others: pd.DataFrame) -> tuple[str, float]:
    """The part of the step that grew most in the stalls against the other steps (medians), and by how much."""
    parts = {c[len("part_"):-len("_ms")]: c for c in stalls.columns if c.startswith("part_")}
    parts[job_time.BETWEEN] = job_time.column(job_time.BETWEEN)
    grew = {p: float(stalls[c].median() - others[c].median()) for p, c in parts.items()}
    part = max(grew, key=grew.get)
    return part, grew[part]
