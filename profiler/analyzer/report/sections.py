"""The report's sections in words: where the time went (the job's and the ranks' ledgers), expected vs measured
(the critical path's: report/critical_path_section.py).

Each takes its section of report.json (judge/ made the numbers) and returns report.md's lines; the
dashboard shows the same sentences (model_line, unknown_words).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from diagtrain.profiler.analyzer.judge.assessments.ledger_price import INTERMITTENT
from diagtrain.profiler.analyzer.judge.model_check.expected import UNKNOWN, UNKNOWN_PIPELINE
from diagtrain.profiler.util.text import ranges
from diagtrain.profiler.util.units import mib_text


# The job's categories (run/job_time.py), in words and in the order shown.
JOB_WORDS = {
    "compute": "computing",
    "data": "waiting for data",
    "communication": "communication the job waits for",
    "imbalance": "waiting for slower ranks",
    "other": "other work in steps",
    "between": "between steps",
    "profiler": "diagtrain's profiler",
    "startup": "start-up",
    "teardown": "after the last step",
}
# What a category holds, where its name alone does not say.
JOB_NOTES = {
    "communication": "transfers nothing overlaps, and pipeline stages waiting for each other",
    "imbalance": "ranks' excess over their peers: the ranks' ledger below",
    "other": "outside the recorded phases, and phases that are not the model's: checkpoints, logging, evaluation",
    "profiler": "writing the traces of profiled steps",
    "teardown": "shutting down; for a hung or failed job, until it was stopped",
}


GOODPUT_LINE = 116  # characters of the goodput line at most: the console summary's line, indented


def goodput_line(section: dict[str, Any] | None) -> str:
    """One line: the job's goodput and where the rest went, largest first ('' without a job time)."""
    if not section or not section.get("wall_s"):
        return ""
    wall, seconds = section["wall_s"], section["seconds"]
    line = f"goodput {section['goodput']:.0%} of {wall:.1f} s (computing)"
    rest = sorted((c for c in seconds if c != "compute" and seconds[c] >= 0.01 * wall), key=lambda c: -seconds[c])
    went: list[str] = []
    for c in rest:  # the largest first, as many as a terminal's line holds
        part = f"{JOB_WORDS.get(c, c)} {seconds[c] / wall:.0%}"
        if len(f"{line}; the rest: {', '.join([*went, part])}") > GOODPUT_LINE:
            break
        went.append(part)
    return line + (f"; the rest: {', '.join(went)}" if went else "") + (
        "; still running" if not section.get("finished", True) else "")


def job_time_lines(section: dict[str, Any] | None) -> list[str]:
    """The report's "Where the time went": the job's wall time by category, adding up to it, and the start-up's parts."""
    if not section:
        return []
    if not section.get("wall_s"):
        return ["### Where the time went", "", f"Not measured: {section.get('reason', 'no steps')}.", ""]
    wall, seconds, per_step = section["wall_s"], section["seconds"], section.get("per_step_ms") or {}
    lines = ["### Where the time went", "",
             f"Goodput **{section['goodput']:.0%}**: of the job's {wall:.2f} s from launch to end, "
             f"{seconds['compute']:.2f} s went to computing. Over {section['steady_steps']} steady steps "
             f"({section['step_ms']:.1f} ms typical), after {section['warmup_steps']} warm-up step(s):", "",
             "| where | seconds | share | per steady step | what it holds |", "| --- | ---: | ---: | ---: | --- |"]
    for c, value in seconds.items():
        typical = f"{per_step[c]:.1f} ms" if c in per_step else ""
        lines.append(f"| {JOB_WORDS.get(c, c)} | {value:.2f} | {value / wall:.0%} | {typical} | {JOB_NOTES.get(c, '')} |")
    if section.get("startup"):
        lines += ["", "Start-up: " + ", ".join(f"{name} {value:.2f} s" for name, value in section["startup"].items())
                  + "."]
    return lines + [""]


def ledger_lines(ledger_section: dict[str, Any] | None) -> list[str]:
    """The report's lines on the ranks' ledger: who made the others wait, in which part, at what cost."""
    if not ledger_section:
        return []
    s = ledger_section
    lines = ["### Between the ranks", "",
             f"{s['steady_steps']} steady steps, {s['job_s']:.2f} s of job time; the ranks spent {s['waiting_s']:.2f} s "
             "blocked in collectives and point-to-point calls in all"
             + (f" ({s['device_steps']} of the steps timed on the devices: CUDA events and NCCL's collective timing)"
                if s.get("device_steps") else "")
             + (f", and {s['starved_s']:.2f} s waiting for a CPU" if s.get("starved_s") else "")
             + f". Steps are charged to a cause above {s['charged_above_ms']:.1f} ms (this run's noise: "
             f"{s['noise_ms']:.1f} ms).", ""]
    if not s["causes"]:
        return lines + ["No rank made the others wait beyond the noise.", ""]
    lines += ["| cause | when | lost | per step | share of the run |", "| --- | --- | ---: | ---: | ---: |"]
    for x in s["causes"][:10]:
        when = x["pattern"] if x["pattern"] != INTERMITTENT else f"steps {ranges(x['steps'])}"
        lines.append(f"| rank {x['rank']}, {x['part']} | {when} | {x['lost_s']:.2f} s | {x['per_step_ms']:.1f} ms | "
                     f"{x['share']:.0%} |")
    return lines + [""]


def expected_lines(section: dict[str, Any] | None, max_rows: int = 64) -> list[str]:
    """The report.md lines of the section, at most ``max_rows`` rows per table (all of them stay in report.json)."""
    if not section:
        return []
    if not section.get("available"):
        return ["### Expected vs measured", "", f"Not compared: {section.get('reason')}", ""]
    lines = ["### Expected vs measured", "", model_line(section)]
    if section.get("unknown"):
        lines.append(f"- not known: {unknown_words(section['unknown'])}")
    lines += [f"- assumed: {n}" for n in section["notes"]] + [""]
    lines += ["| rank | parameters expected | held | state expected (MiB) | held (MiB) | peak estimate (MiB) | peak (MiB) |",
              "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in section["state"][:max_rows]:
        lines.append("| {} | {:,.0f} | {} | {:.2f} | {} | {} | {} |".format(
            r["rank"], r["expected_parameters"], "" if r["held_parameters"] is None else f"{r['held_parameters']:,}",
            r["expected_state_bytes"] / 2**20,
            "" if r["held_state_bytes"] is None else f"{r['held_state_bytes'] / 2**20:.2f}",
            mib_text(r["expected_peak_bytes"]), mib_text(r["peak_bytes"])))
    lines.append("")
    if section["collectives"]:
        lines += ["| rank | group | op | bytes | calls/step expected | measured | transfer per call, median (ms) "
                  "| ring model per call (ms) |",
                  "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
        for r in section["collectives"][:max_rows]:
            expected = "" if r["expected_calls"] is None else f"{r['expected_calls']:g}"
            lines.append(f"| {r['rank']} | {r['group'] or '?'} | {r['op']} | {r['bytes']:,} | {expected} | "
                         f"{r['measured_calls']:g} | {_num(r['measured_transfer_ms'])} | {_num(r['model_ms'])} |")
        lines.append("")
    b = section.get("bubble")
    if b and b.get("formula") is None:
        measured = f"measured {b['measured']:.0%}" if b.get("measured") is not None else "not measured"
        lines += [f"Pipeline bubble over {b['stages']} stages: {measured} (no formula: the schedule and its "
                  "microbatches are not known).", ""]
    elif b:
        measured = f"; measured {b['measured']:.0%}" if b.get("measured") is not None else ""
        staged = f" ({b['with_stage_times']:.0%} with the stages' measured times)" if b.get("with_stage_times") else ""
        lines += [f"Pipeline bubble: {b['schedule']}, {b['stages']} stages, {b['microbatches']} microbatches: "
                  f"formula {b['formula']:.0%}{staged}{measured}.", ""]
    s = section.get("step")
    if s and s.get("model_ms") is None:
        lines += [f"Step: measured {s['measured_ms']:.1f} ms; no model prediction (its compute needs the model's "
                  "shape and batch, which the run does not record).", ""]
    elif s:
        lines += [f"Step: measured {s['measured_ms']:.1f} ms; the model at this run's speeds "
                  f"({s['achieved_tflops_per_rank'] * 1e3:.1f} GFLOP/s per rank, best bus bandwidth "
                  + ", ".join(f"{k} {v:.2f} GB/s" for k, v in s["best_busbw_gbps"].items())
                  + f") predicts {s['model_ms']:.1f} ms.", ""]
    return lines


def model_line(section: dict[str, Any]) -> str:
    """The section's first line: the model as the run gave it (trainer.json), else only what it measured."""
    model = section["model"]
    if section["exact_layout"]:
        return (f"Model: {model['parameters']:,.0f} parameters, {model['layers']} layers, hidden {model['hidden']}, "
                f"{model['precision']} ({model['state_bytes_per_parameter']} bytes of state per parameter); "
                f"layout {model['layout']}.")
    source = f" (read off its {model['parameters_from']})" if model.get("parameters_from") else ""
    return (f"Model: {model['parameters']:,.0f} parameters{source}, shape not recorded; {model['precision']} "
            f"assumed ({model['state_bytes_per_parameter']} bytes of state per parameter); "
            f"layout {model['layout']} ({model.get('layout_from') or 'assumed'}).")


def unknown_words(keys: list[str]) -> str:
    """What the run did not record, in words, and what the section leaves out for it."""
    words = {**UNKNOWN, **UNKNOWN_PIPELINE}
    return (", ".join(words.get(k, k) for k in keys) + ": the run records no model shape or batch, so no peak, "
            "compute or step-time estimate, and no finding that would need them")


def _num(x: float | None) -> str:
    return "" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:.3g}"
