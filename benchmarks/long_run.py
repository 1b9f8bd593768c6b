"""Long runs (issue 62): `diagtrain analyze` of step records as a week-long job leaves them, growing steps
rather than ranks or trace events: time, peak memory and run-directory bytes, and whether the straggler's
onset, price and words hold.

Synthetic step records (benchmarks/live_cost.py's ``SyntheticJob``: data, forward, backward and optimizer
with a little jitter, waiting in backward for the slowest rank) with rank 1 made 60 ms slower in forward
from half-way through the run: its onset is that step, its price (60 ms excess, the job waiting for it) is
about 30 ms a step averaged over the run. Each case is analyzed cold (no cache) in a fresh process,
`--format json,md`, the local pool of 2 workers or a Dask LocalCluster (`dask`: 2 worker processes; the
client reads the step records, the workers load the ranks' traces, of which these runs have none). Peak
memory is the process tree's, sampled (benchmarks/measure.py); the Dask workers' and client's own peaks
are their VmHWM.

    python benchmarks/long_run.py [--cases 2x500000 1x1000000 8x250000 1024x10000:dask] [--no-save]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, save  # noqa: E402
from live_cost import STRAGGLER, SyntheticJob  # noqa: E402
from measure import run_measured_detail  # noqa: E402
from scale import LOCAL, ON_DASK  # noqa: E402 - the same two ways of analyzing, in a fresh process

DEFAULT_CASES = ("2x500000", "1x1000000", "8x250000", "1024x10000:dask")
WORKERS = 2  # this machine's cores
GENERATE_STEPS = 2000  # steps appended at a time while the run is written
MAX_EXPLANATION_CHARS = 2000  # the bound on a finding's words, whatever the run's length


def write_run(root: Path, ranks: int, steps: int) -> float:
    """The synthetic run of ``ranks`` x ``steps``, rank 1 slow from half-way; seconds it took to write."""
    started = time.perf_counter()
    job = SyntheticJob(root, ranks, straggler_from=steps // 2 + 1)
    while job.step < steps:
        job.append(min(GENERATE_STEPS, steps - job.step))
    return time.perf_counter() - started


def run_bytes(root: Path) -> int:
    """The bytes of the run directory as the job left it (no analysis)."""
    return sum(p.stat().st_size for p in (root / "ranks").rglob("*") if p.is_file())


def measure(tmp: Path, case: str) -> dict:
    """One case ``RANKSxSTEPS[:dask]``: written, analyzed in a fresh process, its straggler finding checked."""
    shape, _, way = case.partition(":")
    ranks, steps = (int(x) for x in shape.split("x"))
    run, out, result = tmp / "run", tmp / "out", tmp / "dask.json"
    written_s = write_run(run, ranks, steps)
    load_before = os.getloadavg()[0]
    code = (ON_DASK if way == "dask" else LOCAL).format(folder=str(run), out=str(out), workers=WORKERS, result=str(result),
                                                        formats="json,md")
    wall, tree, largest, pss = run_measured_detail(code, timeout=3600)
    report = json.loads((out / "report.json").read_text())
    row = {"case": case, "ranks": ranks, "steps": steps, "rank_steps": ranks * steps, "written_s": round(written_s, 1),
           "run_dir_bytes": run_bytes(run), "bytes_per_rank_step": round(run_bytes(run) / (ranks * steps), 1),
           "seconds": round(wall, 2), "us_per_rank_step": round(wall / (ranks * steps) * 1e6, 2),
           "peak_mib": round(tree), "peak_pss_mib": round(pss), "largest_process_mib": round(largest),
           "report_json_bytes": (out / "report.json").stat().st_size,
           "longest_explanation": max((len(f["explanation"]) for f in report["findings"]), default=0),
           "load_before": round(load_before, 1), "load_after": round(os.getloadavg()[0], 1),
           **_straggler(report, ranks, steps)}
    if way == "dask":
        peaks = json.loads(result.read_text())
        row |= {"client_peak_mib": round(peaks["client_peak_mib"]), "worker_peak_mib": round(max(peaks["worker_peak_mib"]))}
    shutil.rmtree(run)
    shutil.rmtree(out)
    return row


def _straggler(report: dict, ranks: int, steps: int) -> dict:
    """The straggler finding's onset and price against the truth (slow from half-way, 60 ms, ~30 ms a step)."""
    if ranks < 2:
        return {"straggler": "one rank: no peers to compare"}
    found = [f for f in report["findings"] if f["kind"] == "straggler" and f["ranks"] == [STRAGGLER]]
    if not found:
        return {"straggler": "not found"}
    f = found[0]
    return {"straggler": f["severity"], "onset_step": f["metrics"].get("onset_step"), "true_onset": steps // 2 + 1,
            "impact_ms": round(f["impact_ms"], 2), "explanation_chars": len(f["explanation"])}


def markdown(m: dict, rows: list[dict]) -> str:
    """The results as a table, with what each column means."""
    head = ("| case | rank-steps | run dir MB | bytes / rank-step | analysis s | us / rank-step | peak MiB (tree) "
            "| largest process MiB | Dask client / worker MiB | straggler | onset (true) | ms/step | longest words | load |")
    lines = [head, "|" + " --- |" * 14]
    for r in rows:
        dask = f"{r['client_peak_mib']} / {r['worker_peak_mib']}" if "worker_peak_mib" in r else ""
        onset = f"{r.get('onset_step')} ({r.get('true_onset')})" if "true_onset" in r else ""
        lines.append(f"| {r['case']} | {r['rank_steps']:,} | {r['run_dir_bytes'] / 1e6:.0f} | {r['bytes_per_rank_step']} "
                     f"| {r['seconds']} | {r['us_per_rank_step']} | {r['peak_mib']} | {r['largest_process_mib']} | {dask} "
                     f"| {r['straggler']} | {onset} | {r.get('impact_ms', '')} | {r['longest_explanation']} "
                     f"| {r['load_before']}-{r['load_after']} |")
    return (f"# Long runs: analysis time, memory and bytes against steps\n\n{m['date']}, {m['cpu_count']} cores, "
            f"load {m['load_average_1_5_15']}, `{m['command']}`\n\n"
            "Synthetic step records, rank 1 60 ms slower in forward from half-way (the job's price ~30 ms a step over "
            "the run); each analyzed cold in a fresh process (`--format json,md`). *Peak*: the process tree's RSS, "
            "sampled. *Longest words*: the longest finding explanation (target: under "
            f"{MAX_EXPLANATION_CHARS:,} characters). Target (issue 62): 2 x 500,000 within 15 s and 1 GiB.\n\n"
            + "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES), help="RANKSxSTEPS, ':dask' for a LocalCluster")
    parser.add_argument("--no-save", action="store_true", help="print the results only")
    args = parser.parse_args()
    m, rows = machine(), []
    for case in args.cases:
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(measure(Path(tmp), case))
        print(rows[-1], flush=True)
    text = markdown(m, rows)
    print(text)
    if not args.no_save:
        save("long_run", {"machine": m, "rows": rows}, text)


if __name__ == "__main__":
    main()
