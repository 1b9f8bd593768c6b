"""How analysis time and memory grow with ranks and with events per rank (synthetic GPU-shaped
traces), through the whole `diagtrain analyze` pipeline (JSON report), each point two ways: the
local pool (no --scheduler, the default) and a Dask LocalCluster of worker processes
(`--scheduler`, the cluster path, started in the measured process as an embedded default would be);
and Holistic Trace Analysis 0.5.0 on the same traces where it can finish on this machine.

    python benchmarks/scale.py [--max-ranks 1024]

Expected: time linear in ranks x events; memory per worker bounded by one rank (one rank in
memory per worker, only summaries merged), so total memory grows with workers, not ranks; the
client's memory independent of the events per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from analyzer_speed import HTA
from common import PEAK_MIB_CODE, machine, save
from measure import run_measured_detail
from synthetic import trace_set, unpacked_mib

WORKERS = 2  # this machine's cores: one rank per worker process either way
LOCAL = """
import sys
from diagtrain.profiler.cli import main
sys.exit(main(["analyze", {folder!r}, "--out", {out!r}, "--format", "{formats}", "--quiet", "--workers", "{workers}"]))
"""
# The client (this process, with the LocalCluster's scheduler in it) and each worker report their own
# peak RSS (VmHWM: the true peak, not a sample); the workers are fresh processes for each point.
ON_DASK = PEAK_MIB_CODE + """
import json, sys
from distributed import Client, LocalCluster
from diagtrain.profiler.cli import main

with LocalCluster(n_workers={workers}, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \\
        Client(cluster) as client:
    code = main(["analyze", {folder!r}, "--out", {out!r}, "--format", "{formats}", "--quiet",
                 "--scheduler", cluster.scheduler_address])
    workers = sorted(client.run(peak_mib).values())
with open({result!r}, "w") as f:
    json.dump({{"worker_peak_mib": workers, "client_peak_mib": peak_mib()}}, f)
sys.exit(code)
"""
# HTA runs at every point where it can finish: stopped when its processes hold more than this (the
# machine's 23 GiB less room for the OS), or after HTA_TIMEOUT_S, and recorded as not finished.
HTA_MAX_MIB = 18 * 1024
HTA_TIMEOUT_S = 1800
HTA_WAY = "HTA 0.5.0"
RANKS = (8, 64, 256, 1024)
EVENTS_FOR_RANKS = 20_000
EVENTS = (10_000, 50_000, 200_000)
RANKS_FOR_EVENTS = 8
# The events series keeps the collectives fixed (one all-reduce in 20 kernels would grow them with the
# events): the client holds one row per collective and rank, and no per-event data (issue 18's target).
COLLECTIVES_PER_STEP = 50


def measure(tmp: Path, ranks: int, events: int, collectives_per_step: int | None = None) -> list[dict]:
    """One point, the local pool, the Dask LocalCluster (each into its own --out) and HTA on the same traces."""
    folder = trace_set(tmp / f"r{ranks}-e{events}", ranks, events, collectives_per_step)
    trace_mib = unpacked_mib(folder / "rank0.json.gz")
    rows = []
    for way in ("local pool", "dask LocalCluster", HTA_WAY):
        out, result = tmp / "out", tmp / "dask.json"
        shutil.rmtree(out, ignore_errors=True)
        load_before = os.getloadavg()[0]
        code = {"local pool": LOCAL, "dask LocalCluster": ON_DASK, HTA_WAY: HTA}[way]
        try:
            wall, tree, largest, _ = run_measured_detail(code.format(folder=str(folder), out=str(out), workers=WORKERS,
                                                                  result=str(result), formats="json"), timeout=HTA_TIMEOUT_S,
                                                         max_mib=HTA_MAX_MIB if way == HTA_WAY else None)
        except (RuntimeError, TimeoutError) as e:  # HTA out of memory, of time, or failing: recorded, the series goes on
            if way != HTA_WAY:
                raise
            rows.append({"way": way, "ranks": ranks, "events_per_rank": events, "trace_mib": round(trace_mib, 1),
                         "not_run": f"did not finish: {str(e).strip().splitlines()[-1][:120]}"})
            print(rows[-1], flush=True)
            continue
        row = {"way": way, "ranks": ranks, "events_per_rank": events, "trace_mib": round(trace_mib, 1),
               "seconds": round(wall, 2), "us_per_event": round(wall / (ranks * events) * 1e6, 2),
               "peak_mib": round(tree), "largest_process_mib": round(largest),
               "load_before": round(load_before, 1), "load_after": round(os.getloadavg()[0], 1)}
        if way == "dask LocalCluster":
            peaks = json.loads(result.read_text())
            row |= {"client_peak_mib": round(peaks["client_peak_mib"]),
                    "worker_peak_mib": round(max(peaks["worker_peak_mib"]))}
        print(row, flush=True)
        rows.append(row)
    shutil.rmtree(folder)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| ranks | events per rank | way | seconds | µs per event | peak MiB (all processes) | "
             "largest process MiB | client peak MiB | worker peak MiB | load avg before / after |",
             "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        if "not_run" in r:
            lines.append(f"| {r['ranks']} | {r['events_per_rank']:,} | {r['way']} | {r['not_run']} | | | | | | |")
            continue
        lines.append(f"| {r['ranks']} | {r['events_per_rank']:,} | {r['way']} | {r['seconds']} | {r['us_per_event']} | "
                     f"{r['peak_mib']} | {r['largest_process_mib']} | {r.get('client_peak_mib', '-')} | "
                     f"{r.get('worker_peak_mib', '-')} | {r['load_before']} / {r['load_after']} |")
    return "\n".join(lines)


def markdown(m: dict, by_events: list[dict], by_ranks: list[dict]) -> str:
    """The recorded result: how it was measured, then one table per series."""
    return f"""# Analyzer scale

{m['date']}, {m['cpu_count']} cores, {m['memory_gib']} GiB, Python {m['python']}. Command: `{m['command']}`.
Whole `diagtrain analyze` pipeline (load, tables, detectors, JSON report) on synthetic GPU-shaped
traces (benchmarks/synthetic.py), fresh processes for each point, two ways on the same traces:
the local pool ({WORKERS} worker processes, the default) and a Dask `LocalCluster` of {WORKERS}
worker processes of one thread each, started inside the measured process (`--scheduler`; the
scheduler runs in the client process, so "client peak" includes it). Beside them, {HTA_WAY}
(`TraceAnalysis` load, `get_temporal_breakdown`, `get_comm_comp_overlap`, as in analyzer_speed.py)
at every point (stopped at {HTA_MAX_MIB // 1024} GiB or {HTA_TIMEOUT_S // 60} minutes, where it would not finish). Peak MiB (all processes) and
largest process are sampled with psutil every 20 ms; client and worker peaks are each process's own
peak RSS (VmHWM). The load average (1 min) is recorded because the machine was shared with
other jobs during the measurement: compare the two ways of one point, not seconds across recordings.
"trace MiB" is one rank's trace unpacked (JSON). "local pool" is the default without --scheduler: the
ranks load in this process one after the other while their traces total under 4 MiB compressed
(pool.POOL_MIN_BYTES), in the pool above.

## Events per rank ({RANKS_FOR_EVENTS} ranks, {COLLECTIVES_PER_STEP} collectives a step whatever the events)

{table(by_events)}

## Ranks ({EVENTS_FOR_RANKS:,} events each, one all-reduce in 20 kernels)

{table(by_ranks)}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-ranks", type=int, default=max(RANKS), help="leave out larger points")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        by_events = [row for e in EVENTS for row in measure(Path(tmp), RANKS_FOR_EVENTS, e, COLLECTIVES_PER_STEP)]
        by_ranks = [row for n in RANKS if n <= args.max_ranks for row in measure(Path(tmp), n, EVENTS_FOR_RANKS)]
    m = machine()
    text = markdown(m, by_events, by_ranks)
    save("scale", {"machine": m, "by_ranks": by_ranks, "by_events": by_events}, text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
