"""Impact claims against reality: what a finding says removing its cause would save per step
(``impact_ms``), against what removing it does save, measured.

Each case is a fault and its clean twin (the same job with the same arguments, less the fault),
both under `diagtrain run` (no flags, and once more with --profile-steps where that is cheap), run
interleaved (twin, fault, twin, fault with --reps 2) so that the machine's load hits both alike.

- claimed: the ``impact_ms`` of the finding of the expected kind that names the expected rank (any
  severity; the severity is recorded), and the finding's metrics;
- measured: the fault run's step time minus its twin's, a step's time being the longest ``wall_ms``
  of its ranks (analysis/steps.parquet), over the steps after the first. The median of those for a
  fault that hits every step; the mean for one that hits every few steps (a median would not see it;
  an impact is an average over the steps, the slow and the others);
- ratio claimed / measured: within +-30% passes; a claim the report makes as a bound ("up to") passes
  when the measured saving is not above it by more than 30%.

    python benchmarks/impact.py [--only NAME,...] [--reps N]

Writes results/impact.json and results/impact.md; rows of cases not run this time are kept from the
previous recording (each row has its date).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from common import RESULTS, machine, save
from user_cases import FAULTS

STEPS = 20
TOLERANCE = 0.30
RUN_TIMEOUT_S = 900
CLI = [sys.executable, "-m", "diagtrain.profiler.cli"]


@dataclass
class ImpactCase:
    """A fault (``fault``: the job's command) and its clean twin (``clean``), and the right verdict."""

    name: str
    fault: list[str]
    clean: list[str]
    expected: tuple[str, list[int]]
    statistic: str = "median"  # "median": the fault hits every step; "mean": every few steps
    profile: str | None = None  # --profile-steps window for the profiled mode; None: no flags only
    run_options: tuple[str, ...] = ()


def _plain(name: str, statistic: str, profile: str) -> ImpactCase:
    """A fault case of the accuracy suite's plain-script table (user_cases.py), at STEPS steps."""
    case = next(c for c in FAULTS if c.name == name)
    return ImpactCase(name, case.job(STEPS), replace(case, args=[]).job(STEPS), case.expected, statistic, profile,
                      tuple(case.run_options))


def _trainer(name: str, trainer: list[str], inject: str, steps: int, expected: tuple[str, list[int]],
             profile: str | None) -> ImpactCase:
    job = [*CLI, "train", *trainer, "--steps", str(steps)]
    return ImpactCase(name, [*job, "--inject", inject], job, expected, "median", profile)


# The profiled windows hold whole periods of the periodic faults (4 steps of every 4th, 6 of every 3rd),
# so that a claim made per profiled step is not biased by where the window falls.
CASES = [
    _plain("slow-rank-ddp", "median", "8-11"),
    _plain("slow-loader-ddp", "median", "8-11"),
    _plain("checkpoint-ddp", "mean", "8-11"),
    _plain("slow-item-ddp", "mean", "8-13"),
    # Time every rank loses together, priced by the job's own ledger.
    _plain("input-bound-ddp", "median", "8-11"),
    _plain("checkpoint-all-ddp", "mean", "8-13"),
    # A rank late at every collective (a slow communication hook): slow_collective's price, not yet validated.
    _plain("hook-delay-ddp", "median", "8-11"),
    _trainer("straggler-ddp-2", ["--strategy", "ddp", "--nproc", "2"], "straggler:rank=1,ms=60", STEPS,
             ("straggler", [1]), "8-11"),
    # 8 ranks on 2 cores: ~1 s a step, and profiling them is not cheap; no flags only.
    _trainer("straggler-3d-8", ["--strategy", "3d", "--nproc", "8"], "straggler:rank=3,ms=200", 12,
             ("straggler", [3]), None),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated case names (default: all of " +
                        ", ".join(c.name for c in CASES) + ")")
    parser.add_argument("--reps", type=int, default=1, help="twin/fault pairs per case and mode (default 1)")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else [c.name for c in CASES]
    unknown = set(names) - {c.name for c in CASES}
    if unknown:
        sys.exit(f"unknown case(s): {', '.join(sorted(unknown))}; cases: {', '.join(c.name for c in CASES)}")
    m = machine()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in [c for c in CASES if c.name in names]:
            modes = {"no flags": []} | ({f"--profile-steps {case.profile}": ["--profile-steps", case.profile]}
                                        if case.profile else {})
            for mode, options in modes.items():
                rows.append(measure(case, mode, options, args.reps, Path(tmp)))
                print(_line(rows[-1]), flush=True)
    previous = json.loads((RESULTS / "impact.json").read_text()) if (RESULTS / "impact.json").exists() else {}
    kept = [r for r in previous.get("rows", []) if r["case"] not in names]
    order = [c.name for c in CASES]
    rows = sorted(kept + rows, key=lambda r: (order.index(r["case"]) if r["case"] in order else len(order),
                                            r["mode"] != "no flags"))
    result = {"machine": m, "steps": STEPS, "tolerance": TOLERANCE, "rows": rows}
    markdown = to_markdown(result)
    save("impact", result, markdown)
    print(markdown)


def measure(case: ImpactCase, mode: str, options: list[str], reps: int, tmp: Path) -> dict:
    """Twin, fault, twin, fault...: the claim from each fault run, the step times of every run."""
    runs: dict[str, list[dict]] = {"clean": [], "fault": []}
    for rep in range(reps):
        for side in ("clean", "fault"):
            out = tmp / f"{case.name}-{mode.split()[0].strip('-')}-{side}-{rep}"
            runs[side].append(_run(case.clean if side == "clean" else case.fault, [*options, *case.run_options], out,
                                   case.expected))
    stat = statistics.median if case.statistic == "median" else statistics.fmean
    step_times = {side: [t for r in rs for t in r["step_ms"]] for side, rs in runs.items()}
    errors = [f"{side} {i + 1}: {r['error']}" for side, rs in runs.items() for i, r in enumerate(rs) if r.get("error")]
    measured = (stat(step_times["fault"]) - stat(step_times["clean"])) if all(step_times.values()) else None
    per_rep = [stat(f["step_ms"]) - stat(c["step_ms"]) if f["step_ms"] and c["step_ms"] else None
               for c, f in zip(runs["clean"], runs["fault"])]
    loads = [r[k] for rs in runs.values() for r in rs for k in ("load_before", "load_after") if r.get(k) is not None]
    claims = [r["claim"] for r in runs["fault"]]
    found = [c for c in claims if c is not None]
    impacts = [c["impact_ms"] for c in found if c.get("impact_ms") is not None]
    claimed = statistics.fmean(impacts) if impacts else None
    ratio = claimed / measured if claimed is not None and measured and measured > 0 else None
    bound = bool(found) and all((c.get("metrics") or {}).get("impact_is_upper_bound") for c in found)
    kind, ranks = case.expected
    return {
        "case": case.name, "mode": mode, "date": time.strftime("%Y-%m-%d %H:%M"), "reps": reps,
        "expected": {"kind": kind, "ranks": ranks}, "statistic": case.statistic,
        "fault_command": case.fault, "clean_command": case.clean,
        "found": f"{len(found)}/{len(claims)}", "claimed_ms": _round(claimed), "measured_ms": _round(measured),
        "measured_per_rep_ms": [_round(x) for x in per_rep], "load_average": _round(max(loads, default=None), 2),
        "ratio": _round(ratio, 3), "bound": bound, "within": _within(claimed, measured, ratio, bound),
        "clean_step_ms": {"median": _round(_stat(statistics.median, step_times["clean"])),
                          "mean": _round(_stat(statistics.fmean, step_times["clean"]))},
        "fault_step_ms": {"median": _round(_stat(statistics.median, step_times["fault"])),
                          "mean": _round(_stat(statistics.fmean, step_times["fault"]))},
        "claims": claims, "errors": errors,
        "runs": {side: [{k: v for k, v in r.items() if k != "claim"} for r in rs] for side, rs in runs.items()},
    }


def _within(claimed: float | None, measured: float | None, ratio: float | None, bound: bool) -> bool:
    """A price within +-30% of the saving; a bound ("up to") when the saving does not exceed it by more."""
    if bound:
        return claimed is not None and measured is not None and measured <= claimed * (1 + TOLERANCE)
    return ratio is not None and abs(ratio - 1) <= TOLERANCE


def _run(job: list[str], options: list[str], out: Path, expected: tuple[str, list[int]]) -> dict:
    """One `diagtrain run` of ``job``, analyzed: its per-step times and the claim of the expected finding."""
    started, load = time.monotonic(), os.getloadavg()[0]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        done = subprocess.run([*CLI, "run", "--out", str(out), *options, "--no-analyze", "--", *job],
                              capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return {"step_ms": [], "claim": None, "error": f"diagtrain run did not finish in {RUN_TIMEOUT_S} s"}
    result: dict = {"seconds": None, "load_before": round(load, 2), "step_ms": [], "claim": None}
    # The load of the whole run (others' jobs, and the run itself): 1-minute average at its end.
    if done.returncode != 0:
        result["error"] = f"diagtrain run exit {done.returncode}: {done.stderr.strip()[-300:]}"
    analyzed = subprocess.run([*CLI, "analyze", str(out), "--format", "json", "--quiet"],
                              capture_output=True, text=True)
    result["seconds"], result["load_after"] = round(time.monotonic() - started, 1), round(os.getloadavg()[0], 2)
    if analyzed.returncode != 0 or not (out / "report.json").exists():
        result["error"] = f"analysis failed: {analyzed.stderr.strip()[-300:]}"
        return result
    steps = pd.read_parquet(out / "analysis" / "steps.parquet")
    per_step = steps.groupby("step")["wall_ms"].max().dropna()
    per_step = per_step[per_step.index > per_step.index.min()]  # step 1 holds start-up
    result["step_ms"] = [round(float(v), 3) for v in per_step]
    result["steps"] = [int(s) for s in per_step.index]
    report = json.loads((out / "report.json").read_text())
    result["findings"] = [{"kind": f["kind"], "ranks": f["ranks"], "severity": f["severity"],
                           "impact_ms": _round(f.get("impact_ms"))} for f in report["findings"]]
    kind, ranks = expected
    matching = [f for f in report["findings"] if f["kind"] == kind and set(ranks) <= set(f["ranks"])]
    if matching:
        f = max(matching, key=lambda f: f.get("impact_ms") or 0.0)
        result["claim"] = {"impact_ms": f.get("impact_ms"), "severity": f["severity"], "steps": f["steps"],
                           "readings": readings(f.get("metrics") or {}), "metrics": f.get("metrics"),
                           "explanation": f["explanation"]}
    return result


def readings(metrics: dict) -> dict:
    """The finding's other figures for the same saving: totals, time lost, ranges, the detector's own
    figure where another replaced it (whatever of these the finding's metrics hold)."""
    keys = ("total", "lost", "impact", "critical_path")
    return {k: v for k, v in metrics.items() if any(w in k for w in keys) and k != "impact_source"
            and (isinstance(v, (int, float)) and not isinstance(v, bool)
                 or isinstance(v, list) and all(isinstance(x, (int, float)) for x in v))}


def _other_readings(row: dict) -> str:
    """The first found claim's other figures, compact: ``lost_ms_per_step 56.8; impact_range_ms 30.5-78.4``."""
    found = [c for c in row["claims"] if c and c.get("readings")]
    if not found:
        return ""
    return "; ".join(f"{k} {'-'.join(f'{x:.1f}' for x in v) if isinstance(v, list) else f'{v:.4g}'}"
                     for k, v in found[0]["readings"].items())


def _reps(row: dict) -> str:
    """Each twin/fault pair's own measured saving, where there were several."""
    each = row.get("measured_per_rep_ms") or []
    return "; pairs " + ", ".join("-" if x is None else f"{x:g}" for x in each) if len(each) > 1 else ""


def _stat(fn, values: list[float]) -> float | None:
    return fn(values) if values else None


def _round(x: float | None, digits: int = 1) -> float | None:
    return None if x is None else round(float(x), digits)


def _line(row: dict) -> str:
    return (f"{'PASS' if row['within'] else 'FAIL'} {row['case']} [{row['mode']}]: found {row['found']}, "
            f"claimed {row['claimed_ms']} ms/step, measured {row['measured_ms']} ms/step ({row['statistic']}), "
            f"ratio {row['ratio']}" + (f"; errors: {row['errors']}" if row["errors"] else ""))


def to_markdown(result: dict) -> str:
    m, rows = result["machine"], result["rows"]

    def cell(x: float | None) -> str:
        return "-" if x is None else f"{x:g}"

    def severity(row: dict) -> str:
        seen = sorted({c["severity"] for c in row["claims"] if c})
        return f" ({', '.join(seen)})" if seen and seen != ["warning"] else ""

    table = "\n".join(
        f"| {r['case']} | {r['mode']} | {r['expected']['kind']} {r['expected']['ranks']} | "
        f"{'yes' if r['found'].split('/')[0] != '0' else '**no**'} {r['found']}{severity(r)} | "
        f"{'up to ' if r.get('bound') else ''}{cell(r['claimed_ms'])} | "
        f"{cell(r['measured_ms'])} ({r['statistic']}{_reps(r)}) | {cell(r['ratio'])} | {'yes' if r['within'] else '**no**'} | "
        f"{cell(r['clean_step_ms'][r['statistic']])} -> {cell(r['fault_step_ms'][r['statistic']])} | {_other_readings(r)} | "
        f"{cell(r.get('load_average'))} | {r['date']} |"
        for r in rows)
    passed = sum(r["within"] for r in rows)
    errors = [f"- {r['case']} [{r['mode']}]: {e}" for r in rows for e in r["errors"]]
    return f"""# Impact claims against reality

{m['date']} on {m['cpu_count']} CPUs, {m['memory_gib']} GiB, load average {m['load_average_1_5_15']}; torch
{m['torch']}, diagtrain {m['diagtrain']}; `{m['command']}`.

Each case: the fault and its clean twin (the same job less the fault) under `diagtrain run` (no flags;
with --profile-steps where cheap), {result['steps']} steps (the 3D job 12), interleaved twin, fault, twin,
fault... Claimed: the `impact_ms` of the finding of the expected kind naming the expected rank (mean over
the fault runs that found it). Measured: the fault run's step time minus the twin's, a step's time the
longest `wall_ms` of its ranks in analysis/steps.parquet, step 1 left out; the median over the steps
for a fault in every step, the mean for a periodic one. Within: claimed/measured in 1 +- {result['tolerance']:g};
a claim the report makes as a bound ("up to": a kind not validated, or a host with more ranks than CPUs)
is within when the measured saving is at most the bound + {result['tolerance'] * 100:.0f}%.
Load: the highest 1-minute load average seen at a run's start or end (2 cores): the twin's step time
moves with it, and above ~2 the measured saving is mostly the machine's noise (rerun with --reps 3).

**{passed}/{len(rows)} claims hold: within +-{result['tolerance'] * 100:.0f}%, or a bound the measured saving does not exceed.**

| case | mode | expected | found | claimed ms/step | measured ms/step | ratio | within +-{result['tolerance'] * 100:.0f}% | step ms clean -> fault | the claim's other figures | load | date |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
{table}
""" + (("\nErrors:\n\n" + "\n".join(errors) + "\n") if errors else "")


if __name__ == "__main__":
    main()
