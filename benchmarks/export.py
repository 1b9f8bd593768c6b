"""`diagtrain export --perfetto` at 64 ranks: the file's size, the time and the peak memory of writing it.

    python benchmarks/export.py [--world 64] [--events 20000]

A folder of synthetic traces (synthetic.py: GPU-shaped steps, one all-reduce in 20 kernels), analyzed once,
then exported whole and for one step, each in a fresh process (time, peak RSS); results in
results/export.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import PEAK_MIB_CODE, machine, save
from synthetic import trace_set

EXPORT = PEAK_MIB_CODE + """
import json, sys, time
from pathlib import Path
from diagtrain.profiler.export.perfetto import export
started = time.perf_counter()
steps = {int(sys.argv[3])} if len(sys.argv) > 3 else None
done = export(Path(sys.argv[1]), Path(sys.argv[2]), steps=steps)
print(json.dumps({"seconds": time.perf_counter() - started, "events": done.events, "bytes": done.bytes, "peak_mib": peak_mib()}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=64)
    parser.add_argument("--events", type=int, default=20_000, help="duration events per rank's trace")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        traces = trace_set(Path(tmp) / "traces", args.world, args.events)
        out = Path(tmp) / "analyzed"
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "diagtrain.profiler.cli", "analyze", str(traces), "--out", str(out),
                        "--format", "json", "--quiet"], check=True)
        analyzed_s = time.perf_counter() - started
        cases = {}
        for name, extra in (("whole run", []), ("one step", ["3"])):
            target = Path(tmp) / f"{name.replace(' ', '-')}.json.gz"
            proc = subprocess.run([sys.executable, "-c", EXPORT, str(out), str(target), *extra],
                                  capture_output=True, text=True, check=True)
            cases[name] = json.loads(proc.stdout)
    result = {"machine": machine(), "world": args.world, "events_per_rank": args.events,
              "analysis_s": round(analyzed_s, 1), "exports": cases}
    rows = "\n".join(f"| {name} | {c['events']:,} | {c['bytes'] / 2**20:.1f} MiB | {c['seconds']:.1f} s | {c['peak_mib']:.0f} MiB |"
                     for name, c in cases.items())
    markdown = f"""# Perfetto export at {args.world} ranks

{result['machine']['date']}, {result['machine']['cpu_count']} cores. `python benchmarks/export.py --world {args.world} --events {args.events}`:
{args.world} synthetic GPU traces of ~{args.events:,} events each, analyzed once ({analyzed_s:.0f} s), then
`diagtrain export --perfetto OUT.json.gz` in a fresh process (time to write, its peak RSS).

| export | events | file (gzipped) | time | peak RSS |
| --- | ---: | ---: | ---: | ---: |
{rows}
"""
    save("export", result, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
