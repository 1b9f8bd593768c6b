"""input_bound's words (judge/detectors/input_bound.py)."""

from __future__ import annotations

from diagtrain.profiler.analyzer.report.words import Words

WORDS = {"input_bound": Words(
    lambda f: (f"the job is bound by its input: its ranks wait {f['data_ms']:.1f} ms for their next batch in a step of "
               f"{f['step_ms']:.1f} ms ({f['data_ms'] / f['step_ms']:.0%}), every rank alike, in {f['steps_bound']} of "
               f"{f['steady_steps']} steady steps; the devices and the model wait for data."),
    "Load ahead of the model: DataLoader(num_workers=N, prefetch_factor=2..4, pin_memory=True, "
    "persistent_workers=True), so that batches are read and transformed while the model computes; move heavy "
    "per-sample transforms to the workers or the GPU, and check the storage's read speed.")}
