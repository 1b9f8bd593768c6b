"""straggler: one rank does its own work slower than its peers, and everyone waits for it.

In synchronous training all ranks have the same step time (they meet at every collective), so
step time cannot point at the slow rank. Its *own* time can: from profiled steps, wall minus the
time spent inside collectives (the others spend the difference waiting there); from the always-on
step records, the first phase of the step in which one rank is far above its peers (waiting comes
later in the step than its cause).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.detectors.base import peer_groups, persistently_late, ranges, steady, time_range
from diagtrain.profiler.analyzer.findings import Finding
from diagtrain.profiler.analyzer.tables import Tables

MIN_EXCESS_MS = 5.0  # below this, scheduling noise on a busy host explains it
MIN_EXCESS_SHARE = 0.08  # ... or below this share of the median step time
MIN_STEPS = 2  # one slow step is noise; two is a pattern
ERROR_SHARE = 0.5  # a straggler costing half the step or more is an error, not a warning
EXCLUDED_PHASES = ("data",)  # waiting for data is the dataloader_stall detector's finding


def detect(tables: Tables) -> list[Finding]:
    steps = steady(tables.steps)
    if steps.empty or steps["rank"].nunique() < 2:
        return []
    findings = []
    # A rank late at nearly every collective has a slow communication path (slow_collective),
    # not slow work of its own.
    comm_late = persistently_late(tables.collectives)
    for peers in peer_groups(tables, sorted(steps["rank"].unique())):
        group = steps[steps["rank"].isin(peers)]
        if group["rank"].nunique() >= 2:
            findings += [f for f in _stragglers(group, tables.phases) if f.ranks[0] not in comm_late]
    return findings


def _stragglers(steps: pd.DataFrame, phases: list[str]) -> list[Finding]:
    step_ms = float(steps["wall_ms"].median())
    threshold = max(MIN_EXCESS_MS, MIN_EXCESS_SHARE * step_ms)
    slow = _excess(steps, phases, threshold)  # rank, step, phase, excess_ms, value_ms, peer_ms
    findings = []
    for rank, rows in slow.groupby("rank"):
        if len(rows) < MIN_STEPS:
            continue
        phase = rows["phase"].mode().iloc[0]
        per_step = float(rows["excess_ms"].median())
        # Per step it could be seen in: traces cover only the profiled steps.
        observed = steps.loc[steps["profiled"], "step"].nunique() if (rows["source"] == "trace").all() else steps["step"].nunique()
        impact = float(rows["excess_ms"].sum() / max(observed, 1))
        others = sorted(int(r) for r in steps["rank"].unique() if r != rank)
        findings.append(Finding(
            kind="straggler",
            severity="error" if per_step >= ERROR_SHARE * step_ms else "warning",
            ranks=[int(rank)], steps=sorted(int(s) for s in rows["step"]),
            time_range=time_range(steps[steps["rank"].eq(rank) & steps["step"].isin(rows["step"])]),
            explanation=(
                f"rank {rank} is a straggler in steps {ranges(rows['step'])}: {phase} "
                f"{rows['value_ms'].median():.1f} ms, {per_step:.1f} ms more than its peers' "
                f"{rows['peer_ms'].median():.1f} ms; ranks {ranges(others)} wait for it at the next collective."
            ),
            suggestion=(
                f"Look at what rank {rank} does differently there ({phase}): its host or GPU (throttling, "
                "other processes), its data (larger samples), or code that runs only on that rank."
            ),
            metrics={"observed_ms": float(rows["value_ms"].median()), "expected_ms": float(rows["peer_ms"].median()),
                     "excess_ms": per_step, "threshold_ms": threshold, "phase": phase,
                     "step_time_median_ms": step_ms, "source": rows["source"].iloc[0]},
            evidence=[{"type": "steps", "rank": int(rank), "step": int(s), "phase": p, "excess_ms": round(float(e), 3)}
                      for s, p, e in zip(rows["step"], rows["phase"], rows["excess_ms"])][:20],
            impact_ms=impact,
        ))
    return findings


def _excess(steps: pd.DataFrame, phases: list[str], threshold: float) -> pd.DataFrame:
    """Each rank's excess over its peers per step, from traces where profiled, else from phases."""
    rows = []
    for step, group in steps.groupby("step"):
        if group.get("profiled", pd.Series(False)).all() and "comm_ms" in group:
            # Parts of its own time, clearest first: outside any operator (host stalls), then
            # compute, then both; a busy host adds noise to compute on every rank alike.
            for label, values in (("time outside any operator", group["idle_ms"]),
                                  ("compute time", group["compute_ms"]),
                                  ("time outside collectives", group["wall_ms"] - group["comm_ms"])):
                found = _over_peers(step, group["rank"], values, label, "trace", threshold)
                if found:
                    rows += found
                    break
            continue
        for phase in (p for p in phases if p not in EXCLUDED_PHASES):
            column = f"{phase}_ms"
            if column not in group or group[column].isna().any():
                continue
            found = _over_peers(step, group["rank"], group[column], f"{phase} phase", "phases", threshold)
            if found:
                rows += found
                break  # the earliest phase with a slow rank is the cause; later ones are waiting
    return pd.DataFrame(rows, columns=["rank", "step", "phase", "excess_ms", "value_ms", "peer_ms", "source"])


def _over_peers(step: int, ranks: pd.Series, values: pd.Series, phase: str, source: str,
                threshold: float) -> list[dict]:
    """The rank whose value stands above the rest, if one does."""
    values = values.to_numpy(dtype=float)
    if len(values) < 2 or np.isnan(values).any():
        return []  # a rank alone in this step has no peers to compare with
    top = int(np.argmax(values))
    peers = np.delete(values, top)
    peer = float(np.median(peers))
    excess = values[top] - peer
    spread_rest = float(peers.max() - peers.min()) if len(peers) > 1 else 0.0
    if excess < threshold or excess <= 2 * spread_rest:
        return []
    return [{"rank": int(ranks.iloc[top]), "step": int(step), "phase": phase, "excess_ms": excess,
             "value_ms": float(values[top]), "peer_ms": peer, "source": source}]
