"""Expected vs measured: the run against the plan's model of its own layout (report.json's ``expected``)."""

from __future__ import annotations

from typing import Any

from diagtrain.dashboard.data import RunData
from diagtrain.dashboard.figures import empty
from diagtrain.profiler.analyzer.report.sections import model_line, unknown_words
from diagtrain.profiler.util.units import MIB

MODEL_FINDINGS = ("state_mismatch", "unexpected_communication", "bubble_above_model", "memory_above_model",
                  "slow_collective_group")
STATE_COLUMNS = {"rank": "rank", "expected_parameters": "parameters expected", "held_parameters": "held",
                 "expected_state_mib": "state expected (MiB)", "held_state_mib": "held (MiB)",
                 "expected_peak_mib": "peak estimate (MiB)", "peak_mib": "peak (MiB)", "match": "state matches"}
COLLECTIVE_COLUMNS = {"rank": "rank", "group": "group", "op": "op", "bytes": "bytes", "purpose": "what",
                      "expected_calls": "calls/step expected", "measured_calls": "measured", "match": "matches",
                      "measured_transfer_ms": "transfer (ms)", "model_ms": "ring model (ms)",
                      "best_busbw_gbps": "best busbw (GB/s)"}


def section(run: RunData) -> dict[str, Any] | None:
    return run.report.get("expected")


def summary(run: RunData) -> list[str]:
    """Lines above the tables: the model, what was assumed, the step and the bubble."""
    s = section(run)
    if not s:
        return ["This analysis has no expected-vs-measured section (analyze the run again with this diagtrain)."]
    if not s.get("available"):
        return [f"Not compared: {s.get('reason')}"]
    m = s["model"]
    if s["exact_layout"]:
        lines = [f"Model: {m['parameters']:,.0f} parameters, {m['layers']} layers, hidden {m['hidden']}, "
                 f"{m['precision']}; layout {m['layout']}."]
    else:  # a run without trainer.json: what it measured, and what it did not record
        lines = [model_line(s)]
        if s.get("unknown"):
            lines.append(f"Not known: {unknown_words(s['unknown'])}.")
    lines += [f"Assumed: {n}" for n in s.get("notes") or []]
    step = s.get("step")
    if step and step.get("model_ms") is not None:
        lines.append(f"Step: measured {step['measured_ms']:.1f} ms, the model at this run's speeds "
                     f"{step['model_ms']:.1f} ms.")
    elif step:
        lines.append(f"Step: measured {step['measured_ms']:.1f} ms; no model prediction without the shape and batch.")
    b = s.get("bubble")
    if b and b.get("formula") is None:
        measured = f"measured {b['measured']:.0%}" if b.get("measured") is not None else "not measured"
        lines.append(f"Pipeline bubble ({b['stages']} stages): {measured}; no formula without the schedule and "
                     "its microbatches.")
    elif b:
        measured = f", measured {b['measured']:.0%}" if b.get("measured") is not None else ""
        lines.append(f"Pipeline bubble ({b['schedule']}, {b['stages']} stages, {b['microbatches']} microbatches): "
                     f"formula {b['formula']:.0%}{measured}.")
    found = [f for f in run.findings if f["kind"] in MODEL_FINDINGS]
    lines += [f"{f['severity'].upper()} {f['kind']}: {f['explanation']}" for f in found] or \
        ["No difference the model cannot explain."]
    return lines


def state_table(run: RunData) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Per rank: parameters and model state expected and held, peak estimated and measured."""
    s = section(run)
    if not s or not s.get("available"):
        return [], []
    rows = [{"rank": r["rank"], "expected_parameters": round(r["expected_parameters"]),
             "held_parameters": r["held_parameters"], "expected_state_mib": round(r["expected_state_bytes"] / MIB, 3),
             "held_state_mib": None if r["held_state_bytes"] is None else round(r["held_state_bytes"] / MIB, 3),
             "expected_peak_mib": _mib(r["expected_peak_bytes"]), "peak_mib": _mib(r["peak_bytes"]),
             "match": "" if r["held_parameters"] is None else
             ("yes" if round(r["held_parameters"]) == round(r["expected_parameters"]) else "NO")}
            for r in s["state"]]
    return rows, [{"name": v, "id": k} for k, v in STATE_COLUMNS.items()]


def _mib(n: float | None) -> float | None:
    return None if n is None else round(n / MIB, 1)


def collectives_table(run: RunData) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Per rank and collective size: calls per step expected and measured, transfer time against the ring model."""
    s = section(run)
    if not s or not s.get("available"):
        return [], []
    rows = [{**{k: r.get(k) for k in COLLECTIVE_COLUMNS if k != "match"},
             "match": "" if r["expected_calls"] is None else
             "yes" if r["expected_calls"] == r["measured_calls"] else "NO"} for r in s["collectives"]]
    for row in rows:
        for k in ("measured_transfer_ms", "model_ms", "best_busbw_gbps"):
            row[k] = None if row[k] is None else round(row[k], 4)
    return rows, [{"name": v, "id": k} for k, v in COLLECTIVE_COLUMNS.items()]


def memory_figure(run: RunData) -> dict[str, Any]:
    """Per rank: the model state and peak the layout implies beside what the rank held and peaked at."""
    rows, _ = state_table(run)
    if not rows:
        return empty("No expected-vs-measured memory for this run.")
    ranks = [r["rank"] for r in rows]
    series = [("model state expected", "expected_state_mib", "#9ecae1"), ("model state held", "held_state_mib", "#3182bd"),
              ("peak estimate", "expected_peak_mib", "#fdae6b"), ("peak measured", "peak_mib", "#e6550d")]
    data = [{"type": "bar", "name": name, "x": ranks, "y": [r[key] for r in rows], "marker": {"color": color},
             "hovertemplate": f"rank %{{x}}: {name} %{{y}} MiB<extra></extra>"} for name, key, color in series]
    return {"data": data, "layout": {"title": {"text": "Memory per rank: the model against the run (MiB)"},
                                     "barmode": "group", "height": 360, "xaxis": {"title": {"text": "rank"}, "dtick": 1},
                                     "yaxis": {"title": {"text": "MiB"}}}}
