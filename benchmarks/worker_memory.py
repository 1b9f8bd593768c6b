"""Memory of one rank's work against the size of its trace: what a worker (a process of the local
pool or a Dask worker) holds while it loads one rank, for traces up to gigabytes.

    python benchmarks/worker_memory.py [--events 1000000,4000000,12000000]

For each size, a synthetic GPU-shaped trace of one rank (benchmarks/synthetic.py), then two fresh
processes:
- the worker's task, `pipeline.load_rank` (decode, step breakdown, collectives, the rank's summary and
  its cache files): peak RSS, and the RSS after imports (its base) for the growth above it;
- the decoder alone, `trace_file.read_trace`: the decoded columns' size (the events table and the
  kept arguments, numpy/pandas deep sizes), what the issue's target is stated against.

Target (issue 18): a worker's peak above its base at most 1.5x the decoded columns, whatever the
trace's size: the JSON is decoded a block at a time and never held whole.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from common import PEAK_MIB_CODE, machine, save
from synthetic import unpacked_mib, write_trace

EVENTS = (1_000_000, 4_000_000, 12_000_000)  # about 0.2, 0.7 and 2 GiB of JSON
TARGET_RATIO = 1.5  # issue 18: worker peak above its base / decoded columns
WORKER = PEAK_MIB_CODE + """
import json, sys
from pathlib import Path
from diagtrain.profiler.analyzer.per_rank.pipeline import load_rank
from diagtrain.profiler.analyzer.read.discover import discover
import pyarrow.parquet  # every worker writes Parquet: its import is part of a worker's base, not a trace's cost

def rss_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024

inputs, _ = discover(Path({folder!r}))
base = rss_mib()
result = load_rank(inputs[0], Path({cache!r}))
print(json.dumps({{"base_mib": base, "peak_mib": peak_mib(),
                  "steps": len(result.steps)}}))
"""
DECODER = PEAK_MIB_CODE + """
import json, sys
from pathlib import Path
from diagtrain.profiler.analyzer.read import trace_file
trace = trace_file.read_trace(Path({path!r}))
events = int(trace.events.memory_usage(deep=True).sum())
kept = trace.arguments
arguments = 0 if kept is None else int(kept.rows.nbytes + sum(
    __import__("pandas").Series(v).memory_usage(deep=True) for v in kept.columns.values()))
print(json.dumps({{"events": len(trace.events), "columns_mib": (events + arguments) / 2**20,
                  "peak_mib": peak_mib()}}))
"""


def measure(tmp: Path, events: int) -> dict:
    """One trace size: the worker's task and the decoder, each in a fresh process."""
    folder = tmp / f"e{events}"
    folder.mkdir()
    trace = write_trace(folder / "rank0.json.gz", 0, 8, events)
    json_mib, gz_mib = unpacked_mib(trace), trace.stat().st_size / 2**20
    worker = _child(WORKER.format(folder=str(folder), cache=str(tmp / "cache")))
    decoder = _child(DECODER.format(path=str(trace)))
    shutil.rmtree(folder)
    shutil.rmtree(tmp / "cache", ignore_errors=True)
    growth = worker["peak_mib"] - worker["base_mib"]
    row = {"events": decoder["events"], "json_mib": round(json_mib), "gz_mib": round(gz_mib, 1), "columns_mib": round(decoder["columns_mib"], 1),
           "worker_base_mib": round(worker["base_mib"]), "worker_peak_mib": round(worker["peak_mib"]),
           "growth_over_columns": round(growth / decoder["columns_mib"], 2),
           "growth_mib_per_gib_json": round(growth / (json_mib / 1024)), "decoder_peak_mib": round(decoder["peak_mib"])}
    print(row, flush=True)
    return row


def _child(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=3600, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def markdown(m: dict, rows: list[dict]) -> str:
    lines = ["| events | JSON MiB | decoded columns MiB | worker base MiB | worker peak MiB | growth / columns | "
             "growth MiB per GiB of JSON | decoder alone, peak MiB |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['events']:,} | {r['json_mib']:,} | {r['columns_mib']} | {r['worker_base_mib']} | {r['worker_peak_mib']:,} | "
              f"{r['growth_over_columns']} | {r['growth_mib_per_gib_json']:,} | {r['decoder_peak_mib']:,} |" for r in rows]
    return f"""# Worker memory per trace size

{m['date']}, {m['cpu_count']} cores, {m['memory_gib']} GiB, Python {m['python']}. Command: `{m['command']}`.
One synthetic GPU-shaped rank per size (benchmarks/synthetic.py). "worker": a fresh process running
`pipeline.load_rank`, the task a pool or Dask worker runs for one rank (decode, step breakdown,
collectives, summary, cache files); its base is its RSS after imports (pyarrow's included), its
peak the true peak RSS of its own address space (VmHWM; getrusage's counter carries the parent's
over exec). "decoded columns": the events table and kept arguments that `trace_file.read_trace`
returns (deep sizes). Target: growth (peak - base) at most {TARGET_RATIO}x the decoded columns.

{chr(10).join(lines)}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", default=",".join(map(str, EVENTS)), help="comma-separated events per trace")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(Path(tmp), int(n)) for n in args.events.split(",")]
    m = machine()
    save("worker_memory", {"machine": m, "rows": rows}, markdown(m, rows))


if __name__ == "__main__":
    main()
