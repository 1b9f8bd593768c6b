"""Every trace folder of Holistic Trace Analysis's own test corpus through `diagtrain analyze` and HTA,
side by side: idle, compute and non-compute per rank, and where they differ, why.

    git clone https://github.com/facebookresearch/HolisticTraceAnalysis
    python benchmarks/hta_corpus.py HolisticTraceAnalysis/tests/data

Each folder that holds trace files (.json, .json.gz) is one input, as both tools take a folder.
It is copied to a scratch folder first, so neither tool writes into the corpus (and HTA never sees
a report.json). HTA 0.5.0 runs `TraceAnalysis` + `get_temporal_breakdown` in a fresh process;
diagtrain runs `diagtrain analyze FOLDER --format json --out SCRATCH`. A difference is explained
when our report's health section names the reason (a departure from HTA's definition on purpose,
a category that is not device work, device time that cannot be measured); any other difference,
any crash of ours, and any skipped file are listed as unexplained, and the script exits 1.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from common import machine, save

TIMEOUT_S = 300  # per tool and folder; the largest folder takes ~30 s in HTA on 2 cores
# Equal means equal: HTA's numbers are whole or fractional µs, ours the same sums in float64.
REL_TOLERANCE, ABS_TOLERANCE_US = 1e-9, 1e-3
TRACE_SUFFIXES = (".json", ".json.gz")
# Health checks that say why our numbers differ from HTA's on purpose; one must name each difference.
EXPLAINING_CHECKS = ("departs_from_hta", "unclassified", "device_time_unknown", "not_device_work")
NOT_A_TRACE = "not a profiler trace"  # a skip for this reason is right: the file is something else

HTA = """
import json, logging, sys, warnings
logging.disable(logging.WARNING); warnings.simplefilter("ignore")
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
b = a.get_temporal_breakdown(visualize=False)
print(json.dumps({int(r["rank"]): {"idle_us": float(r["idle_time(us)"]), "compute_us": float(r["compute_time(us)"]),
                  "non_compute_us": float(r["non_compute_time(us)"])} for _, r in b.iterrows()}))
"""


def folders(corpus: Path) -> list[Path]:
    """The folders of ``corpus`` that hold trace files, in path order."""
    found = {p.parent for p in corpus.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES)}
    return sorted(found)


def run_hta(folder: Path) -> dict:
    """HTA's temporal breakdown per rank, or the last line of its error."""
    try:
        proc = subprocess.run([sys.executable, "-c", HTA, str(folder)], capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {TIMEOUT_S} s"}
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        return {"error": lines[-1][:160] if lines else f"exit {proc.returncode}"}
    return {"ranks": {int(k): v for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}}


def run_diagtrain(folder: Path, out: Path) -> dict:
    """Our report.json for ``folder``, or what went wrong."""
    cmd = [sys.executable, "-m", "diagtrain.profiler.cli", "analyze", str(folder), "--format", "json", "--out", str(out),
           "--quiet", "--workers", "1"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {TIMEOUT_S} s"}
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:160]}
    return {"report": json.loads((out / "report.json").read_text())}


def same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=REL_TOLERANCE, abs_tol=ABS_TOLERANCE_US)


def compare(name: str, hta: dict, ours: dict) -> dict:
    """One row of the table: our numbers, HTA's, and the explanation of any difference."""
    row: dict = {"folder": name, "hta_error": hta.get("error"), "our_error": ours.get("error"), "ranks": []}
    report = ours.get("report") or {}
    row["skipped"] = report.get("skipped", [])
    row["on_gpu"] = bool(report.get("run", {}).get("on_gpu"))
    health = report.get("health", [])
    row["explanations"] = [h["message"] for h in health if h["check"] in EXPLAINING_CHECKS]
    row["unexplained"] = []
    if row["our_error"]:
        row["unexplained"].append(f"diagtrain failed: {row['our_error']}")
    row["explanations"] += [f"{Path(s['path']).name} skipped: {s['reason'].split(': ', 1)[-1]}"
                            for s in row["skipped"] if NOT_A_TRACE in s["reason"]]
    unexplained_skips = [s for s in row["skipped"] if NOT_A_TRACE not in s["reason"]]
    if unexplained_skips:
        row["unexplained"].append(f"diagtrain skipped {len(unexplained_skips)} file(s): {unexplained_skips[0]['reason']}")
    hta_ranks = hta.get("ranks", {})
    for r in report.get("ranks", []):
        theirs = hta_ranks.get(r["rank"], {})
        numbers = {k: (r.get(k), theirs.get(k)) for k in ("idle_us", "compute_us", "non_compute_us")}
        equal = all(same(a, b) for a, b in numbers.values())
        row["ranks"].append({"rank": r["rank"], **{f"our_{k}": a for k, (a, _) in numbers.items()},
                             **{f"hta_{k}": b for k, (_, b) in numbers.items()}, "equal": equal})
        if theirs and not equal and not row["explanations"]:
            row["unexplained"].append(f"rank {r['rank']} differs from HTA with no health note saying why")
    return row


def _ms(us: float | None) -> str:
    return "n/a" if us is None else f"{us / 1e3:,.3f}"


def markdown(rows: list[dict], m: dict, absent: list[str]) -> str:
    lines = [
        "# Holistic Trace Analysis's test corpus: diagtrain and HTA side by side", "",
        f"{m['date']}, {m['cpu_count']} cores, Python {m['python']}, HTA 0.5.0, diagtrain {m['diagtrain']}. "
        f"Command: `{m['command']}`.", "",
        f"Corpus: `tests/data` of facebookresearch/HolisticTraceAnalysis ({len(rows)} folders with trace files). "
        "Numbers are per rank, in ms: idle / compute / non-compute over HTA's window (first to last "
        "device event). HTA: `get_temporal_breakdown`. diagtrain: report.json's ranks.", "",
        "| folder | diagtrain idle / compute / non-compute | HTA idle / compute / non-compute | difference explained |",
        "| --- | --- | --- | --- |",
    ]
    for row in rows:
        ranks = row["ranks"] or [None]
        for r in ranks:
            ours = row["our_error"] and f"failed: {row['our_error']}" or (
                "no ranks" if r is None else f"{_ms(r['our_idle_us'])} / {_ms(r['our_compute_us'])} / {_ms(r['our_non_compute_us'])}")
            theirs = row["hta_error"] and f"failed: {row['hta_error']}" or (
                "" if r is None or r["hta_idle_us"] is None else
                f"{_ms(r['hta_idle_us'])} / {_ms(r['hta_compute_us'])} / {_ms(r['hta_non_compute_us'])}")
            label = row["folder"] if r is None or len(ranks) == 1 else f"{row['folder']} (rank {r['rank']})"
            lines.append(f"| {label} | {ours} | {theirs} | {_explain(row, r)} |")
    unexplained = [f"- {row['folder']}: {u}" for row in rows for u in row["unexplained"]]
    lines += ["", f"Unexplained differences, crashes and skipped files: {len(unexplained)}", *unexplained, ""]
    if absent:
        lines += [f"Not in the copy of the corpus used (files too large for it): {', '.join(absent)}.", ""]
    return "\n".join(lines)


def _explain(row: dict, r: dict | None) -> str:
    if row["unexplained"]:
        return "**UNEXPLAINED**: " + "; ".join(row["unexplained"])
    if row["hta_error"] and not row["on_gpu"]:
        return "CPU trace: HTA's breakdown needs kernels; ours is from host ops" + "".join(f"; {e}" for e in row["explanations"])
    if row["hta_error"]:
        return "HTA failed; ours: " + ("; ".join(row["explanations"]) or "every event classified")
    if r is not None and r["equal"] and not row["explanations"]:
        return "equal"
    if r is not None and r["equal"]:
        return "equal; " + "; ".join(row["explanations"])
    return "; ".join(row["explanations"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", type=Path, help="HolisticTraceAnalysis's tests/data folder")
    parser.add_argument("--absent", action="append", default=[], metavar="FILE",
                        help="a file of the corpus missing from this copy, to list in the result (repeatable)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for folder in folders(args.corpus):
            name = str(folder.relative_to(args.corpus))
            work = Path(tmp) / name.replace(os.sep, "__")
            shutil.copytree(folder, work / "traces")
            hta = run_hta(work / "traces")
            ours = run_diagtrain(work / "traces", work / "out")
            rows.append(compare(name, hta, ours))
            print(f"{name}: HTA {'failed' if hta.get('error') else 'ok'}, diagtrain "
                  f"{'failed' if ours.get('error') else 'ok'}, unexplained {len(rows[-1]['unexplained'])}", flush=True)
    m = machine()
    text = markdown(rows, m, args.absent)
    save("hta_corpus", {"machine": m, "rows": rows}, text)
    print(text)
    return 1 if any(row["unexplained"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
