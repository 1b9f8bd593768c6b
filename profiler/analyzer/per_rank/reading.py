"""How one rank's trace is read into stretches of work and calls: the rank stage's settings.

The rank stage runs in worker processes (the local pool's, a Dask cluster's), which do not see the
analysis' overrides: the analysis hands each task the values in force (:func:`in_force`), and a rank's
cache (analysis/cache) is used again only when it was made with the same values (rank/cache.py).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from diagtrain.profiler.util.settings import section, setting


@section("reading")
class Reading:
    """How a rank's trace becomes the critical path's work and its calls' flight records."""

    coalesce_gap_us: float = setting(50.0, "ops this close together are one stretch of work in the critical path: a "
                                     "node per aten op would make a GPU step tens of thousands of nodes, and a gap "
                                     "this short is launch overhead, not a dependency on anything")
    fr_match_tolerance_us: float = setting(5000.0, "without calls to go by, a flight-recorder entry is the traced "
                                           "collective's that started within this of the entry's creation")
    created_slack_us: float = setting(200.0, "a flight-recorder entry is created while its call runs: this much on "
                                      "either side of the call allows for the clocks' rounding")
    max_queue_us: float = setting(5_000_000.0, "work gloo's thread picks up this long after a call belongs to a "
                                  "later call")


def in_force() -> dict[str, Any]:
    """The reading settings in force now, as a task hands them to its worker."""
    return asdict(Reading.active())
