"""How analysis time and memory grow with ranks and with events per rank (synthetic GPU-shaped
traces), through the whole `diagtrain analyze` pipeline (JSON report).

    python benchmarks/scale.py

Expected: time linear in ranks x events; memory per worker bounded by one rank (one rank in
memory per worker, only summaries merged), so total memory grows with workers, not ranks.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from common import machine, save
from measure import run_measured_detail
from synthetic import trace_set

WORKERS = 2
ANALYZE = """
import sys
from diagtrain.profiler.cli import main
sys.exit(main(["analyze", {folder!r}, "--format", "json", "--quiet", "--workers", "{workers}"]))
"""
RANKS = (2, 8, 32, 64)
EVENTS_FOR_RANKS = 20_000
EVENTS = (10_000, 50_000, 200_000)
RANKS_FOR_EVENTS = 8


def measure(tmp: Path, ranks: int, events: int) -> dict:
    folder = trace_set(tmp / f"r{ranks}-e{events}", ranks, events)
    wall, tree, worker = run_measured_detail(ANALYZE.format(folder=str(folder), workers=WORKERS))
    row = {"ranks": ranks, "events_per_rank": events, "seconds": round(wall, 2), "peak_mib": round(tree),
           "largest_process_mib": round(worker), "us_per_event": round(wall / (ranks * events) * 1e6, 2)}
    print(row, flush=True)
    return row


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        by_ranks = [measure(Path(tmp), n, EVENTS_FOR_RANKS) for n in RANKS]
        by_events = [measure(Path(tmp), RANKS_FOR_EVENTS, e) for e in EVENTS]
    m = machine()

    def table(rows: list[dict]) -> str:
        return "\n".join(f"| {r['ranks']} | {r['events_per_rank']:,} | {r['seconds']} | {r['us_per_event']} | "
                         f"{r['peak_mib']} | {r['largest_process_mib']} |" for r in rows)

    header = "| ranks | events per rank | seconds | µs per event | peak MiB (all processes) | largest process MiB |\n" \
             "| ---: | ---: | ---: | ---: | ---: | ---: |"
    markdown = f"""# Analyzer scale

{m['date']}, {m['cpu_count']} cores, {m['memory_gib']} GiB, Python {m['python']}. Command: `{m['command']}`.
Whole `diagtrain analyze` pipeline (load, tables, detectors, JSON report), {WORKERS} workers, synthetic
GPU-shaped traces (benchmarks/synthetic.py), fresh process per point.

## Ranks ({EVENTS_FOR_RANKS:,} events each)

{header}
{table(by_ranks)}

## Events per rank ({RANKS_FOR_EVENTS} ranks)

{header}
{table(by_events)}
"""
    save("scale", {"machine": m, "by_ranks": by_ranks, "by_events": by_events}, markdown)
    print(markdown)


if __name__ == "__main__":
    sys.exit(main())
