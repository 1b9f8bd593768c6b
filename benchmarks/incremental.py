"""Analyzing a run again after it grew (issue 39, item 3): the step records are read from the per-rank
cache (read/step_cache.py) and only what was appended is parsed.

A synthetic run (benchmarks/live_cost.py's ``SyntheticJob``: ranks working data, forward, backward and
optimizer, rank 1 a straggler) of ``S`` steps is analyzed once with no cache (cold: every line parsed,
the cache written), then grown by ``N`` steps and analyzed again (incremental: the cache read, the ``N``
new lines parsed), for each ``N`` in turn. Each grown run is also analyzed into another folder, where
no cache is (cold again), and its step records read the way they were read before the cache
(``read_step_records`` without one: the old full read). Every analysis is the whole ``diagtrain
analyze`` pipeline in this process (report formats json); its stages are timed from its progress
messages, and the step-reading stage directly (``run_read.read_step_records``, wall and CPU).

With ``--after-live``, each run is also grown the way a running job grows under ``diagtrain run``:
``--steps-per-judgement`` steps at a time, each followed by a live judgement (judge/live_judge.py, default
settings), which puts the records read into the final analysis' cache; then the final analysis (*after
live*) against a cold one of the same run.

    python benchmarks/incremental.py [--runs 8x5000 8x20000 64x1000] [--grow 10 100 1000] [--after-live] [--no-save]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, save  # noqa: E402
from live_cost import SyntheticJob  # noqa: E402

from diagtrain.profiler.analyzer.analyze import analyze  # noqa: E402
from diagtrain.profiler.analyzer.judge.live_judge import LiveJudge  # noqa: E402
from diagtrain.profiler.analyzer.read.inputs import Inputs  # noqa: E402
from diagtrain.profiler.analyzer.read import run_read  # noqa: E402

STAGES = {"building the tables": "load", "running the detectors": "tables", "writing the results": "judge"}


class Timed:
    """``run_read.read_step_records`` and ``run_read.read_steps_cached`` wrapped: the stage's wall and CPU
    seconds and the lines parsed, per analysis."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0
        self.parsed = 0
        self.read_records, self.read_cached = run_read.read_step_records, run_read.read_steps_cached
        run_read.read_step_records, run_read.read_steps_cached = self._records, self._cached

    def _records(self, *args: Any) -> Any:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return self.read_records(*args)
        finally:
            self.wall += time.perf_counter() - wall
            self.cpu += time.process_time() - cpu

    def _cached(self, *args: Any) -> Any:
        found = self.read_cached(*args)
        self.parsed += found.parsed
        return found

    def analysis(self, run: Path, out: Path) -> dict[str, float]:
        """One whole analysis of ``run`` into ``out``: its wall time, its stages', the step reading's."""
        self.wall = self.cpu = 0.0
        self.parsed = 0
        marks = []
        started = time.perf_counter()
        analyze(run, out, ["json"], workers=1, progress=lambda message: marks.append((message, time.perf_counter())))
        ended = time.perf_counter()
        stages, last = {}, started
        for message, at in marks:
            if message in STAGES:
                stages[STAGES[message]] = round(at - last, 3)
                last = at
        stages["write"] = round(ended - last, 3)
        return {"wall_s": round(ended - started, 3), "steps_wall_s": round(self.wall, 3),
                "steps_cpu_s": round(self.cpu, 3), "lines_parsed": self.parsed, "stages_s": stages}

    def old_read(self, run: Path) -> float:
        """Wall seconds of the step records read as before the cache: every line, no cache."""
        inputs = Inputs()
        started = time.perf_counter()
        self.read_records(run_read.rank_folders(run, inputs), inputs, [], None)
        return round(time.perf_counter() - started, 3)


def measure(timed: Timed, ranks: int, steps: int, grow: list[int], root: Path) -> list[dict]:
    """One synthetic run: cold, then grown by each of ``grow`` in turn, incremental and cold."""
    run = root / f"run-{ranks}x{steps}"
    job = SyntheticJob(run, ranks)
    job.append(steps)
    rows = [{"ranks": ranks, "steps": steps, "grown_by": 0, "cold": timed.analysis(run, run), "old_read_s": timed.old_read(run)}]
    print(json.dumps(rows[-1]), flush=True)
    for n in grow:
        job.append(n)
        incremental = timed.analysis(run, run)
        cold_out = root / "cold"
        cold = timed.analysis(run, cold_out)
        shutil.rmtree(cold_out)
        rows.append({"ranks": ranks, "steps": job.step, "grown_by": n, "incremental": incremental, "cold": cold,
                     "old_read_s": timed.old_read(run)})
        print(json.dumps(rows[-1]), flush=True)
    shutil.rmtree(run)
    return rows


def after_live(timed: Timed, ranks: int, steps: int, per_judgement: int, root: Path) -> dict:
    """One synthetic run grown ``per_judgement`` steps between live judgements, then analyzed: the
    judgements' CPU, the part of it spent on the step cache, and the final analysis against a cold one."""
    run = root / f"live-{ranks}x{steps}"
    job, judge = SyntheticJob(run, ranks), LiveJudge(run)
    cache_steps, cache_cpu = judge.steps.cache_steps, [0.0]

    def timed_cache(*args: Any) -> int:
        cpu = time.thread_time()
        try:
            return cache_steps(*args)
        finally:
            cache_cpu[0] += time.thread_time() - cpu
    judge.steps.cache_steps = timed_cache
    judge_cpu, judgements = 0.0, 0
    while job.step < steps:
        job.append(min(per_judgement, steps - job.step))
        cpu = time.thread_time()
        judge.judge()
        judge_cpu, judgements = judge_cpu + time.thread_time() - cpu, judgements + 1
    row = {"ranks": ranks, "steps": steps, "grown_by": 0, "steps_per_judgement": per_judgement,
           "judgements": judgements, "judge_cpu_s": round(judge_cpu, 3), "cache_cpu_s": round(cache_cpu[0], 3),
           "after live": timed.analysis(run, run), "cold": timed.analysis(run, root / "cold"),
           "old_read_s": timed.old_read(run)}
    shutil.rmtree(run), shutil.rmtree(root / "cold")
    print(json.dumps(row), flush=True)
    return row


def markdown(rows: list[dict], facts: dict) -> str:
    lines = ["# Incremental analysis: a run analyzed again after it grew", "",
             f"{facts['date']}, {facts['cpu_count']} cores, load {facts['load_average_1_5_15']}, `{facts['command']}`", "",
             "Synthetic step records (benchmarks/live_cost.py's SyntheticJob), the whole `diagtrain analyze` pipeline "
             "in one process (json report). *cold*: no cache (every line parsed, the cache written); *incremental*: "
             "the previous analysis' cache read, only the lines appended since parsed (and each file's last line "
             "again: a full read judges it apart, so the cache stops before it). *old read*: the step records "
             "read as before the cache (`read_step_records` with none), for the same file.", "",
             "| ranks | steps | grown by | analysis | wall s | step reading wall s | its CPU s | its CPU µs per step record "
             "| lines parsed | old read s | tables s | judge s | write s | rest µs per step record |",
             "| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        records = r["ranks"] * r["steps"]
        for kind in ("incremental", "after live", "cold"):
            if kind not in r:
                continue
            a, s = r[kind], r[kind]["stages_s"]
            rest_us = (a["wall_s"] - a["steps_wall_s"]) / records * 1e6
            lines.append(f"| {r['ranks']} | {r['steps']:,} | {r['grown_by']:,} | {kind} | {a['wall_s']} | "
                         f"{a['steps_wall_s']} | {a['steps_cpu_s']} | {a['steps_cpu_s'] / records * 1e6:.1f} | "
                         f"{a['lines_parsed']:,} | {r['old_read_s']} | {s.get('tables', '')} | {s.get('judge', '')} | "
                         f"{s.get('write', '')} | {rest_us:.0f} |")
    live = [r for r in rows if "after live" in r]
    if live:
        lines += ["", "Live judgement, as the run grew (*after live* rows): its CPU, and the part spent putting step records "
                  "in the cache.", "",
                  "| ranks | steps | steps per judgement | judgements | judgement CPU s | of it, the cache | cache CPU µs "
                  "per record cached | lines left to the final analysis |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in live:
            cached = r["ranks"] * r["steps"] - r["after live"]["lines_parsed"]
            lines.append(f"| {r['ranks']} | {r['steps']:,} | {r['steps_per_judgement']} | {r['judgements']} | "
                         f"{r['judge_cpu_s']} | {r['cache_cpu_s']} | {r['cache_cpu_s'] / max(cached, 1) * 1e6:.0f} | "
                         f"{r['after live']['lines_parsed']:,} |")
    return "\n".join(lines) + "\n" + NOTES


# What the numbers say, written once the results were in (see the md for the run they are from).
NOTES = """
*tables s* is the table build (the step reading inside it), *judge s* the detectors, passes, ledger
and critical path, *write s* the outputs; loading the ranks is ~0 here (no traces). *rest µs per step
record*: the analysis' wall time outside the step reading, per rank and step of the whole run.

What is proportional to N: the lines parsed (`lines parsed`: the N new lines per rank, and each
file's last line again) and the Parquet written (the new rows, or a last file of under 4,096 rows
rewritten with them: at most 4,096 + N rows a rank). What still costs the whole run, per step record:
reading the cached rows back (Parquet to Python rows, ~8 µs) and the steps table built from every row
as before (~4 µs), so the step reading of an incremental analysis is ~10 µs per step record of the
run against ~45 µs cold (15 µs at 64 ranks x 1,000 steps: each rank's files, state and small last
file rewritten are a fixed ~10 ms);
and everything after the reading, unchanged by the cache: the detectors, passes, ledger and
critical path judge every step of the run (the straggler detector loops over every step), which is
most of an incremental analysis at 8 ranks (*judge s*). A cold analysis pays for writing the cache:
compare its step reading with *old read s* (the same file read with no cache, as before).
The host is shared: wall times vary by tens of percent between neighbouring rows (see the load
average); compare CPU seconds and ratios within a row.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", default=["8x5000", "8x20000", "64x1000"], help="RANKSxSTEPS")
    parser.add_argument("--grow", type=int, nargs="*", default=[10, 100, 1000], help="none: no grown analyses")
    parser.add_argument("--after-live", action="store_true", help="also each run grown under live judgement")
    parser.add_argument("--steps-per-judgement", type=int, default=25, help="with --after-live (default: 25)")
    parser.add_argument("--name", default="incremental", help="results/<name>.md and .json")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    timed = Timed()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        warm = Path(tmp) / "warm-up"
        SyntheticJob(warm, 2).append(20)
        timed.analysis(warm, warm)  # imports and first calls, outside the measured analyses
        for spec in args.runs:
            ranks, steps = (int(x) for x in spec.split("x"))
            rows += measure(timed, ranks, steps, args.grow, Path(tmp)) if args.grow else []
            if args.after_live:
                rows.append(after_live(timed, ranks, steps, args.steps_per_judgement, Path(tmp)))
    facts = machine()
    if not args.no_save:
        save(args.name, {"machine": facts, "results": rows}, markdown(rows, facts))
    print(markdown(rows, facts))


if __name__ == "__main__":
    main()
