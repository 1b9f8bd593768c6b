"""Analyzer speed and memory against Holistic Trace Analysis and against the floor (gzip + orjson
of the same files, nothing else), on the same trace sets, interleaved, medians of repetitions.

    python benchmarks/analyzer_speed.py [--reps 3]

Each measurement is a fresh process (imports included, as a user runs it); memory is the peak RSS
of the process and its workers. Targets: no slower than the floor, at least 8x faster than HTA,
peak memory at most half of HTA's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from common import machine, run, save
from measure import run_measured
from synthetic import copy_run_traces, relabeled_copies, trace_set, write_trace

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces" / "hta"
WORKERS = 2  # this machine's cores; HTA uses its own multiprocessing parser for several ranks

DIAGTRAIN = """
from pathlib import Path
from diagtrain.profiler.analyzer import load
import tempfile
inputs, _ = load.discover(Path({folder!r}))
with tempfile.TemporaryDirectory() as cache:  # no cache: every run parses
    results, skipped = load.load(inputs, Path(cache), {workers})
assert results and not skipped, skipped
"""
HTA = """
import logging; logging.disable(logging.WARNING)
import warnings; warnings.simplefilter("ignore")
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir={folder!r})
for analysis in (a.get_temporal_breakdown, a.get_comm_comp_overlap, a.get_idle_time_breakdown):
    try:
        analysis(visualize=False)
    except Exception:
        pass  # HTA's GPU analyses fail on traces without kernels (CPU runs): parsing is still timed
"""
FLOOR = """
import gzip, orjson
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
def parse(p):
    return len(orjson.loads(gzip.decompress(Path(p).read_bytes()))["traceEvents"])
files = sorted(str(p) for p in Path({folder!r}).glob("*.json.gz"))
with ProcessPoolExecutor({workers}) as pool:
    assert sum(pool.map(parse, files)) > 0
"""


def trace_sets(tmp: Path) -> dict[str, Path]:
    sets = {}
    for name, files in (("nccl 1 rank (real)", ["nccl_2rank_rank0"]), ("sampled 2 ranks (real)", ["sampled_128rank_rank0", "sampled_128rank_rank1"])):
        folder = tmp / name.split()[0] / str(len(files))
        folder.mkdir(parents=True)
        for f in files:
            (folder / f"{f}.json.gz").write_bytes((SHARED / f"{f}.json.gz").read_bytes())
        sets[name] = folder
    for n in (8, 32):
        sets[f"nccl x{n} ranks (relabeled copies)"] = relabeled_copies(SHARED / "nccl_2rank_rank0.json.gz", tmp / f"x{n}", n)
    run_dir = tmp / "cpu-run"
    run([sys.executable, "-m", "diagtrain.profiler.cli", "run", "--out", str(run_dir), "--profile-steps", "3-4", "--no-analyze",
         "--", sys.executable, "-m", "diagtrain.profiler.cli", "train", "--strategy", "3d", "--nproc", "8", "--steps", "5"])
    sets["CPU 3d run, 8 ranks (gloo)"] = copy_run_traces(run_dir, tmp / "cpu")
    synthetic = tmp / "synthetic"
    synthetic.mkdir()
    write_trace(synthetic / "rank0.json.gz", 0, 1, 1_000_000)
    sets["synthetic 1M events, 1 rank"] = synthetic
    return sets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3, help="repetitions per tool and set (default 3)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, folder in trace_sets(Path(tmp)).items():
            reps = 1 if "1M" in name or "x32" in name else args.reps
            times: dict[str, list[tuple[float, float]]] = {"diagtrain": [], "hta": [], "floor": []}
            for _ in range(reps):  # interleaved: a slow moment of the machine hits every tool alike
                for tool, code in (("floor", FLOOR), ("diagtrain", DIAGTRAIN), ("hta", HTA)):
                    times[tool].append(run_measured(code.format(folder=str(folder), workers=WORKERS)))
            row = {"set": name, "files": len(list(folder.glob("*.json.gz"))),
                   "mib_gz": round(sum(f.stat().st_size for f in folder.glob("*.json.gz")) / 2**20, 1), "reps": reps}
            for tool, samples in times.items():
                row[f"{tool}_s"] = round(statistics.median(s for s, _ in samples), 2)
                row[f"{tool}_mib"] = round(statistics.median(m for _, m in samples))
            row["speedup_vs_hta"] = round(row["hta_s"] / row["diagtrain_s"], 1)
            row["vs_floor"] = round(row["diagtrain_s"] / row["floor_s"], 2)
            row["memory_vs_hta"] = round(row["diagtrain_mib"] / row["hta_mib"], 2)
            rows.append(row)
            print(row, flush=True)
    m = machine()
    table = "\n".join(f"| {r['set']} | {r['files']} | {r['mib_gz']} | {r['floor_s']} | {r['diagtrain_s']} | {r['hta_s']} | "
                      f"**{r['speedup_vs_hta']}x** | {r['vs_floor']} | {r['floor_mib']} | {r['diagtrain_mib']} | {r['hta_mib']} | "
                      f"{r['memory_vs_hta']} |" for r in rows)
    markdown = f"""# Analyzer speed: diagtrain vs Holistic Trace Analysis vs the parsing floor

{m['date']}, {m['cpu_count']} cores, {m['memory_gib']} GiB, Python {m['python']}, torch {m['torch']}; HTA 0.5.0.
Command: `{m['command']}`. Fresh process per measurement (imports included), {WORKERS} workers, medians;
memory is the peak RSS of the process tree. diagtrain: loading, step/collective tables and the time
breakdown, overlap and idle of every rank. HTA: `TraceAnalysis` + `get_temporal_breakdown`,
`get_comm_comp_overlap`, `get_idle_time_breakdown`. Floor: gzip + orjson of every file in a pool.

| trace set | files | MiB (gz) | floor s | diagtrain s | HTA s | speed-up vs HTA | diagtrain / floor | floor MiB | diagtrain MiB | HTA MiB | memory vs HTA |
| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |
{table}

Targets: diagtrain / floor <= 1, speed-up >= 8x, memory vs HTA <= 0.5. On the CPU (gloo) set HTA's
breakdowns fail (they need GPU kernels): its time there is parsing only.
"""
    save("analyzer_speed", {"machine": m, "rows": rows}, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
