"""Colours and the few CSS rules of the dashboard, in one place.

One meaning per colour across the timeline's levels of detail: the span kinds (zoomed in) and the
step phases (zoomed out) never share a colour, so a legend read at one zoom holds at every other.
"""

from __future__ import annotations

KIND_COLORS = {"compute": "#4C78A8", "comm": "#F58518", "memory": "#54A24B", "idle": "#D3D3D3"}
PHASE_COLORS = {"data": "#B279A2", "forward": "#72B7B2", "backward": "#EECA3B", "forward_backward": "#72B7B2",
                "optimizer": "#9D755D", "metrics": "#FF9DA6", "checkpoint": "#79706E"}
STEP_COLOR = "#BAB0AC"  # a step without phase records
EXPORT_COLOR = "#3F3F3F"  # the profiler writing its trace after a profiled window: dark, never data
FINDING_COLORS = {"critical": "#B00020", "error": "#D62728", "warning": "#E8A200", "info": "#5A7D9A"}
