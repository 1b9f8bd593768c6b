"""Overhead of `diagtrain run` on step time, outside profiled windows.

1. A plain training script (overhead_job.py: DDP, a DataLoader, a 4-layer transformer encoder,
   AdamW; no diagtrain import) alone, under `diagtrain run --profile-steps none` (everything that is
   always on: bootstrap, step records and heartbeat, the counters and their hooks, teed logs,
   flight recorder, telemetry, live judgement), and under plain `diagtrain run` (the default, auto
   profiling: steps inside its windows are left out). Every wrapped run serves the metrics
   endpoint (``--metrics-port``), scraped every second while it runs (harsher than Prometheus'
   15 s). Runs alternate; the script times its own steps, so every arm is measured the same way.
2. The reference trainer (its own StepRecorder) alone against under `diagtrain run --profile-steps
   none`: what the wrapper adds to a loop that records steps itself.
3. Step time inside a profiled window against outside it.
4. What the in-rank counters cost per call, measured in one process: a wrapped wait, a phase,
   a module call with the global hooks, a step's counter reading.

    python benchmarks/overhead.py [--pairs 5] [--steps 60]

Target: median step time under `diagtrain run` <= 1.01 x alone, outside profiled windows.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
import timeit
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from common import machine, run, save

WARMUP_STEPS = 5  # first steps carry start-up and allocator growth, not steady state
TRAINER = ["--strategy", "ddp", "--nproc", "2", "--dim", "256", "--layers", "4", "--seq-len", "64"]
JOB = Path(__file__).resolve().parent / "overhead_job.py"
TARGET_RATIO = 1.01
ARMS = {"alone": [], "always on": ["--profile-steps", "none"], "default (auto)": []}
SCRAPE_EVERY_S = 1.0  # how often the metrics endpoint is read while a wrapped job runs


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def scraped(port: int) -> Iterator[list[int]]:
    """Read http://127.0.0.1:PORT/metrics every SCRAPE_EVERY_S while the block runs; the scrapes that
    answered, in a list (a job not started yet, or ended, refuses them)."""
    answered: list[int] = []
    stop = threading.Event()

    def scrape() -> None:
        while not stop.wait(SCRAPE_EVERY_S):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                    answered.append(len(response.read()))
            except OSError:
                pass

    thread = threading.Thread(target=scrape, daemon=True)
    thread.start()
    try:
        yield answered
    finally:
        stop.set()
        thread.join()


def run_wrapped(cmd: list[str], env: dict | None = None) -> int:
    """Run a `diagtrain run` command line with the metrics endpoint on, scraped; the scrapes answered."""
    port = free_port()
    with scraped(port) as answered:
        run([*cmd[:4], "--metrics-port", str(port), *cmd[4:]], env=env)
    return len(answered)


def torchrun() -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(JOB)]


def job_median_ms(times_dir: Path, skip: set[int]) -> float:
    """Median over ranks of each rank's median step time (steps after warm-up, not in ``skip``)."""
    per_rank = []
    for path in sorted(times_dir.glob("rank*.json")):
        times = json.loads(path.read_text())
        per_rank.append(statistics.median(ms for step, ms in enumerate(times, start=1)
                                          if step > WARMUP_STEPS and step not in skip))
    return statistics.median(per_rank)


def profiled_steps(run_dir: Path) -> set[int]:
    path = run_dir / "profile_windows.json"
    windows = json.loads(path.read_text())["windows"] if path.exists() else []
    return {s for w in windows for s in range(w["first"], w["last"] + 1)}


def plain_job_arm(tmp: Path, name: str, steps: int) -> float:
    times = tmp / "times"
    env = {"STEPS": str(steps), "STEP_TIMES_DIR": str(times), "OMP_NUM_THREADS": "1"}
    if name == "alone":
        run(torchrun(), env=env)
        return job_median_ms(times, set())
    out = tmp / "run"
    if not run_wrapped([sys.executable, "-m", "diagtrain.profiler.cli", "run", "--out", str(out), "--no-analyze",
                        *ARMS[name], "--", *torchrun()], env=env):
        sys.exit(f"{name}: the metrics endpoint never answered")
    return job_median_ms(times, profiled_steps(out))


def recorded_median_ms(run_dir: Path, steps: range | None = None) -> float:
    """Median over ranks of each rank's median steady-state step time, from steps.jsonl."""
    per_rank = []
    for path in sorted(run_dir.glob("ranks/*/steps.jsonl")):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        keep = [r["duration_ms"] for r in records if r["step"] > WARMUP_STEPS and (steps is None or r["step"] in steps)]
        per_rank.append(statistics.median(keep))
    return statistics.median(per_rank)


def trainer(out: Path, steps: int) -> list[str]:
    return [sys.executable, "-m", "diagtrain.profiler.cli", "train", *TRAINER, "--steps", str(steps), "--out", str(out)]


def wrapped(out: Path, steps: int, *options: str) -> list[str]:
    return [sys.executable, "-m", "diagtrain.profiler.cli", "run", "--out", str(out), "--no-analyze", *options, "--",
            sys.executable, "-m", "diagtrain.profiler.cli", "train", *TRAINER, "--steps", str(steps)]


def per_call_us() -> dict[str, float]:
    """The in-rank counters' own cost per call (µs), against the same call unwrapped."""
    import torch

    from diagtrain.profiler.rank.counters import LEARN_STEPS, Counters, _phase_wrapper, _wait_wrapper
    from diagtrain.profiler.rank.instrument import StepRecorder

    counters = Counters()
    bare = lambda: None  # noqa: E731 - the cheapest callable: what remains is the wrapper
    n = 200_000
    base = timeit.timeit(bare, number=n)
    costs = {"wrapped wait": (timeit.timeit(_wait_wrapper(bare, counters), number=n) - base) / n * 1e6,
             "timed phase": (timeit.timeit(_phase_wrapper(bare, counters, "data"), number=n) - base) / n * 1e6}
    module, x = torch.nn.Identity(), torch.zeros(1)
    plain = timeit.timeit(lambda: module(x), number=n)
    counters.set_phase_tracking(True)
    hooked = timeit.timeit(lambda: module(x), number=n)
    for _ in range(LEARN_STEPS):
        counters.step_ended()  # the module was called with no phase open: it is a root, it keeps a hook
    root = timeit.timeit(lambda: module(x), number=n)
    counters.set_phase_tracking(False)
    costs[f"module call, first {LEARN_STEPS} steps (global hooks)"] = (hooked - plain) / n * 1e6
    costs["outermost module call, later steps (its own hooks; inner modules: none)"] = (root - plain) / n * 1e6
    with tempfile.TemporaryDirectory() as d, StepRecorder(d, rank=0) as rec:
        start = time.perf_counter()
        for _ in range(2000):
            rec.step(samples=1)
        costs["StepRecorder.step() with the counters"] = (time.perf_counter() - start) / 2000 * 1e6
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5, help="alternating rounds of every arm (default 5)")
    parser.add_argument("--steps", type=int, default=60, help="steps per run (default 60)")
    args = parser.parse_args()
    plain: dict[str, list[float]] = {name: [] for name in ARMS}
    alone, under_run = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            order = list(ARMS) if i % 2 == 0 else list(reversed(ARMS))  # no arm always runs first
            for name in order:
                plain[name].append(plain_job_arm(Path(tmp) / f"{name}-{i}", name, args.steps))
            a, b = Path(tmp) / f"alone{i}", Path(tmp) / f"run{i}"
            run(trainer(a, args.steps))
            run_wrapped(wrapped(b, args.steps, "--profile-steps", "none"))
            alone.append(recorded_median_ms(a))
            under_run.append(recorded_median_ms(b))
            print(f"round {i + 1}: " + ", ".join(f"{n} {v[-1]:.2f} ms" for n, v in plain.items())
                  + f"; trainer alone {alone[-1]:.2f} ms, under diagtrain run {under_run[-1]:.2f} ms", flush=True)
        window = range(args.steps // 2, args.steps // 2 + 10)
        p = Path(tmp) / "profiled"
        run(wrapped(p, args.steps, "--profile-steps", f"{window.start}-{window.stop - 1}"))
        inside = recorded_median_ms(p, window)
        outside = recorded_median_ms(p, range(WARMUP_STEPS + 1, window.start - 1))
    ratios = {name: [v / a for v, a in zip(values, plain["alone"])] for name, values in plain.items() if name != "alone"}
    ratio = {name: statistics.median(r) for name, r in ratios.items()}
    trainer_ratio = statistics.median(b / a for a, b in zip(alone, under_run))
    result = {
        "machine": machine(),
        "plain_job": {"script": JOB.name, "steps": args.steps, "median_step_ms": plain, "ratio_per_round": ratios,
                      "ratio_median": ratio},
        "trainer": TRAINER + ["--steps", str(args.steps)],
        "warmup_steps_excluded": WARMUP_STEPS,
        "alone_median_step_ms": alone,
        "under_run_median_step_ms": under_run,
        "ratio_median": trainer_ratio,
        "target_ratio": TARGET_RATIO,
        "met": max(*ratio.values(), trainer_ratio) <= TARGET_RATIO,
        "profiled_window": {"steps": [window.start, window.stop - 1], "inside_ms": inside, "outside_ms": outside,
                            "ratio": inside / outside},
        "per_call_us": per_call_us(),
    }
    save("overhead", result, markdown(result, plain, alone, under_run))
    print(markdown(result, plain, alone, under_run))


def markdown(result: dict, plain: dict[str, list[float]], alone: list[float], under_run: list[float]) -> str:
    m, ratio, window = result["machine"], result["plain_job"]["ratio_median"], result["profiled_window"]

    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):.2f} ms (runs: {', '.join(f'{x:.2f}' for x in values)})"

    verdict = lambda r: f"**{r:.3f}** (target <= {TARGET_RATIO}: {'met' if r <= TARGET_RATIO else 'missed'})"  # noqa: E731
    calls = "\n".join(f"| {name} | {us:.2f} us |" for name, us in result["per_call_us"].items())
    return f"""# Overhead of `diagtrain run`

{m['date']}, {m['cpu_count']} cores, {m['memory_gib']} GiB, Python {m['python']}, torch {m['torch']}.
Command: `{m['command']}`. Steps {WARMUP_STEPS + 1}-{result['plain_job']['steps']} of each run, rounds alternating.
Every `diagtrain run` arm judges the job live (the default) and serves `--metrics-port`, scraped every
{SCRAPE_EVERY_S:g} s while it runs.

**A plain script** (`benchmarks/{result['plain_job']['script']}`: DDP on 2 gloo ranks, DataLoader,
4-layer transformer encoder, AdamW; no diagtrain import), timed by itself:

| | median step time |
| --- | --- |
| alone | {cell(plain['alone'])} |
| `diagtrain run --profile-steps none` (always on) | {cell(plain['always on'])} |
| `diagtrain run` (auto profiling; steps outside its windows) | {cell(plain['default (auto)'])} |
| ratio, always on (median of rounds) | {verdict(ratio['always on'])} |
| ratio, default (median of rounds) | {verdict(ratio['default (auto)'])} |

**The reference trainer** (`diagtrain train {' '.join(result['trainer'])}`, which records its own steps):

| | median step time |
| --- | --- |
| alone | {cell(alone)} |
| `diagtrain run --profile-steps none` | {cell(under_run)} |
| ratio (median of rounds) | {verdict(result['ratio_median'])} |
| inside a profiled window (steps {window['steps'][0]}-{window['steps'][1]}) | {window['inside_ms']:.2f} ms vs {window['outside_ms']:.2f} ms outside: x{window['ratio']:.2f} |

**The counters' own cost per call** (one process, against the same call unwrapped):

| | cost |
| --- | --- |
{calls}

Always on means: the bootstrap, step records and heartbeat, the counters (a timed `Work.wait`,
functional-collective wait and DataLoader `__next__`; backward wrapped, with DDP's final-callback
window; forward hooks on the outermost modules for the forward phase of a script without its own
StepRecorder; one CPU-time, scheduler and process-group reading per step), teed logs, NCCL and
flight-recorder settings, telemetry once a second. Differences of a few percent between rounds are
this shared machine's noise (other jobs run on it); the per-call costs bound what the counters add:
for the plain script, one outermost module call (the DDP model), a handful of waits
and one StepRecorder step per training step.
"""


if __name__ == "__main__":
    main()
