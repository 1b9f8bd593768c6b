"""The critical path's what-if as an assessment: a straggler priced by replaying its profiled steps' graphs
(run/step_graph.py, run/replay.py) without its excess, or a ledger's price checked by it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.judge.assessments.ledger_price import LedgerPrice
from diagtrain.profiler.analyzer.judge.quantities import Measure, Quantity
from diagtrain.profiler.analyzer.judge.findings import Finding
from diagtrain.profiler.analyzer.judge.verdict import REPLAY, Assessed, Assessment, Results
from diagtrain.profiler.analyzer.run.replay import RunPaths, excess_scale, peer_scale, saving_us
from diagtrain.profiler.analyzer.run.step_graph import CriticalPath, StepGraph
from diagtrain.profiler.util.settings import values


@dataclass(frozen=True)
class ReplayCheck:
    """The replay of taking the ledger's excess off a priced rank in its profiled steps: the check of that price."""

    ms: float  # how much sooner the profiled steps end, per step
    wait_coverage: float | None  # the share of the ranks' blocked time the graphs model as waits (wait_coverage)

    def to_metrics(self) -> dict[str, float | None]:
        """The finding's metrics of it."""
        return {"critical_path_ms": self.ms, "critical_path_wait_coverage": self.wait_coverage}


def with_impacts(findings: list[Finding], prior: list[Results], run: RunPaths,
                 ledger: pd.DataFrame | None = None) -> Assessed:
    """A straggler's ``impact_ms`` from the graph where it exists: the mean saving per profiled step of
    bringing the rank's slow part to its peers' median (the detector's estimate stays elsewhere). One the
    ledger priced over the whole run keeps that price; the replay of taking the ledger's excess off the
    rank in each profiled step is recorded beside it (:class:`ReplayCheck`): whether that excess reaches
    the step's end. The ledger measures the excess on running time; traces cannot tell a CPU-starved
    operator from a slow one, and on a host with more ranks than cores the peers' traced time is half
    starvation."""
    out = Assessed()
    for i, f in enumerate(findings):
        if f.kind != "straggler" or not f.ranks:
            continue
        rank = f.ranks[0]
        quantity = Quantity.from_key(f.metrics["quantity"]) if f.metrics.get("quantity") else None
        phase = quantity.phase if quantity and quantity.measure is Measure.PHASE else None
        steps = [g for g in run.graphs if rank in g.window_start]
        if not steps:
            continue
        used = values(CriticalPath.active())  # the what-if that priced it
        if prior[i].of(LedgerPrice) is not None:  # priced over every step: the replay is its check
            excess = _ledger_excess(ledger, rank)
            replay = float(np.mean([saving_us(g, excess_scale(g, rank, phase, excess.get(g.step, 0.0))) for g in steps]))
            check = ReplayCheck(replay / 1e3, wait_coverage(steps, ledger))
            out.add(i, Assessment(REPLAY, settings=used, metrics=check.to_metrics(), result=check))
            continue
        impact = float(np.mean([saving_us(g, peer_scale(g, rank, phase)) for g in steps])) / 1e3
        out.add(i, Assessment(REPLAY, settings=used, impact_ms=impact, prices=True,
                              metrics={"detector_impact_ms": f.impact_ms, "impact_source": "critical_path"}))
    return out


def wait_coverage(graphs: list[StepGraph], ledger: pd.DataFrame | None) -> float | None:
    """The share of the ranks' time blocked in collectives (the step records' counters) that the graphs
    model as waits released by a collective; None without counters. Where a wait sits inside an operator
    (DTensor's redistribute blocks in its own collective), the graph holds it as work, and a what-if
    cannot shorten it."""
    if ledger is None or ledger.empty or not graphs:
        return None
    modeled = blocked = 0.0
    for g in graphs:
        prev_end = np.where(g.prev >= 0, g.end[np.clip(g.prev, 0, None)], [g.window_start[r] for r in g.rank])
        released = g.release >= 0
        modeled += float(np.clip(g.c_done[g.release[released]] - prev_end[released], 0.0, None).sum()) / 1e3
        blocked += float(ledger.loc[ledger["step"] == g.step, "wait_ms"].sum())
    return modeled / blocked if blocked > 0 else None


def _ledger_excess(ledger: pd.DataFrame | None, rank: int) -> dict[int, float]:
    """The rank's running time above its peers' per step (µs), from the ledger."""
    if ledger is None or ledger.empty:
        return {}
    mine = ledger[ledger["rank"] == rank]
    return dict(zip(mine["step"].astype(int), mine["excess_ms"].astype(float) * 1e3))
