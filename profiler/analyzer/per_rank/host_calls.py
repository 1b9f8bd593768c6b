"""CPU (gloo) collectives seen from both sides: the call on the rank's own thread and the work.

A gloo collective leaves two spans in a trace: the ``c10d::*`` call on the thread that issued it
(short: it only enqueues), and the ``gloo:*`` work on one of gloo's threads, which runs when that
thread gets to it and lasts until every rank of the group has taken part. The flight recorder
creates its entry (group, sequence number) inside the call. So the call says *when the rank asked*
and *what the rank was doing just before* (the gap on its thread: a delay right before the call),
the flight recorder says *which collective* it was, and the work says *when it ended*.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.per_rank.reading import Reading
from diagtrain.profiler.analyzer.read.dialects import STEP_ANNOTATION, name_matches
from diagtrain.profiler.util.intervals import merge

CALL_PREFIX = "c10d::"
# The pause before a call: the idle gaps between the last few stretches of ops before it (the
# call's own preparation is a few small ops), read from this many ops that ended before it.
GAPS_BEFORE_CALL = 4
RECENT_OPS = 64


def issuing_calls(work: pd.DataFrame, work_keys: list[list[str]], calls: pd.DataFrame, call_keys: list[str]) -> np.ndarray:
    """For each work span (``gloo:*``), the row position in ``calls`` that issued it, or -1.

    Work runs in the order it was issued, so each work span takes the earliest call not yet
    taken among those with one of its keys: the flight-recorder name when the call has an entry
    (a reduce-scatter call runs as ``gloo:all_reduce`` work), else the kind of op.
    """
    issued = np.full(len(work), -1, dtype=np.int64)
    max_queue_us = Reading.active().max_queue_us
    call_ts = calls["ts"].to_numpy()
    queues: dict[str, deque[int]] = {}
    for position in np.argsort(call_ts, kind="stable"):
        queues.setdefault(call_keys[position], deque()).append(int(position))
    for i, (keys, ts) in enumerate(zip(work_keys, work["ts"].to_numpy())):
        heads = []
        for queue in (queues.get(k) for k in keys):
            while queue and call_ts[queue[0]] < ts - max_queue_us:
                queue.popleft()  # issued long before: its work ran before the window opened
            if queue and call_ts[queue[0]] <= ts:
                heads.append(queue)
        if heads:
            issued[i] = min(heads, key=lambda q: call_ts[q[0]]).popleft()
    return issued


def flight_recorder_entries(calls: pd.DataFrame, entries: pd.DataFrame, call_kinds: np.ndarray,
                            entry_kinds: np.ndarray) -> np.ndarray:
    """For each call, the position in ``entries`` created while it ran (-1 when none was), of a kind that can be
    the call's: ``call_kinds`` and ``entry_kinds`` number the kinds of op (-1: any). A send that records no entry
    took the all-gather's created 0.2 ms after it (within the slack), and the all-gather was left unnamed."""
    found = np.full(len(calls), -1, dtype=np.int64)
    if entries.empty or calls.empty:
        return found
    created = entries["created_us"].to_numpy()
    order = np.argsort(created, kind="stable")
    created_sorted = created[order]
    used = np.zeros(len(entries), dtype=bool)
    slack_us = Reading.active().created_slack_us
    for i, (start, end) in enumerate(zip(calls["ts"].to_numpy(), calls["end"].to_numpy())):
        lo = np.searchsorted(created_sorted, start - slack_us, side="left")
        hi = np.searchsorted(created_sorted, end + slack_us, side="right")
        kind = call_kinds[i]
        for j in order[lo:hi]:
            if not used[j] and (kind < 0 or entry_kinds[j] < 0 or entry_kinds[j] == kind):
                found[i], used[j] = j, True
                break
    return found


def gaps_before(calls: pd.DataFrame, host: pd.DataFrame) -> np.ndarray:
    """µs each call's thread spent outside any recorded op just before the call (NaN: unknown).

    The idle gaps between the last few stretches of ops that ended before the call, summed: a
    pause before a collective is often followed by a small op of the call's own preparation (a
    comm hook sleeps, then divides the gradient, then calls all_reduce). Ops that enclose the call
    (still running when it starts) do not count: a hook runs inside the autograd op that fires it.
    Only the pause inside the innermost op enclosing the call counts (step annotations aside): a
    rank that sleeps before its module's forward starts its step late (its own time), although
    FSDP's all-gather is the first thing that forward does. ``host``: the host ops (tid, ts, end, name).
    """
    gaps = np.full(len(calls), np.nan)
    if calls.empty or "tid" not in host:
        return gaps
    ordinary = ~name_matches(host["name"], STEP_ANNOTATION)
    for tid, rows in calls.groupby("tid"):
        on_thread = (host["tid"] == tid).to_numpy()
        ops = host[on_thread]
        order = np.argsort(ops["end"].to_numpy(), kind="stable")
        ends, starts = ops["end"].to_numpy()[order], ops["ts"].to_numpy()[order]
        enclosers = _Enclosers(ops[ordinary[on_thread]])
        positions = calls.index.get_indexer(rows.index)
        for position, at, until in zip(positions, rows["ts"].to_numpy(), rows["end"].to_numpy()):
            done = np.searchsorted(ends, at, side="right")
            if done == 0:
                continue
            lo = max(0, done - RECENT_OPS)
            (busy_starts, busy_ends) = merge(starts[lo:done], ends[lo:done])
            since = enclosers.innermost(at, until, since=float(busy_starts[0]))
            idle = np.clip(np.append(busy_starts[1:], at) - np.maximum(busy_ends, since), 0.0, None)
            gaps[position] = float(idle[-GAPS_BEFORE_CALL:].sum())
    return gaps


class _Enclosers:
    """One thread's ops by start: which began before a call and outlast it."""

    def __init__(self, ops: pd.DataFrame) -> None:
        order = np.argsort(ops["ts"].to_numpy(), kind="stable")
        self.starts, self.ends = ops["ts"].to_numpy()[order], ops["end"].to_numpy()[order]

    def innermost(self, at: float, until: float, since: float) -> float:
        """The start of the latest op that began in [since, at) and ends after ``until``; -inf if none
        (one that began before ``since`` encloses all the gaps looked at)."""
        lo, hi = np.searchsorted(self.starts, [since, at], side="left")
        outlasting = np.flatnonzero(self.ends[lo:hi] >= until)
        return float(self.starts[lo + outlasting[-1]]) if len(outlasting) else -np.inf
