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
from diagtrain.profiler.util.stats import median_known


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


def waited(blocked: np.ndarray, ranks: np.ndarray, rank: int, excess_ms: float) -> bool:
    """Whether ``rank``'s excess in a phase in one step is mostly time blocked in collectives, beyond what
    its peers were blocked there (``blocked``: the phase's blocked ms of the step's rows, ``ranks`` theirs)."""
    # Arrays, not the step's rows re-indexed: this runs for every step of the straggler detector.
    known = ~np.isnan(blocked)
    ranks, blocked = ranks[known], blocked[known]
    mine = ranks == rank
    if not mine.any() or len(blocked) < 2:
        return False
    return float(blocked[mine][0] - median_known(blocked[~mine])) >= OwnTime.active().waiting_share * excess_ms
