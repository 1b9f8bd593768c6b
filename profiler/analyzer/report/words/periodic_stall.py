"""periodic_stall's words (judge/detectors/periodic_stall.py)."""

from __future__ import annotations

from diagtrain.profiler.analyzer.report.words import Facts, Words
from diagtrain.profiler.analyzer.run import job_time
from diagtrain.profiler.util.text import ranges

# What the part of the step that grew in the stalls is, where it is not a recorded phase.
PART_WORDS = {
    "outside phases": "work outside any recorded phase (a checkpoint, logging, evaluation or garbage collection "
                      "called from the training loop)",
    job_time.BETWEEN: "the time between two recorded steps (an evaluation or a checkpoint between them)",
    "data": "the wait for data (a new file, shard or epoch of the loader)",
    "device idle": "the device's idle time before the step (its host busy with something else)",
}


def _explanation(f: Facts) -> str:
    part = PART_WORDS.get(f["part"], f"the {f['part']} phase")
    return (f"every {f['every']} steps (steps {ranges(f['stalls'])}) every rank's step takes {f['stall_ms']:.0f} ms "
            f"longer than its typical {f['typical_ms']:.1f} ms, all ranks together; the time grows in {part} "
            f"(+{f['part_extra_ms']:.0f} ms).")


WORDS = {"periodic_stall": Words(
    _explanation,
    "If it is a checkpoint: save asynchronously (torch.distributed.checkpoint.async_save blocks only for the copy to "
    "host memory) or less often; if an evaluation: fewer evaluation batches or a less frequent one; if garbage "
    "collection: gc.freeze() after start-up, or gc.disable() with a gc.collect() at a chosen step on every rank.")}
