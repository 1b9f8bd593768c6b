"""pipeline_bubble's words (judge/detectors/pipeline_bubble.py), by case: too few microbatches for the stages,
unequal stages, or the pipeline as measured (balanced)."""

from __future__ import annotations

from diagtrain.profiler.analyzer.report.words import Facts, Words


def _few_microbatches(f: Facts) -> str:
    m, p = f["microbatches"], f["stages"]
    return (f"{m} microbatch{'es' if m != 1 else ''} for {p} pipeline stages: each stage idles (p-1)/(m+p-1) = "
            f"{f['bubble']:.0%} of every step waiting for the pipeline to fill and drain.")


def _per_stage(f: Facts) -> str:
    """``stage 0: 12 ms (idle 30%), 1.20 GFLOP; stage 1: ...``, then what the busiest stage idles, where timed."""
    timed = f["timed"]
    unit = " ms" if timed else ""
    per_stage = "; ".join(f"stage {st['stage']}: {st['work']:,.0f}{unit}"
                          + (f" (idle {st['idle_share']:.0%})" if timed else "")
                          + (f", {st['gflops']:.2f} GFLOP" if st["gflops"] is not None else "") for st in f["per_stage"])
    bubble = f["bubble"]
    measured = (f"; the busiest stage idles {f['pace_idle_share']:.0%} of the step"
                + (f" against the (p-1)/(m+p-1) = {bubble:.0%} of a balanced pipeline with {f['microbatches']} "
                   "microbatches" if bubble is not None else "") if timed else "")
    return per_stage + measured


def _unequal(f: Facts) -> str:
    busiest, layers = f["busiest"], f["layers"]
    return (f"pipeline stage {busiest} does {f['ratio']:.1f}x the work of stage {f['lightest']} (by {f['compared_by']}): "
            f"stage {busiest} (ranks {', '.join(map(str, f['busiest_ranks']))}) is the bottleneck and the other stages "
            f"wait for it every microbatch. Per stage: {_per_stage(f)}."
            + (f" Layers per stage: {layers}." if layers else ""))


def _balanced(f: Facts) -> str:
    slowed = (f" Stage {f['pace']} takes {f['time_ratio']:.1f}x the time of stage {f['quickest']} for the same work "
              f"({f['compared_by']} within {f['ratio']:.2f}x): its ranks are slowed by something other than the split "
              "(other processes on the host, a slower device)." if f["slowed"] else "")
    return (f"pipeline of {f['stages']} stages" + (f", {f['microbatches']} microbatches" if f["microbatches"] else "")
            + f" (stages from {f['stage_source']}); {f['source']} per step: {_per_stage(f)}." + slowed
            + _by_turns(f["turns"]))


def _by_turns(turns: dict | None) -> str:
    """Why medians this far apart are no unequal split: the stage was ahead by the ratio only now and then."""
    if turns is None:
        return ""
    top, low, ratio = turns["stage"], turns["lightest"], turns["ratio"]
    if turns["ahead"] == turns["steps"]:  # ahead in every step, but too few of them to tell
        return (f" Stage {top} took {ratio:g}x stage {low}'s time in all {turns['steps']} steps timed: too few to tell an "
                f"unequal split from a busy host's turns (pipeline_bubble.min_steps: {turns['min_steps']}).")
    return (f" Stage {top} took {ratio:g}x stage {low}'s time in only {turns['ahead']} of {turns['steps']} steps: an "
            "unequal split would in every step, so this is the host's load by turns.")


WORDS = {
    "pipeline_bubble/few_microbatches": Words(
        _few_microbatches,
        lambda f: (f"Use at least {f['suggested']} microbatches ({f['per_stage']}x the stages), or an interleaved "
                   "schedule.")),
    "pipeline_bubble/unequal": Words(
        _unequal,
        "Rebalance the split: move layers from the busiest stage to the others (the first and last stages also carry "
        "the embedding and the output layer)."),
    "pipeline_bubble/balanced": Words(_balanced, "Nothing to fix: the stages are balanced within the threshold."),
}
