"""Numpy arrays as pandas columns without a copy.

pandas 3 (copy-on-write) copies an array given to ``frame[name] = array`` or ``frame.assign``, so that
the caller cannot change the frame through it later. The analyzer's arrays are new and never written
after, and at millions of events each such copy is a whole column of extra peak memory in a worker
(measured with benchmarks/worker_memory.py): the columns that grow with events are set through here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd


def set_column(frame: pd.DataFrame, name: str, values: Any) -> None:
    """``frame[name] = values``, taking the array (or Categorical) as it is."""
    frame[name] = _series(frame, values)


def with_columns(frame: pd.DataFrame, **columns: Any) -> pd.DataFrame:
    """``frame.assign(**columns)``, taking the arrays as they are."""
    added = {name: _series(frame, values) for name, values in columns.items()}
    if frame.index.is_unique and frame.columns.is_unique and not frame.columns.isin(list(added)).any():
        # Only new columns: one frame made of all of them at once. assign copies the frame, then adds a
        # column at a time (0.6 ms for a trace's 9 argument columns, twice a rank).
        return pd.DataFrame({**{name: frame[name] for name in frame.columns}, **added})
    return frame.assign(**added)


def _series(frame: pd.DataFrame, values: Any) -> pd.Series:
    # The array's own dtype: an object array of strings and None stays so (not pandas' str with NaN).
    return pd.Series(values, index=frame.index, dtype=getattr(values, "dtype", None), copy=False)


def code_dtype(count: int) -> type[np.signedinteger]:
    """The narrowest signed integer for codes into ``count`` values (-1 left for none): an event's
    string codes are held for every event, and int32 codes cost 64 MiB at 16M events."""
    for dtype in (np.int8, np.int16):
        if count <= np.iinfo(dtype).max:
            return dtype
    return np.int32
