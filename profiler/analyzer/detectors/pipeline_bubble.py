"""pipeline_bubble: pipeline stages idle more than the schedule must, or the schedule itself idles.

The analytical bubble of a pipeline with p stages and m microbatches is (p-1)/(m+p-1) of each
step. Two findings: too few microbatches (the analytical bubble alone is large), and stages with
unequal work (the fastest stages wait for the slowest every microbatch), measured from the
profiled compute per stage, or from the parameters each stage holds when nothing was profiled.
"""

from __future__ import annotations

import pandas as pd

from diagtrain.profiler.analyzer.detectors.base import stage_of, steady
from diagtrain.profiler.analyzer.findings import Finding
from diagtrain.profiler.analyzer.tables import Tables

BUBBLE_WARN = 0.3  # an analytical bubble of 30% of the step is worth more microbatches
IMBALANCE_RATIO = 1.5  # the busiest stage doing 1.5x the least busy one's work


def detect(tables: Tables) -> list[Finding]:
    trainer = tables.trainer or {}
    p = int((trainer.get("mesh") or {}).get("pp") or 1)
    m = trainer.get("n_microbatches")
    if p < 2:
        return []
    findings = []
    if m:
        bubble = (p - 1) / (m + p - 1)
        if bubble >= BUBBLE_WARN:
            findings.append(_few_microbatches(tables, p, int(m), bubble))
    imbalance = _stage_imbalance(tables, p)
    if imbalance:
        findings.append(imbalance)
    return findings


def _few_microbatches(tables: Tables, p: int, m: int, bubble: float) -> Finding:
    steps = steady(tables.steps)
    wall = float(steps["wall_ms"].median()) if len(steps) else None
    suggested = 4 * p
    return Finding(
        kind="pipeline_bubble", severity="warning", ranks=sorted(int(r) for r in steps["rank"].unique()),
        explanation=(f"{m} microbatch{'es' if m != 1 else ''} for {p} pipeline stages: each stage idles "
                     f"(p-1)/(m+p-1) = {bubble:.0%} of every step waiting for the pipeline to fill and drain."),
        suggestion=f"Use at least {suggested} microbatches (4x the stages), or an interleaved schedule.",
        metrics={"observed_microbatches": m, "stages": p, "expected_bubble": bubble, "threshold": BUBBLE_WARN},
        evidence=[{"type": "config", "file": "trainer.json", "n_microbatches": m, "pp": p}],
        impact_ms=(bubble - (p - 1) / (suggested + p - 1)) * wall if wall else None,
    )


def _stage_imbalance(tables: Tables, p: int) -> Finding | None:
    work, source = _work_per_stage(tables)
    if len(work) < 2 or work.min() <= 0:
        return None
    ratio = float(work.max() / work.min())
    if ratio < IMBALANCE_RATIO:
        return None
    busiest, lightest = int(work.idxmax()), int(work.idxmin())
    steps = steady(tables.steps)
    wall = float(steps["wall_ms"].median()) if len(steps) else None
    layers = (tables.trainer or {}).get("stage_layers")
    stage_ranks = sorted(r for r in tables.steps["rank"].unique() if stage_of(tables, r) == busiest)
    return Finding(
        kind="pipeline_bubble", severity="warning", ranks=[int(r) for r in stage_ranks],
        explanation=(f"pipeline stage {busiest} does {ratio:.1f}x the work of stage {lightest} (by {source}); "
                     "the other stages wait for it every microbatch."
                     + (f" Layers per stage: {layers}." if layers else "")),
        suggestion="Rebalance the split: move layers from the busiest stage to the others (the first and last "
                   "stages also carry the embedding and the output layer).",
        metrics={"observed_ratio": ratio, "threshold_ratio": IMBALANCE_RATIO, "work_per_stage": work.round(3).to_dict(),
                 "source": source},
        evidence=[{"type": "stage", "stage": int(s), "work": float(w)} for s, w in work.items()],
        # The pipeline moves at the busiest stage's pace; balanced, every stage does the mean.
        impact_ms=wall * (1 - float(work.mean() / work.max())) if wall else None,
    )


def _work_per_stage(tables: Tables) -> tuple[pd.Series, str]:
    steps = steady(tables.steps)
    stages = steps["rank"].map(lambda r: stage_of(tables, r))
    if "compute_ms" in steps and steps["compute_ms"].notna().any():
        return steps.assign(stage=stages).groupby("stage")["compute_ms"].median(), "profiled compute time"
    if tables.parameters:
        held = pd.Series(tables.parameters)
        return held.groupby(held.index.map(lambda r: stage_of(tables, r))).median(), "parameters held"
    return pd.Series(dtype=float), ""
