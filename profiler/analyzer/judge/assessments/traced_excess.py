"""Where in the traces a rank's excess went: its operators in the profiled steps, against its peers'.

The ledger prices a cause from every step's records (a phase, or work outside the recorded phases);
where some of the steps it charged were profiled, the rank's timeline spans say which operators took
the extra time, or that it was spent outside any operator (a sleep, I/O, a lock, the interpreter
between operators). Whole steps are compared, not one phase: plain scripts' traces mark few phases,
and a rank's other phases match its peers' anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.judge.assessments.ledger_price import EVERY_STEP, LedgerPrice
from diagtrain.profiler.analyzer.judge.detectors.base import steady
from diagtrain.profiler.analyzer.judge.findings import Finding
from diagtrain.profiler.analyzer.judge.verdict import TRACED, Assessed, Assessment, Results
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.util.settings import section, setting, values

WORK_KINDS = ("compute", "memory")  # timeline span kinds that are the rank's own work (not comm, not idle)


@section("traced_excess")
class TracedExcessSettings:
    """Which operators a finding names as the place of a rank's excess in its traced steps."""

    min_share: float = setting(0.1, "an operator is named when it holds at least this share of the rank's excess "
                               "over its peers (smaller differences are the peers' own variation)")
    shown_ops: int = setting(3, "operators a finding's words name (its metrics keep every operator named)")


SpansOf = Callable[[int], "pd.DataFrame | None"]


@dataclass
class TracedExcess:
    """A rank's excess in some traced steps: the operators it spent longer in than its peers, and the rest."""

    steps: list[int]  # the charged steps that were profiled
    excess_ms: float  # the ledger's excess of the rank's running time over its peers' (median of the traced steps)
    ops: list[tuple[str, float]]  # (operator, ms per step above the peers' median), largest first
    outside_ops_ms: float  # the excess not in the operators named, per step

    def to_metrics(self) -> dict:
        """The finding's record of it."""
        return {"traced_steps": self.steps, "traced_ops_ms": {op: round(ms, 3) for op, ms in self.ops},
                "traced_outside_ops_ms": round(self.outside_ops_ms, 3)}

    def remark(self) -> dict | None:
        """Where the excess went, largest part first, as a remark (report/wording.py); None when it says nothing:
        the operators shown and the time outside any, each above the settings' share of the excess."""
        s = TracedExcessSettings.active()
        parts = [{"op": op, "ms": ms} for op, ms in self.ops[:s.shown_ops]]
        if self.outside_ops_ms >= s.min_share * self.excess_ms:
            parts.append({"op": None, "ms": self.outside_ops_ms})  # outside any operator
        if not parts:
            return None
        return {"says": "traced_operators", "steps": self.steps, "parts": sorted(parts, key=lambda p: -p["ms"])}


def refine(findings: list[Finding], prior: list[Results], t: Tables, spans_of: SpansOf) -> Assessed:
    """Each finding the ledger priced on one rank, told where its excess went in the charged steps that
    were profiled (nothing to say without traces of them)."""
    out = Assessed()
    for i, f in enumerate(findings):
        price = prior[i].of(LedgerPrice)
        if price is None or len(f.ranks) != 1 or not price.charged_steps:
            continue
        # A cause in every step is there in the steps under the ledger's bar too (on a busy host, often
        # the profiled ones, which profiling slows on every rank).
        steps = None if price.pattern == EVERY_STEP else price.charged_steps
        found = traced_excess(t, spans_of, f.ranks[0], steps)
        if found is not None and (remark := found.remark()):
            out.add(i, Assessment(TRACED, metrics=found.to_metrics(), says=remark,
                                  settings=values(TracedExcessSettings.active()), result=found))
    return out


def stall_operators(findings: list[Finding], t: Tables, spans_of: SpansOf) -> Assessed:
    """Each periodic stall whose steps were profiled, told where its extra time went in them: every rank's
    operators against the same rank's traced steps without a stall (``torch.save``'s copies, an evaluation's
    forward ops), and the rest outside any operator (its file I/O, a sleep, gc)."""
    out = Assessed()
    for i, f in enumerate(findings):
        if f.kind != "periodic_stall" or not f.steps:
            continue
        found = _stall_excess(t, spans_of, f)
        if found is not None and (remark := found.remark()):
            out.add(i, Assessment(TRACED, metrics=found.to_metrics(), says={**remark, "says": "traced_stall"},
                                  settings=values(TracedExcessSettings.active()), result=found))
    return out


def _stall_excess(t: Tables, spans_of: SpansOf, f: Finding) -> TracedExcess | None:
    """Where a stall's extra time went in its profiled steps, against the other profiled steps (None without both)."""
    seg = t.segments
    if seg is None or seg.empty:
        return None
    traced = set(seg["step"].astype(int))
    stalled = sorted(traced & set(f.steps))
    others = sorted(traced - set(f.steps) - set(f.metrics.get("unperiodic_stalls") or []) - {1})
    if not stalled or not others:
        return None
    ranks = sorted(int(r) for r in seg["rank"].unique())
    busy = _busy_by_op(t, spans_of, ranks, stalled + others)
    if busy.empty:
        return None
    steps = busy.index.get_level_values("step")
    # Per rank, its operators in the stall steps above its own steps without one; the median over the ranks.
    above = (busy[steps.isin(stalled)].groupby(level="rank").median()
             - busy[steps.isin(others)].groupby(level="rank").median()).median()
    excess = float(f.metrics.get("stall_ms") or 0.0)
    least = TracedExcessSettings.active().min_share * excess
    ops = sorted(((str(op), float(ms)) for op, ms in above.dropna().items() if ms >= least and ms > 0), key=lambda x: -x[1])
    return TracedExcess(stalled, excess, ops, max(excess - sum(ms for _, ms in ops), 0.0)) if excess > 0 else None


def traced_excess(t: Tables, spans_of: SpansOf, rank: int, steps: list[int] | None) -> TracedExcess | None:
    """Where ``rank``'s excess went in those of ``steps`` (None: any) that were profiled; None without
    traces of them, of a peer, or an excess."""
    seg = t.segments
    if seg is None or seg.empty or t.ledger.empty:
        return None
    profiled = set(seg.loc[seg["rank"] == rank, "step"].astype(int)) & set(steady(t.ledger[["rank", "step"]])["step"])
    traced = sorted(profiled if steps is None else set(int(s) for s in steps) & profiled)
    ranks = sorted(int(r) for r in t.ledger["rank"].unique())
    group = next((g for g in t.structure.peer_groups(ranks) if rank in g), [])
    peers = [r for r in group if r != rank]
    if not traced or not peers:
        return None
    mine = t.ledger[(t.ledger["rank"] == rank) & t.ledger["step"].isin(traced)]
    # Medians over the steps: on a busy host one preempted operator takes tens of ms in one step.
    excess = float(mine["excess_ms"].median()) if len(mine) else float("nan")
    if not np.isfinite(excess) or excess <= 0:
        return None
    busy = _busy_by_op(t, spans_of, [rank, *peers], traced)
    if busy.empty or rank not in busy.index.get_level_values("rank"):
        return None
    per_op = _above_peers(busy, rank)
    least = TracedExcessSettings.active().min_share * excess
    ops = sorted(((str(op), float(ms)) for op, ms in per_op.items() if ms >= least), key=lambda x: -x[1])
    outside = max(excess - sum(ms for _, ms in ops), 0.0)  # the ops named: small ones are the peers' noise
    return TracedExcess(traced, excess, ops, outside)


def _busy_by_op(t: Tables, spans_of: SpansOf, ranks: list[int], steps: list[int]) -> pd.DataFrame:
    """ms of work per (step, rank) and operator, from each rank's spans inside its traced steps (a step's
    window: from its first work segment's start to its last one's end)."""
    seg = t.segments[t.segments["rank"].isin(ranks) & t.segments["step"].isin(steps)]
    windows = seg.groupby(["rank", "step"]).agg(start=("start_us", "min"), end=("end_us", "max"))
    rows = []
    for rank in ranks:
        spans = spans_of(rank)
        if spans is None or spans.empty or rank not in windows.index.get_level_values("rank"):
            continue
        work = spans[spans["kind"].isin(WORK_KINDS)]
        for step, (start, end) in windows.loc[rank].iterrows():
            inside = work[(work["end_us"] > start) & (work["start_us"] < end)]
            ms = (inside["end_us"].clip(upper=end) - inside["start_us"].clip(lower=start)) / 1e3
            rows.append(ms.groupby(inside["name"]).sum().rename((rank, int(step))))
    if not rows:
        return pd.DataFrame()
    busy = pd.DataFrame(rows).fillna(0.0)
    busy.index = pd.MultiIndex.from_tuples(busy.index, names=["rank", "step"])
    return busy


def _above_peers(busy: pd.DataFrame, rank: int) -> pd.Series:
    """Per operator, the rank's ms above its peers' median in the same step, the median over its steps."""
    above = []
    for step, cell in busy.groupby(level="step"):
        cell = cell.droplevel("step")
        if rank in cell.index and len(cell) >= 2:
            above.append(cell.loc[rank] - cell.drop(index=rank).median())
    return pd.concat(above, axis=1).median(axis=1) if above else pd.Series(dtype=float)
