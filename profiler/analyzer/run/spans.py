"""Reading back a rank's timeline spans: what its loader wrote to the cache, put on the run's common clock."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def read_spans(path: Path, clock_shift_us: float = 0.0) -> pd.DataFrame | None:
    """A rank's timeline spans file (start_us, end_us, kind, name), moved onto the common clock; None if gone."""
    try:
        spans = pd.read_parquet(path, columns=["start_us", "end_us", "kind", "name"])
    except (OSError, ValueError):
        return None  # the cache was removed after the analysis
    return spans.assign(start_us=spans["start_us"] + clock_shift_us, end_us=spans["end_us"] + clock_shift_us)
