"""How soon live judgement names a fault: from the step where it starts to its live finding.

Each case is a real 2-rank job under `diagtrain run --profile-steps none --no-analyze` whose fault
starts at a known step (the reference trainer's --inject with steps=A-B; a plain script's straggler,
or its leak of 16 MiB a step, from its first step). Latency is read from live/findings.jsonl: the first event of the
expected kind on the faulty rank at warning or worse; in steps (its ``step`` less the fault's first
step) and in seconds (its ``detected_at`` less the start of the fault's first step on that rank).
Target (issue 39): at most 15 s or 3 steps, whichever is later. Also recorded: any warning-or-worse
event of another kind or rank (a false alarm), and the wrapper's CPU for live judgement (host.json).

    python benchmarks/live_latency.py [--reps N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, save  # noqa: E402

PLAIN_JOB = Path(__file__).resolve().parents[1] / "tests" / "scripts" / "plain_job.py"
DDP_LOADER = Path(__file__).resolve().parent / "user_scripts" / "ddp_loader.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
TRAINER = [sys.executable, "-m", "diagtrain.profiler.cli", "train", "--strategy", "ddp", "--nproc", "2", "--steps", "60"]
FAULT_FROM = 15
# name, kind expected, faulty rank, first faulty step, command, environment
CASES = [
    ("trainer straggler 300 ms from step 15", "straggler", 1, FAULT_FROM,
     TRAINER + ["--inject", f"straggler:rank=1,ms=300,steps={FAULT_FROM}-60"], {}),
    ("trainer data stall 500 ms every 3rd step from step 15", "dataloader_stall", 1, FAULT_FROM,
     TRAINER + ["--inject", f"dataloader_stall:rank=1,ms=500,every=3,steps={FAULT_FROM}-60"], {}),
    ("plain script straggler 300 ms from step 1", "straggler", 1, 1, TORCHRUN + [str(PLAIN_JOB)],
     {"MODE": "ddp", "STEPS": "60", "STEP_MS": "50", "SLEEP_RANK": "1", "SLEEP_MS": "300"}),
    # memory_growth needs its warm-up (3 steps) and 5 more to fit: 8 steps at the earliest.
    ("plain script leak 16 MiB a step from step 1", "memory_growth", 1, 1,
     TORCHRUN + [str(DDP_LOADER), "--steps", "40", "--leak-rank", "1", "--leak-mb", "16"], {}),
]
ACTIONABLE = ("warning", "error", "critical")


def one(kind: str, rank: int, first: int, command: list[str], env: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        proc = subprocess.run([sys.executable, "-m", "diagtrain.profiler.cli", "run", "--out", str(out),
                               "--profile-steps", "none", "--no-analyze", "--", *command],
                              capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1", **env})
        if proc.returncode != 0:
            sys.exit(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        path = out / "live" / "findings.jsonl"
        events = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        steps = {r["step"]: r for r in map(json.loads, (out / "ranks" / str(rank) / "steps.jsonl").read_text().splitlines())}
        [host] = out.glob("hosts/*/host.json")
        live = json.loads(host.read_text()).get("live") or {}
    hit = next((e for e in events if e["kind"] == kind and e["ranks"] == [rank] and e["severity"] in ACTIONABLE), None)
    false = sorted({f"{e['kind']} {e['ranks']}" for e in events if e["severity"] in ACTIONABLE
                    and not (e["kind"] == kind and e["ranks"] == [rank])})
    step_s = statistics.median(r["duration_ms"] for s, r in steps.items() if s > 1) / 1e3
    return {"found": hit is not None, "latency_steps": hit["step"] - first + 1 if hit else None,
            "latency_s": round(hit["detected_at"] - steps[first]["start"], 2) if hit else None,
            "step_s": round(step_s, 3), "false_alarms": false, "judgements": live.get("judgements"),
            "live_cpu_s": live.get("cpu_s")}


def cpu_and_rounds(runs: list[dict]) -> str:
    return ", ".join(f"{x['live_cpu_s']} ({x['judgements']})" for x in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    rows = []
    for name, kind, rank, first, command, env in CASES:
        runs = [one(kind, rank, first, command, env) for _ in range(args.reps)]
        found = [r for r in runs if r["found"]]
        seconds = [r["latency_s"] for r in found]
        steps = [r["latency_steps"] for r in found]
        bound = [max(15.0, 3 * r["step_s"]) for r in found]
        rows.append({"case": name, "kind": kind, "runs": runs, "found": f"{len(found)}/{len(runs)}",
                     "median_s": round(statistics.median(seconds), 2) if seconds else None, "worst_s": max(seconds, default=None),
                     "median_steps": statistics.median(steps) if steps else None, "worst_steps": max(steps, default=None),
                     "within_target": len(found) == len(runs) and all(s <= b for s, b in zip(seconds, bound))})
        print(rows[-1]["case"], rows[-1]["found"], rows[-1]["median_s"], rows[-1]["worst_s"], flush=True)
    info = machine()
    lines = ["# Live judgement: from a fault's first step to its live finding", "",
             f"{info['date']}, {info['cpu_count']} cores, load {info['load_average_1_5_15']}, `{info['command']}`", "",
             "Latency: the first warning-or-worse event of the expected kind and rank in live/findings.jsonl; in steps "
             "counting the fault's first, and in seconds from that step's start. Target: at most 15 s or 3 steps, "
             "whichever is later.", "",
             "| case | found | median s | worst s | median steps | worst steps | step s | within target | false alarms | "
             "live CPU s (judgements) |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['found']} | {r['median_s']} | {r['worst_s']} | {r['median_steps']} | "
                     f"{r['worst_steps']} | {statistics.median(x['step_s'] for x in r['runs'])} | {r['within_target']} | "
                     f"{'; '.join(sorted({a for x in r['runs'] for a in x['false_alarms']})) or 'none'} | "
                     f"{cpu_and_rounds(r['runs'])} |")
    save("live_latency", {"machine": info, "rows": rows}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
