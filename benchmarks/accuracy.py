"""Accuracy of the analyzer, in two tables; clean runs must give no finding of warning severity or
higher, and a fault counts as found when a finding of the right kind (warning or worse) names its
rank(s) and, where the fault has a step range, steps inside it.

1. Reference trainers: `diagtrain train` runs with injected faults (ground truth in injected.json).
2. Plain user scripts (benchmarks/user_scripts/, no diagtrain import) under
   `diagtrain run -- torchrun ...`, each once with --profile-steps and once with no flags at all;
   faults people really have (a slow rank, an uneven batch, a slow dataset item, a data loader slow
   on one rank in every step, a checkpoint every 4th step on one rank, a delaying comm hook, an
   unbalanced pipeline split, extra memory, memory that grows every step, a hang, a crash) and a clean twin of every
   script, the clean ones run 3 times and once more beside a CPU hog.

    python benchmarks/accuracy.py [--table reference|user|both] [--only NAME]

Target: every fault found and located, zero false alarms.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from common import RESULTS, live_alarms, machine, run, save
from user_cases import USER_CASES, run_user_cases, user_markdown

# Which finding kind diagnoses each fault kind.
EXPECTED_KIND = {"straggler": "straggler", "dataloader_stall": "dataloader_stall", "slow_comm": "slow_collective",
                 "mem_imbalance": "memory_imbalance", "pp_imbalance": "pipeline_bubble",
                 "few_microbatches": "pipeline_bubble"}
ACTIONABLE = ("warning", "error", "critical")

# name, trainer arguments, --profile-steps (None: always-on records only)
CASES = [
    ("clean-ddp-4", ["--strategy", "ddp", "--nproc", "4"], "4-5"),
    ("clean-fsdp-2", ["--strategy", "fsdp", "--nproc", "2"], "4-5"),
    ("clean-tp-2", ["--strategy", "tp", "--nproc", "2"], "4-5"),
    ("clean-pp-2", ["--strategy", "pp", "--nproc", "2"], "4-5"),
    ("clean-3d-8", ["--strategy", "3d", "--nproc", "8"], "4-5"),
    ("straggler-ddp-4", ["--strategy", "ddp", "--nproc", "4", "--inject", "straggler:rank=2,ms=60,steps=3-8"], None),
    ("straggler-fsdp-2", ["--strategy", "fsdp", "--nproc", "2", "--inject", "straggler:rank=1,ms=60"], "4-5"),
    ("straggler-3d-8", ["--strategy", "3d", "--nproc", "8", "--inject", "straggler:rank=3,ms=200"], "4-6"),
    ("stall-ddp-2", ["--strategy", "ddp", "--nproc", "2", "--inject", "dataloader_stall:rank=1,ms=80,every=2"], None),
    ("stall-tp-2", ["--strategy", "tp", "--nproc", "2", "--inject", "dataloader_stall:rank=0,ms=80,every=3"], None),
    ("slowcomm-ddp-2", ["--strategy", "ddp", "--nproc", "2", "--inject", "slow_comm:rank=1,ms=30"], "3-5"),
    ("slowcomm-fsdp-2", ["--strategy", "fsdp", "--nproc", "2", "--inject", "slow_comm:rank=0,ms=20"], "4-5"),
    ("mem-fsdp-2", ["--strategy", "fsdp", "--nproc", "2", "--inject", "mem_imbalance:rank=1,mb=400"], None),
    ("mem-3d-8", ["--strategy", "3d", "--nproc", "8", "--inject", "mem_imbalance:rank=5,mb=400"], None),
    ("ppimb-pp-2", ["--strategy", "pp", "--nproc", "2", "--layers", "6", "--inject", "pp_imbalance:stage=0,layers=5"], None),
    ("fewmb-pp-2", ["--strategy", "pp", "--nproc", "2", "--schedule", "gpipe", "--inject", "few_microbatches:microbatches=1"], None),
]
STEPS = "8"
# Clean runs are repeated: on shared 2-core machines a rank now and then pauses for hundreds of ms,
# so one clean run says little about the false-alarm rate.
CLEAN_REPEATS = 3


def score(manifest: dict, report: dict, live: list[str] | None = None) -> dict:
    """Found and located for each injected fault; false alarms for clean runs, the report's and ``live``
    judgement's while the job ran."""
    actionable = [f for f in report["findings"] if f["severity"] in ACTIONABLE]
    if not manifest["injected"]:
        return {"ok": not actionable and not live,
                "false_alarms": [f"{f['kind']} {f['ranks']}" for f in actionable] + (live or []),
                "details": [f["explanation"] for f in actionable] + (live or [])}
    trainer = report["run"]
    results = []
    for fault in manifest["injected"]:
        kind = EXPECTED_KIND.get(fault["kind"])
        matching = [f for f in actionable if f["kind"] == kind]
        ranks = _fault_ranks(fault, trainer)
        located = [f for f in matching if set(ranks) & set(f["ranks"]) and _steps_ok(fault, f)]
        others = [f"{f['kind']} {f['ranks']}" for f in actionable if f not in located]
        results.append({"fault": fault["kind"], "found": bool(matching), "located": bool(located),
                        "other_findings": others})
    return {"ok": all(r["located"] for r in results), "faults": results}


def _fault_ranks(fault: dict, run: dict) -> list[int]:
    if fault["rank"] is not None:
        return [fault["rank"]]
    mesh = run.get("mesh") or {}
    per_stage = (mesh.get("dp") or 1) * (mesh.get("tp") or 1)
    stage = fault["params"].get("stage")
    if stage is None:
        return list(range(run.get("world_size") or 0))
    return list(range(stage * per_stage, (stage + 1) * per_stage))


def _steps_ok(fault: dict, finding: dict) -> bool:
    window = fault["params"].get("steps")
    if not window or not finding["steps"]:
        return True
    first, last = map(int, window.split("-"))
    return all(first <= s <= last for s in finding["steps"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="run only the case with this name")
    parser.add_argument("--clean-repeats", type=int, default=CLEAN_REPEATS,
                        help=f"runs of each clean case (default {CLEAN_REPEATS}): false alarms are a rate")
    parser.add_argument("--table", choices=["reference", "user", "both"], default="both",
                        help="which table to run (default both); the other one's recorded rows are kept")
    args = parser.parse_args()
    previous = json.loads((RESULTS / "accuracy.json").read_text()) if (RESULTS / "accuracy.json").exists() else {}
    reference = reference_table(args) if args.table in ("reference", "both") else previous.get("reference", previous)
    user = run_user_cases(args.only, args.clean_repeats) if args.table in ("user", "both") else previous.get("user")
    if args.only:
        return
    # The header describes the reference table's run: a kept table keeps its own date and repeats.
    m = machine() if args.table != "user" else previous.get("machine") or machine()
    repeats = reference.get("clean_repeats", args.clean_repeats)
    markdown = reference_markdown(m, reference, repeats) + ("\n" + user_markdown(user) if user else "")
    save("accuracy", {"machine": m, "reference": reference, "user": user}, markdown)
    print(markdown)


def reference_table(args: argparse.Namespace) -> dict:
    """Run the reference-trainer cases; their rows and summary."""
    cases = [c for c in CASES if args.only in (None, c[0])]
    cases = [c for c in cases for _ in range(args.clean_repeats if c[0].startswith("clean") else 1)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, trainer, profile) in enumerate(cases):
            out = Path(tmp) / f"{name}-{i}"
            started = time.monotonic()
            options = ["--profile-steps", profile] if profile else []
            run([sys.executable, "-m", "diagtrain.profiler.cli", "run", "--out", str(out), *options, "--no-analyze", "--",
                 sys.executable, "-m", "diagtrain.profiler.cli", "train", *trainer, "--steps", STEPS])
            run([sys.executable, "-m", "diagtrain.profiler.cli", "analyze", str(out), "--format", "json", "--quiet"])
            manifest = json.loads((out / "manifest.json").read_text())
            report = json.loads((out / "report.json").read_text())
            result = {"case": name, "trainer": trainer, "profile_steps": profile, **score(manifest, report, live_alarms(out)),
                      "seconds": round(time.monotonic() - started, 1)}
            rows.append(result)
            print(f"{'PASS' if result['ok'] else 'FAIL'} {name}: {json.dumps({k: v for k, v in result.items() if k in ('faults', 'false_alarms', 'details')})}", flush=True)
    faults = [f for r in rows for f in r.get("faults", [])]
    clean = [r for r in rows if "false_alarms" in r]
    summary = {"faults": len(faults), "located": sum(f["located"] for f in faults), "found": sum(f["found"] for f in faults),
               "clean_runs": len(clean), "false_alarm_runs": sum(bool(r["false_alarms"]) for r in clean)}
    return {"summary": summary, "cases": rows, "clean_repeats": args.clean_repeats}


def reference_markdown(m: dict, reference: dict, clean_repeats: int) -> str:
    """The first table: reference trainers."""
    rows, summary = reference["cases"], reference["summary"]
    table = "\n".join(f"| {r['case']} | {'pass' if r['ok'] else '**fail**'} | "
                      f"{'; '.join(f['fault'] + (' located' if f['located'] else ' found only' if f['found'] else ' missed') for f in r.get('faults', [])) or '; '.join(r.get('details', [])) or 'no alarm'} |"
                      for r in rows)
    return f"""# Analyzer accuracy

{m['date']}, {m['cpu_count']} cores, Python {m['python']}, torch {m['torch']}. Command: `{m['command']}`.

## Reference trainers

Each case: `diagtrain run -- diagtrain train ... --steps {STEPS}`, then `diagtrain analyze`; each clean case {reference.get('clean_repeats', clean_repeats)} times.
A clean run's false alarm is a warning or worse in its report or raised by live judgement while it ran.

**{summary['located']}/{summary['faults']} injected faults found and located** ({summary['found']} found with the right kind);
**{summary['false_alarm_runs']}/{summary['clean_runs']} clean runs with a false alarm** (warning or worse).

| case | result | detail |
| --- | --- | --- |
{table}
"""


if __name__ == "__main__":
    main()
