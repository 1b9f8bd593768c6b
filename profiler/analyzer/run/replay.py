"""Replaying a step's graph (run/step_graph.py): its critical path, and what-ifs.

Replaying the graph with the measured durations gives back the measured times; the binding predecessor of
each node (the one that made it start when it did) traced back from the rank that finished the step last is
the critical path. A what-if replays the graph with some durations shortened, and the step's new end is the
saving. Time order is a topological order of the graph, so a replay is one pass over the step's nodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.run.step_graph import StepGraph, graphs
from diagtrain.profiler.analyzer.run.tables import Tables

DATA_PHASE = "data"  # the phase whose time (work or idle) is data loading
CATEGORIES = ("compute", "transfer", "waiting", "data", "host_overhead")
# Codes (not thresholds) of what a node's start is bound by: its step's start, the rank's previous
# node, or the collective that released it; plain ints, as the replay's loop and its int8 array want.
_START, _PREV, _RELEASE = range(3)


@dataclass
class Replay:
    """Node and collective times of one replay, and what bound each."""

    start: np.ndarray
    end: np.ndarray
    bound_by: np.ndarray  # _START | _PREV | _RELEASE
    arrival: np.ndarray
    c_end: np.ndarray
    c_done: np.ndarray  # per row: when the collective ended on its first rank
    c_last: np.ndarray  # per row: the row of the collective's last arrival
    finish: float  # the step's end: the last rank's closing node



def replay(g: StepGraph, scale: np.ndarray | None = None) -> Replay:
    """Node and collective times when each node's duration and own lag are multiplied by ``scale``
    (none: the measured times come back)."""
    n, m = len(g.start), len(g.c_arrival)
    scale = np.ones(n) if scale is None else scale
    # The loop reads and writes one item at a time, which Python lists do several times faster than
    # arrays, numpy's per-call cost included (a step of 3,000 one-rank collectives took 50 ms that way).
    t = _Times(g.start.tolist(), g.end.tolist(), scale.tolist(), [math.nan] * n, [math.nan] * n)
    dur = ((g.end - g.start) * scale).tolist()
    lag = np.where(g.release >= 0, g.lag, g.lag * scale).tolist()  # a wake-up after a wait is not the rank's own time
    bound = [_START] * n
    prev, rank, release = g.prev.tolist(), g.rank.tolist(), g.release.tolist()
    c_arrival, c_end0, c_transfer, c_issuer = (a.tolist() for a in (g.c_arrival, g.c_end, g.c_transfer, g.c_issuer))
    queued = g.c_queued.tolist() if len(g.c_queued) == m else [-1] * m
    arrival, c_end, c_done, c_last = list(c_arrival), [math.nan] * m, [math.nan] * m, list(range(m))
    firsts = _firsts(g.c_key, g.c_end)
    rows_of, alone = _shared(g.c_key), firsts.tolist()
    # A collective when it is done, before nodes that start at that moment: they resume after it.
    order = np.lexsort((np.r_[np.ones(n), np.zeros(len(firsts))], np.r_[_ready(g, firsts)]))
    for item in order.tolist():
        if item < n:
            k = item
            p = prev[k]
            start, bound[k] = ((t.e[p], _PREV) if p >= 0 else (g.window_start[rank[k]], _START))
            start += lag[k]
            j = release[k]
            if j >= 0 and c_done[j] + lag[k] >= start:  # NaN (not done yet) compares False
                start, bound[k] = c_done[j] + lag[k], _RELEASE
            t.s[k], t.e[k] = start, start + dur[k]
            continue
        rows = rows_of.get(item - n)
        if rows is None:  # a collective of one row (no other rank's matched it): as below, without the lists
            r = alone[item - n]
            a = _arrival(t, c_issuer[r], c_arrival[r], queued[r], c_end, c_end0)
            arrival[r], c_last[r] = a, r
            c_end[r] = c_done[r] = _nan_max(c_end0[r] + (a - c_arrival[r]), a + c_transfer[r])
            continue
        moved = [_arrival(t, c_issuer[r], c_arrival[r], queued[r], c_end, c_end0) for r in rows]
        latest = max(range(len(rows)), key=moved.__getitem__)  # the first of the latest, as np.argmax
        last = rows[latest]
        shift = moved[latest] - max(c_arrival[r] for r in rows)
        # Each rank's end moves with the last arrival, and comes no sooner than its own transfer after its own.
        ends = [_nan_max(c_end0[r] + shift, a + c_transfer[r]) for r, a in zip(rows, moved)]
        done = math.nan if any(map(math.isnan, ends)) else min(ends)
        for r, a, end in zip(rows, moved, ends):
            arrival[r], c_end[r], c_done[r], c_last[r] = a, end, done, last
    closing = np.flatnonzero(np.r_[g.rank[1:] != g.rank[:-1], True])
    end = np.array(t.e, dtype=float)
    return Replay(np.array(t.s, dtype=float), end, np.array(bound, dtype=np.int8), np.array(arrival, dtype=float),
                  np.array(c_end, dtype=float), np.array(c_done, dtype=float), np.array(c_last, dtype=int),
                  float(np.max(end[closing])))


@dataclass
class _Times:
    """A replay's node times so far, as lists: measured start and end, scale; replayed start and end."""

    start: list[float]
    end: list[float]
    scale: list[float]
    s: list[float]
    e: list[float]


def _nan_max(a: float, b: float) -> float:
    """max(a, b), NaN if either is (as np.maximum)."""
    return math.nan if a != a or b != b else (a if a >= b else b)


def _shared(key: np.ndarray) -> dict[int, list[int]]:
    """The rows of each key that several rows hold, by the key's place among the distinct keys in
    ascending order (as :func:`_firsts`). Lists: one array per key cost more than the replay; and none for
    a key of one row, most keys where clocks disagree (a list each was 0.2 s of 1.3 at 1,024 ranks)."""
    order = np.argsort(key, kind="stable")  # a key's rows together, in row order
    ordered = key[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if len(key) else np.zeros(0, dtype=int)
    ends = np.r_[starts[1:], len(key)]
    return {i: order[starts[i]:ends[i]].tolist() for i in np.flatnonzero(ends - starts > 1).tolist()}


def _firsts(key: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per key, in ascending key order, the row that ends first (the first such row; a NaN end first,
    as np.argmin takes it)."""
    by_key = np.lexsort((np.where(np.isnan(end), -np.inf, end), key))  # stable: ties keep row order
    starts = np.flatnonzero(np.r_[True, key[by_key][1:] != key[by_key][:-1]]) if len(key) else []
    return by_key[starts].astype(int)


def _ready(g: StepGraph, firsts: np.ndarray) -> np.ndarray:
    """When each node and each collective (by its first row, in ascending key order) can be replayed:
    a node after its release and its rank's previous node, a collective after its first end and its issuers."""
    ready = g.start.copy()
    key_time = g.c_end[firsts].copy()
    group = np.searchsorted(g.c_key[firsts], g.c_key)  # each row's collective
    issued = g.c_issuer >= 0
    by_issuer, issuer = group[issued], g.c_issuer[issued]
    released = g.release >= 0
    queued = g.c_queued >= 0 if len(g.c_queued) == len(g.c_key) else np.zeros(len(g.c_key), dtype=bool)
    for _ in range(2):  # a node resumed before the recorded end pushes what follows it
        if released.any():
            ready[released] = np.maximum(ready[released], key_time[group[g.release[released]]])
        ready = pd.Series(ready).groupby(g.rank).cummax().to_numpy().copy()
        np.maximum.at(key_time, by_issuer, ready[issuer])
        # a collective queued behind another is replayed after it
        np.maximum.at(key_time, group[queued], key_time[group[g.c_queued[queued]]])
    return np.r_[ready, key_time]


def _arrival(t: _Times, issuer: int, at: float, queued: int, c_end: list[float], c_end0: list[float]) -> float:
    """A collective row's arrival in the replay: after its issuing segment, and, when it waited in its
    group's queue, after the row it waited behind ends there (not yet replayed: as issued)."""
    if queued < 0 or c_end[queued] != c_end[queued]:
        return _moved(t, issuer, at)
    issued = _moved(t, issuer, min(at, t.end[issuer])) if issuer >= 0 else -math.inf
    return max(issued, c_end[queued] + (at - c_end0[queued]))


def _moved(t: _Times, issuer: int, at: float) -> float:
    """Where a time ``at`` measured in or after node ``issuer`` falls in the replay."""
    if issuer < 0 or math.isnan(t.s[issuer]):
        return at
    if at <= t.end[issuer]:
        return t.s[issuer] + (at - t.start[issuer]) * t.scale[issuer]
    return t.e[issuer] + (at - t.end[issuer])


@dataclass
class Hop:
    """A stretch of the critical path: one rank's work in a phase, or one collective."""

    rank: int
    kind: str  # work | collective
    label: str  # the phase (or operator) of work; op(group) of a collective
    us: float
    categories: dict[str, float] = field(default_factory=dict)
    waited_us: float = 0.0  # collective: how long the rank it released waited in it
    released_rank: int | None = None  # collective: that rank
    ops: dict[str, float] = field(default_factory=dict)  # work: operator -> µs on the path
    start_us: float = np.inf  # where it lies on the timeline (epoch µs)
    end_us: float = -np.inf


@dataclass
class StepPath:
    """A step's critical path: hops in time order, its length and what it was spent on."""

    step: int
    length_us: float
    hops: list[Hop]
    totals: dict[str, float]  # category -> µs
    waiting_on: dict[int, float]  # rank waited for -> µs on the path


def critical_path(g: StepGraph, r: Replay | None = None) -> StepPath:
    """Trace the binding predecessors back from the rank that finished the step last."""
    r = r or replay(g)
    closing = np.flatnonzero(np.r_[g.rank[1:] != g.rank[:-1], True])
    k = int(closing[np.argmax(r.end[closing])])
    point = r.end[k]
    items: list[tuple] = []  # (rank, kind, label, us, category, op, ends at), latest first
    for _ in range(2 * len(g.start) + 1):  # each pass moves to an earlier node: a DAG by start time
        covered = max(min(point, r.end[k]) - r.start[k], 0.0)
        if covered > 0:
            full = r.end[k] - r.start[k]
            busy = g.busy[k] * covered / full if full > 0 else 0.0
            work = DATA_PHASE if g.phase[k] == DATA_PHASE else "compute"
            at = r.start[k] + covered
            items.append((g.rank[k], "work", g.phase[k], covered - busy, "host_overhead", g.op[k], at - busy))
            items.append((g.rank[k], "work", g.phase[k], busy, work, g.op[k], at))
        gap_kind = DATA_PHASE if g.gap_phase[k] == DATA_PHASE else "host_overhead"
        if r.bound_by[k] == _START:
            items.append((g.rank[k], "work", g.gap_phase[k], r.start[k] - g.window_start[g.rank[k]], gap_kind, "",
                          r.start[k]))
            break
        if r.bound_by[k] == _PREV:
            p = g.prev[k]
            items.append((g.rank[k], "work", g.gap_phase[k], r.start[k] - r.end[p], gap_kind, "", r.start[k]))
            k, point = p, r.end[p]
            continue
        j = g.release[k]
        done = min(r.c_done[j], r.start[k])  # resumed before the recorded end: the path leaves the collective then
        items.append((g.rank[k], "work", g.gap_phase[k], r.start[k] - done, "host_overhead", "", r.start[k]))
        last = r.c_last[j]
        on_path = max(done - r.arrival[last], 0.0)
        # Its own arrival last: all of it is the collective's own time on this rank.
        transfer = on_path if last == j else min(on_path, g.c_transfer[j])
        waited = max(r.arrival[last] - r.arrival[j], 0.0)
        items.append((g.c_rank[last], "collective", g.c_label[j], on_path,
                      {"transfer": transfer, "waiting": on_path - transfer}, (waited, g.c_rank[j]), done))
        issuer, point = g.c_issuer[last], r.arrival[last]
        if issuer < 0:
            break
        if point > r.end[issuer]:
            items.append((g.rank[issuer], "work", g.phase[issuer], point - r.end[issuer], "host_overhead", "", point))
            point = r.end[issuer]
        k = issuer
    return _summarize(g.step, items[::-1])


def _summarize(step: int, items: list[tuple]) -> StepPath:
    hops: list[Hop] = []
    totals = dict.fromkeys(CATEGORIES, 0.0)
    waiting_on: dict[int, float] = {}
    for rank, kind, label, us, category, extra, at in items:
        rank = int(rank)
        if kind == "collective":
            waited, released = extra
            hops.append(Hop(rank, kind, str(label), us, dict(category), waited, int(released), start_us=at - us,
                            end_us=at))
            for c, v in category.items():
                totals[c] += v
            if category["waiting"] > 0:
                waiting_on[rank] = waiting_on.get(rank, 0.0) + category["waiting"]
            continue
        if us <= 0:
            continue
        totals[category] += us
        label = label or "outside phases"
        if not hops or hops[-1].kind != "work" or hops[-1].rank != rank or hops[-1].label != label:
            hops.append(Hop(rank, "work", label, 0.0))
        hop = hops[-1]
        hop.us += us
        hop.start_us, hop.end_us = min(hop.start_us, at - us), max(hop.end_us, at)
        hop.categories[category] = hop.categories.get(category, 0.0) + us
        op = extra or f"{label} (outside operators)"  # time in no operator: a sleep, Python, a stall
        hop.ops[op] = hop.ops.get(op, 0.0) + us
    return StepPath(step, sum(h.us for h in hops), hops, totals, waiting_on)


# --- what-if ------------------------------------------------------------------------------------

def peer_scale(g: StepGraph, rank: int, phase: str | None) -> np.ndarray:
    """Node scales that bring ``rank``'s own time in ``phase`` (all its work when None) to its
    peers' median; ones where it is already at or below it."""
    own = _own_time(g, phase)
    if rank not in own or len(own) < 2:
        return np.ones(len(g.start))
    peers = float(np.median([t for r, t in own.items() if r != rank]))
    if own[rank] > peers > 0 or (own[rank] > 0 and peers == 0):
        return excess_scale(g, rank, phase, own[rank] - peers)
    return np.ones(len(g.start))


def excess_scale(g: StepGraph, rank: int, phase: str | None, excess_us: float) -> np.ndarray:
    """Node scales that take ``excess_us`` off ``rank``'s own time in ``phase`` (all its work when None)."""
    own = _own_time(g, phase).get(rank, 0.0)
    scale = np.ones(len(g.start))
    if own > 0 and excess_us > 0:
        scale[_in(g, rank, phase)] = max(own - excess_us, 0.0) / own
    return scale


def _in(g: StepGraph, rank: int | None, phase: str | None) -> np.ndarray:
    mask = np.ones(len(g.start), dtype=bool) if rank is None else g.rank == rank
    return mask & ((g.phase == phase) if phase else (g.op != "(step end)"))


def _own_time(g: StepGraph, phase: str | None) -> dict[int, float]:
    """Each rank's time in the phase: its segments and the gaps before them that were not waits."""
    mask = _in(g, None, phase)
    own = (g.end - g.start) + np.where(g.release >= 0, 0.0, g.lag)
    return pd.Series(own[mask]).groupby(g.rank[mask]).sum().to_dict()


def saving_us(g: StepGraph, scale: np.ndarray) -> float:
    """How much earlier the step ends when durations are scaled so."""
    return replay(g).finish - replay(g, scale).finish


@dataclass
class RunPaths:
    """The critical paths of a run's profiled steps, with their graphs for what-ifs."""

    graphs: list[StepGraph]
    paths: list[StepPath]


def analyze(tables: Tables) -> RunPaths:
    """The critical path of every profiled step."""
    built = graphs(tables)
    return RunPaths(built, [critical_path(g) for g in built])

