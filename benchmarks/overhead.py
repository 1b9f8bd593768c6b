"""Overhead of `diagtrain run` on step time: the reference trainer alone against the same trainer
under `diagtrain run` (steps, heartbeat, logs, flight recorder, telemetry at its default rate),
alternating runs; plus the cost inside a profiled window and of one StepRecorder.step() call.

    python benchmarks/overhead.py [--pairs 3] [--steps 60]

Target: median step time under `diagtrain run` <= 1.01 x alone, outside profiled windows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import machine, run, save

WARMUP_STEPS = 5  # first steps carry start-up and allocator growth, not steady state
TRAINER = ["--strategy", "ddp", "--nproc", "2", "--dim", "256", "--layers", "4", "--seq-len", "64"]
TARGET_RATIO = 1.01


def median_step_ms(run_dir: Path, steps: range | None = None) -> float:
    """Median over ranks of each rank's median steady-state step time."""
    per_rank = []
    for path in sorted(run_dir.glob("ranks/*/steps.jsonl")):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        keep = [r["duration_ms"] for r in records if r["step"] > WARMUP_STEPS and (steps is None or r["step"] in steps)]
        per_rank.append(statistics.median(keep))
    return statistics.median(per_rank)


def trainer(out: Path, steps: int) -> list[str]:
    return [sys.executable, "-m", "diagtrain.profiler.cli", "train", *TRAINER, "--steps", str(steps), "--out", str(out)]


def wrapped(out: Path, steps: int, *options: str) -> list[str]:
    return [sys.executable, "-m", "diagtrain.profiler.cli", "run", "--out", str(out), *options, "--",
            sys.executable, "-m", "diagtrain.profiler.cli", "train", *TRAINER, "--steps", str(steps)]


def recorder_call_us(calls: int = 2000) -> float:
    """Cost of one StepRecorder.step() (a JSON line and a heartbeat rename), in microseconds."""
    from diagtrain.profiler.instrument import StepRecorder

    with tempfile.TemporaryDirectory() as d, StepRecorder(d, rank=0) as rec:
        start = time.perf_counter()
        for _ in range(calls):
            rec.step(samples=1)
        return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3, help="alternating alone/wrapped pairs (default 3)")
    parser.add_argument("--steps", type=int, default=60, help="steps per run (default 60)")
    args = parser.parse_args()
    alone, under_run = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            a, b = Path(tmp) / f"alone{i}", Path(tmp) / f"run{i}"
            run(trainer(a, args.steps))
            run(wrapped(b, args.steps))
            alone.append(median_step_ms(a))
            under_run.append(median_step_ms(b))
            print(f"pair {i + 1}: alone {alone[-1]:.2f} ms, under diagtrain run {under_run[-1]:.2f} ms", flush=True)
        window = range(args.steps // 2, args.steps // 2 + 10)
        p = Path(tmp) / "profiled"
        run(wrapped(p, args.steps, "--profile-steps", f"{window.start}-{window.stop - 1}"))
        inside = median_step_ms(p, window)
        outside = median_step_ms(p, range(WARMUP_STEPS + 1, window.start - 1))
    ratios = [b / a for a, b in zip(alone, under_run)]
    ratio = statistics.median(ratios)
    result = {
        "machine": machine(),
        "trainer": TRAINER + ["--steps", str(args.steps)],
        "warmup_steps_excluded": WARMUP_STEPS,
        "alone_median_step_ms": alone,
        "under_run_median_step_ms": under_run,
        "ratio_per_pair": ratios,
        "ratio_median": ratio,
        "target_ratio": TARGET_RATIO,
        "met": ratio <= TARGET_RATIO,
        "profiled_window": {"steps": [window.start, window.stop - 1], "inside_ms": inside, "outside_ms": outside,
                            "ratio": inside / outside},
        "step_recorder_call_us": recorder_call_us(),
    }
    m = result["machine"]
    markdown = f"""# Overhead of `diagtrain run`

{m['date']}, {m['cpu_count']} cores, {m['memory_gib']} GiB, Python {m['python']}, torch {m['torch']}.
Command: `{m['command']}`. Trainer: `diagtrain train {' '.join(result['trainer'])}` (gloo, CPU).

| | median step time |
| --- | --- |
| trainer alone | {statistics.median(alone):.2f} ms (runs: {', '.join(f'{x:.2f}' for x in alone)}) |
| under `diagtrain run` | {statistics.median(under_run):.2f} ms (runs: {', '.join(f'{x:.2f}' for x in under_run)}) |
| ratio (median of pairs) | **{ratio:.3f}** (target <= {TARGET_RATIO}: {'met' if result['met'] else 'missed'}) |
| inside a profiled window | {inside:.2f} ms vs {outside:.2f} ms outside: x{inside / outside:.2f} |
| one `StepRecorder.step()` | {result['step_recorder_call_us']:.0f} us |

Steps 1-{WARMUP_STEPS} are excluded (start-up). The trainer records steps.jsonl in both arms (it
uses the StepRecorder API itself); the difference is what the wrapper adds: bootstrap, teed logs,
NCCL and flight-recorder settings, telemetry sampling once a second, progress.
"""
    save("overhead", result, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
