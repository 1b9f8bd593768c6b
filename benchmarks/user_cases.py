"""The accuracy suite's second table: plain user scripts (benchmarks/user_scripts/) under
`diagtrain run -- torchrun ...`, each once with --profile-steps and once with no flags at all.

A case is a script, its arguments (the fault, or none for the clean twin) and the verdict that is
right for it: the finding kind and the ranks it must name. Clean cases run CLEAN_REPEATS times
and once more while a CPU hog competes for the cores; no finding of warning severity or worse
may appear on any of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from common import live_alarms

SCRIPTS = Path(__file__).resolve().parent / "user_scripts"
STEPS = 10
PROFILE = "4-7"
HANG_TIMEOUT_S = "20"  # the watchdog's wait before it dumps a silent job (default 300 s)
CLEAN_REPEATS = 3
ACTIONABLE = ("warning", "error", "critical")
MODES = {"profiled": ["--profile-steps", PROFILE], "no flags": []}
RUN_TIMEOUT_S = 600
# The verdict a periodic checkpoint on one rank should get (a rank late every few steps). Which kind
# is right for it is still being decided (issue 37): change it here, the impact benchmark follows.
CHECKPOINT_KIND = "straggler"
# The extra MiB each checkpoint writes (and fsyncs): the tiny model's own state saves in a few ms.
CHECKPOINT_MB = "64"


@dataclass
class Case:
    """A plain script with one fault (``expected`` names the right verdict) or none (clean)."""

    name: str
    script: str
    nproc: int
    args: list[str] = field(default_factory=list)
    expected: tuple[str, list[int]] | None = None  # (finding kind, ranks it must name)
    run_options: list[str] = field(default_factory=list)  # extra `diagtrain run` options
    spawns: bool = False  # the script starts its ranks itself (torch.multiprocessing.spawn), no torchrun

    def job(self, steps: int = STEPS) -> list[str]:
        """The command line a user would type for it."""
        script = [str(SCRIPTS / self.script), *self.args, "--steps", str(steps)]
        if self.spawns:
            return [sys.executable, *script, "--nproc", str(self.nproc)]
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={self.nproc}", *script]


# The clean twins: every script, in every style, with no fault.
CLEAN = [
    Case("clean-ddp-loader", "ddp_loader.py", 2),
    Case("clean-ddp-loader-workers", "ddp_loader.py", 2, ["--workers", "2"]),
    Case("clean-fsdp2-bf16", "fsdp2_mp.py", 2),
    Case("clean-dtensor-tp", "dtensor_tp.py", 2),
    Case("clean-tp-fsdp-2d", "tp_fsdp_2d.py", 4),
    Case("clean-pipelining-gpipe", "pipeline.py", 2, ["--schedule", "gpipe"]),
    Case("clean-pipelining-1f1b", "pipeline.py", 2, ["--schedule", "1f1b"]),
    Case("clean-sendrecv-pipeline", "sendrecv_pipeline.py", 2),
    Case("clean-manual-tp", "manual_tp.py", 2),
    Case("clean-ddp-spawn", "ddp_spawn.py", 2, spawns=True),
    # No fault either: one rank's allocator churns memory (more page faults, the same work, a bit slower).
    Case("clean-ddp-churn", "ddp_loader.py", 2, ["--churn-rank", "1"]),
]
FAULTS = [
    Case("slow-rank-ddp", "ddp_loader.py", 2, ["--slow-rank", "1", "--slow-ms", "60"], ("straggler", [1])),
    Case("uneven-batch-ddp", "ddp_loader.py", 2, ["--batch-rank", "1", "--batch-scale", "8"], ("straggler", [1])),
    Case("slow-item-ddp", "ddp_loader.py", 2, ["--slow-item-rank", "1", "--slow-item-every", "3"],
         ("dataloader_stall", [1])),
    # Every item slow to read on one rank, in every step (32 items a batch: ~64 ms a step).
    Case("slow-loader-ddp", "ddp_loader.py", 2, ["--slow-loader-rank", "1", "--slow-loader-ms", "2"],
         ("dataloader_stall", [1])),
    # One rank saves a checkpoint (torch.save + fsync) after every 4th optimizer step.
    Case("checkpoint-ddp", "ddp_loader.py", 2,
         ["--checkpoint-rank", "0", "--checkpoint-every", "4", "--checkpoint-mb", CHECKPOINT_MB],
         (CHECKPOINT_KIND, [0])),
    # Every rank transforms its samples in the main process (2 ms each, 32 a batch): the job waits for its input.
    Case("input-bound-ddp", "ddp_loader.py", 2, ["--transform-ms", "2"], ("input_bound", [0, 1])),
    # Every rank saves a checkpoint (torch.save + fsync) after every 3rd optimizer step: the whole job stalls.
    Case("checkpoint-all-ddp", "ddp_loader.py", 2,
         ["--checkpoint-rank", "all", "--checkpoint-every", "3", "--checkpoint-mb", CHECKPOINT_MB],
         ("periodic_stall", [0, 1])),
    Case("slow-item-ddp-workers", "ddp_loader.py", 2,
         ["--workers", "2", "--slow-item-rank", "0", "--slow-item-every", "2", "--slow-item-ms", "600"],
         ("dataloader_stall", [0])),
    Case("hook-delay-ddp", "ddp_loader.py", 2, ["--hook-delay-rank", "1", "--hook-delay-ms", "30"],
         ("slow_collective", [1])),
    Case("extra-memory-ddp", "ddp_loader.py", 2, ["--hold-rank", "1", "--hold-mb", "300"], ("memory_imbalance", [1])),
    # One rank keeps every step's loss with its graph, and 16 MiB of outputs with it: memory that grows.
    # 16 MiB a step: with steps 4-8 profiled or building the trace, steps 9 and 10 alone must show it.
    Case("leak-ddp", "ddp_loader.py", 2, ["--leak-rank", "1", "--leak-mb", "16"], ("memory_growth", [1])),
    Case("hang-ddp", "ddp_loader.py", 2, ["--hang-rank", "1", "--hang-step", "5"], ("hang", [1]),
         ["--hang-timeout", HANG_TIMEOUT_S]),
    Case("crash-ddp", "ddp_loader.py", 2, ["--crash-rank", "1", "--crash-step", "5"], ("crash", [1])),
    Case("slow-rank-fsdp2", "fsdp2_mp.py", 2, ["--slow-rank", "0", "--slow-ms", "60"], ("straggler", [0])),
    Case("extra-memory-fsdp2", "fsdp2_mp.py", 2, ["--hold-rank", "0", "--hold-mb", "300"], ("memory_imbalance", [0])),
    Case("slow-rank-dtensor-tp", "dtensor_tp.py", 2, ["--slow-rank", "1", "--slow-ms", "60"], ("straggler", [1])),
    Case("slow-rank-2d", "tp_fsdp_2d.py", 4, ["--slow-rank", "2", "--slow-ms", "100"], ("straggler", [2])),
    Case("unbalanced-pipelining-gpipe", "pipeline.py", 2, ["--schedule", "gpipe", "--split", "6,2"],
         ("pipeline_bubble", [0])),
    Case("unbalanced-pipelining-1f1b", "pipeline.py", 2, ["--schedule", "1f1b", "--split", "2,6"],
         ("pipeline_bubble", [1])),
    Case("unbalanced-sendrecv", "sendrecv_pipeline.py", 2, ["--split", "6,2"], ("pipeline_bubble", [0])),
    Case("slow-rank-manual-tp", "manual_tp.py", 2, ["--slow-rank", "0", "--slow-ms", "60"], ("straggler", [0])),
    # Started as PyTorch's DDP tutorial starts it: mp.spawn, no launcher.
    Case("slow-rank-spawn", "ddp_spawn.py", 2, ["--slow-rank", "1", "--slow-ms", "60"], ("straggler", [1]), spawns=True),
]
USER_CASES = FAULTS + CLEAN


def run_user_cases(only: str | None, clean_repeats: int = CLEAN_REPEATS) -> dict:
    """Run every case in both modes; rows and a summary per mode."""
    runs = [(c, hog) for c in USER_CASES if only in (None, c.name)
            for hog in ([False] * (clean_repeats if c.expected is None else 1) + ([True] if c.expected is None else []))]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (case, hog) in enumerate(runs):
            for mode, options in MODES.items():
                out = Path(tmp) / f"{case.name}-{i}-{mode.replace(' ', '-')}"
                started = time.monotonic()
                report = _run(case, options, out, hog)
                row = {"case": case.name, "mode": mode, "cpu_hog": hog, "args": case.args, **score(case, report),
                       "seconds": round(time.monotonic() - started, 1)}
                rows.append(row)
                print(f"{'PASS' if row['ok'] else 'FAIL'} {case.name} [{mode}{', CPU hog' if hog else ''}]: "
                      f"{row['detail']}", flush=True)
    return {"summary": {mode: _summary([r for r in rows if r["mode"] == mode]) for mode in MODES}, "cases": rows,
            "clean_repeats": clean_repeats, "recorded": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def _run(case: Case, options: list[str], out: Path, hog: bool) -> dict:
    """`diagtrain run` the script (a failing or hung job is a result, not an error), then analyze."""
    cli = [sys.executable, "-m", "diagtrain.profiler.cli"]
    job = case.job()
    hogger = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if hog else None
    try:
        subprocess.run([*cli, "run", "--out", str(out), *options, *case.run_options, "--no-analyze", "--", *job],
                       capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env={**os.environ, "OMP_NUM_THREADS": "1"})
    except subprocess.TimeoutExpired:
        return {"findings": [], "error": f"diagtrain run did not finish in {RUN_TIMEOUT_S} s"}
    finally:
        if hogger:
            hogger.kill()
            hogger.wait()
    analyzed = subprocess.run([*cli, "analyze", str(out), "--format", "json", "--quiet"], capture_output=True, text=True)
    if analyzed.returncode != 0:
        return {"findings": [], "error": analyzed.stderr[-2000:]}
    return {**json.loads((out / "report.json").read_text()), "live_alarms": live_alarms(out)}


def score(case: Case, report: dict) -> dict:
    """ok, and a one-line detail: the verdict found (or missed), or the false alarms of a clean run."""
    actionable = [f for f in report.get("findings", []) if f["severity"] in ACTIONABLE]
    missing = [f for f in report.get("findings", []) if f["kind"] == "missing_evidence"]
    others = [f"{f['kind']} {f['ranks']}" for f in actionable]
    if case.expected is None:
        failed = f"analysis failed: {report['error'].strip().splitlines()[-1][:200]}" if report.get("error") else ""
        live = report.get("live_alarms", [])
        return {"ok": not actionable and not live and not failed, "false_alarms": others + live,
                "detail": failed or "; ".join([f"{f['kind']} {f['ranks']}: {f['explanation'][:160]}" for f in actionable]
                                              + live) or "no alarm"}
    kind, ranks = case.expected
    matching = [f for f in actionable if f["kind"] == kind]
    located = [f for f in matching if set(ranks) <= set(f["ranks"])]
    verdict = "located" if located else "found, wrong ranks" if matching else "missed"
    extra = [o for f, o in zip(actionable, others) if f not in located]
    detail = f"{kind} {ranks} {verdict}" + (f"; also {', '.join(extra)}" if extra else "")
    if not located and missing:
        detail += f" (missing evidence: {missing[0]['metrics'].get('check')})"
    if report.get("error"):
        detail += f" (analysis failed: {report['error'].strip().splitlines()[-1][:200]})"
    return {"ok": bool(located), "found": bool(matching), "located": bool(located), "other_findings": extra,
            "missing_evidence": [m["metrics"].get("check") for m in missing], "detail": detail}


def _summary(rows: list[dict]) -> dict:
    faults = [r for r in rows if "located" in r]
    clean = [r for r in rows if "false_alarms" in r]
    return {"faults": len(faults), "located": sum(r["located"] for r in faults),
            "found": sum(r["found"] for r in faults), "clean_runs": len(clean),
            "false_alarm_runs": sum(bool(r["false_alarms"]) for r in clean),
            "false_alarm_runs_with_hog": sum(bool(r["false_alarms"]) for r in clean if r["cpu_hog"]),
            "clean_runs_with_hog": sum(r["cpu_hog"] for r in clean)}


def user_markdown(user: dict) -> str:
    """The second table: plain user scripts, both modes side by side."""
    lines = []
    profiled = [r for r in user["cases"] if r["mode"] == "profiled"]
    plain = [r for r in user["cases"] if r["mode"] == "no flags"]
    for p, n in zip(profiled, plain):
        name = p["case"] + (" (CPU hog)" if p["cpu_hog"] else "")
        lines.append(f"| {name} | {_cell(p)} | {_cell(n)} |")
    summary = user["summary"]

    def line(mode: str) -> str:
        s = summary[mode]
        return (f"- {mode}: **{s['located']}/{s['faults']} faults found and located** ({s['found']} with the right kind); "
                f"**{s['false_alarm_runs']}/{s['clean_runs']} clean runs with a false alarm** "
                f"({s['false_alarm_runs_with_hog']}/{s['clean_runs_with_hog']} beside a CPU hog)")
    recorded = f"Recorded {user['recorded']}." if user.get("recorded") else "Recorded by an earlier run (2026-11-24)."
    return f"""## Plain user scripts

{recorded}

Each case: `diagtrain run [--profile-steps {PROFILE}] -- torchrun --nproc-per-node N benchmarks/user_scripts/SCRIPT ARGS
--steps {STEPS}`, then `diagtrain analyze`; the scripts import nothing from diagtrain. Clean cases
{user.get('clean_repeats', CLEAN_REPEATS)} times, then once beside a CPU hog (`python -c "while True: pass"`). A clean run's
false alarm is a warning or worse in its report or raised by live judgement while it ran (live/findings.jsonl).

{line("profiled")}
{line("no flags")}

| case | --profile-steps {PROFILE} | no flags |
| --- | --- | --- |
{chr(10).join(lines)}
"""


def _cell(row: dict) -> str:
    return ("pass" if row["ok"] else "**fail**") + ": " + row["detail"].replace("|", "/")[:300]
