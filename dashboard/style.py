"""Colours and the few CSS rules of the dashboard, in one place."""

from __future__ import annotations

KIND_COLORS = {"compute": "#4C78A8", "comm": "#F58518", "memory": "#54A24B", "idle": "#D3D3D3"}
PHASE_COLORS = {"data": "#B279A2", "forward": "#4C78A8", "backward": "#72B7B2", "forward_backward": "#4C78A8",
                "optimizer": "#54A24B", "metrics": "#F58518", "checkpoint": "#9D755D"}
STEP_COLOR = "#8FA3BF"
FINDING_COLORS = {"critical": "#B00020", "error": "#D62728", "warning": "#E8A200", "info": "#5A7D9A"}
