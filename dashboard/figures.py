"""What every view's figures share."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np


def empty(message: str, height: int = 260, loading: bool = False) -> dict[str, Any]:
    """A blank figure that says why there is nothing to draw (or, ``loading``, what is coming)."""
    return {"data": [], "layout": {
        "annotations": [{"text": message, "showarrow": False, "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5,
                         "font": {"size": 14, "color": "#666"}}],
        "xaxis": {"visible": False}, "yaxis": {"visible": False}, "height": height,
        "meta": {"loading": message} if loading else {"empty": message}}}


def typed(values: Any) -> dict[str, str]:
    """A float64 array in Plotly's typed-array form (base64): a fraction of a JSON list's size."""
    return {"dtype": "f8", "bdata": base64.b64encode(np.ascontiguousarray(values, dtype=np.float64)).decode()}
