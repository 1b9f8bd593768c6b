"""The job's wall time by category as one stacked bar: report.html, the dashboard's overview and the notebook."""

from __future__ import annotations

from typing import Any

from diagtrain.profiler.analyzer.report.sections import JOB_WORDS

# One colour per category: computing the one that stands out, the job's losses in warm tones, the rest grey.
COLORS = {"compute": "#2E7D32", "data": "#B279A2", "communication": "#F58518", "imbalance": "#D62728",
          "other": "#79706E", "between": "#BAB0AC", "profiler": "#3F3F3F", "startup": "#4C78A8",
          "teardown": "#9ECAE9"}


def figure(section: dict[str, Any] | None) -> Any:
    """A plotly figure of report.json's ``job_time`` (None where the run has none)."""
    import plotly.graph_objects as go

    if not section or not section.get("wall_s"):
        return None
    wall, seconds = section["wall_s"], section["seconds"]
    # As the job went: start-up, the steps' categories, after the last step.
    order = ["startup", *(c for c in seconds if c not in ("startup", "teardown")), "teardown"]
    bars = [go.Bar(name=JOB_WORDS.get(c, c), x=[seconds[c]], y=["job"], orientation="h", marker_color=COLORS.get(c),
                   hovertemplate=f"{JOB_WORDS.get(c, c)}: %{{x:.2f}} s ({seconds[c] / wall:.0%})<extra></extra>")
            for c in order if seconds.get(c, 0.0) > 0]
    return go.Figure(bars, layout={
        "barmode": "stack", "height": 190, "margin": {"l": 40, "r": 20, "t": 40, "b": 30},
        "title": f"Where the job's {wall:.1f} s went: goodput {section['goodput']:.0%}",
        "xaxis_title": "seconds", "legend": {"orientation": "h", "y": -0.5, "traceorder": "normal"},
        "yaxis": {"visible": False}})
