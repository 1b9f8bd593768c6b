"""One profiled step as a dependency graph over every rank: the structure the critical path is traced in.

Per step: each rank's work segments in order (per_rank/work_segments.py; the gap before a segment is its own
lag), each matched collective's rows (a rank arrives when it starts it, from the segment that issued it; its
end on every rank depends on the last rank's arrival; a send and its recv are such a pair), and the edge from
a collective to the segment its rank resumes with when it sat idle through the last arrival (it waited for it).
run/replay.py replays it; judge/assessments/critical_path.py weighs findings by its what-ifs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.util.settings import section, setting


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
    # How report.json shows the paths (report/critical_path_section.py): one section of settings for the path.
    top_pairs: int = setting(5, "(rank, operator) pairs reported per run as carrying most critical time")
    # The sub-ms stretches between phases would drown the few hops that matter.
    min_hop_share: float = setting(0.01, "hops shorter than this share of the step are left out of the "
                                   "one-line path (they stay in the totals)")
    # A step of hundreds of collectives made a 30 KB "line" (every collective was shown, each on its
    # own rank a fraction of a millisecond).
    max_line_hops: int = setting(12, "the one-line path shows at most this many hops, the longest")


P2P_OPS = ("send", "recv")


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
