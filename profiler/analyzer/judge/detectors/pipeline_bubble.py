"""pipeline_bubble: pipeline stages idle more than the schedule must, or the schedule itself idles.

The stages and microbatches come from the run (analyzer/run/structure.py): torch.distributed.pipelining
schedules and hand-written send/recv alike. With p stages and m microbatches a balanced pipeline
idles (p-1)/(m+p-1) of each step filling and draining (the shared cost model's bubble). Each
stage's busy time per step (profiled compute; else its time outside collectives and point-to-point
from the always-on counters; else the parameters it holds) says which stage sets the pace and by
how much; the busiest stage's idle share is the bubble the schedule really has. Findings: too few
microbatches (the analytical bubble alone is large), unequal stages (the others wait for the
busiest every microbatch), and otherwise a summary of the pipeline as measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from diagtrain.profiler.analyzer.judge.detectors.base import Steady, steady
from diagtrain.profiler.analyzer.judge.findings import Candidate
from diagtrain.profiler.analyzer.run.device_time import timed_on_device
from diagtrain.profiler.analyzer.run.ledger import cpu_wait
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.util.settings import section, setting
from diagtrain.profiler.model.pipeline import bubble as bubble_formula


@section("pipeline_bubble")
class PipelineBubble:
    """When a pipeline's schedule idles too much, and when its stages are unequal."""

    warn_bubble_share: float = setting(0.3, "an analytical bubble of this share of the step is worth more microbatches")
    imbalance_ratio: float = setting(1.5, "the busiest stage doing this many times the least busy one's work")
    microbatches_per_stage: int = setting(4, "the microbatches suggested, per stage: a 1F1B bubble under 20%")
    # Clean 2-stage runs on 2 shared cores: one stage 1.35-1.45x the other for three steps, then the other way.
    persistent_share: float = setting(0.6, "an unequal split shows in every step: timed stages that differ by the ratio in "
                                      "fewer of their steps differ by a busy host's turns")
    min_steps: int = setting(3, "... and in at least this many steps: a running job's first steps can show any stage ahead")


SETTINGS = (PipelineBubble, Steady)


@dataclass
class StageWork:
    """Per stage: busy time per step (or a proxy for it), idle share of the step where timed, and
    the matrix-multiply work where the traces recorded shapes (flops.py)."""

    busy: pd.Series  # stage -> busy ms per step (or parameters held)
    idle_share: pd.Series  # stage -> share of the step without work (empty for parameter counts)
    source: str
    gflops: pd.Series = field(default_factory=lambda: pd.Series(dtype=float))  # stage -> GFLOP per step
    per_step: pd.DataFrame = field(default_factory=pd.DataFrame)  # step x stage -> busy ms (timed work only)

    @property
    def work(self) -> tuple[pd.Series, str]:
        """What the stages are compared by: counted work where known (a busy host inflates time,
        not FLOPs), else their busy time or parameters."""
        if len(self.gflops) == len(self.busy) and (self.gflops > 0).all():
            return self.gflops, "matrix-multiply FLOPs"
        return self.busy, self.source


def detect(tables: Tables) -> list[Candidate]:
    """Too few microbatches for the stages, and stages of unequal work (or the pipeline as measured)."""
    settings = PipelineBubble.active()
    s = tables.structure
    p, m = s.n_stages, s.microbatches
    if p < 2:
        return []
    # The structure knows no schedule: GPipe's and 1F1B's bubble, the same.
    bubble = bubble_formula(p, m) if m else None
    findings = []
    if bubble is not None and bubble >= settings.warn_bubble_share:
        findings.append(_few_microbatches(tables, p, int(m), bubble, settings))
    work = stage_work(tables)
    # Parameter counts can show an uneven split; only timed work can show a balanced one.
    if work is not None and (not work.idle_share.empty or _unequal(work, settings)):
        findings.append(_stages(tables, work, bubble, settings))
    return findings


def _unequal(work: StageWork, settings: PipelineBubble) -> bool:
    amount, _ = work.work
    if not (len(amount) >= 2 and amount.min() > 0 and float(amount.max() / amount.min()) >= settings.imbalance_ratio):
        return False
    turns = _steps_ahead(work, settings)
    # Timed work: the busiest stage ahead by the ratio step after step, not in the medians of a few.
    return turns is None or (turns[0] >= settings.min_steps and turns[0] >= settings.persistent_share * turns[1])


def _steps_ahead(work: StageWork, settings: PipelineBubble) -> tuple[int, int] | None:
    """In how many of the timed steps the busiest stage took ``imbalance_ratio`` times the lightest's
    time, and of how many (None for counted work, FLOPs or parameters, which has no step-to-step noise)."""
    amount, compared_by = work.work
    if compared_by != work.source or work.per_step.empty:
        return None
    ahead = work.per_step[amount.idxmax()] >= settings.imbalance_ratio * work.per_step[amount.idxmin()]
    return int(ahead.sum()), len(ahead)


def _by_turns(work: StageWork, settings: PipelineBubble) -> dict[str, Any] | None:
    """Why medians this far apart are no unequal split: the stage was ahead by the ratio only now and then (in how
    many of the timed steps); None where they are not that far apart."""
    amount, _ = work.work
    turns = _steps_ahead(work, settings)
    if turns is None or not amount.min() > 0 or float(amount.max() / amount.min()) < settings.imbalance_ratio:
        return None
    return {"stage": int(amount.idxmax()), "lightest": int(amount.idxmin()), "ratio": settings.imbalance_ratio,
            "ahead": turns[0], "steps": turns[1], "min_steps": settings.min_steps}


def stage_work(tables: Tables) -> StageWork | None:
    """Each stage's work per step from the best evidence the run has, or None without any."""
    steps = steady(tables.steps)
    stage = steps["rank"].map(tables.structure.stage_of)
    steps = steps.assign(stage=stage)[stage.notna()]
    if "compute_ms" in steps and steps["compute_ms"].notna().any():
        timed = steps[steps["compute_ms"].notna()]
        work = _timed(timed, timed["compute_ms"], timed["wall_ms"], "profiled compute time")
        if "gflops" in timed and timed["gflops"].notna().all():
            work.gflops = timed.groupby(["stage", "rank"])["gflops"].median().groupby(level="stage").median()
            work.gflops.index = work.gflops.index.astype(int)
        return work
    # On a CUDA rank (its steps timed on the device) the host's time blocked in send/recv is no wait: NCCL
    # returns once the call is queued, and point-to-point calls carry no device timing to take its place.
    counted = steps[steps["comm_wait_ms"].notna() & ~timed_on_device(steps)] if "comm_wait_ms" in steps else steps[:0]
    if not counted.empty:
        # Time a rank ran, as the ledger counts it: a wait for a CPU (a busy host's, uneven between ranks)
        # is no work of its stage's.
        starved = cpu_wait(counted).fillna(0.0)
        return _timed(counted, (counted["wall_ms"] - counted["comm_wait_ms"] - starved).clip(lower=0.0),
                      counted["wall_ms"], "time outside communication (counters)")
    if tables.parameters:
        held = pd.Series(tables.parameters)
        by_stage = held.groupby(held.index.map(tables.structure.stage_of)).median()
        return StageWork(by_stage, pd.Series(dtype=float), "parameters held")
    return None


def _timed(steps: pd.DataFrame, busy: pd.Series, wall: pd.Series, source: str) -> StageWork:
    """Medians per rank, then per stage: one slow step or one odd rank does not decide; and each
    stage's busy time step by step (the median of its ranks)."""
    rows = pd.DataFrame({"stage": steps["stage"].astype(int), "rank": steps["rank"], "step": steps["step"],
                         "busy": busy, "idle": 1 - busy / wall})
    by_stage = rows.groupby(["stage", "rank"])[["busy", "idle"]].median().groupby(level="stage").median()
    per_step = rows.groupby(["step", "stage"])["busy"].median().unstack("stage").dropna()
    return StageWork(by_stage["busy"], by_stage["idle"].clip(lower=0.0), source, per_step=per_step)


def _few_microbatches(tables: Tables, p: int, m: int, bubble: float, settings: PipelineBubble) -> Candidate:
    steps = steady(tables.steps)
    wall = float(steps["wall_ms"].median()) if len(steps) else None
    suggested = settings.microbatches_per_stage * p
    s = tables.structure
    return Candidate(
        kind="pipeline_bubble", ranks=sorted(int(r) for r in steps["rank"].unique()),
        facts={"case": "few_microbatches", "microbatches": m, "stages": p, "bubble": bubble, "suggested": suggested,
               "per_stage": settings.microbatches_per_stage,
               "lost_ms_per_step": (bubble - bubble_formula(p, suggested)) * wall if wall else None},
        metrics={"observed_microbatches": m, "stages": p, "expected_bubble": bubble,
                 "threshold": settings.warn_bubble_share},
        evidence=[{"type": "structure", "stages_from": s.stage_source, "microbatches_from": s.microbatch_source,
                   "n_microbatches": m, "pp": p}],
    )


def _stages(tables: Tables, work: StageWork, bubble: float | None, settings: PipelineBubble) -> Candidate:
    busy = work.busy
    amount, compared_by = work.work
    s = tables.structure
    busiest, lightest = int(amount.idxmax()), int(amount.idxmin())
    ratio = float(amount.max() / amount.min()) if amount.min() > 0 else float("inf")
    unequal = _unequal(work, settings)
    steps = steady(tables.steps)
    wall = float(steps["wall_ms"].median()) if len(steps) else None
    timed = not work.idle_share.empty
    pace = int(busy.idxmax())  # the stage the pipeline waits for: what it idles is the schedule's bubble
    facts = {"case": "unequal" if unequal else "balanced", "compared_by": compared_by, "ratio": ratio, "timed": timed,
             "per_stage": [{"stage": int(st), "work": float(b),
                            "idle_share": float(work.idle_share[st]) if timed else None,
                            "gflops": float(work.gflops[st]) if st in work.gflops.index else None}
                           for st, b in busy.items()],
             "pace_idle_share": float(work.idle_share[pace]) if timed else None, "bubble": bubble,
             "microbatches": s.microbatches}
    if unequal:
        facts.update(busiest=busiest, lightest=lightest, busiest_ranks=s.stage_ranks(busiest),
                     layers=(tables.trainer or {}).get("stage_layers"),
                     # The pipeline moves at the busiest stage's pace; balanced, every stage does the mean.
                     lost_ms_per_step=wall * (1 - float(amount.mean() / amount.max())) if wall else None)
    else:
        time_ratio = float(busy.max() / busy.min()) if busy.min() > 0 else float("inf")
        facts.update(stages=s.n_stages, stage_source=s.stage_source, source=work.source, pace=pace,
                     quickest=int(busy.idxmin()), time_ratio=time_ratio,
                     slowed=compared_by != work.source and time_ratio >= settings.imbalance_ratio,
                     turns=_by_turns(work, settings))
    return Candidate(
        kind="pipeline_bubble", ranks=s.stage_ranks(busiest) if unequal else sorted(s.stages), facts=facts,
        metrics={"observed_ratio": ratio, "threshold_ratio": settings.imbalance_ratio, "bottleneck_stage": busiest,
                 "compared_by": compared_by, "gflops_per_stage": {int(k): round(float(v), 3) for k, v in work.gflops.items()},
                 "work_per_stage": {int(k): round(float(v), 3) for k, v in busy.items()},
                 "idle_share_per_stage": {int(k): round(float(v), 3) for k, v in work.idle_share.items()},
                 "expected_bubble": bubble, "observed_bubble": float(work.idle_share[pace]) if timed else None,
                 "microbatches": s.microbatches, "source": work.source},
        evidence=[{"type": "stage", "stage": int(st), "ranks": s.stage_ranks(int(st)), "work": float(w)}
                  for st, w in busy.items()],
    )
