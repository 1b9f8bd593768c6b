"""memory_growth's words (judge/detectors/memory_growth.py): a sentence per memory that grows, the device's first."""

from __future__ import annotations

import math
from typing import Any

from diagtrain.profiler.analyzer.report.words import Facts, Words
from diagtrain.profiler.util.text import ranges
from diagtrain.profiler.util.units import MIB, fmt_bytes

MEMORIES = {"gpu_allocated_bytes": "GPU memory allocated", "rss_bytes": "resident memory (RSS)"}


def _sentence(g: dict[str, Any], steps: list[int]) -> str:
    per_min = f" ({g['bytes_per_min'] / MIB:,.0f} MiB/min)" if g["bytes_per_min"] is not None else ""
    start, end = g["start_bytes"], g["end_bytes"]
    growth = end - start
    text = (f"its {MEMORIES[g['memory']]} rises {g['bytes_per_step'] / MIB:.1f} MiB a step{per_min} over steps "
            f"{ranges(steps)}, from {fmt_bytes(start)} to {fmt_bytes(end)} (+{fmt_bytes(growth)}, {growth / start:.0%}), "
            f"rising in {g['rising']} of {g['compared']} steps"
            + (" against its peers, whose memory levels off (the movements every rank shares taken out)"
               if g["against_peers"] else "")
            + (f" (steps {ranges(g['profiled_steps'])}, profiled or building the trace, are not judged: the profiler's "
               "buffers are not the job's)." if g["profiled_steps"] else "."))
    left = g["steps_left"]
    if g["capacity_bytes"] is not None and left is not None:
        where = "its GPU's" if g["memory"] == "gpu_allocated_bytes" else "its host's"
        shared = f" (with the {g['sharing']} ranks whose memory grows on that host)" if g["sharing"] > 1 else ""
        minutes = f", in about {left * g['step_ms'] / 60e3:,.0f} min" if g["step_ms"] > 0 else ""
        text += (f" At this pace{shared} {where} {fmt_bytes(g['capacity_bytes'])} would be full by step "
                 f"{g['last_step'] + math.ceil(left):,}{minutes}.")
    return text


def _explanation(f: Facts) -> str:
    lead = f["growths"][0]  # the GPU's when it grows: what the job runs out of first
    sentences = [_sentence(g, f["steps"] if g["steps"] is None else g["steps"]) for g in f["growths"]]
    if lead["steps_left"] is None:
        sentences.append("The GPU's capacity is unknown (no NVML telemetry): when it would be full cannot be said."
                         if lead["memory"] == "gpu_allocated_bytes" else
                         "The host's free memory is unknown (no telemetry): when it would run out cannot be said.")
    return f"rank {f['ranks'][0]}'s memory grows step after step, as a leak does: " + " ".join(sentences)


WORDS = {"memory_growth": Words(
    _explanation,
    "Find what the training loop keeps from every step. The classic one is a tensor kept with its autograd graph: "
    "`losses.append(loss)` or `total += loss` instead of `loss.item()` (or `.detach()`), outputs or activations kept "
    "for logging or metrics; then Python lists and dicts that grow each step, and caches without a bound. On a GPU "
    "`torch.cuda.memory._record_memory_history()` and a snapshot a few steps apart show which allocations stay; on "
    "the CPU, `tracemalloc` snapshots compared across steps.")}
