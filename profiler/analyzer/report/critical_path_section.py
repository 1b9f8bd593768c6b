"""The critical path in the report: report.json's ``critical_path`` section from the run's paths
(run/replay.py), its hops and one-line paths in words, and report.md's lines of it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from diagtrain.profiler.analyzer.run.replay import CATEGORIES, Hop, StepPath
from diagtrain.profiler.analyzer.run.step_graph import CriticalPath


def section(paths: list[StepPath] | None, failure: str | None = None) -> dict[str, Any]:
    """report.json's ``critical_path``: the median and the worst step's hops, the top pairs; where none was
    traced (None), why (``failure``: the error that stopped the tracing)."""
    if paths is None:
        return {"available": False, "reason": failure}
    if not paths:
        return {"available": False, "reason": "no profiled step with work segments (profile some steps)"}
    s = CriticalPath.active()
    by_length = sorted(paths, key=lambda p: p.length_us)
    return {"available": True, "steps": [p.step for p in paths],
            "median_step": _step_json(by_length[(len(by_length) - 1) // 2], s),
            "worst_step": _step_json(by_length[-1], s), "top": top(paths, s)}


def top(paths: list[StepPath], s: CriticalPath | None = None) -> list[dict[str, Any]]:
    """The ``top_pairs`` (rank, operator) pairs carrying most critical time over the profiled steps
    (``s``: the settings in force when not given)."""
    s = s or CriticalPath.active()
    carried: dict[tuple[int, str], float] = {}
    for p in paths:
        for h in p.hops:
            for op, us in h.ops.items():
                carried[(h.rank, op)] = carried.get((h.rank, op), 0.0) + us
    total = sum(p.length_us for p in paths) or 1.0
    best = sorted(carried.items(), key=lambda kv: -kv[1])[:s.top_pairs]
    return [{"rank": r, "op": op, "ms": us / 1e3, "share": us / total} for (r, op), us in best]


def hop_text(h: Hop) -> str:
    """``rank 3 forward 196.0 ms`` or ``all_reduce(mesh_dp) waits 149.0 ms on rank 3``."""
    if h.kind == "collective" and h.released_rank is not None and h.released_rank != h.rank:
        return (f"{h.label} waits {h.waited_us / 1e3:.1f} ms on rank {h.rank} "
                f"(transfer {h.categories.get('transfer', 0.0) / 1e3:.1f} ms)")
    return f"rank {h.rank} {h.label} {h.us / 1e3:.1f} ms"


def line(p: StepPath, s: CriticalPath | None = None) -> str:
    """One line for the report, hops joined by arrows: a rank's own collectives under min_hop_share
    of the step are left out, and its work on both sides of one reads as one stretch; then the
    stretches over min_hop_share and the collectives that take the path to another rank, past
    max_line_hops the longest of them, the rest counted (``s``: the settings in force when not given)."""
    s = s or CriticalPath.active()
    short = s.min_hop_share * p.length_us
    stretches: list[Hop] = []
    for h in p.hops:
        if h.kind == "collective" and h.us < short and h.released_rank in (None, h.rank):
            continue  # a rank's own short collective; one that takes the path to another rank stays
        last = stretches[-1] if stretches else None
        if last and h.kind == last.kind == "work" and (h.rank, h.label) == (last.rank, last.label):
            stretches[-1] = replace(last, us=last.us + h.us)
        else:
            stretches.append(h)
    shown = [i for i, h in enumerate(stretches) if h.us >= short or h.kind == "collective"]
    left = 0
    if len(shown) > s.max_line_hops:
        left = len(stretches) - s.max_line_hops
        shown = sorted(sorted(shown, key=lambda i: -stretches[i].us)[:s.max_line_hops])
    text = " → ".join(hop_text(stretches[i]) for i in shown)
    return f"{text} (and {left:,} shorter hops)" if left else text


def _step_json(p: StepPath, s: CriticalPath) -> dict[str, Any]:
    return {"step": p.step, "length_ms": p.length_us / 1e3, "line": line(p, s),
            "attribution_ms": {c: v / 1e3 for c, v in p.totals.items()},
            "waiting_on_ms": {str(r): v / 1e3 for r, v in p.waiting_on.items()},
            "hops": [{"rank": h.rank, "kind": h.kind, "label": h.label, "ms": h.us / 1e3, "text": hop_text(h),
                      "start": h.start_us / 1e6, "end": h.end_us / 1e6,
                      "categories_ms": {c: v / 1e3 for c, v in h.categories.items()},
                      **({"waited_ms": h.waited_us / 1e3, "released_rank": h.released_rank}
                         if h.kind == "collective" else {}),
                      **({"ops_ms": {o: v / 1e3 for o, v in sorted(h.ops.items(), key=lambda kv: -kv[1])[:3]}}
                         if h.ops else {})}
                     for h in p.hops]}


def critical_path_lines(shown: dict[str, Any] | None) -> list[str]:
    """The report's critical-path lines: the median and the worst step, one line of hops each."""
    if not shown or not shown.get("available"):
        return []
    lines = ["### Critical path", ""]
    for name in ("median_step", "worst_step"):
        p = shown[name]
        a = p["attribution_ms"]
        spent = ", ".join(f"{c.replace('_', ' ')} {a[c]:.1f}" for c in CATEGORIES if a.get(c))
        lines += [f"- {name.replace('_', ' ')} (step {p['step']}, {p['length_ms']:.1f} ms; {spent} ms): {p['line']}"]
    if shown.get("top"):
        over = f"summed over the {len(shown.get('steps') or [])} profiled steps"
        pairs = ", ".join(f"rank {t['rank']} {t['op']} {t['ms']:.1f} ms" for t in shown["top"])
        lines += [f"- most critical time ({over}): {pairs}"]
    return lines + [""]
