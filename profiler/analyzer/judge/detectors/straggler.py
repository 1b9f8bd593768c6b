"""straggler: one rank does its own work slower than its peers, and everyone waits for it.

In synchronous training all ranks have the same step time (they meet at every collective), so
step time cannot point at the slow rank. Its *own* time can: from profiled steps, wall minus the
time spent inside collectives (the others spend the difference waiting there); from the always-on
step records, the first phase of the step in which one rank is far above its peers (waiting comes
later in the step than its cause; a phase a rank spent blocked in collectives is waiting), else
its step without the time it was blocked in collectives (the counters of any job, see own_time).
On a GPU, steps timed on every rank's device (run/device_time.py) are compared by the device's idle
time before the step (its host late) and busy time (a slow GPU) instead of the host's phases: NCCL
returns on the host once a collective is queued, so there the host's times say nothing of who waited.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd

from diagtrain.profiler.util.settings import section, setting
from diagtrain.profiler.analyzer.judge.detectors.base import (LateArrival, Steady, onset, informative_phases, late_on_their_path,
                                                              steady, time_range)
from diagtrain.profiler.analyzer.judge.findings import Candidate
from diagtrain.profiler.analyzer.judge.own_time import SOURCE as COUNTERS, OwnTime, blocked_column, own_time, waited
from diagtrain.profiler.analyzer.judge.quantities import (CAUSE_OF, DEVICE_MEASURES, DeviceCause, Measure, Quantity,
                                                           phase as phase_quantity)
from diagtrain.profiler.analyzer.run.device_time import on_device
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.util.stats import MAD_TO_SIGMA
from diagtrain.profiler.util.groups import Groups, distinct, ranked, strictly_ordered



@section("straggler")
class Straggler:
    """When a rank's own work stands far enough above its peers' to make it the one everyone waits for."""

    min_excess_ms: float = setting(5.0, "below this, scheduling noise on a busy host explains a rank's extra time")
    min_excess_share: float = setting(0.08, "... or below this share of the median step time")
    noise_sigmas: float = setting(3.0, "... or within this many robust standard deviations of the peers' own "
                                  "step-to-step variation (10-30% on a busy host)")
    min_noise_steps: int = setting(3, "steps needed to estimate a rank's step-to-step variation")
    unknown_noise_share: float = setting(0.2, "where the peers' variation is unknown (too few steps), the excess must "
                                         "reach this share of the step: clean ranks on 2 shared cores differ by up to 15%")
    min_steps: int = setting(2, "one slow step is noise; two in one kind of evidence is a pattern")
    error_share: float = setting(0.5, "a straggler costing this share of the step or more is an error, not a warning")
    persistent_share: float = setting(0.5, "slow in fewer than this share of the steps it could be seen in: an "
                                      "intermittent pause (a busy host gives any rank some), reported as info")
    data_share: float = setting(0.5, "a late host (its device idle before the step) whose data phase holds at least "
                                "this share of that excess was waiting for its batch: a dataloader_stall, not a straggler")
    more_work: float = setting(1.1, "compute above its peers with matrix-multiply FLOPs within this factor of theirs: "
                               "the same work done more slowly, said so as information")


# Waiting for data is the dataloader_stall detector's finding: a rank standing out there is not a
# straggler, and in that step its peers' later phases are waiting for it.
EXCLUDED_PHASES = ("data",)
# The kinds of evidence, most specific first: a finding seen in several names the one that saw most
# of its steps, the first of these on a tie (a profiled window is a few steps; records cover all).
DEVICE = "device"  # the kind of evidence of the device's timings (CUDA events, NCCL's collective timing)
SOURCES = ("trace", DEVICE, "phases", COUNTERS)
# From step records, the part of a step that comes first is compared first: a late host's device idles
# before the step, and what follows is waiting for it.
RECORDED = (Measure.DEVICE_IDLE, Measure.DEVICE_BUSY, Measure.PHASE, Measure.OWN_TIME)
# Which time each kind of evidence measured (a finding's ``metrics["time_source"]``).
TIME_SOURCE = {"trace": "trace", DEVICE: "device", "phases": "host", COUNTERS: "host"}
SETTINGS = (Straggler, Steady, LateArrival, OwnTime)
# Columns of the steps table the detector never reads (memory, counts, CPU counters): left out of its copy of the
# steady steps, a long run's largest.
UNREAD = ("peak_mem_bytes", "samples", "tokens", "comm_calls", "cpu_ms", "runq_ms", "comm_runq_ms", "page_faults",
          "rss_bytes", "gpu_allocated_bytes", "gpu_reserved_bytes", "gpu_peak_bytes", "gpu_peak_since")


def detect(tables: Tables) -> list[Candidate]:
    """Ranks whose own work, in some part of the step, stands above their peers' beyond the noise."""
    s = Straggler.active()
    steps = steady(tables.steps.drop(columns=[c for c in UNREAD if c in tables.steps]))
    ranks = distinct(steps["rank"])
    if len(ranks) < 2:
        return []
    findings = []
    # A rank late at nearly every collective because it pauses right before its calls has a slow
    # path to the collective (slow_collective), not slow work. Where the gaps before the calls are
    # unknown (GPU traces), such a rank's time outside operators could be that pause: only its
    # phases can make it a straggler then.
    held, maybe_held = late_on_their_path(tables.collectives)
    for peers in tables.structure.peer_groups(ranks.tolist()):
        # All ranks peers (no pipeline stages): the table itself, not a copy of its rows.
        group = steps if len(peers) == len(ranks) else steps[steps["rank"].isin(peers)]
        if np.isin(ranks, peers).sum() >= 2:
            findings += [f for f in _stragglers(group, tables.phases, s) if f.ranks[0] not in held
                         and (f.ranks[0] not in maybe_held or f.metrics["source"] in ("phases", DEVICE))]
    return findings


def _stragglers(steps: pd.DataFrame, phases: list[str], s: Straggler) -> list[Candidate]:
    step_ms = float(steps["wall_ms"].median())
    threshold = max(s.min_excess_ms, s.min_excess_share * step_ms)
    slow, compared, measured = _excess(steps, phases, threshold, step_ms, s)  # rank, step, phase, excess_ms, value_ms, peer_ms
    ranks = distinct(steps["rank"])
    findings = []
    for rank, rows in slow.groupby("rank"):
        # A pattern in one kind of evidence (traces or phase records), not one step of each.
        counts = rows.groupby("source").size()
        rows = rows[rows["source"].isin(counts[counts >= s.min_steps].index)]
        if rows.empty:
            continue
        by_source = rows.groupby("source")["step"].nunique()
        source = max(by_source.index, key=lambda src: (by_source[src], -SOURCES.index(src)))
        # Per step it could be seen in: traces cover only the profiled steps.
        # Arrays, not lists of steps: a long run's straggler is slow in hundreds of thousands of them.
        seen_in = distinct(steps.loc[steps["profiled"], "step"] if (rows["source"] == "trace").all() else steps["step"])
        flagged = distinct(rows["step"])
        began = onset(flagged, seen_in)
        blips = int((flagged < began).sum()) if began is not None else 0
        if blips:  # before it began: a busy host's pauses, told apart
            rows = rows[rows["step"] >= began]
        phase = rows.loc[rows["source"] == source, "phase"].mode().iloc[0]
        per_step = float(rows["excess_ms"].median())
        observed = len(seen_in)
        impact = float(rows["excess_ms"].sum() / max(observed, 1))
        since = int((seen_in >= began).sum()) if began is not None else observed
        others = ranks[ranks != rank].tolist()
        in_slow = _in_steps(steps, rows["step"])  # one mask of the slow steps' rows for each cut of them below
        work = _work_ratio(steps, in_slow, int(rank)) if measured[phase].measure is Measure.COMPUTE else None
        same_work = work is not None and work < s.more_work
        cause = CAUSE_OF.get(measured[phase].measure)
        if cause is DeviceCause.HOST_LATE and _waited_for_data(steps, in_slow, int(rank), s.data_share * per_step):
            continue  # its host waited for data: the dataloader_stall detector's finding, priced by the device's idle time
        findings.append(Candidate(
            kind="straggler", ranks=[int(rank)], steps=rows["step"].sort_values().tolist(),
            time_range=time_range(steps.loc[in_slow & (steps["rank"].to_numpy() == rank),
                                            [c for c in ("start", "end") if c in steps]]),
            facts={"phase": phase, "value_ms": float(rows["value_ms"].median()), "excess_ms": per_step,
                   "peer_ms": float(rows["peer_ms"].median()), "others": others, "onset": began, "blips": blips,
                   "cause": cause.value if cause else None, "work_ratio": work, "same_work": same_work,
                   "seen_share": rows["step"].nunique() / max(since, 1), "lost_ms_per_step": impact},
            metrics={"observed_ms": float(rows["value_ms"].median()), "expected_ms": float(rows["peer_ms"].median()),
                     "work_ratio": work,
                     "excess_ms": per_step, "threshold_ms": float(rows["threshold_ms"].median()), "phase": phase,
                     "quantity": measured[phase].key,
                     "step_time_median_ms": step_ms,
                     "source": source, "steps_seen": _seen(compared, int(rank), steps, source),
                     "onset_step": began, "blips_before_onset": blips,
                     "time_source": TIME_SOURCE[source], **({"cause": cause.value} if cause else {})},
            evidence=[{"type": "steps", "rank": int(rank), "step": int(s), "phase": p, "excess_ms": round(float(e), 3)}
                      for s, p, e in rows[["step", "phase", "excess_ms"]].head(20).itertuples(index=False)],
        ))
    return findings


def _in_steps(steps: pd.DataFrame, slow_steps: pd.Series) -> np.ndarray:
    """Which rows of ``steps`` are of ``slow_steps``: by a table of the step numbers, not a hash of every row's (2 ms a
    finding, for each cut, at 8,192 ranks x 20 steps)."""
    return np.isin(steps["step"].to_numpy(), slow_steps.to_numpy(), kind="table")


def _waited_for_data(steps: pd.DataFrame, in_slow: np.ndarray, rank: int, at_least_ms: float) -> bool:
    """Whether a late host's data phase was ``at_least_ms`` above its peers' in the steps it was slow in (the rows
    ``in_slow``): a data stall."""
    if "data_ms" not in steps:
        return False
    rows = steps[in_slow]
    mine, theirs = rows.loc[rows["rank"] == rank, "data_ms"], rows.loc[rows["rank"] != rank, "data_ms"]
    return bool(float(mine.median()) - float(theirs.median()) >= at_least_ms)


def _seen(compared: tuple[np.ndarray, np.ndarray], rank: int, steps: pd.DataFrame, source: str) -> int:
    """The steps in which ``rank`` was compared with a peer (profiled ones for trace evidence): a step
    where it was the only rank left after a stall cannot show it slow. ``compared``: the distinct (rank, step)
    pairs compared, as two arrays."""
    ranks, of_steps = compared
    mine = ranks == rank
    if "profiled" in steps and source == "trace":
        mine &= np.isin(of_steps, steps.loc[steps["profiled"], "step"].to_numpy())
    return int(mine.sum())


def _work_ratio(steps: pd.DataFrame, in_slow: np.ndarray, rank: int) -> float | None:
    """The rank's matrix-multiply FLOPs over its peers' median in the steps it was slow in (the rows ``in_slow``; None
    where the traces recorded no shapes)."""
    if "gflops" not in steps:
        return None
    rows = steps[in_slow]
    mine, theirs = rows.loc[rows["rank"] == rank, "gflops"], rows.loc[rows["rank"] != rank, "gflops"]
    if mine.isna().all() or theirs.isna().all() or not theirs.median() > 0:
        return None
    return float(mine.median() / theirs.median())


def _quantities(steps: pd.DataFrame, phases: list[str]) -> tuple[dict[str, np.ndarray], dict[str, Quantity]]:
    """Per row of ``steps``, each part of a rank's own time the detector compares (ms, as floats), by label; and each
    label's quantity. Arrays, not a frame of them: the frame cost 6 ms of a live window of 8,192 ranks, and no more
    than a column of it was read at a time."""
    parts: dict[Quantity, pd.Series] = {}
    if "comm_ms" in steps:
        # Clearest first: outside any operator (host stalls), then compute, then both; a busy host
        # adds noise to compute on every rank alike.
        parts = {Quantity(Measure.IDLE): steps["idle_ms"], Quantity(Measure.COMPUTE): steps["compute_ms"],
                 Quantity(Measure.OUTSIDE_COLLECTIVES): steps["wall_ms"] - steps["comm_ms"]}
    for phase in informative_phases(phases):
        if f"{phase}_ms" in steps:
            parts[phase_quantity(phase)] = steps[f"{phase}_ms"]
    parts.update(own_time(steps))
    device = on_device(steps)
    if device.any():
        # On the device's rows the host's phases and blocked time say nothing of who waited (NCCL returns
        # once a collective is queued): there the device's own time is compared instead.
        parts = {q: (v if q.measure not in RECORDED else v.where(~device)) for q, v in parts.items()}
        busy = steps["device_step_ms"] - steps["device_comm_wait_ms"] - steps["device_idle_ms"]
        parts[Quantity(Measure.DEVICE_IDLE)] = steps["device_idle_ms"].where(device)
        parts[Quantity(Measure.DEVICE_BUSY)] = busy.where(device)
    return {q.label: v.to_numpy(dtype=float) for q, v in parts.items()}, {q.label: q for q in parts}


def _usual(values: np.ndarray, by_rank: Groups, min_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Per rank (``by_rank``'s groups), one quantity's median over steps, and its robust standard deviation from step
    to step (NaN with fewer than ``min_steps`` steps); NaN is skipped, as pandas' groupby median skips it. All ranks
    at once (a function per rank and quantity cost a second at 1,024 ranks), a quantity at a time (all at once held
    three copies of a long run's quantities)."""
    usual = by_rank.median(values, skip_nan=True)
    with np.errstate(invalid="ignore"):  # inf - inf: NaN, skipped as pandas skips it
        spread = MAD_TO_SIGMA * by_rank.median(np.abs(values - usual[by_rank.codes]), skip_nan=True)
    known = np.bincount(by_rank.codes, weights=~np.isnan(values), minlength=by_rank.n)
    return usual, np.where(known >= min_steps, spread, np.nan)


SLOW_COLUMNS = ["rank", "step", "phase", "excess_ms", "value_ms", "peer_ms", "source", "threshold_ms"]


def _excess(steps: pd.DataFrame, phases: list[str], threshold: float,
            step_ms: float, s: Straggler) -> tuple[pd.DataFrame, tuple[np.ndarray, np.ndarray], dict[str, Quantity]]:
    """Each rank's excess over its peers per step, from traces where profiled, else from phases; the distinct
    (rank, step) pairs compared with a peer at all (as arrays of ranks and steps); and each compared label's quantity."""
    quantities, measured = _quantities(steps, phases)
    excluded = [phase_quantity(p).label for p in EXCLUDED_PHASES if phase_quantity(p).label in measured]
    # A data stall comes first in a step, also in profiled ones, and explains what follows it.
    traced = excluded + [label for label, q in measured.items() if q.measure not in RECORDED]
    phased = [label for m in RECORDED for label, q in measured.items() if q.measure is m]
    ranks, of_steps = steps["rank"].to_numpy(), steps["step"].to_numpy()
    numbers, at = ranked(of_steps)
    # The rows gathered by rank once for every part's usual value and noise, each part's computed only if it is
    # compared: a live window's steps are mostly decided by its first parts (issue 62).
    found, rank_at = ranked(ranks)
    by_rank = Groups(rank_at, len(found))
    parts = {label: _Part(label, _source(q.measure), quantities[label], by_rank, s.min_noise_steps,
                          _column(steps, blocked_column(q))) for label, q in measured.items()}
    profiled = steps["profiled"].to_numpy(dtype=bool) if "profiled" in steps else np.zeros(len(steps), bool)
    # From traces, the first part in which a rank stands out; from phases, the earliest phase with a slow
    # rank is the cause, and later ones are waiting. Every step at once, part by part: a loop over the
    # steps cost 4 s of a run of 2 x 100,000 steps (issue 62).
    traced_steps = (np.bincount(at, weights=~profiled, minlength=len(numbers)) == 0) & (len(traced) > len(excluded))
    walk = _Walk(at, len(numbers), by_rank.codes)
    for labels, in_mode in ((traced, traced_steps), (phased, ~traced_steps)):
        for label in labels:
            walk.compare(parts[label], in_mode, label in excluded, threshold, step_ms, s)
    return walk.slow(ranks, numbers), _pairs(ranks, of_steps, walk.compared()), measured


def _source(measure: Measure) -> str:
    """The kind of evidence a measure is of."""
    return ("phases" if measure is Measure.PHASE else COUNTERS if measure is Measure.OWN_TIME
            else DEVICE if measure in DEVICE_MEASURES else "trace")


def _column(steps: pd.DataFrame, name: str | None) -> np.ndarray | None:
    """The step column ``name`` as floats (None where there is none)."""
    return steps[name].to_numpy(dtype=float) if name is not None and name in steps else None


@dataclass
class _Part:
    """One compared part of the step: its values per row, the rows' ranks (``by_rank``: 0 .. ranks - 1) whose usual
    value and noise it is compared with, and the time blocked in collectives within it per row (a phase's counters;
    None for the rest)."""

    label: str
    source: str
    values: np.ndarray
    by_rank: Groups
    min_steps: int
    blocked: np.ndarray | None

    @cached_property
    def usual(self) -> tuple[np.ndarray, np.ndarray]:
        """Each rank's usual value and noise (:func:`_usual`), on first use: a part whose steps were all decided
        by earlier parts never needs them."""
        return _usual(self.values, self.by_rank, self.min_steps)


class _Walk:
    """The parts compared step by step, as arrays over the steps: which steps still have no straggler, which
    rows were left out of their step (a rank stalled for data: the rest of its step is compared without it),
    and the candidates kept (``at``: each row's step, 0 .. ``n_steps`` - 1; ``rank_at``: each row's rank's position
    in the parts' per-rank values)."""

    def __init__(self, at: np.ndarray, n_steps: int, rank_at: np.ndarray) -> None:
        self.at, self.n_steps, self.rank_at = at, n_steps, rank_at
        self.open = np.ones(n_steps, dtype=bool)
        self.dropped = np.zeros(len(at), dtype=bool)
        self.kept: list[pd.DataFrame] = []

    def compare(self, part: _Part, in_mode: np.ndarray, exclusion: bool, threshold: float, step_ms: float,
                s: Straggler) -> None:
        """Compare ``part`` in the open steps of ``in_mode``: a candidate that waited in collectives there is
        passed over; one found in an ``exclusion`` part (data) leaves its step's comparison; else it is kept
        and its step decided."""
        rows = np.flatnonzero((self.open & in_mode)[self.at] & ~self.dropped)
        if not len(rows):
            return
        of_rank = _taken(self.rank_at, rows)
        by_step = Groups(_taken(self.at, rows), self.n_steps)  # gathered by step once, for the candidates and waiting
        usual, noise = part.usual
        found = _Candidates(by_step, _taken(part.values, rows), usual[of_rank], noise[of_rank], threshold, step_ms, s)
        hit = found.ok
        if part.blocked is not None:
            hit = hit & ~waited(_taken(part.blocked, rows), by_step, np.where(hit, found.top, -1), found.excess)
        top = np.where(hit, rows[np.minimum(found.top, len(rows) - 1)], -1)
        if exclusion:
            self.dropped[top[hit]] = True
            return
        self.open &= ~hit
        k = np.flatnonzero(hit)
        self.kept.append(pd.DataFrame({"k": k, "row": top[k], "phase": part.label, "excess_ms": found.excess[k],
                                       "value_ms": found.value[k], "peer_ms": found.peer[k], "source": part.source,
                                       "threshold_ms": found.limit[k]}))

    def slow(self, ranks: np.ndarray, numbers: np.ndarray) -> pd.DataFrame:
        """The candidates kept, one per step at most, in step order (columns SLOW_COLUMNS)."""
        if not self.kept:
            return pd.DataFrame(columns=SLOW_COLUMNS)
        kept = pd.concat(self.kept, ignore_index=True).sort_values("k", kind="stable")
        kept.insert(0, "rank", ranks[kept["row"].to_numpy()].astype(np.int64))
        kept.insert(1, "step", numbers[kept["k"].to_numpy()].astype(np.int64))
        return kept[SLOW_COLUMNS].reset_index(drop=True)

    def compared(self) -> np.ndarray:
        """The rows of the steps where a rank was compared with a peer (two rows or more left in the step)."""
        left = ~self.dropped
        sizes = np.bincount(self.at[left], minlength=self.n_steps)
        return np.flatnonzero(left & (sizes[self.at] >= 2))


def _taken(per_row: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``per_row`` at ``rows`` (ascending); the array itself where they are every row (a live window's first part)."""
    return per_row if len(rows) == len(per_row) else per_row[rows]


def _pairs(ranks: np.ndarray, steps: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (rank, step) pairs of the rows at positions ``at`` (of rows' ``ranks`` and ``steps``): their ranks
    and their steps."""
    ranks, steps = ranks.astype(np.int64, copy=False)[at], steps.astype(np.int64, copy=False)[at]
    if not len(at) or strictly_ordered(ranks, steps):  # a steps table's rows by rank, then step: distinct already
        return ranks, steps
    low, span = steps.min(), steps.max() - steps.min() + 1
    pair = distinct((ranks - ranks.min()) * span + (steps - low))
    return pair // span + ranks.min(), pair % span + low


class _Candidates:
    """One part's candidate in every step at once: the rank whose value stands above the rest of its step,
    beyond the noise, if one does (``by_step``: the rows' steps, 0 .. n - 1; ``usual`` and ``noise``: each
    row's rank's). tests/straggler_reference.py keeps the function per step it gives to the bit."""

    def __init__(self, by_step: Groups, values: np.ndarray, usual: np.ndarray,
                 noise: np.ndarray, threshold: float, step_ms: float, s: Straggler) -> None:
        sizes, n = by_step.sizes, len(values)
        unknown = np.bincount(by_step.codes, weights=np.isnan(values), minlength=by_step.n) > 0
        # The top row of each step: its largest value, the first such row on a tie (as np.argmax).
        filled = np.where(np.isnan(values), -np.inf, values)
        self.top = by_step.first(filled == by_step.maximum(filled)[by_step.codes])
        # The others: one row per rank and step, so the rows other than the top are its peers.
        peer = np.ones(n, dtype=bool)
        peer[self.top[self.top < n]] = False
        peers = by_step.within(peer)
        self.peer = peers.median(values)
        with np.errstate(invalid="ignore"):  # NaN in a step makes it unknown (below): its spread is not used
            high, low = peers.maximum(values), peers.minimum(values)
        # Above the peers in this step and above what they usually take: one peer's quick step is
        # not the candidate's slow one.
        spread_rest = np.where(sizes > 2, high - low, 0.0)
        usual_others = peers.within(~np.isnan(usual)).median(usual)
        # The peers' own variation, not the candidate's: a straggler for part of the run varies a lot.
        peer_noise = peers.within(~np.isnan(noise)).median(noise)
        # Python's max(a, b) (b where b > a): NaN never wins.
        top = np.minimum(self.top, n - 1)
        self.value = values[top]
        self.excess = self.value - np.where(usual_others > self.peer, usual_others, self.peer)
        # Too few steps to know how much the peers vary: only a large excess counts.
        bar = np.where(np.isnan(peer_noise), s.unknown_noise_share * step_ms, s.noise_sigmas * peer_noise)
        self.limit = np.where(bar > threshold, bar, threshold)
        with np.errstate(invalid="ignore"):
            self.ok = (sizes >= 2) & ~unknown & ~(self.excess < self.limit) & ~(self.excess <= 2 * spread_rest)
