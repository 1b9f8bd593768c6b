"""The work a rank did, counted rather than timed: matrix-multiply FLOPs from the recorded shapes.

Time spent in operators says how long a rank computed; on a host shared with other processes that
grows with every time the rank is descheduled, so two ranks doing the same work can differ by 2x.
The shapes of the matrix multiplies (traces record them) say how much work there was, whatever the
host did: 2·M·K·N per product. Counted on the leaf ops only (``aten::linear`` and
``aten::matmul`` call ``aten::addmm``/``aten::mm``), forward and backward alike.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# op -> positions of the two matrices in its "Input Dims"
MATMULS = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::bmm": (0, 1), "aten::baddbmm": (1, 2)}


def matmul_flops(events: pd.DataFrame) -> np.ndarray:
    """FLOPs of each event (0 for events that are not a matrix multiply with recorded shapes)."""
    flops = np.zeros(len(events))
    if "input_dims" not in events:
        return flops
    names = events["name"].astype(str).to_numpy()
    for i in np.flatnonzero(np.isin(names, list(MATMULS))):
        flops[i] = _flops(events["input_dims"].iat[i], MATMULS[names[i]])
    return flops


def _flops(dims, positions: tuple[int, int]) -> float:
    try:
        a, b = dims[positions[0]], dims[positions[1]]
        if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
            return 0.0
        batch = float(np.prod(a[:-2])) if len(a) > 2 else 1.0
        return 2.0 * batch * a[-2] * a[-1] * b[-1]
    except (TypeError, IndexError, ValueError):
        return 0.0  # shapes not recorded (record_shapes off) or not a matrix
