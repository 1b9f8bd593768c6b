"""slow_startup's words (judge/detectors/slow_startup.py)."""

from __future__ import annotations

from diagtrain.profiler.analyzer.report.words import Facts, Words
from diagtrain.profiler.analyzer.run import job_time

SEGMENT_WORDS = {
    job_time.LAUNCH: "the launcher and Python's own start (a slow file system, a large environment)",
    job_time.IMPORTS: "imports (torch and the job's own modules; on a shared file system, every rank reads them)",
    job_time.PROCESS_GROUP: "the process group's set-up (the rendezvous: every rank waits for the last to arrive)",
    job_time.FIRST_STEPS: "building the job and its first steps (model and data set-up, loading a checkpoint, "
                          "compilation, the allocator's warm-up)",
}


def _explanation(f: Facts) -> str:
    startup, wall = f["startup_s"], f["wall_s"]
    split = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in f["segments_s"].items())
    return (f"the job took {startup:.1f} s from its launch to its steady steps, {startup / wall:.0%} of its {wall:.1f} s "
            f"({split}); the longest part is {SEGMENT_WORDS.get(f['longest'], f['longest'])}.")


WORDS = {"slow_startup": Words(
    _explanation,
    "Shorten the longest part: for imports, a container image or a local copy of the environment; for the rendezvous, "
    "check that every rank starts together (a slow host, a scheduler); for the first steps, load checkpoints "
    "asynchronously and cache compilation (TORCHINDUCTOR_CACHE_DIR, torch.compile's mega-cache).")}
