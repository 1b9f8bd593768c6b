"""Put every host's timestamps on one clock: the clock of the host that ran the lowest rank.

Each host stamps what it records with its own wall clock, right within a host but off by the
hosts' skew across hosts. One offset per host, from the best source there is:

- traces: collectives end at nearly the same moment on every rank of a group, so the median gap
  between a host's collective end times and the reference rank's is the skew (µs-exact, but only
  where steps were profiled and enough collectives match);
- the handshake the wrappers make while they run (``hosts/<h>/clock.json``, see
  collect/clock_sync.py): within half a round trip through the run directory, about a
  millisecond, with or without profiled steps. Measurements chain: a host measured only against a
  third one is placed through it.

The same offset then moves everything the host recorded: steps, traces, their collectives and work segments,
telemetry, log lines, flight-recorder entries, exit records, and the host's own record.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from diagtrain.profiler.analyzer.per_rank.collectives import last_to_arrive
from diagtrain.profiler.util.settings import section, setting

if TYPE_CHECKING:
    from diagtrain.profiler.analyzer.run.tables import Tables



@section("clocks")
class Clocks:
    """When ranks' clocks are taken to disagree, and when a trace's evidence of it is enough."""

    min_shift_us: float = setting(500.0, "below this, collective end-time gaps are jitter, not clock skew")
    min_matched: int = setting(3, "collectives needed before a host's offset is trusted")
    skew_ms: float = setting(50.0, "ProfilerStep#N starting this far apart on different ranks: their clocks disagree "
                             "(the trace-health check)")


UNNAMED_HOST = "(no host name)"  # where ranks whose traces name no host ran


@dataclass
class HostClock:
    """How one host's times are put on the reference clock."""

    host: str
    offset_s: float  # added to every time this host recorded
    source: str  # reference | traces | handshake | none
    uncertainty_s: float | None = None  # the handshake's bound on the offset, when there is one
    handshake_s: float | None = None  # what the handshake alone says
    traces_s: float | None = None  # what the collectives' end times alone say
    via: list[str] | None = None  # hosts the handshake chained through


def host_clocks(collectives: pd.DataFrame, rank_hosts: dict[int, str | None],
                measurements: dict[str, list[dict[str, Any]]]) -> dict[str, HostClock]:
    """One HostClock per host that ran ranks; empty when all ranks ran on one host.

    The handshake bounds a host's offset for certain (the true value lies within half its best
    round trip); the collectives' end times pick the value inside that bound. On GPU they are
    exact to microseconds; on CPU, gloo's ring lets ranks finish a collective in turn, a
    millisecond or two apart, so they are not trusted beyond the bound.
    """
    # Traces may not name their host: those ranks share one clock, unlike any named host's.
    rank_hosts = {r: h or UNNAMED_HOST for r, h in rank_hosts.items()}
    hosts = set(rank_hosts.values())
    if len(hosts) < 2:
        return {}
    reference = rank_hosts[min(rank_hosts)]
    traced = trace_offsets(collectives, rank_hosts)
    # Relative to the reference host (the lowest traced rank may run elsewhere); else unusable.
    traced = {h: s - traced[reference] for h, s in traced.items()} if reference in traced else {}
    handshake = handshake_offsets(measurements, reference)
    clocks = {host: HostClock(host, 0.0, "reference") for host in hosts if host == reference}
    for host in sorted(hosts - {reference}):
        said, seen = handshake.get(host), traced.get(host)
        offset, uncertainty, via = said if said is not None else (None, None, None)
        if seen is not None:
            value = seen if said is None else min(max(seen, offset - uncertainty), offset + uncertainty)
            jitter = abs(value) * 1e6 < Clocks.active().min_shift_us and (said is None or abs(offset) <= uncertainty)
            clocks[host] = HostClock(host, 0.0 if jitter else value, "traces", uncertainty, offset, seen, via)
        elif said is not None:
            clocks[host] = HostClock(host, offset if abs(offset) > uncertainty else 0.0, "handshake", uncertainty,
                                     offset, None, via)
        else:
            clocks[host] = HostClock(host, 0.0, "none")
    return clocks


def trace_offsets(collectives: pd.DataFrame, rank_hosts: dict[int, str | None]) -> dict[str, float]:
    """Per host: seconds to add to reach the lowest traced rank's clock (0 on its host), from collective end times."""
    if collectives.empty or "group" not in collectives:
        return {}
    shared = collectives[collectives["ranks_seen"] > 1].assign(end=lambda c: c["ts"] + c["dur"])
    if shared.empty:
        return {}
    # The lowest rank's clock is the reference; compare with it in the collectives it shares.
    reference = int(shared["rank"].min())
    key = ["group", "op", "seq"]
    ref_ends = shared[shared["rank"] == reference].set_index(key)["end"]
    others = shared[shared["rank"] != reference].join(ref_ends.rename("ref_end"), on=key, how="inner")
    per_rank = (others["end"] - others["ref_end"]).groupby(others["rank"]).agg(["median", "size"])
    per_host: dict[str, list[float]] = {}
    for rank, row in per_rank.iterrows():
        host = rank_hosts.get(int(rank))
        if host and host != rank_hosts.get(reference) and row["size"] >= Clocks.active().min_matched:
            per_host.setdefault(host, []).append(-float(row["median"]) / 1e6)
    found = {host: float(pd.Series(values).median()) for host, values in per_host.items()}
    return {rank_hosts[reference]: 0.0, **found} if rank_hosts.get(reference) else found


def handshake_offsets(measurements: dict[str, list[dict[str, Any]]],
                      reference: str) -> dict[str, tuple[float, float, list[str]]]:
    """Per host: (seconds to add, uncertainty, hosts chained through) from the wrappers' handshakes.

    Each measurement is one host's clock minus a peer's; the path to the reference with the
    smallest summed uncertainty wins.
    """
    edges: dict[str, list[tuple[str, float, float]]] = {}
    for host, found in measurements.items():
        for m in found:
            try:
                peer, offset, uncertainty = str(m["peer"]), float(m["offset_s"]), float(m["uncertainty_s"])
            except (KeyError, TypeError, ValueError):
                continue
            edges.setdefault(host, []).append((peer, -offset, uncertainty))  # peer - host
            edges.setdefault(peer, []).append((host, offset, uncertainty))  # host - peer
    # Dijkstra on uncertainty; ahead[h] = clock_h - clock_reference.
    best: dict[str, tuple[float, float, list[str]]] = {}
    queue = [(0.0, reference, 0.0, [])]
    while queue:
        uncertainty, host, ahead, path = heapq.heappop(queue)
        if host in best:
            continue
        best[host] = (-ahead, uncertainty, path)
        for peer, peer_minus_host, u in edges.get(host, []):
            if peer not in best:
                heapq.heappush(queue, (uncertainty + u, peer, ahead + peer_minus_host, path + [host]))
    best.pop(reference, None)
    return {host: (offset, u, path[1:]) for host, (offset, u, path) in best.items()}


def align(tables: Tables) -> None:
    """Move every time the tables hold by its host's offset (in place); sets ``clock_shifts_us``."""
    by_host = {h: c.offset_s for h, c in tables.host_clocks.items() if c.offset_s}
    by_rank = {r: by_host[h] for r, h in tables.rank_hosts.items() if h in by_host}
    tables.clock_shifts_us = {r: s * 1e6 for r, s in by_rank.items()}
    if not by_host:
        return
    if not tables.steps.empty:
        shift = tables.steps["rank"].map(by_rank).fillna(0.0).astype(float)
        for column in ("start", "end", "trace_start", "trace_end"):
            if column in tables.steps:
                tables.steps[column] = tables.steps[column] + shift
    if not tables.collectives.empty:
        shift_us = tables.collectives["rank"].map(by_rank).fillna(0.0) * 1e6
        for column in ("ts", "issued_ts", "arrived_ts"):
            if column in tables.collectives:
                tables.collectives[column] = tables.collectives[column] + shift_us
    if not tables.segments.empty:
        shift_us = tables.segments["rank"].map(by_rank).fillna(0.0) * 1e6
        tables.segments["start_us"] = tables.segments["start_us"] + shift_us
        tables.segments["end_us"] = tables.segments["end_us"] + shift_us
    for rank, shift in by_rank.items():
        if tables.exits.get(rank) and tables.exits[rank].get("time") is not None:
            tables.exits[rank] = {**tables.exits[rank], "time": tables.exits[rank]["time"] + shift}
        for event in [*tables.log_events.get(rank, []), *getattr(tables.nccl_logs.get(rank), "warnings", [])]:
            if event.time is not None:
                event.time += shift
    for entry in tables.flight_records:
        entry.created_ns += int(by_rank.get(entry.rank, 0.0) * 1e9)
    for record in tables.hosts:
        _shift_host_record(record, by_host.get(record.get("name"), 0.0))
    if tables.telemetry is not None and "host" in tables.telemetry:
        shifts = tables.telemetry["host"].map(by_host).fillna(0.0)
        time = tables.telemetry["time"]
        tables.telemetry["time"] = (time + pd.to_timedelta(shifts, unit="s")) if time.dtype.kind == "M" else time + shifts
    if not tables.collectives.empty:
        c = tables.collectives
        c["last_rank"] = last_to_arrive(c, c["ranks_seen"] > 1) if "ranks_seen" in c else c["last_rank"]


def _shift_host_record(record: dict[str, Any], shift: float) -> None:
    if not shift:
        return
    for key in ("started_at", "ended_at", "last_seen"):
        if isinstance(record.get(key), (int, float)):
            record[key] += shift
    for key in ("interrupted", "heartbeat"):
        inner = record.get(key)
        if isinstance(inner, dict) and isinstance(inner.get("time"), (int, float)):
            record[key] = {**inner, "time": inner["time"] + shift}
