"""missing_evidence's words (judge/detectors/missing_evidence.py): by case, which verdict could not be reached, why,
and the command that would reach it."""

from __future__ import annotations

from diagtrain.profiler.analyzer.report.words import Facts, Words

PROFILE_HINT = "diagtrain run --profile-steps 4-6 -- <your command>"


def _plural(n: int) -> str:
    return "s" if n != 1 else ""


def _no_per_rank_evidence(f: Facts) -> str:
    profiled = f["profiled_steps"]
    if profiled:
        return (f"only {profiled} profiled step{_plural(profiled)}: a rank's step-to-step variation is unknown, so only "
                "a very large excess would count")
    return ("no profiled steps and no per-step times of each rank's own work (data wait, compute, time in collectives): "
            "in a synchronous job every rank's step lasts as long as the slowest's, so step times cannot say which rank "
            "is slow or waits for data")


def _words(what: str, missing, how) -> Words:
    """``<what> could not be checked: <missing>.``, and how to check it."""
    return Words(lambda f: f"{what} could not be checked: {missing if isinstance(missing, str) else missing(f)}.", how)


WORDS = {
    "missing_evidence/too_few_steps": _words(
        "step-to-step comparison",
        lambda f: (f"only {f['steps']} step{_plural(f['steps'])} recorded; the first carries start-up and "
                   f"{f['min_steady_steps']} more are needed to compare ranks"),
        lambda f: f"Run at least {f['min_steps'] + 2} steps."),
    "missing_evidence/no_per_rank_evidence": _words(
        "stragglers and data stalls", _no_per_rank_evidence,
        lambda f: (f"Profile {f['min_profiled_steps']} or more steps after warm-up: `{PROFILE_HINT}` (or time phases "
                   "with diagtrain.profiler.instrument.StepRecorder).")),
    "missing_evidence/pipeline_without_busy_time": _words(
        "pipeline stage balance",
        lambda f: (f"a pipeline of {f['stages']} stages was found (from {f['stage_source']}) but no stage's busy time "
                   "per step was recorded"),
        f"Profile a few steps: `{PROFILE_HINT}`."),
    "missing_evidence/hang_without_dumps": _words(
        "where the job hangs", "no rank left a flight-recorder dump or its stacks",
        "Run the job under `diagtrain run` (it dumps every rank's state when steps stop), or pass the dumps NCCL wrote "
        "on its timeout: `diagtrain analyze RUN --flight-recorder DIR`."),
}
