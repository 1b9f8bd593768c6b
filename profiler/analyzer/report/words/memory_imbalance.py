"""memory_imbalance's words (judge/detectors/memory_imbalance.py)."""

from __future__ import annotations

from diagtrain.profiler.analyzer.report.words import Facts, Words
from diagtrain.profiler.util.units import MIB


def _explanation(f: Facts) -> str:
    peak, median, state = f["peak_bytes"], f["median_bytes"], f["model_state_bytes"]
    where = (f"; the model state it holds needs about {state / MIB:.0f} MiB "
             f"({f['parameters']:,} parameters x {f['bytes_per_parameter']} bytes)") if state else ""
    return (f"rank {f['rank']} peaks at {peak / MIB:.0f} MiB, {(peak - median) / MIB:.0f} MiB ({peak / median:.2f}x) "
            f"above its peers' median of {median / MIB:.0f} MiB{where}.")


WORDS = {"memory_imbalance": Words(
    _explanation,
    "Find what that rank keeps that the others do not: tensors held across steps (logging, caches, a list of losses), "
    "an uneven shard or pipeline stage, or rank-specific code.")}
