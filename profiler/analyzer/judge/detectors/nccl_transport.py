"""nccl_transport: NCCL using a slower transport than the hardware should give it.

Read from each rank's NCCL_DEBUG=INFO log: connections over NET/Socket (TCP: no InfiniBand or
RoCE found, or NCCL_IB_DISABLE set), GPUs on the same host talking over the network instead of
P2P or shared memory (P2P disabled, or GPUs in different IOMMU groups), and NCCL's own warnings.
"""

from __future__ import annotations

from collections import defaultdict

from diagtrain.profiler.analyzer.judge.findings import Candidate
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.util.settings import section, setting


@section("nccl_transport")
class NcclTransport:
    """How much of NCCL's log a transport finding quotes."""

    max_evidence: int = setting(10, "log lines kept as evidence per finding (two per rank at most)")


SETTINGS = (NcclTransport,)


def detect(tables: Tables) -> list[Candidate]:
    """Socket transports, network between GPUs of one host, and NCCL's warnings, from the NCCL logs."""
    s = NcclTransport.active()
    logs = tables.nccl_logs
    if not logs:
        return []
    return [f for f in (_sockets(tables, s), _same_host_network(tables, s), _warnings(tables, s)) if f]


def _sockets(tables: Tables, s: NcclTransport) -> Candidate | None:
    edges = {r: [e for e in log.transports if e.family == "NET/Socket"] for r, log in tables.nccl_logs.items()}
    ranks = sorted(r for r, found in edges.items() if found)
    if not ranks:
        return None
    return Candidate(
        kind="nccl_transport", ranks=ranks, facts={"case": "sockets"},
        metrics={"observed_transport": "NET/Socket", "expected_transport": "NET/IB or P2P/SHM",
                 "socket_edges": sum(len(v) for v in edges.values())},
        evidence=[{"type": "nccl_log", "rank": r, "line": e.line_no, "via": e.via}
                  for r in ranks for e in edges[r][:2]][:s.max_evidence],
    )


def _same_host_network(tables: Tables, s: NcclTransport) -> Candidate | None:
    hosts = tables.rank_hosts
    crossing = defaultdict(list)
    for rank, log in tables.nccl_logs.items():
        for e in log.transports:
            same_host = hosts.get(e.src_rank) is not None and hosts.get(e.src_rank) == hosts.get(e.dst_rank)
            if same_host and e.family.startswith("NET"):
                crossing[rank].append(e)
    if not crossing:
        return None
    ranks = sorted(crossing)
    return Candidate(
        kind="nccl_transport", ranks=ranks, facts={"case": "same_host_network"},
        metrics={"observed_transport": "NET on one host", "expected_transport": "P2P or SHM"},
        evidence=[{"type": "nccl_log", "rank": r, "line": e.line_no, "via": e.via}
                  for r in ranks for e in crossing[r][:2]][:s.max_evidence],
    )


def _warnings(tables: Tables, s: NcclTransport) -> Candidate | None:
    found = {r: log.warnings for r, log in tables.nccl_logs.items() if log.warnings}
    if not found:
        return None
    first_rank = min(found)
    return Candidate(
        kind="nccl_transport", ranks=sorted(found),
        facts={"case": "warnings", "warnings": sum(map(len, found.values())),
               "first": found[first_rank][0].text},
        metrics={"observed_warnings": sum(map(len, found.values())), "threshold": 1},
        evidence=[{"type": "nccl_log", "rank": r, "line": w.line_no, "text": w.text}
                  for r, ws in sorted(found.items()) for w in ws[:2]][:s.max_evidence],
    )
