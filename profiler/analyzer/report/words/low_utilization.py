"""low_utilization's words (judge/detectors/low_utilization.py)."""

from __future__ import annotations

from diagtrain.profiler.analyzer.report.words import Words

WORDS = {"low_utilization": Words(
    lambda f: (f"rank {f['rank']}'s GPU runs kernels only {f['util_percent']:.0f}% of the time during steps "
               f"(median of {f['samples']} samples)."),
    "Profile a few steps (--profile-steps) to see what the GPU waits for: the data loader, host-side Python, "
    "synchronizations, or exposed communication.")}
