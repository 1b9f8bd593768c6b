"""The plan's model against real runs of the reference trainers (CPU, gloo).

    python benchmarks/plan.py [--only NAME]

For each run (under `diagtrain run`, profiled, analyzed): model-state parameters per rank predicted
against parameters.json (must be equal), collectives per profiled step (op, bytes, calls) predicted
against the traces (must be equal), the pipeline bubble (formula, formula with the stages' measured
times, measured), and peak memory. Then the what-ifs against the runs they describe: the model,
calibrated on one run, predicting another run's step and memory.

Peak memory on CPU is the process's resident set: it holds the interpreter, torch and gloo (a few
hundred MiB) besides the model. So the model is checked on the difference between two sizes of the
same job, where that baseline cancels.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from common import RESULTS, machine, run, save

from diagtrain.profiler.analyzer.judge.model_check import measured as plan_measured
from diagtrain.profiler.plan import whatif

STEPS = "5"
PROFILE = "3-4"
BIG = ["--dim", "256", "--seq-len", "64", "--global-batch", "16"]  # microbatches large enough to time on CPU

# name, trainer arguments
CASES = [
    ("ddp-2", ["--strategy", "ddp", "--nproc", "2"]),
    ("ddp-4-dim256", ["--strategy", "ddp", "--nproc", "4", "--dim", "256"]),  # two gradient buckets
    ("fsdp-2", ["--strategy", "fsdp", "--nproc", "2"]),
    ("fsdp-3-uneven", ["--strategy", "fsdp", "--nproc", "3", "--global-batch", "6"]),  # 64 rows / 3: padded shards
    ("fsdp-2-no-reshard", ["--strategy", "fsdp", "--nproc", "2", "--fsdp-reshard-after-forward", "false"]),
    ("fsdp-2-accum2-ac", ["--strategy", "fsdp", "--nproc", "2", "--grad-accum", "2", "--activation-checkpoint"]),
    ("tp-2-bf16", ["--strategy", "tp", "--nproc", "2", "--bf16"]),  # bf16 forward all-reduces, fp32 backward
    ("3d-8-accum2", ["--strategy", "3d", "--nproc", "8", "--grad-accum", "2"]),
    *[(f"pp-2-gpipe-m{m}", ["--strategy", "pp", "--nproc", "2", "--schedule", "gpipe", "--microbatches", str(m), *BIG])
      for m in (1, 2, 4)],
    *[(f"pp-2-1f1b-m{m}", ["--strategy", "pp", "--nproc", "2", "--schedule", "1f1b", "--microbatches", str(m), *BIG])
      for m in (2, 4, 8)],
    ("pp-2-interleaved-m4", ["--strategy", "pp", "--nproc", "2", "--schedule", "interleaved1f1b",
                             "--microbatches", "4", *BIG]),
    # Two sizes of one job: the resident baseline cancels in the difference of their peaks.
    ("ddp-2-dim512", ["--strategy", "ddp", "--nproc", "2", "--dim", "512"]),
    ("ddp-2-dim1024", ["--strategy", "ddp", "--nproc", "2", "--dim", "1024"]),
    ("fsdp-2-dim512", ["--strategy", "fsdp", "--nproc", "2", "--dim", "512"]),
    ("fsdp-2-dim1024", ["--strategy", "fsdp", "--nproc", "2", "--dim", "1024"]),
]
MEMORY_PAIRS = [("ddp-2-dim512", "ddp-2-dim1024"), ("fsdp-2-dim512", "fsdp-2-dim1024")]
# What-ifs checked against the run they describe: (from, change, the run that made the change).
WHAT_IFS = [("pp-2-1f1b-m2", "microbatches=4", "pp-2-1f1b-m4"), ("pp-2-1f1b-m2", "microbatches=8", "pp-2-1f1b-m8"),
            ("pp-2-gpipe-m1", "microbatches=2", "pp-2-gpipe-m2"), ("pp-2-gpipe-m1", "microbatches=4", "pp-2-gpipe-m4"),
            ("ddp-2", "zero=3", "fsdp-2"), ("fsdp-2", "zero=0", "ddp-2")]


def run_case(root: Path, name: str, args: list[str]) -> Path:
    out = root / name
    run([sys.executable, "-m", "diagtrain.profiler.cli", "run", "--out", str(out), "--profile-steps", PROFILE, "--",
         sys.executable, "-m", "diagtrain.profiler.cli", "train", "--steps", STEPS, *args], env={"OMP_NUM_THREADS": "1"})
    return out


def evaluate(out: Path) -> dict:
    """One run against the model, from its analysis."""
    report = json.loads((out / "report.json").read_text())
    e = report["expected"]
    state_ok = all(r["held_parameters"] == r["expected_parameters"] for r in e["state"])
    rows = [r for r in e["collectives"] if r["expected_calls"]]  # the layout's; the rest is the job's own
    own = [r for r in e["collectives"] if not r["expected_calls"]]
    matched = sum(r["expected_calls"] == r["measured_calls"] for r in rows)
    bytes_model = sum(r["expected_calls"] * r["bytes"] for r in rows)
    bytes_seen = sum(r["measured_calls"] * r["bytes"] for r in rows)
    b = e.get("bubble") or {}
    return {"layout": e["model"]["layout"], "precision": e["model"]["precision"], "ranks": len(e["state"]),
            "state_exact": state_ok, "params_per_rank": sorted({int(r["held_parameters"]) for r in e["state"]}),
            "collective_rows": len(rows), "collective_rows_matched": matched,
            "own_bytes_per_step": sum(r["measured_calls"] * r["bytes"] for r in own),
            "bytes_per_step_model": bytes_model, "bytes_per_step_measured": bytes_seen,
            "bubble_formula": b.get("formula"), "bubble_with_stage_times": b.get("with_stage_times"),
            "bubble_measured": b.get("measured"),
            "peak_model_mib": max(r["expected_peak_bytes"] for r in e["state"]) / 2**20,
            "peak_measured_mib": max((r["peak_bytes"] or 0) for r in e["state"]) / 2**20,
            "step_measured_ms": (e.get("step") or {}).get("measured_ms"),
            "state_held_mib": max((r["held_state_bytes"] or 0) for r in e["state"]) / 2**20,
            "step_model_ms": (e.get("step") or {}).get("model_ms"),
            "model_findings": [f["kind"] for f in report["findings"]
                               if f["kind"] in ("state_mismatch", "unexpected_communication", "bubble_above_model")]}


def what_if(root: Path, source: str, change: str, target: str, results: dict) -> dict:
    """The model, calibrated on ``source``, predicting the run that made ``change``."""
    files = plan_measured.read_run(root / source)
    rm = files.describe()
    key, value = change.split("=")
    layout = whatif.with_microbatches(rm.layout, int(value)) if key == "microbatches" else \
        replace(rm.layout, zero=int(value))
    e, step = whatif.predict(rm, files.measure(rm), layout)
    actual = results[target]
    return {"from": source, "change": change, "run": target, "step_predicted_ms": step,
            "step_measured_ms": actual["step_measured_ms"], "bubble_predicted": e.bubble,
            "bubble_measured": actual["bubble_measured"], "state_predicted_mib": e.memory.model_state / 2**20,
            "state_measured_mib": actual["state_held_mib"]}


def memory_pair(small: dict, big: dict, names: tuple[str, str]) -> dict:
    model = big["peak_model_mib"] - small["peak_model_mib"]
    seen = big["peak_measured_mib"] - small["peak_measured_mib"]
    return {"runs": list(names), "model_delta_mib": model, "measured_delta_mib": seen, "ratio": seen / model}


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = ["# The plan's model against real runs", "",
             f"{m['date']}, {m['cpu_count']} CPUs, torch {m['torch']}, load average at start {result['load_start']}, "
             f"at end {result['load_end']}; `{m['command']}`; {STEPS} steps, steps {PROFILE} profiled, gloo on CPU.", "",
             "## Model state and collectives (exact)", "",
             "A row is one rank's collectives of one op and size: calls per profiled step, the layout's against the "
             "traces'. 'Job's own': bytes per step of collectives no layout has (the trainer's loss all-reduce).", "",
             "| run | layout | precision | parameters per rank | state = parameters.json | collective rows matched "
             "| bytes per step, model / traces | job's own |", "| --- | --- | --- | --- | --- | ---: | ---: | ---: |"]
    for name, r in result["runs"].items():
        lines.append(f"| {name} | {r['layout']} | {r['precision']} | {', '.join(f'{p:,}' for p in r['params_per_rank'])} | "
                     f"{'yes' if r['state_exact'] else 'NO'} | {r['collective_rows_matched']}/{r['collective_rows']} | "
                     f"{r['bytes_per_step_model']:,.0f} / {r['bytes_per_step_measured']:,.0f} | "
                     f"{r['own_bytes_per_step']:,.0f} |")
    lines += ["", "## Pipeline bubble", "",
              "Measured: 1 - (mean work of the stages inside their forward-backward phase: the phase less the time "
              "spent waiting in pipeline sends and receives) / (the longest phase), median over the profiled steps. "
              "'With stage times': GPipe/1F1B's bubble for the stages' measured work (unequal stages idle more than "
              "the formula says).", "",
              "| run | formula (p-1)/(m+p-1) | with stage times | measured |", "| --- | ---: | ---: | ---: |"]
    for name, r in result["runs"].items():
        if r["bubble_formula"] is not None:
            staged = "" if r["bubble_with_stage_times"] is None else f"{r['bubble_with_stage_times']:.0%}"
            seen = "" if r["bubble_measured"] is None else f"{r['bubble_measured']:.0%}"
            lines.append(f"| {name} | {r['bubble_formula']:.0%} | {staged} | {seen} |")
    lines += ["", "## What-ifs against the runs they describe", "",
              "The model at the speeds one run measured, predicting another run of the same job: the step (the "
              "measured step moved by the model's change), the bubble, the largest rank's model state.", "",
              "| from | change | run | step predicted (ms) | step measured (ms) | bubble predicted | bubble measured "
              "| state predicted (MiB) | state held (MiB) |",
              "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for w in result["what_ifs"]:
        bm = "" if w["bubble_measured"] is None else f"{w['bubble_measured']:.0%}"
        lines.append(f"| {w['from']} | {w['change']} | {w['run']} | {w['step_predicted_ms']:.0f} | "
                     f"{w['step_measured_ms']:.0f} | {w['bubble_predicted']:.0%} | {bm} | "
                     f"{w['state_predicted_mib']:.2f} | {w['state_measured_mib']:.2f} |")
    lines += ["", "## Peak memory", "",
              "Per run, the model's peak (model state, gathered weights, activations) against the measured peak RSS "
              "(which also holds the interpreter, torch and gloo). Between two sizes of one job that baseline cancels:",
              "", "| runs | model: peak difference (MiB) | measured: peak RSS difference (MiB) | measured / model |",
              "| --- | ---: | ---: | ---: |"]
    for p in result["memory_pairs"]:
        lines.append(f"| {' -> '.join(p['runs'])} | {p['model_delta_mib']:.0f} | {p['measured_delta_mib']:.0f} | "
                     f"{p['ratio']:.2f} |")
    lines += ["", "| run | model peak (MiB) | measured peak RSS (MiB) |", "| --- | ---: | ---: |"]
    for name, r in result["runs"].items():
        lines.append(f"| {name} | {r['peak_model_mib']:.1f} | {r['peak_measured_mib']:.0f} |")
    findings = {n: r["model_findings"] for n, r in result["runs"].items() if r["model_findings"]}
    lines += ["", f"Model findings on these clean runs: {findings or 'none'}.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run only the cases whose name contains this")
    args = parser.parse_args()
    cases = [c for c in CASES if not args.only or args.only in c[0]]
    load_start = os.getloadavg()[0]
    results, started = {}, time.time()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, trainer_args in cases:
            print(f"{name} ...", flush=True)
            results[name] = evaluate(run_case(root, name, trainer_args))
            (RESULTS / "plan.partial.json").write_text(json.dumps(results, indent=2))  # a crash keeps what ran
        what_ifs = [what_if(root, s, c, t, results) for s, c, t in WHAT_IFS if s in results and t in results]
    pairs = [memory_pair(results[a], results[b], (a, b)) for a, b in MEMORY_PAIRS if a in results and b in results]
    result = {"machine": machine(), "load_start": round(load_start, 1), "load_end": round(os.getloadavg()[0], 1),
              "seconds": round(time.time() - started), "runs": results, "what_ifs": what_ifs, "memory_pairs": pairs}
    save("plan", result, markdown(result))
    (RESULTS / "plan.partial.json").unlink(missing_ok=True)
    print(markdown(result))


if __name__ == "__main__":
    main()
