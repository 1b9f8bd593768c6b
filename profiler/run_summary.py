"""What `diagtrain compare` compares: a run reduced to per-step samples and facts.

Read from the analyzer's output (analysis/*.parquet, report.json), running the analysis first if
it is missing. ``diagtrain baseline RUN -o FILE`` stores exactly this, so CI need not keep runs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from diagtrain.profiler.run_dir import SCHEMA_VERSION

KIND = "diagtrain-baseline"
# Warm-up rule for comparisons: the first 10% of steps, and at least step 1, are left out
# (process-group start, allocator growth, first-call compilation vary between runs).
WARMUP_FRACTION = 0.1
PER_STEP_METRICS = {  # column in analysis/steps.parquet -> (metric name, unit)
    "compute_ms": ("compute per step", "ms"),
    "exposed_comm_ms": ("exposed communication per step", "ms"),
    "idle_ms": ("idle per step", "ms"),
}


class SummaryError(ValueError):
    """A run or baseline that cannot be compared; the message names the file and the problem."""


def summarize(run: Path, workers: int = 1) -> dict[str, Any]:
    """The summary of a run directory (analyzing it first when needed)."""
    if not (run / "analysis" / "steps.parquet").exists() or not (run / "report.json").exists():
        from diagtrain.profiler.analyzer.analyze import analyze

        analyze(run, run, ["json"], workers)
    steps = pd.read_parquet(run / "analysis" / "steps.parquet")
    report = json.loads((run / "report.json").read_text())
    if steps.empty:
        raise SummaryError(f"{run}: no steps were recorded")
    steps = _after_warmup(steps)
    per_step = steps.groupby("step")
    samples: dict[str, list[float]] = {"step time": _clean(per_step["wall_ms"].median())}
    if "samples" in steps and steps["samples"].notna().any():
        samples["samples per second"] = _clean(per_step["samples"].max() / (per_step["wall_ms"].median() / 1e3))
    if "tokens" in steps and steps["tokens"].notna().any():
        samples["tokens per second"] = _clean(per_step["tokens"].max() / (per_step["wall_ms"].median() / 1e3))
    for column, (name, _) in PER_STEP_METRICS.items():
        if column in steps and steps[column].notna().any():
            samples[name] = _clean(steps.dropna(subset=[column]).groupby("step")[column].median())
    per_rank = {}
    for rank, rows in steps.groupby("rank"):
        record = {"peak memory": _clean(rows["peak_mem_bytes"] / 2**20)} if "peak_mem_bytes" in rows else {}
        for column in [c for c in rows.columns if c.endswith("_ms") and c not in ("wall_ms", "trace_wall_ms")]:
            if rows[column].notna().any():
                record[column.removesuffix("_ms")] = _clean(rows[column])
        per_rank[str(int(rank))] = record
    return {
        "kind": KIND, "schema_version": SCHEMA_VERSION, "source": str(run),
        "strategy": report["run"].get("strategy"), "world_size": report["run"].get("world_size"),
        "mesh": report["run"].get("mesh"), "command": report["run"].get("command"),
        "steps_used": sorted(int(s) for s in steps["step"].unique()),
        "samples": samples, "per_rank": per_rank, "collectives": _collectives(run),
        "findings": [{"kind": f["kind"], "ranks": f["ranks"], "severity": f["severity"], "explanation": f["explanation"]}
                     for f in report["findings"]],
    }


def load(path: Path, workers: int = 1) -> dict[str, Any]:
    """A run directory's summary, or a stored baseline file."""
    if path.is_dir():
        return summarize(path, workers)
    if not path.exists():
        raise SummaryError(f"{path}: no such run directory or baseline file")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SummaryError(f"{path}: not a readable baseline ({e})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise SummaryError(f"{path}: not a diagtrain baseline (make one with `diagtrain baseline RUN -o FILE`)")
    return data


def _after_warmup(steps: pd.DataFrame) -> pd.DataFrame:
    first = sorted(steps["step"].unique())
    skip = max(1, math.ceil(WARMUP_FRACTION * len(first)))
    kept = steps[steps["step"].isin(first[skip:])]
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
        f" ~{_bytes(s)}" if not np.isnan(s) else "" for s in size]
    return {name: _clean(rows / 1e3) for name, rows in c.assign(label=label).groupby("label")["transfer_us"]}


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.0f} TiB"


def _clean(series: pd.Series) -> list[float]:
    return [round(float(v), 6) for v in series.dropna().to_numpy()]
