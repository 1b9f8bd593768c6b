"""The time of a collective: its bus-bandwidth factor and the seconds it takes at a bus bandwidth.

With B the bus bandwidth of the slowest link the algorithm crosses and S the buffer size (nccl-tests'
size: the gathered output of an all-gather, the input otherwise): all-reduce 2·S/B·(n-1)/n;
all-gather, reduce-scatter and all-to-all S/B·(n-1)/n; broadcast, reduce and point-to-point S/B.
These are nccl-tests' bus-bandwidth factors: the bytes each rank must move, which a ring and NCCL's
double binary tree both reach (a tree all-reduce also moves 2·S·(n-1)/n per rank). The two differ
in latency (n-1 steps against log n), which is not modeled: small messages take longer than this.
"""

from __future__ import annotations

ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL = "all_reduce", "all_gather", "reduce_scatter", "all_to_all"
SEND, RECV = "send", "recv"
# Ops whose nccl-tests size is the whole (gathered) buffer where a trace records one rank's part of it
# (count x element size): that times the ranks.
WHOLE_BUFFER_OPS = frozenset({ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL})


def bus_factor(op: str, n: int) -> float:
    """Bytes each of ``n`` ranks moves per byte of the buffer (nccl-tests' busBw / algBw); 1 for an op
    that moves the buffer once (broadcast, reduce, point-to-point)."""
    if op == ALL_REDUCE:
        return 2 * (n - 1) / n
    if op in (ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL):
        return (n - 1) / n
    return 1.0


def bus_bytes(op: str, size: float, n: int) -> float:
    """The nccl-tests buffer size S of a call that passes ``size`` bytes in on each of ``n`` ranks: the
    gathered output for an all-gather, else the input."""
    return size * n if op == ALL_GATHER else size


def ring_time(op: str, size: float, n: int, bandwidth: float) -> float:
    """Seconds ``op`` over ``n`` ranks takes to move an S = ``size`` byte buffer at bus bandwidth ``bandwidth``."""
    if n <= 1 and op not in (SEND, RECV):
        return 0.0
    return bus_factor(op, n) * size / bandwidth
