"""Public import path of the in-rank API: ``from diagtrain.profiler.instrument import StepRecorder``.

The code lives in :mod:`diagtrain.profiler.rank.instrument`; this path is kept because users'
training scripts import it (README, "Instrumenting your own loop").
"""

from diagtrain.profiler.rank.instrument import StepRecorder, current_rank, explicit_recorder_active

__all__ = ["StepRecorder", "current_rank", "explicit_recorder_active"]
