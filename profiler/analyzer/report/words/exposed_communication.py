"""exposed_communication's words (judge/detectors/exposed_communication.py)."""

from __future__ import annotations

from diagtrain.profiler.analyzer.report.words import Facts, Words


def _explanation(f: Facts) -> str:
    # On CPU (gloo) toy runs communication dominates by construction: no saving is claimed for it.
    saving = (f"; overlapping it would save up to {f['exposed_ms']:.0f} ms per step" if f["on_gpu"] else
              "; on CPU (gloo) a small model's step is mostly communication by design, so no saving is claimed")
    top = [f"{t['op']} ({t['ms_per_step']:.0f} ms per step on each of its {t['ranks']} ranks)" for t in f["top"]]
    return (f"{f['share']:.0%} of the profiled step time ({f['exposed_ms']:.0f} ms per step, median over ranks and "
            f"steps) is communication that no computation overlaps{saving}"
            + (f". The longest collectives: {', '.join(top)}." if top else "."))


WORDS = {"exposed_communication": Words(
    _explanation,
    "Overlap it: larger DDP buckets or FSDP prefetching (forward/backward prefetch), fewer and larger collectives, or a "
    "higher compute-to-communication ratio (batch size per rank).")}
