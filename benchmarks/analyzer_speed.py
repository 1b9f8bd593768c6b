"""Analyzer speed and memory: diagtrain against Holistic Trace Analysis and against the parsing floor,
on the same trace sets, interleaved, every set at least 3 times.

    pip install -e ".[bench]" && pip install --no-deps HolisticTraceAnalysis==0.5.0
    python benchmarks/analyzer_speed.py [--reps 3] [--sets 1M,8,32,2M,64]

What each side does, in a fresh process per measurement (imports included, as a user runs it):
- diagtrain: `diagtrain analyze DIR --format json --out SCRATCH --quiet`, a new SCRATCH every time
  (no cache). This is the whole analysis: per-rank loading, step, collective and time-breakdown
  tables, timeline spans, detectors, report.json; more than HTA is asked to do. Its modules are
  byte-compiled first, as installing its wheel does (HTA's are, from its wheel).
- HTA 0.5.0: `TraceAnalysis(trace_dir=DIR)`, `get_temporal_breakdown()`, `get_comm_comp_overlap()`
  (the two analyses report.json's ranks match it on).
- floor: gunzip + `orjson.loads` of every file, nothing else, in as many processes as diagtrain
  uses (`--workers`, one per core), the least any analysis of these files must spend.
- pandas start: a process that imports numpy, pandas and pyarrow and reads nothing, the least any
  analysis whose tables are pandas frames (diagtrain's, HTA's) spends before its first byte. Set
  beside HTA's time / 15 and memory / 4 (the issue's targets), it says what those targets leave.

The four run one after the other within a repetition, in an order that rotates between
repetitions, so a slow moment of a shared machine falls on every tool alike; ratios are taken
within a repetition, then their median. Memory is the peak PSS of each measured process tree: the
memory it holds, each page shared between processes (a forked worker's imports) counted once; the
peak of summed RSS, which counts those pages once per process, is recorded beside it.
The machine's load average is recorded around every measurement.
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import machine, save
from measure import run_measured_detail
from synthetic import relabeled_copies, write_trace

SHARED = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "public" / "traces" / "hta"
REAL = SHARED / "nccl_2rank_rank0.json.gz"  # a real 2-rank NCCL training trace, ~40k events
WORKERS = os.cpu_count() or 1  # diagtrain's default --workers, and the floor's pool
TOOLS = ("floor", "diagtrain", "hta", "start")
SPEEDUP_TARGET = 15  # issue 20: at least 15x HTA's time on every set HTA runs
MEMORY_TARGET = 4  # issue 20: at most a quarter of HTA's memory
# Each set: name -> how to make it. Synthetic sets give events per rank; real sets relabel one trace.
SETS = {
    "1M": ("synthetic 1M events, 1 rank", lambda d: _synthetic(d, 1, 1_000_000)),
    "2M": ("synthetic 2M events, 1 rank", lambda d: _synthetic(d, 1, 2_000_000)),
    "8": ("8 ranks of a real NCCL trace", lambda d: relabeled_copies(REAL, d, 8)),
    "32": ("32 ranks of the same", lambda d: relabeled_copies(REAL, d, 32)),
    "64": ("64 ranks of the same", lambda d: relabeled_copies(REAL, d, 64)),
}

DIAGTRAIN = """
import sys
from diagtrain.profiler.cli import main
sys.exit(main(["analyze", {folder!r}, "--format", "json", "--out", {out!r}, "--quiet"]))
"""
HTA = """
import logging, warnings
logging.disable(logging.WARNING); warnings.simplefilter("ignore")
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir={folder!r})
a.get_temporal_breakdown(visualize=False)
a.get_comm_comp_overlap(visualize=False)
"""
START = """
import numpy, pandas, pyarrow
"""
FLOOR = """
import gzip, orjson
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
def parse(p):
    return len(orjson.loads(gzip.decompress(Path(p).read_bytes()))["traceEvents"])
files = sorted(str(p) for p in Path({folder!r}).glob("*.json.gz"))
if len(files) == 1:
    assert parse(files[0]) > 0
else:
    with ProcessPoolExecutor({workers}) as pool:
        assert sum(pool.map(parse, files)) > 0
"""

CODE = {"diagtrain": DIAGTRAIN, "hta": HTA, "floor": FLOOR, "start": START}  # what each of TOOLS runs


def _synthetic(folder: Path, ranks: int, events: int) -> Path:
    folder.mkdir(parents=True)
    for rank in range(ranks):
        write_trace(folder / f"rank{rank}.json.gz", rank, ranks, events)
    return folder


def measure(tool: str, folder: Path, scratch: Path) -> dict:
    """One run of ``tool`` on ``folder``: seconds, peak MiB, and the load average around it."""
    out = tempfile.mkdtemp(dir=scratch)
    code = CODE[tool].format(folder=str(folder), out=out, workers=WORKERS)
    load_before = os.getloadavg()[0]
    wall, rss_mib, _, pss_mib = run_measured_detail(code)
    return {"s": wall, "mib": pss_mib, "rss_mib": rss_mib, "load": (load_before + os.getloadavg()[0]) / 2}


def summarize(name: str, folder: Path, reps: list[dict[str, dict]]) -> dict:
    """Medians with min-max per tool, and per-repetition ratios (their medians)."""
    row: dict = {"set": name, "files": len(list(folder.glob("*.json.gz"))), "reps": len(reps),
                 "mib_gz": round(sum(f.stat().st_size for f in folder.glob("*.json.gz")) / 2**20, 1)}
    for tool in TOOLS:
        if tool not in reps[0]:
            continue
        for key in ("s", "mib", "rss_mib"):
            values = [r[tool][key] for r in reps]
            row[f"{tool}_{key}"] = round(statistics.median(values), 2 if key == "s" else 0)
            row[f"{tool}_{key}_range"] = [round(min(values), 2 if key == "s" else 0), round(max(values), 2 if key == "s" else 0)]
    ratios = {"hta_over_diagtrain": ("hta", "diagtrain", "s"), "diagtrain_over_floor": ("diagtrain", "floor", "s"),
              "memory_diagtrain_over_hta": ("diagtrain", "hta", "mib")}
    for key, (a, b, unit) in ratios.items():
        if a in reps[0] and b in reps[0]:
            values = [r[a][unit] / r[b][unit] for r in reps]
            row[key] = round(statistics.median(values), 2)
            row[f"{key}_range"] = [round(min(values), 2), round(max(values), 2)]
    row["load"] = [round(min(r[t]["load"] for r in reps for t in r), 1), round(max(r[t]["load"] for r in reps for t in r), 1)]
    return row


def _commit() -> str:
    """The commit of the code measured (DIAGTRAIN_COMMIT when it runs from a copy)."""
    if os.environ.get("DIAGTRAIN_COMMIT"):
        return os.environ["DIAGTRAIN_COMMIT"][:10]
    proc = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).parent)
    return proc.stdout.strip() or "unknown"


def _cell(row: dict, key: str, unit: str = "") -> str:
    if key not in row:
        return "not run"
    low, high = row[f"{key}_range"]
    return f"{row[key]}{unit} ({low}-{high})"


def markdown(rows: list[dict], m: dict) -> str:
    lines = [
        "# Analyzer speed and memory: diagtrain, Holistic Trace Analysis 0.5.0, and the parsing floor", "",
        f"{m['date']}, {m['cpu_count']} cores, {m['memory_gib']} GiB, Python {m['python']}, diagtrain {m['diagtrain']} "
        f"(commit {_commit()}). Command: `{m['command']}`. {WORKERS} workers.", "",
        "Medians of the repetitions, min-max in brackets; ratios are taken within each repetition (the "
        "tools run back to back, in rotating order), then their median. Seconds are wall time of a fresh "
        "process (imports included); MiB the peak PSS of its process tree (summed RSS, which counts the pages "
        "a forked worker shares with its parent once per process, in the last column). See the script's docstring for "
        "exactly what each side runs: diagtrain's side is the whole `diagtrain analyze`, HTA's its load plus "
        "`get_temporal_breakdown` and `get_comm_comp_overlap`.", "",
        "| set | files | MiB gz | reps | floor s | diagtrain s | HTA s | HTA / diagtrain | diagtrain / floor | "
        "diagtrain MiB | HTA MiB | memory diagtrain / HTA | load avg | diagtrain summed RSS MiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(f"| {r['set']} | {r['files']} | {r['mib_gz']} | {r['reps']} | {_cell(r, 'floor_s')} | "
                     f"{_cell(r, 'diagtrain_s')} | {_cell(r, 'hta_s')} | {_cell(r, 'hta_over_diagtrain', 'x')} | "
                     f"{_cell(r, 'diagtrain_over_floor')} | {_cell(r, 'diagtrain_mib')} | {_cell(r, 'hta_mib')} | "
                     f"{_cell(r, 'memory_diagtrain_over_hta')} | {r['load'][0]}-{r['load'][1]} | "
                     f"{_cell(r, 'diagtrain_rss_mib')} |")
    return "\n".join(lines + _budget(rows)) + "\n"


def _budget(rows: list[dict]) -> list[str]:
    """What the targets leave: HTA's time / 15 and memory / 4 beside a bare pandas start, per set."""
    lines = [
        "", f"## What {SPEEDUP_TARGET}x HTA and 1/{MEMORY_TARGET} of its memory leave", "",
        f"HTA's median time / {SPEEDUP_TARGET} and memory / {MEMORY_TARGET}, beside a fresh process that only "
        "imports numpy, pandas and pyarrow (medians, min-max, measured in the same repetitions): the least "
        "any analyzer built on pandas tables spends before reading a byte.", "",
        f"| set | HTA s / {SPEEDUP_TARGET} | pandas start s | diagtrain s | HTA MiB / {MEMORY_TARGET} | "
        "pandas start MiB | diagtrain MiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        if "hta_s" not in r:
            continue
        lines.append(f"| {r['set']} | {r['hta_s'] / SPEEDUP_TARGET:.2f} | {_cell(r, 'start_s')} | {r['diagtrain_s']} | "
                     f"{r['hta_mib'] / MEMORY_TARGET:.0f} | {_cell(r, 'start_mib')} | {r['diagtrain_mib']:.0f} |")
    return lines


def _byte_compiled() -> None:
    """Byte-compile diagtrain as installing its wheel does. An editable install under
    PYTHONDONTWRITEBYTECODE=1 (this machine's setting) never writes .pyc files: every measured process
    would compile ~80 modules (~0.1 s) that HTA, installed from a wheel, finds compiled."""
    for name in ("diagtrain.profiler", "diagtrain.dashboard", "diagtrain.reference_trainers"):
        for folder in importlib.util.find_spec(name).submodule_search_locations:
            compileall.compile_dir(folder, quiet=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3, help="repetitions per set and tool (at least 3)")
    parser.add_argument("--sets", default=",".join(SETS), help=f"which sets, comma-separated: {','.join(SETS)}")
    parser.add_argument("--no-hta", default="", help="sets to run without HTA (e.g. the linearity sets 2M,64)")
    parser.add_argument("--name", default="analyzer_speed", help="results/<name>.md and .json")
    args = parser.parse_args()
    if args.reps < 3:
        parser.error("--reps: at least 3, or the medians say nothing")
    try:
        import hta.trace_analysis  # noqa: F401 - a benchmark against HTA without HTA is no benchmark
    except ImportError as e:
        sys.exit(f"HolisticTraceAnalysis cannot be imported ({e}): pip install --no-deps HolisticTraceAnalysis==0.5.0 "
                 "and its imports (pip install -e '.[dev]')")
    _byte_compiled()
    keys = [k.strip() for k in args.sets.split(",") if k.strip()]
    without_hta = {k.strip() for k in args.no_hta.split(",") if k.strip()}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for key in keys:
            name, make = SETS[key]
            folder = make(Path(tmp) / f"set-{key}")
            scratch = Path(tmp) / f"out-{key}"
            scratch.mkdir()
            tools = [t for t in TOOLS if not (t == "hta" and key in without_hta)]
            reps = []
            for rep in range(args.reps):
                order = tools[rep % len(tools):] + tools[:rep % len(tools)]
                reps.append({tool: measure(tool, folder, scratch) for tool in order})
                print(name, rep, {t: (round(v["s"], 2), round(v["mib"])) for t, v in reps[-1].items()}, flush=True)
            rows.append(summarize(name, folder, reps))
    m = machine()
    text = markdown(rows, m)
    save(args.name, {"machine": m, "workers": WORKERS, "rows": rows}, text)
    print(text)


if __name__ == "__main__":
    main()
