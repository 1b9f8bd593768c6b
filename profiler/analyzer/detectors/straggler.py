"""straggler: one rank does its own work slower than its peers, and everyone waits for it.

In synchronous training all ranks have the same step time (they meet at every collective), so
step time cannot point at the slow rank. Its *own* time can: from profiled steps, wall minus the
time spent inside collectives (the others spend the difference waiting there); from the always-on
step records, the first phase of the step in which one rank is far above its peers (waiting comes
later in the step than its cause; a phase a rank spent blocked in collectives is waiting), else
its step without the time it was blocked in collectives (the counters of any job, see own_time).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.detectors.base import informative_phases, late_on_their_path, ranges, steady, time_range
from diagtrain.profiler.analyzer.findings import Finding
from diagtrain.profiler.analyzer.own_time import OWN_TIME, SOURCE as COUNTERS, own_time, waited
from diagtrain.profiler.analyzer.tables import Tables

MIN_EXCESS_MS = 5.0  # below this, scheduling noise on a busy host explains it
MIN_EXCESS_SHARE = 0.08  # ... or below this share of the median step time
# ... or within this many robust standard deviations of the peers' own step-to-step variation of
# the same quantity: on a busy host a phase varies by 10-30% from step to step on every rank.
NOISE_SIGMAS = 3.0
MIN_NOISE_STEPS = 3  # a rank's variation needs at least this many steps to be estimated
MAD_TO_SIGMA = 1.4826  # median absolute deviation of a normal distribution, in standard deviations
# Where the peers' variation is unknown (fewer than MIN_NOISE_STEPS profiled steps), the excess must
# reach this share of the step: clean runs on 2 shared cores differ by up to 15% between ranks.
UNKNOWN_NOISE_SHARE = 0.2
MIN_STEPS = 2  # one slow step is noise; two is a pattern
ERROR_SHARE = 0.5  # a straggler costing half the step or more is an error, not a warning
# Slow in fewer than this share of the steps it could be seen in: an intermittent pause (a busy
# host; 3 of 7 steps in a clean 2-rank run here), reported as info.
PERSISTENT_SHARE = 0.5
# Waiting for data is the dataloader_stall detector's finding: a rank standing out there is not a
# straggler, and in that step its peers' later phases are waiting for it.
EXCLUDED_PHASES = ("data",)
# The kinds of evidence, most specific first: a finding seen in several names the one that saw most
# of its steps, the first of these on a tie (a profiled window is a few steps; records cover all).
SOURCES = ("trace", "phases", COUNTERS)
# A rank whose compute time stands out but whose matrix multiplies are within this factor of its
# peers' does the same work more slowly: said so, as information (flops.py).
MORE_WORK = 1.1


def detect(tables: Tables) -> list[Finding]:
    steps = steady(tables.steps)
    if steps.empty or steps["rank"].nunique() < 2:
        return []
    findings = []
    # A rank late at nearly every collective because it pauses right before its calls has a slow
    # path to the collective (slow_collective), not slow work. Where the gaps before the calls are
    # unknown (GPU traces), such a rank's time outside operators could be that pause: only its
    # phases can make it a straggler then.
    held, maybe_held = late_on_their_path(tables.collectives)
    for peers in tables.structure.peer_groups(sorted(steps["rank"].unique())):
        group = steps[steps["rank"].isin(peers)]
        if group["rank"].nunique() >= 2:
            findings += [f for f in _stragglers(group, tables.phases) if f.ranks[0] not in held
                         and (f.ranks[0] not in maybe_held or f.metrics["source"] == "phases")]
    return findings


def _stragglers(steps: pd.DataFrame, phases: list[str]) -> list[Finding]:
    step_ms = float(steps["wall_ms"].median())
    threshold = max(MIN_EXCESS_MS, MIN_EXCESS_SHARE * step_ms)
    slow, compared = _excess(steps, phases, threshold, step_ms)  # rank, step, phase, excess_ms, value_ms, peer_ms
    findings = []
    for rank, rows in slow.groupby("rank"):
        # A pattern in one kind of evidence (traces or phase records), not one step of each.
        counts = rows.groupby("source").size()
        rows = rows[rows["source"].isin(counts[counts >= MIN_STEPS].index)]
        if rows.empty:
            continue
        by_source = rows.groupby("source")["step"].nunique()
        source = max(by_source.index, key=lambda s: (by_source[s], -SOURCES.index(s)))
        phase = rows.loc[rows["source"] == source, "phase"].mode().iloc[0]
        per_step = float(rows["excess_ms"].median())
        # Per step it could be seen in: traces cover only the profiled steps.
        observed = steps.loc[steps["profiled"], "step"].nunique() if (rows["source"] == "trace").all() else steps["step"].nunique()
        impact = float(rows["excess_ms"].sum() / max(observed, 1))
        others = sorted(int(r) for r in steps["rank"].unique() if r != rank)
        work = _work_ratio(steps, int(rank), rows["step"]) if phase == "compute time" else None
        same_work = work is not None and work < MORE_WORK
        findings.append(Finding(
            kind="straggler",
            severity="info" if same_work else _severity(per_step, rows["step"].nunique() / max(observed, 1), step_ms),
            ranks=[int(rank)], steps=sorted(int(s) for s in rows["step"]),
            time_range=time_range(steps[steps["rank"].eq(rank) & steps["step"].isin(rows["step"])]),
            explanation=(
                f"rank {rank} is a straggler in steps {ranges(rows['step'])}: {phase} "
                f"{rows['value_ms'].median():.1f} ms, {per_step:.1f} ms more than its peers' "
                f"{rows['peer_ms'].median():.1f} ms; rank{'s' if len(others) > 1 else ''} {ranges(others)} "
                f"wait{'' if len(others) > 1 else 's'} for it at the next collective."
                + (f" It does the same work as they do ({work:.2f}x their matrix-multiply FLOPs): its compute is "
                   "slower, not larger (other processes on its host, a slower or throttled device)." if same_work else "")
            ),
            suggestion=(
                f"Look at what rank {rank} does differently there ({phase}): its host or GPU (throttling, "
                "other processes), its data (larger samples), or code that runs only on that rank."
            ),
            metrics={"observed_ms": float(rows["value_ms"].median()), "expected_ms": float(rows["peer_ms"].median()),
                     "work_ratio": work,
                     "excess_ms": per_step, "threshold_ms": float(rows["threshold_ms"].median()), "phase": phase,
                     "step_time_median_ms": step_ms,
                     "source": source, "steps_seen": _seen(compared, int(rank), steps, source)},
            evidence=[{"type": "steps", "rank": int(rank), "step": int(s), "phase": p, "excess_ms": round(float(e), 3)}
                      for s, p, e in zip(rows["step"], rows["phase"], rows["excess_ms"])][:20],
            impact_ms=impact,
        ))
    return findings


def _seen(compared: set[tuple[int, int]], rank: int, steps: pd.DataFrame, source: str) -> int:
    """The steps in which ``rank`` was compared with a peer (profiled ones for trace evidence): a step
    where it was the only rank left after a stall cannot show it slow."""
    profiled = set(steps.loc[steps["profiled"], "step"]) if "profiled" in steps and source == "trace" else None
    return sum(1 for r, s in compared if r == rank and (profiled is None or s in profiled))


def _work_ratio(steps: pd.DataFrame, rank: int, slow_steps: pd.Series) -> float | None:
    """The rank's matrix-multiply FLOPs over its peers' median in the steps it was slow in (None
    where the traces recorded no shapes)."""
    if "gflops" not in steps:
        return None
    rows = steps[steps["step"].isin(slow_steps)]
    mine, theirs = rows.loc[rows["rank"] == rank, "gflops"], rows.loc[rows["rank"] != rank, "gflops"]
    if mine.isna().all() or theirs.isna().all() or not theirs.median() > 0:
        return None
    return float(mine.median() / theirs.median())


def _severity(per_step: float, share_of_steps: float, step_ms: float) -> str:
    """error: half the step or more; warning: seen in at least PERSISTENT_SHARE of the steps it
    could be seen in; else info (a rank that pauses now and then on a busy host)."""
    if share_of_steps < PERSISTENT_SHARE:
        return "info"
    return "error" if per_step >= ERROR_SHARE * step_ms else "warning"


def _quantities(steps: pd.DataFrame, phases: list[str]) -> pd.DataFrame:
    """Per rank and step, each part of a rank's own time the detector compares (ms)."""
    parts = {}
    if "comm_ms" in steps:
        # Clearest first: outside any operator (host stalls), then compute, then both; a busy host
        # adds noise to compute on every rank alike.
        parts = {"time outside any operator": steps["idle_ms"], "compute time": steps["compute_ms"],
                 "time outside collectives": steps["wall_ms"] - steps["comm_ms"]}
    for phase in informative_phases(phases):
        if f"{phase}_ms" in steps:
            parts[f"{phase} phase"] = steps[f"{phase}_ms"]
    parts.update(own_time(steps))
    return pd.DataFrame({"rank": steps["rank"], "step": steps["step"], **parts})


def _usual(quantities: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per rank and quantity: the median over steps, and the robust standard deviation from step
    to step (NaN with fewer than MIN_NOISE_STEPS steps)."""
    values = quantities.drop(columns=["step", "rank"])
    by_rank = values.groupby(quantities["rank"])
    usual = by_rank.median()
    # All ranks at once (a function per rank and quantity cost a second at 1,024 ranks); NaN is skipped.
    deviation = (values - usual.loc[quantities["rank"]].to_numpy()).abs()
    noise = MAD_TO_SIGMA * deviation.groupby(quantities["rank"]).median()
    return usual, noise.where(by_rank.count() >= MIN_NOISE_STEPS)


def _excess(steps: pd.DataFrame, phases: list[str], threshold: float,
            step_ms: float) -> tuple[pd.DataFrame, set[tuple[int, int]]]:
    """Each rank's excess over its peers per step, from traces where profiled, else from phases; and the
    (rank, step) pairs compared with a peer at all."""
    quantities = _quantities(steps, phases)
    usual, noise = _usual(quantities)
    excluded = [f"{p} phase" for p in EXCLUDED_PHASES if f"{p} phase" in quantities]
    # A data stall comes first in a step, also in profiled ones, and explains what follows it.
    traced = excluded + [c for c in quantities.columns
                         if not c.endswith(" phase") and c not in ("rank", "step", OWN_TIME)]
    phased = [c for c in quantities.columns if c.endswith(" phase")] + [c for c in quantities.columns if c == OWN_TIME]
    rows, compared = [], set()
    for step, group in quantities.groupby("step"):
        profiled = steps.loc[group.index, "profiled"].all() if "profiled" in steps else False
        # From traces, the first part in which a rank stands out; from phases, the earliest phase
        # with a slow rank is the cause, and later ones are waiting.
        for label in (traced if profiled and len(traced) > len(excluded) else phased):
            source = "phases" if label.endswith(" phase") else COUNTERS if label == OWN_TIME else "trace"
            found = _over_peers(step, group["rank"], group[label], label, usual[label], noise[label], source,
                                threshold, step_ms)
            if found and waited(steps.loc[group.index], label, found[0]["rank"], found[0]["excess_ms"]):
                continue  # blocked in collectives there: it waited for another rank
            if found and label in excluded:
                # A stalled rank: the others wait for it later in this step, so the rest of the
                # step is compared without it (with one rank left, not at all).
                group = group[group["rank"] != found[0]["rank"]]
                continue
            if found:
                rows += found
                break
        if len(group) >= 2:
            compared |= {(int(r), int(step)) for r in group["rank"]}
    return pd.DataFrame(rows, columns=["rank", "step", "phase", "excess_ms", "value_ms", "peer_ms", "source",
                                       "threshold_ms"]), compared


def _over_peers(step: int, ranks: pd.Series, values: pd.Series, label: str, usual: pd.Series, noise: pd.Series,
                source: str, threshold: float, step_ms: float) -> list[dict]:
    """The rank whose value stands above the rest, beyond the noise, if one does."""
    values = values.to_numpy(dtype=float)
    if len(values) < 2 or np.isnan(values).any():
        return []  # a rank alone in this step has no peers to compare with
    top = int(np.argmax(values))
    peers = np.delete(values, top)
    peer = float(np.median(peers))
    others = [r for r in ranks if r != ranks.iloc[top]]
    # Above the peers in this step and above what they usually take: one peer's quick step is
    # not the candidate's slow one.
    excess = values[top] - max(peer, float(usual.reindex(others).median()))
    spread_rest = float(peers.max() - peers.min()) if len(peers) > 1 else 0.0
    # The peers' own variation, not the candidate's: a straggler for part of the run varies a lot.
    peer_noise = noise.reindex(others).dropna()
    if len(peer_noise):
        limit = max(threshold, NOISE_SIGMAS * float(peer_noise.median()))
    else:  # too few steps to know how much the peers vary: only a large excess counts
        limit = max(threshold, UNKNOWN_NOISE_SHARE * step_ms)
    if excess < limit or excess <= 2 * spread_rest:
        return []
    return [{"rank": int(ranks.iloc[top]), "step": int(step), "phase": label, "excess_ms": excess,
             "value_ms": float(values[top]), "peer_ms": peer, "source": source, "threshold_ms": limit}]
