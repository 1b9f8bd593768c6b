"""A rank's own time from the always-on step counters, without traces.

In synchronous training a rank that finishes its part early waits for the slowest one inside the
next collective, so a fast rank's step and phases are as long as the slow rank's. The counters in
steps.jsonl (``comm_ms``: time blocked in collectives and point-to-point operations; ``phase_comm_ms``:
the same per phase) take that waiting out: a step without it is the rank's own time, and a phase
that stands out only because the rank was blocked in it was spent waiting for another rank.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.judge.quantities import Measure, Quantity
from diagtrain.profiler.util.settings import section, setting
from diagtrain.profiler.util.groups import Groups


@section("own_time")
class OwnTime:
    """When a rank's excess in a phase was time spent waiting for another rank, not its own work."""

    waiting_share: float = setting(0.5, "a phase whose excess over its peers was at least this share time blocked "
                                   "in collectives was spent waiting for another rank (the cause is elsewhere)")


OWN_TIME = Quantity(Measure.OWN_TIME)
SOURCE = "counters"  # the kind of evidence, beside "trace" and "phases"


def own_time(steps: pd.DataFrame) -> dict[Quantity, pd.Series]:
    """``{OWN_TIME: wall - blocked in communication}`` per step row, where the counters measured it."""
    if "comm_wait_ms" not in steps or steps["comm_wait_ms"].isna().all():
        return {}
    return {OWN_TIME: steps["wall_ms"] - steps["comm_wait_ms"]}


def blocked_column(quantity: Quantity) -> str | None:
    """The step column of time blocked in collectives within ``quantity`` (a phase; None for the rest)."""
    return f"{quantity.phase}_comm_wait_ms" if quantity.measure is Measure.PHASE else None


def waited(blocked: np.ndarray, by_step: Groups, top: np.ndarray, excess_ms: np.ndarray) -> np.ndarray:
    """Per step, whether its candidate's excess in a phase is mostly time blocked in collectives, beyond what
    its peers were blocked there: it waited for another rank. ``blocked``: the phase's blocked ms per row compared;
    ``by_step``: those rows' steps (0 .. n-1); ``top``: each step's candidate row (-1 for none); ``excess_ms``: its
    excess per step. Every step at once: this decided each step of the straggler detector, a second of a long
    run's analysis as a function per step."""
    known = ~np.isnan(blocked)
    is_top = np.zeros(len(blocked), dtype=bool)
    is_top[top[top >= 0]] = True
    counted = by_step.within(known).sizes  # the candidate's own row among them
    peers = by_step.within(known & ~is_top).median(blocked)
    mine = blocked[np.maximum(top, 0)]
    share = OwnTime.active().waiting_share
    with np.errstate(invalid="ignore"):  # a step without a candidate or known peers: not waiting
        return (top >= 0) & ~np.isnan(mine) & (counted >= 2) & (mine - peers >= share * excess_ms)
