"""What every view's figures share."""

from __future__ import annotations

from typing import Any


def empty(message: str, height: int = 260) -> dict[str, Any]:
    """A blank figure that says why there is nothing to draw."""
    return {"data": [], "layout": {
        "annotations": [{"text": message, "showarrow": False, "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5,
                         "font": {"size": 14, "color": "#666"}}],
        "xaxis": {"visible": False}, "yaxis": {"visible": False}, "height": height,
        "meta": {"empty": message}}}
