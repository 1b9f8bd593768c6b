"""Several hosts and interrupted runs: how well the clocks line up, and how often a stop reads as a hang.

1. Clock alignment: two-host runs (two `diagtrain run` wrappers, one --out, torchrun --nnodes 2 with
   2 ranks per host, each host in a network namespace of its own where this machine allows it),
   host B's wall clock moved by a known amount (a preload shim, see tests/multihost.py), with and
   without profiled steps. Recorded: the handshake's error against the known shift and its bound,
   the error of the offset the analysis applied (traces or handshake), and after alignment the
   median gap between the two hosts' step ends against the spread of one host's ranks.
2. Interrupted runs: a 2-rank DDP reference trainer under `diagtrain run`, stopped with SIGINT or
   SIGTERM at a random moment; recorded: runs whose report has a hang or crash finding, and runs
   stopped in the state that used to read as a hang (a collective one rank entered, the other not).

    python benchmarks/hosts.py [--runs 3] [--stops 8]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from common import machine, save

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from multihost import build_shim, free_port, host_names, shifted, start, two_hosts, wrapper, wrapper_host  # noqa: E402

JOB_TIMEOUT_S = 300


def aligned(root: Path, shim: Path, shift_s: float, profiled: bool) -> dict:
    out = root / f"run-{shift_s:+.2f}-{'traced' if profiled else 'untraced'}"
    with two_hosts() as (a, b, isolated):
        endpoint = f"{a.addr}:{29500 if isolated else free_port()}"
        common = {"STEPS": "12", "STEP_SLEEP": "0.02"}
        options = ["--profile-steps", "3-6"] if profiled else []
        procs = [start(wrapper(a, out, endpoint, 2, *options), {**common, **a.env})]
        while not list(out.glob("hosts/*/host.json")):
            time.sleep(0.1)
        procs.append(start(wrapper(b, out, endpoint, 2, *options), {**common, **b.env, **shifted(shim, shift_s)}))
        for proc in procs:
            proc.communicate(timeout=JOB_TIMEOUT_S)
    a_name, b_name = wrapper_host(out, procs[0].pid), wrapper_host(out, procs[1].pid)
    hosts = host_names(out)
    of_host = {r: h for h, ranks in hosts.items() for r in ranks}
    measured = []
    for name, sign in ((a_name, -1), (b_name, 1)):
        path = out / "hosts" / name / "clock.json"
        for m in json.loads(path.read_text())["measurements"] if path.exists() else []:
            measured.append({"error_ms": (sign * m["offset_s"] - shift_s) * 1e3, "bound_ms": m["uncertainty_s"] * 1e3})
    report = json.loads((out / "report.json").read_text())
    note = next((h["message"] for h in report["health"] if h["check"] == "clocks"), "")
    moved = next(h for h in hosts if h != of_host[0])
    truth_s = -shift_s if moved == b_name else shift_s
    steps = pd.read_parquet(out / "analysis/steps.parquet").pivot_table(index="step", columns="rank", values="end")
    # What the analysis applied: a moved rank's step end in the tables against its own record.
    rank = hosts[moved][0]
    recorded = json.loads((out / f"ranks/{rank}/steps.jsonl").read_text().splitlines()[-1])
    applied_s = float(steps.loc[recorded["step"], rank]) - recorded["end"]
    steps = steps[steps.index > 1]  # step 1 holds start-up
    by_host = [steps[sorted(ranks)] for ranks in hosts.values()]
    return {
        "shift_s": shift_s, "profiled": profiled, "isolated": isolated,
        "source": "traces" if "collectives" in note else "handshake", "note": note,
        "applied_error_ms": (applied_s - truth_s) * 1e3, "handshakes": measured,
        "across_median_ms": float((by_host[0].mean(axis=1) - by_host[1].mean(axis=1)).abs().median() * 1e3),
        "intra_median_ms": float(pd.concat([t.max(axis=1) - t.min(axis=1) for t in by_host]).median() * 1e3),
    }


def stopped(root: Path, signum: int, index: int) -> dict:
    out = root / f"stop-{signal.Signals(signum).name}-{index}"
    cmd = [sys.executable, "-m", "diagtrain.profiler.cli", "run", "--out", str(out), "--", sys.executable, "-m",
           "diagtrain.profiler.cli", "train", "--strategy", "ddp", "--nproc", "2", "--steps", "100000"]
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    while not (out / "ranks/1/heartbeat").exists():
        time.sleep(0.1)
    time.sleep(1 + 2 * random.random())
    proc.send_signal(signum)
    proc.wait(timeout=JOB_TIMEOUT_S)
    report = json.loads((out / "report.json").read_text())
    blocked = json.loads((out / "analysis/hang.json").read_text())["blocked"]
    kinds = [f"{f['severity']} {f['kind']}" for f in report["findings"] if f["kind"] in ("hang", "crash", "interrupted")]
    return {"signal": signal.Signals(signum).name, "status": report["run"]["status"], "blocked": bool(blocked),
            "verdicts": kinds, "false_hang": any(k.endswith((" hang", " crash")) for k in kinds)}


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"# Several hosts and interrupted runs ({m['date']})", "",
             f"Machine: {m['cpu_count']} cores, {m['memory_gib']} GiB, {m['platform']}; torch {m['torch']}; "
             f"load average at start {result['load_average']}; command `{m['command']}`.", "",
             "## Clock alignment (host B's wall clock moved by a known shift)", "",
             "| shift (s) | profiled | own namespaces | applied from | applied offset error (ms) | handshake errors / bounds (ms) "
             "| hosts' step ends apart, median (ms) | one host's ranks apart, median (ms) |",
             "| ---: | --- | --- | --- | ---: | --- | ---: | ---: |"]
    for r in result["aligned"]:
        hs = ", ".join(f"{h['error_ms']:+.2f} / {h['bound_ms']:.2f}" for h in r["handshakes"])
        lines.append(f"| {r['shift_s']:+.2f} | {'yes' if r['profiled'] else 'no'} | {'yes' if r['isolated'] else 'no'} "
                     f"| {r['source']} | {r['applied_error_ms']:+.2f} | {hs} | {r['across_median_ms']:.2f} "
                     f"| {r['intra_median_ms']:.2f} |")
    stops = result["stops"]
    lines += ["", "## Runs stopped with a signal at a random moment (2-rank DDP reference trainer)", "",
              "| signal | runs | stopped mid-collective (used to read as a hang) | hang or crash verdicts |",
              "| --- | ---: | ---: | ---: |"]
    for name in ("SIGINT", "SIGTERM"):
        mine = [s for s in stops if s["signal"] == name]
        lines.append(f"| {name} | {len(mine)} | {sum(s['blocked'] for s in mine)} | {sum(s['false_hang'] for s in mine)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="two-host runs (alternately with and without profiled steps)")
    parser.add_argument("--stops", type=int, default=8, help="interrupted runs per signal")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        shim = build_shim(root)
        aligned_runs = []
        for i in range(args.runs):
            shift = random.choice([-1, 1]) * random.uniform(0.5, 3.5)
            aligned_runs.append(aligned(root, shim, round(shift, 3), profiled=i % 2 == 0))
            print(aligned_runs[-1], flush=True)
        stops = []
        for signum in (signal.SIGINT, signal.SIGTERM):
            for i in range(args.stops):
                stops.append(stopped(root, signum, i))
                print(stops[-1], flush=True)
    result = {"machine": machine(), "load_average": round(load, 1), "aligned": aligned_runs, "stops": stops}
    save("hosts", result, markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
