"""The regression gate itself: does `diagtrain compare` stay quiet on clean runs and catch real slowdowns?

The reference trainer (DDP, 2 ranks) run clean 3 times and once beside a CPU hog, and with real
slowdowns: a straggler costing 10/20/50% of a step, a slower collective, a larger model; with
``--plain`` also a plain torchrun script (4 clean runs, one with a sleeping rank). Then:

- false regressions: every clean run against every other (one-run baselines) and against every
  3-run baseline it is not part of; the target is no exit 1 at all;
- detection: each slowdown against a 3-run baseline (and a one-run one), the exit code, the first
  regression named, and the step time change actually measured.

Writes results/compare.md and results/compare.json. About 5 minutes on this 2-core machine when it
is quiet (9 runs; 3-4x that while other jobs share it), plus 3 with ``--plain``.
"""

from __future__ import annotations

import itertools
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import machine, run, save

from diagtrain.profiler.cli.compare import EXIT_CODES
from diagtrain.profiler.compare import regression, summary

REPO = Path(__file__).resolve().parent.parent
TRAINER = ["--strategy", "ddp", "--nproc", "2", "--steps", "20", "--dim", "256", "--seq-len", "64"]
PLAIN = REPO / "tests" / "scripts" / "plain_job.py"
PLAIN_ENV = {"MODE": "ddp", "STEPS": "24", "STEP_MS": "40", "OMP_NUM_THREADS": "1"}
SLOWDOWNS = (0.10, 0.20, 0.50)  # of a clean step, as a straggler's sleep
CLEAN = 3  # clean runs of each job, plus one of the trainer beside a CPU hog
BASELINE = 3


def trainer(out: Path, *extra: str) -> None:
    run([sys.executable, "-m", "diagtrain.profiler.cli", "run", "--out", str(out), "--", sys.executable, "-m",
         "diagtrain.profiler.cli", "train", *TRAINER, *extra], env={"OMP_NUM_THREADS": "1"})


def plain(out: Path, env: dict[str, str]) -> None:
    run([sys.executable, "-m", "diagtrain.profiler.cli", "run", "--out", str(out), "--", sys.executable, "-m",
         "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(PLAIN)], env={**PLAIN_ENV, **env})


def with_hog(make) -> None:
    """Run ``make()`` beside one busy-looping process (another job on the host)."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        make()
    finally:
        hog.kill()
        hog.wait()


def step_ms(s: dict) -> float:
    return statistics.median(s["samples"]["step time"])


def judged(base: list[dict], new: dict) -> dict:
    c = regression.compare(base, new, 5.0)
    first = c.regressions[0] if c.regressions else None
    return {"exit": EXIT_CODES[c.verdict], "verdict": c.verdict,
            "first": f"{first.metric} ({first.scope})" if first else None,
            "machine": c.machine.different + c.machine.contention}


def clean_pairs(runs: dict[str, dict]) -> dict:
    """Every clean run against every other, and against every 3-run baseline it is not in."""
    names = sorted(runs)
    one = [judged([runs[a]], runs[b]) for a, b in itertools.permutations(names, 2)]
    three = [judged([runs[n] for n in base], runs[new]) for base in itertools.combinations(names, BASELINE)
             for new in names if new not in base]
    return {"one_run": _counts(one), "three_runs": _counts(three)}


def _counts(results: list[dict]) -> dict:
    return {"pairs": len(results), **{f"exit_{code}": sum(r["exit"] == code for r in results) for code in (0, 1, 3)},
            "machine_said": sum(bool(r["machine"]) for r in results)}


def slowdowns(clean: dict[str, dict], slow: dict[str, tuple[str, dict]]) -> list[dict]:
    base = [clean[n] for n in sorted(clean)[:BASELINE]]
    center = statistics.geometric_mean(step_ms(b) for b in base)
    rows = []
    for name, (what, s) in slow.items():
        three, one = judged(base, s), judged(base[:1], s)
        rows.append({"run": name, "what": what, "step_change_pct": round((step_ms(s) / center - 1) * 100, 1),
                     "exit_3_runs": three["exit"], "first_regression": three["first"], "exit_1_run": one["exit"],
                     "machine": three["machine"]})
    return rows


def make_runs(root: Path, with_plain: bool) -> tuple[dict, dict, dict, dict]:
    for i in range(1, CLEAN + 1):
        say(f"trainer clean {i}")
        trainer(root / f"trainer-clean{i}")
    say("trainer clean, beside a CPU hog")
    with_hog(lambda: trainer(root / f"trainer-clean{CLEAN + 1}-hog"))
    clean_t = {p.name: summary.summarize(p) for p in sorted(root.glob("trainer-clean*"))}
    step = statistics.median(step_ms(s) for s in clean_t.values())
    slow_t = {}
    for frac in SLOWDOWNS:
        ms, name = max(1, round(frac * step)), f"trainer-straggler{int(frac * 100)}"
        say(name)
        trainer(root / name, "--inject", f"straggler:rank=1,ms={ms}")
        slow_t[name] = f"straggler on rank 1, {ms} ms ({frac:.0%} of a step)"
    ms = max(1, round(0.5 * step / 2))  # two gradient all-reduces a step here
    say("trainer-slowcomm")
    trainer(root / "trainer-slowcomm", "--inject", f"slow_comm:rank=1,ms={ms}")
    slow_t["trainer-slowcomm"] = f"slower collective on rank 1, {ms} ms per collective"
    larger = [*TRAINER]
    larger[larger.index("--dim") + 1] = "320"
    say("trainer-larger")
    run([sys.executable, "-m", "diagtrain.profiler.cli", "run", "--out", str(root / "trainer-larger"), "--",
         sys.executable, "-m", "diagtrain.profiler.cli", "train", *larger], env={"OMP_NUM_THREADS": "1"})
    slow_t["trainer-larger"] = "larger model (--dim 320 instead of 256)"
    clean_p, slow_p = {}, {}
    if with_plain:
        for i in range(1, CLEAN + 2):
            say(f"plain clean {i}")
            plain(root / f"plain-clean{i}", {})
        clean_p = {p.name: summary.summarize(p) for p in sorted(root.glob("plain-clean*"))}
        ms = round(0.5 * float(PLAIN_ENV["STEP_MS"]))
        say("plain-sleep")
        plain(root / "plain-sleep", {"SLEEP_RANK": "1", "SLEEP_MS": str(ms)})
        slow_p["plain-sleep"] = f"rank 1 sleeps {ms} ms before forward"
    slow_t = {n: (w, summary.summarize(root / n)) for n, w in slow_t.items()}
    slow_p = {n: (w, summary.summarize(root / n)) for n, w in slow_p.items()}
    return clean_t, slow_t, clean_p, slow_p


def say(what: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = ["# The regression gate (`diagtrain compare`)", "",
             f"{m['date']} · {m['cpu_count']} CPUs · torch {m['torch']} · `{m['command']}` · "
             f"{result['minutes']:.1f} min · load average (1, 5, 15 min) before {result['load_before']}, after "
             f"{result['load_after']}", "",
             "## Clean runs: false regressions (target: no exit 1)", "",
             "| job | baseline | pairs | exit 0 | exit 1 | exit 3 | machine difference said |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for job, pairs in result["clean"].items():
        for kind, c in pairs.items():
            lines.append(f"| {job} | {kind.replace('_', ' ')} | {c['pairs']} | {c['exit_0']} | {c['exit_1']} | "
                         f"{c['exit_3']} | {c['machine_said']} |")
    lines += ["", f"## Slowdowns against a {BASELINE}-run baseline (the first {BASELINE} clean runs)", "",
              "| job | slowdown | step time change | exit (3 runs) | first regression | exit (1 run) |",
              "| --- | --- | ---: | ---: | --- | ---: |"]
    for job, rows in result["slow"].items():
        for r in rows:
            lines.append(f"| {job} | {r['what']} | {r['step_change_pct']:+.1f}% | {r['exit_3_runs']} | "
                         f"{r['first_regression'] or ''} | {r['exit_1_run']} |")
    lines += ["", f"Smallest slowdown detected (exit 1) with {BASELINE} baseline runs: "
              f"{result['smallest_detected'] or 'none'}.", ""]
    return "\n".join(lines)


def main() -> None:
    import os

    started, load = time.time(), os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="compare-gate-") as tmp:
        clean_t, slow_t, clean_p, slow_p = make_runs(Path(tmp), "--plain" in sys.argv)
        say("comparing")
        slow = {"trainer": slowdowns(clean_t, slow_t)}
        clean = {"trainer": clean_pairs(clean_t)}
        if clean_p:
            slow["plain script"], clean["plain script"] = slowdowns(clean_p, slow_p), clean_pairs(clean_p)
    detected = [r for rows in slow.values() for r in rows if r["exit_3_runs"] == 1]
    smallest = min(detected, key=lambda r: r["step_change_pct"], default=None)
    result = {"machine": machine(), "minutes": (time.time() - started) / 60,
              "load_before": [round(x, 1) for x in load],
              "load_after": [round(x, 1) for x in os.getloadavg()], "clean": clean, "slow": slow,
              "smallest_detected": f"{smallest['what']} ({smallest['step_change_pct']:+.1f}% step time, first "
                                   f"regression {smallest['first_regression']})" if smallest else None}
    save("compare", result, markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
