"""What `diagtrain compare` compares: a run reduced to per-step samples and facts.

Read from the analyzer's output (analysis/*.parquet, report.json); the CLI analyzes a run that has
none first. ``diagtrain baseline RUN [RUN...] -o FILE`` stores exactly this for each run, so CI
need not keep runs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from diagtrain.profiler.compare import machine
from diagtrain.profiler.compare.thresholds import CompareSettings
from diagtrain.profiler.run_dir import SCHEMA_VERSION
from diagtrain.profiler.util.units import MIB, fmt_bytes

KIND = "diagtrain-baseline"
# Warm-up rule for comparisons (compare.warmup_share): the first share of steps, and at least step 1, are left
# out (process-group start, allocator growth, first-call compilation vary between runs).
# The always-on counters say where a rank's time went, not how fast the job is: waiting and a busy
# host move them from run to run (runq_ms above all). They stay out of the regression gate.
# On a GPU the same holds of the device's step, its waits in collectives and its idle time before a step
# (its host late); its busy time (the step less both) is compared instead, as ``device_busy``.
NOT_COMPARED = ("wall_ms", "trace_wall_ms", "comm_wait_ms", "cpu_ms", "runq_ms", "comm_runq_ms", "device_step_ms",
                "device_comm_wait_ms", "device_idle_ms")
NOT_COMPARED_SUFFIXES = ("_comm_wait_ms",)
PER_STEP_METRICS = {  # column in analysis/steps.parquet -> (metric name, unit)
    "compute_ms": ("compute per step", "ms"),
    "exposed_comm_ms": ("exposed communication per step", "ms"),
    "idle_ms": ("idle per step", "ms"),
}
# The job's steps by category (analysis/job_steps.parquet) -> metric name: a job whose data wait, or work outside
# its phases, grew is slower for it whatever its ranks did. The time between steps and the profiler's are left out:
# a fraction of a millisecond a step.
JOB_METRICS = {"compute_ms": "job compute per step", "data_ms": "job data wait per step",
               "communication_ms": "job communication wait per step",
               "imbalance_ms": "job wait for slower ranks per step", "other_ms": "job other work per step"}


class SummaryError(ValueError):
    """A run or baseline that cannot be compared; the message names the file and the problem."""


def is_analyzed(run: Path) -> bool:
    """Whether ``run`` holds the analysis a summary is read from."""
    return (run / "analysis" / "steps.parquet").exists() and (run / "report.json").exists()


def summarize(run: Path) -> dict[str, Any]:
    """The summary of an analyzed run directory."""
    if not is_analyzed(run):
        raise SummaryError(f"{run}: not analyzed yet (run `diagtrain analyze {run}`)")
    try:
        steps = pd.read_parquet(run / "analysis" / "steps.parquet")
        report = json.loads((run / "report.json").read_text())
    except (OSError, ValueError) as e:
        raise SummaryError(f"{run}: cannot read its analysis ({e}); run `diagtrain analyze {run}` again") from None
    if not (isinstance(report, dict) and isinstance(report.get("run"), dict) and isinstance(report.get("findings"), list)):
        raise SummaryError(f"{run}: report.json is not a diagtrain report; run `diagtrain analyze {run}` again")
    if steps.empty:
        raise SummaryError(f"{run}: no steps were recorded")
    steps = _after_warmup(steps)
    if "device_step_ms" in steps:
        steps = steps.assign(device_busy_ms=steps["device_step_ms"] - steps["device_comm_wait_ms"] - steps["device_idle_ms"])
    timed = _unprofiled(steps)  # step times: profiling slows the steps it records
    per_step = timed.groupby("step")
    samples: dict[str, list[float]] = {"step time": _clean(per_step["wall_ms"].median())}
    if "samples" in steps and steps["samples"].notna().any():
        samples["samples per second"] = _clean(per_step["samples"].max() / (per_step["wall_ms"].median() / 1e3))
    if "tokens" in steps and steps["tokens"].notna().any():
        samples["tokens per second"] = _clean(per_step["tokens"].max() / (per_step["wall_ms"].median() / 1e3))
    for column, (name, _) in PER_STEP_METRICS.items():
        if column in steps and steps[column].notna().any():
            samples[name] = _clean(steps.dropna(subset=[column]).groupby("step")[column].median())
    samples.update(_job_samples(run, set(timed["step"])))
    per_rank = {}
    for rank, rows in steps.groupby("rank"):
        record = {"peak memory": _clean(rows["peak_mem_bytes"] / MIB)} if "peak_mem_bytes" in rows else {}
        timed_rows = timed[timed["rank"] == rank]
        for column in [c for c in rows.columns if c.endswith("_ms") and c not in NOT_COMPARED
                       and not c.endswith(NOT_COMPARED_SUFFIXES)]:
            # Phases from unprofiled steps; what only traces measure, from the profiled ones.
            values = timed_rows[column] if timed_rows[column].notna().any() else rows[column]
            if values.notna().any():
                record[column.removesuffix("_ms")] = _clean(values)
        per_rank[str(int(rank))] = record
    return {
        "kind": KIND, "schema_version": SCHEMA_VERSION, "source": str(run),
        "strategy": report["run"].get("strategy"), "world_size": report["run"].get("world_size"),
        "mesh": report["run"].get("mesh"), "command": report["run"].get("command"),
        "steps_used": sorted(int(s) for s in timed["step"].unique()),  # the step-time samples' steps
        "samples": samples, "per_rank": per_rank, "collectives": _collectives(run),
        "findings": [{"kind": f["kind"], "ranks": f["ranks"], "severity": f["severity"], "explanation": f["explanation"],
                      "impact_ms": f.get("impact_ms")} for f in report["findings"]],
        "machine": machine.facts(run, timed),
        # What each cause cost the job (the ledger; absent in runs without step counters).
        "time_lost": [{k: c[k] for k in ("rank", "part", "per_step_ms", "lost_s", "pattern")}
                      for c in (report.get("ledger") or {}).get("causes") or []],
        # Where the job's wall time went, and its goodput (absent in runs analyzed before it was measured).
        "job_time": report.get("job_time"),
        # The thresholds its findings were judged with (None: analyzed before settings were recorded).
        "settings": (report.get("settings") or {}).get("values"),
    }


def baseline(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The baseline file's document: every run's summary (its per-step samples, hence each metric's
    pace and steps per run) and machine facts."""
    return {"kind": KIND, "schema_version": SCHEMA_VERSION, "runs": runs}


def load(path: Path) -> list[dict[str, Any]]:
    """The run summaries of an analyzed run directory (one) or of a stored baseline file (one per run)."""
    if path.is_dir():
        return [summarize(path)]
    if not path.exists():
        raise SummaryError(f"{path}: no such run directory or baseline file")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SummaryError(f"{path}: not a readable baseline ({e})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise SummaryError(f"{path}: not a diagtrain baseline (make one with `diagtrain baseline RUN -o FILE`)")
    runs = data.get("runs", [data])  # a file from before several runs: the one run's summary itself
    if not runs or not all(isinstance(r, dict) and "samples" in r for r in runs):
        raise SummaryError(f"{path}: a diagtrain baseline without run summaries")
    return runs


def _job_samples(run: Path, steps: set[int]) -> dict[str, list[float]]:
    """Per metric of JOB_METRICS, the job's steps' values (those of ``steps``: after warm-up, not profiled)."""
    path = run / "analysis" / "job_steps.parquet"
    if not path.exists():
        return {}
    try:
        job = pd.read_parquet(path)
    except (OSError, ValueError) as e:
        raise SummaryError(f"{path}: cannot read it ({e}); run `diagtrain analyze {run}` again") from None
    job = job[job["step"].isin(steps)]
    return {name: _clean(job[column]) for column, name in JOB_METRICS.items() if column in job and len(job)}


def _after_warmup(steps: pd.DataFrame) -> pd.DataFrame:
    first = sorted(steps["step"].unique())
    skip = max(1, math.ceil(CompareSettings.active().warmup_share * len(first)))
    kept = steps[steps["step"].isin(first[skip:])]
    return kept if not kept.empty else steps


def _unprofiled(steps: pd.DataFrame) -> pd.DataFrame:
    """The steps outside profiled windows (all of them if that leaves none)."""
    if "profiled" not in steps:
        return steps
    kept = steps[~steps["profiled"].astype(bool)]
    return kept if not kept.empty else steps


def _collectives(run: Path) -> dict[str, list[float]]:
    path = run / "analysis" / "collectives.parquet"
    if not path.exists():
        return {}
    c = pd.read_parquet(path)
    if c.empty:
        return {}
    c = c.drop_duplicates(["group", "op", "seq"])
    size = np.where(c["bytes"].notna(), 2 ** np.floor(np.log2(c["bytes"].fillna(1).clip(lower=1))), np.nan)
    label = c["op"] + " on " + c["pg_desc"].fillna(c["pg"]).astype(str) + [
        f" ~{fmt_bytes(s)}" if not np.isnan(s) else "" for s in size]
    return {name: _clean(rows / 1e3) for name, rows in c.assign(label=label).groupby("label")["transfer_us"]}


def _clean(series: pd.Series) -> list[float]:
    return [round(float(v), 6) for v in series.dropna().to_numpy()]
