"""The cross-rank critical path of each profiled step: what the step's time was spent on, and what-ifs.

Per step, a dependency graph over every rank: each rank's work segments in order (work_segments.py;
the gap before a segment is its own lag), each matched collective's rows (a rank arrives when it
starts it, from the segment that issued it; its end on every rank depends on the last rank's
arrival; a send and its recv are such a pair), and the edge from a collective to the segment its
rank resumes with when it sat idle through the last arrival (it waited for it). Replaying the graph with the measured durations gives back
the measured times; the binding predecessor of each node (the one that made it start when it did)
traced back from the rank that finished the step last is the critical path. A what-if replays the
graph with some durations shortened, and the step's new end is the saving.

Time order is a topological order of the graph, so a replay is one pass over the step's nodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.judge.quantities import Measure, Quantity
from diagtrain.profiler.analyzer.judge.findings import Finding
from diagtrain.profiler.analyzer.judge.verdict import REPLAY, Assessed, Assessment
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.util.settings import section, setting, values


@section("critical_path")
class CriticalPath:
    """When a rank that resumes after a collective was waiting for it, and how much of the path the report shows."""

    release_window_us: float = setting(5_000.0, "a rank idle through a collective's last arrival that resumes "
                                       "by this after its end on it was waiting for it: a blocked thread wakes "
                                       "a few ms late on a busy host")
    # On a host with more ranks than cores a thread blocked for 100 ms can wake 6 ms late, yet a wake-up
    # this small beside its wait is no work of its own. A rank that sleeps on well past a collective it
    # hardly waited for keeps its own time.
    release_share: float = setting(0.25, "... or by this share of the time it sat idle before that end")
    # gloo runs a group's collectives one after another on its worker thread (NCCL on the group's stream):
    # DDP's second bucket starts when the first ends, whenever its gradients were ready.
    queue_gap_us: float = setting(500.0, "a collective that starts on its rank within this after the previous "
                                  "one of its group ended there waited for it in the group's queue")
    top_pairs: int = setting(5, "(rank, operator) pairs reported per run as carrying most critical time")
    # The sub-ms stretches between phases would drown the few hops that matter.
    min_hop_share: float = setting(0.01, "hops shorter than this share of the step are left out of the "
                                   "one-line path (they stay in the totals)")
    # A step of hundreds of collectives made a 30 KB "line" (every collective was shown, each on its
    # own rank a fraction of a millisecond).
    max_line_hops: int = setting(12, "the one-line path shows at most this many hops, the longest")


P2P_OPS = ("send", "recv")
DATA_PHASE = "data"  # the phase whose time (work or idle) is data loading
CATEGORIES = ("compute", "transfer", "waiting", "data", "host_overhead")
# Codes (not thresholds) of what a node's start is bound by: its step's start, the rank's previous
# node, or the collective that released it; plain ints, as the replay's loop and its int8 array want.
_START, _PREV, _RELEASE = range(3)


@dataclass
class StepGraph:
    """One step's nodes (rank work segments, one closing node per rank) and collective rows."""

    step: int
    rank: np.ndarray
    start: np.ndarray  # µs
    end: np.ndarray
    busy: np.ndarray
    phase: np.ndarray
    gap_phase: np.ndarray
    op: np.ndarray
    prev: np.ndarray  # previous node of the rank, -1 for its first
    lag: np.ndarray  # own gap before the node (from the previous node, its step's start, or its release)
    release: np.ndarray  # collective row that released the node, -1
    window_start: dict[int, float]
    c_rank: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=int))
    c_arrival: np.ndarray = field(default_factory=lambda: np.empty(0))
    c_end: np.ndarray = field(default_factory=lambda: np.empty(0))
    c_transfer: np.ndarray = field(default_factory=lambda: np.empty(0))
    c_key: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=int))  # the same collective on every rank
    c_issuer: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=int))  # node that issued it, -1
    c_label: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object))
    c_done: np.ndarray = field(default_factory=lambda: np.empty(0))  # when it ended on its first rank
    c_queued: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=int))  # the row it queued behind, -1


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


def graphs(tables: Tables) -> list[StepGraph]:
    """One graph per profiled step that has work segments."""
    segs, steps = tables.segments, tables.steps
    if "trace_start" not in steps and "start" in steps:  # a folder of traces: every step is a traced one
        steps = steps.rename(columns={"start": "trace_start", "end": "trace_end"})
    if segs.empty or "trace_start" not in steps:
        return []
    windows = steps.loc[steps["trace_start"].notna(), ["rank", "step", "trace_start", "trace_end"]]
    coll = tables.collectives
    s = CriticalPath.active()
    found = []
    for step, rows in segs.groupby("step", sort=True):
        win = windows[windows["step"] == step]
        if win.empty:
            continue
        found.append(build_step(int(step), rows, win, coll, s))
    return found


def build_step(step: int, segments: pd.DataFrame, windows: pd.DataFrame, collectives: pd.DataFrame,
               s: CriticalPath | None = None) -> StepGraph:
    """The graph of one step from its segments, its ranks' step windows (Unix s) and the collectives
    (``s``: the settings in force when not given)."""
    s = s or CriticalPath.active()
    span = {int(r): (b * 1e6, e * 1e6) for r, b, e in zip(windows["rank"], windows["trace_start"], windows["trace_end"])}
    segments = segments[segments["rank"].isin(span)]
    closing = pd.DataFrame({"rank": list(span), "start_us": [e for _, e in span.values()],
                            "end_us": [e for _, e in span.values()], "busy_us": 0.0, "phase": "", "gap_phase": "",
                            "op": "(step end)"})
    nodes = pd.concat([segments, closing], ignore_index=True).sort_values(["rank", "start_us", "end_us"],
                                                                          ignore_index=True)
    rank = nodes["rank"].to_numpy(dtype=int)
    start, end = nodes["start_us"].to_numpy(dtype=float), nodes["end_us"].to_numpy(dtype=float)
    first = np.concatenate([[True], rank[1:] != rank[:-1]])
    prev = np.where(first, -1, np.arange(len(nodes)) - 1)
    win_start = np.array([span[r][0] for r in rank])
    prev_end = np.where(first, win_start, end[np.clip(prev, 0, None)])
    g = StepGraph(step=step, rank=rank, start=start, end=end, busy=nodes["busy_us"].to_numpy(dtype=float),
                  phase=nodes["phase"].to_numpy(dtype=object), gap_phase=nodes["gap_phase"].to_numpy(dtype=object),
                  op=nodes["op"].to_numpy(dtype=object), prev=prev, lag=np.maximum(start - prev_end, 0.0),
                  release=np.full(len(nodes), -1), window_start={r: b for r, (b, _) in span.items()})
    if collectives.empty:
        return g
    c = collectives.iloc[np.flatnonzero(_in_windows(collectives["rank"].to_numpy(), collectives["ts"].to_numpy(),
                                                    span))].sort_values(["rank", "ts"])
    if c.empty:
        return g
    g.c_rank = c["rank"].to_numpy(dtype=int)
    g.c_arrival = c["ts"].to_numpy(dtype=float)
    g.c_end = g.c_arrival + c["dur"].to_numpy(dtype=float)
    g.c_key = _sync_keys(c, g.c_arrival, g.c_end)
    dur = g.c_end - g.c_arrival
    g.c_transfer = pd.Series(dur).groupby(g.c_key).transform("min").to_numpy()  # as collectives.match
    g.c_label = _labels(c, g.c_key)
    # Done when it ends on its first rank: a rank's own end can be recorded ms later (its thread
    # descheduled) than the moment the waiting rank is woken.
    g.c_done = pd.Series(g.c_end).groupby(g.c_key).transform("min").to_numpy()
    last_arrival = pd.Series(g.c_arrival).groupby(g.c_key).transform("max").to_numpy()
    g.c_issuer = np.full(len(c), -1)
    # Nodes and rows are sorted by rank: each rank's are one range (a search of all of them per rank
    # was ranks x rows).
    ranks = np.unique(g.c_rank)
    nodes_from, nodes_to = np.searchsorted(rank, ranks), np.searchsorted(rank, ranks, side="right")
    rows_from, rows_to = np.searchsorted(g.c_rank, ranks), np.searchsorted(g.c_rank, ranks, side="right")
    for a, b, c_a, c_b in zip(nodes_from.tolist(), nodes_to.tolist(), rows_from.tolist(), rows_to.tolist()):
        on_rank, mine = np.arange(a, b), np.arange(c_a, c_b)
        # Issued by the last segment that started by its arrival.
        at = np.searchsorted(start[on_rank], g.c_arrival[mine], side="right") - 1
        g.c_issuer[mine] = np.where(at >= 0, on_rank[np.clip(at, 0, None)], -1)
        # A node resumed by the collective of its rank whose last rank arrived while it sat idle
        # (the latest such), when it started soon after the collective's end on its own rank
        # (release_window_us, release_share): the recorded ends come late (the op's end is recorded
        # after the waiting thread is woken), so it may start before them, never before the last arrival.
        by_last = mine[np.argsort(last_arrival[mine], kind="stable")]
        j = np.clip(np.searchsorted(last_arrival[by_last], start[on_rank], side="left") - 1, 0, None)
        row = by_last[j]
        idle = g.c_end[row] - prev_end[on_rank]
        ok = (last_arrival[row] < start[on_rank]) & (last_arrival[row] >= prev_end[on_rank]) & \
             (start[on_rank] - g.c_end[row] <= np.maximum(s.release_window_us, s.release_share * idle))
        released = on_rank[ok]
        g.release[released] = row[ok]
        g.lag[released] = start[released] - g.c_done[g.release[released]]
    g.c_queued = _queued(c["pg"].astype(str).to_numpy(), g, end, s)
    return g


def _in_windows(rank: np.ndarray, ts: np.ndarray, span: dict[int, tuple[float, float]]) -> np.ndarray:
    """Which rows (``rank``, ``ts``) start inside their rank's window of ``span``, by sorted rank, not a
    lookup per row: the collectives hold a row per collective and rank (337k at 1,024 ranks x 20k events)."""
    if not span:
        return np.zeros(len(rank), dtype=bool)
    ranks = np.array(sorted(span))
    lo, hi = (np.array([span[r][i] for r in ranks.tolist()], dtype=float) for i in (0, 1))
    at = np.clip(np.searchsorted(ranks, rank), 0, len(ranks) - 1)
    return (ranks[at] == rank) & (ts >= lo[at]) & (ts <= hi[at])


def _queued(pg: np.ndarray, g: StepGraph, node_end: np.ndarray, s: CriticalPath) -> np.ndarray:
    """Per collective row, the row of its rank and group it waited behind (it started as that one ended,
    after its issuing segment had ended: a worker was free only then), else -1. Rows are in (rank,
    arrival) order; gloo runs two workers per group, so the one it waited for need not be the one before."""
    queued = np.full(len(g.c_rank), -1)
    earlier: dict[tuple[int, str], list[int]] = {}
    for row, (r, group) in enumerate(zip(g.c_rank.tolist(), pg.tolist())):
        at = g.c_arrival[row]
        # Arrivals only grow: a row that ended longer ago than the gap can hold no later one either.
        rows = earlier[(r, group)] = [b for b in earlier.get((r, group), []) if at - g.c_end[b] <= s.queue_gap_us]
        issued = node_end[g.c_issuer[row]] if g.c_issuer[row] >= 0 else -math.inf
        ended = [b for b in rows if 0.0 <= at - g.c_end[b] and issued < g.c_end[b]]
        if ended:
            queued[row] = max(ended, key=lambda b: g.c_end[b])
        rows.append(row)
    return queued


def _sync_keys(c: pd.DataFrame, arrival: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Which rows are the same collective on different ranks: matched by group and sequence; a row
    the flight recorder could not name (group ``?``) joins the collective of its op that lacks its
    rank and whose times it fits, a send its recv (_p2p_pairs), the others their like on other ranks
    in order. A real collective ends on no rank before its last rank arrives: rows that say
    otherwise were matched wrongly and get no edge across ranks."""
    key = pd.factorize(pd.MultiIndex.from_frame(c[["group", "op", "seq"]]))[0]
    unnamed = (c["pg"].astype(str) == "?").to_numpy().copy()
    key[unnamed] = -1  # named below: a named collective's row, a send/recv pair, or by their order
    ranks, ops = c["rank"].to_numpy(), c["op"].to_numpy()
    members = c["group_ranks"].to_numpy()
    for i in np.flatnonzero(unnamed):
        best, best_gap = None, np.inf
        for k in np.unique(key[~unnamed & (ops == ops[i])]):
            rows = np.flatnonzero(key == k)
            if ranks[i] in ranks[rows] or ranks[i] not in tuple(members[rows[0]]):
                continue
            if max(arrival[rows].max(), arrival[i]) > min(end[rows].min(), end[i]):
                continue
            gap = abs(float(np.median(end[rows])) - end[i])
            if gap < best_gap:
                best, best_gap = k, gap
        if best is not None:
            key[i] = best
            unnamed[i] = False
    p2p = unnamed & np.isin(ops, P2P_OPS)
    key[p2p] = 3 * len(key) + _p2p_pairs(ranks[p2p], ops[p2p])
    unnamed &= ~p2p
    # The rest pair up across ranks in order: the k-th unnamed op of a kind on each rank in this step.
    rest = c[unnamed]
    nth = rest.groupby(["rank", "op"]).cumcount().to_numpy()
    pairs = pd.factorize(pd.MultiIndex.from_arrays([rest["op"].to_numpy(), nth]))[0] if len(rest) else []
    key[unnamed] = [2 * len(key) + p for p in pairs]
    frame = pd.DataFrame({"key": key, "a": arrival, "f": end}).groupby("key")
    impossible = (frame["a"].transform("max") > frame["f"].transform("min") + 1.0).to_numpy()
    return np.where(impossible, 5 * len(key) + np.arange(len(key)), key)


def _p2p_pairs(ranks: np.ndarray, ops: np.ndarray) -> np.ndarray:
    """Send → recv pairs between the two ranks of a two-stage pipeline: the k-th send of one rank is
    the k-th recv of the other (the traces name no peer: with more ranks each row stays alone)."""
    if len(np.unique(ranks)) != 2:
        return len(ranks) + np.arange(len(ranks))
    a, b = np.unique(ranks)
    sender = np.where(ops == "send", ranks, np.where(ranks == a, b, a))
    nth = pd.DataFrame({"r": ranks, "op": ops}).groupby(["r", "op"]).cumcount().to_numpy()
    return pd.factorize(pd.MultiIndex.from_arrays([sender, nth]))[0]


def _labels(c: pd.DataFrame, key: np.ndarray) -> np.ndarray:
    """``op(group)`` of each row, the group named as the matched rows name it."""
    desc = c["pg_desc"].where(c["pg_desc"].notna() & (c["pg_desc"] != "undefined") & (c["pg"].astype(str) != "?"))
    desc = desc.fillna(c["pg"].where(c["pg"].astype(str) != "?")).astype(object)
    named = pd.Series(desc.to_numpy()).groupby(key).transform("first")
    named = named.fillna(pd.Series(np.where(np.isin(c["op"].to_numpy(), P2P_OPS), "p2p", "?"))).fillna("?")
    return (c["op"].astype(str).to_numpy() + "(" + named.astype(str).to_numpy() + ")").astype(object)


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

    def text(self) -> str:
        """``rank 3 forward 196.0 ms`` or ``all_reduce(mesh_dp) waits 149.0 ms on rank 3``."""
        if self.kind == "work":
            return f"rank {self.rank} {self.label} {self.us / 1e3:.1f} ms"
        if self.released_rank is not None and self.released_rank != self.rank:
            return (f"{self.label} waits {self.waited_us / 1e3:.1f} ms on rank {self.rank} "
                    f"(transfer {self.categories.get('transfer', 0.0) / 1e3:.1f} ms)")
        return f"rank {self.rank} {self.label} {self.us / 1e3:.1f} ms"


@dataclass
class StepPath:
    """A step's critical path: hops in time order, its length and what it was spent on."""

    step: int
    length_us: float
    hops: list[Hop]
    totals: dict[str, float]  # category -> µs
    waiting_on: dict[int, float]  # rank waited for -> µs on the path

    def line(self, s: CriticalPath | None = None) -> str:
        """One line for the report, hops joined by arrows: a rank's own collectives under min_hop_share
        of the step are left out, and its work on both sides of one reads as one stretch; then the
        stretches over min_hop_share and the collectives that take the path to another rank, past
        max_line_hops the longest of them, the rest counted (``s``: the settings in force when not given)."""
        s = s or CriticalPath.active()
        short = s.min_hop_share * self.length_us
        stretches: list[Hop] = []
        for h in self.hops:
            if h.kind == "collective" and h.us < short and h.released_rank in (None, h.rank):
                continue  # a rank's own short collective; one that takes the path to another rank stays
            last = stretches[-1] if stretches else None
            if last and h.kind == last.kind == "work" and (h.rank, h.label) == (last.rank, last.label):
                stretches[-1] = replace(last, us=last.us + h.us)
            else:
                stretches.append(h)
        shown = [i for i, h in enumerate(stretches) if h.us >= short or h.kind == "collective"]
        left = 0
        if len(shown) > s.max_line_hops:
            left = len(stretches) - s.max_line_hops
            shown = sorted(sorted(shown, key=lambda i: -stretches[i].us)[:s.max_line_hops])
        text = " → ".join(stretches[i].text() for i in shown)
        return f"{text} (and {left:,} shorter hops)" if left else text


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


# --- the run ------------------------------------------------------------------------------------

@dataclass
class RunPaths:
    """The critical paths of a run's profiled steps, with their graphs for what-ifs."""

    graphs: list[StepGraph]
    paths: list[StepPath]

    def section(self) -> dict[str, Any]:
        """report.json's ``critical_path``: the median and the worst step's hops, the top pairs."""
        if not self.paths:
            return {"available": False, "reason": "no profiled step with work segments (profile some steps)"}
        s = CriticalPath.active()
        by_length = sorted(self.paths, key=lambda p: p.length_us)
        return {"available": True, "steps": [p.step for p in self.paths],
                "median_step": _step_json(by_length[(len(by_length) - 1) // 2], s),
                "worst_step": _step_json(by_length[-1], s), "top": self.top(s)}

    def top(self, s: CriticalPath | None = None) -> list[dict[str, Any]]:
        """The ``top_pairs`` (rank, operator) pairs carrying most critical time over the profiled steps
        (``s``: the settings in force when not given)."""
        s = s or CriticalPath.active()
        carried: dict[tuple[int, str], float] = {}
        for p in self.paths:
            for h in p.hops:
                for op, us in h.ops.items():
                    carried[(h.rank, op)] = carried.get((h.rank, op), 0.0) + us
        total = sum(p.length_us for p in self.paths) or 1.0
        best = sorted(carried.items(), key=lambda kv: -kv[1])[:s.top_pairs]
        return [{"rank": r, "op": op, "ms": us / 1e3, "share": us / total} for (r, op), us in best]


def _step_json(p: StepPath, s: CriticalPath) -> dict[str, Any]:
    return {"step": p.step, "length_ms": p.length_us / 1e3, "line": p.line(s),
            "attribution_ms": {c: v / 1e3 for c, v in p.totals.items()},
            "waiting_on_ms": {str(r): v / 1e3 for r, v in p.waiting_on.items()},
            "hops": [{"rank": h.rank, "kind": h.kind, "label": h.label, "ms": h.us / 1e3, "text": h.text(),
                      "start": h.start_us / 1e6, "end": h.end_us / 1e6,
                      "categories_ms": {c: v / 1e3 for c, v in h.categories.items()},
                      **({"waited_ms": h.waited_us / 1e3, "released_rank": h.released_rank}
                         if h.kind == "collective" else {}),
                      **({"ops_ms": {o: v / 1e3 for o, v in sorted(h.ops.items(), key=lambda kv: -kv[1])[:3]}}
                         if h.ops else {})}
                     for h in p.hops]}


def analyze(tables: Tables) -> RunPaths:
    """The critical path of every profiled step."""
    built = graphs(tables)
    return RunPaths(built, [critical_path(g) for g in built])


def with_impacts(findings: list[Finding], run: RunPaths, ledger: pd.DataFrame | None = None) -> Assessed:
    """A straggler's ``impact_ms`` from the graph where it exists: the mean saving per profiled step of
    bringing the rank's slow part to its peers' median (the detector's estimate stays elsewhere). One the
    ledger priced over the whole run keeps that price; the replay of taking the ledger's excess off the
    rank in each profiled step is recorded beside it (``critical_path_ms``): whether that excess reaches
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
        if f.metrics.get("impact_source") == "ledger":  # priced over every step: the replay is its check
            excess = _ledger_excess(ledger, rank)
            replay = float(np.mean([saving_us(g, excess_scale(g, rank, phase, excess.get(g.step, 0.0))) for g in steps]))
            out.add(i, Assessment(REPLAY, settings=used, metrics={
                "critical_path_ms": replay / 1e3, "critical_path_wait_coverage": wait_coverage(steps, ledger)}))
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
