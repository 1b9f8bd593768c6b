"""slow_collective: collectives slower than they should be, and the rank or link responsible.

Two causes, told apart by the matched collectives: a rank that arrives last at nearly every
collective (its own path to the collective is slow: the others wait each time), and collectives
whose transfer time (the shortest duration across the group, i.e. after the last rank arrived)
gives a bus bandwidth far below the best seen for that op and size in the same run.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.detectors.base import MIN_LATENESS_MS, PERSISTENTLY_LATE, is_persistently_late, late_arrivals
from diagtrain.profiler.analyzer.findings import Finding
from diagtrain.profiler.analyzer.tables import Tables

BANDWIDTH_FRACTION = 0.25  # busbw under a quarter of the best for its op and size is slow
MIN_BYTES = 1 << 20  # small messages are latency-bound: bandwidth says nothing about them
MIN_SAMPLES = 4  # need several transfers of a size to know what "best" is


def detect(tables: Tables) -> list[Finding]:
    c = tables.collectives
    if c.empty or "group" not in c:
        return []
    profiled_steps = int(tables.steps.loc[tables.steps["profiled"], "step"].nunique()) if "profiled" in tables.steps else 0
    return _late_ranks(c, profiled_steps) + _low_bandwidth(c)


def _late_ranks(c: pd.DataFrame, profiled_steps: int) -> list[Finding]:
    findings = []
    late = late_arrivals(c)
    for row in late[is_persistently_late(late)].itertuples():
        mine = c[c["rank"] == row.rank]
        groups = sorted(set(mine["pg_desc"].fillna(mine["pg"]).astype(str)))
        waited = c[(c["rank"] != row.rank) & c.set_index(["group", "op", "seq"]).index.isin(
            mine.set_index(["group", "op", "seq"]).index)]
        per_collective = float(waited.groupby(["group", "op", "seq"])["wait_us"].max().median() / 1e3) if len(waited) else 0.0
        findings.append(Finding(
            kind="slow_collective", severity="warning", ranks=[int(row.rank)],
            explanation=(f"rank {row.rank} arrives last at {row.late_share:.0%} of its {row.collectives} collectives "
                         f"(groups {', '.join(groups)}), {row.lateness_ms:.1f} ms after the first rank on average; "
                         f"its peers wait about {per_collective:.1f} ms in each."),
            suggestion=(f"The delay sits right before rank {row.rank}'s collective calls: look for work or "
                        "synchronization it does before each collective (hooks, logging, a slow NIC or CPU "
                        "affinity on its host)."),
            metrics={"observed_late_share": float(row.late_share), "threshold_late_share": PERSISTENTLY_LATE,
                     "lateness_ms": float(row.lateness_ms), "threshold_lateness_ms": MIN_LATENESS_MS,
                     "peer_wait_ms": per_collective},
            evidence=[{"type": "collective", "rank": int(row.rank), "group": g, "op": o, "seq": int(s)}
                      for g, o, s in mine[["group", "op", "seq"]].head(10).itertuples(index=False)],
            # Everyone waits this long at each of the rank's collectives in a step.
            impact_ms=row.lateness_ms * row.collectives / profiled_steps if profiled_steps else None,
        ))
    return findings


def _low_bandwidth(c: pd.DataFrame) -> list[Finding]:
    big = c[(c["bytes"] >= MIN_BYTES) & c["busbw_gbps"].notna()].drop_duplicates(["group", "op", "seq"])
    if big.empty:
        return []
    big = big.assign(size_bucket=np.floor(np.log2(big["bytes"])))
    best = big.groupby(["op", "size_bucket"])["busbw_gbps"].transform("max")
    counts = big.groupby(["op", "size_bucket"])["busbw_gbps"].transform("size")
    slow = big[(counts >= MIN_SAMPLES) & (big["busbw_gbps"] < BANDWIDTH_FRACTION * best)]
    findings = []
    for (group, op), rows in slow.groupby(["group", "op"]):
        expected = float(best.loc[rows.index].median())
        findings.append(Finding(
            kind="slow_collective", severity="warning",
            ranks=sorted(int(r) for r in c.loc[c["group"] == group, "rank"].unique()),
            explanation=(f"{len(rows)} {op} on group {group} reach {rows['busbw_gbps'].median():.2f} GB/s bus "
                         f"bandwidth, under {BANDWIDTH_FRACTION:.0%} of the {expected:.2f} GB/s the same size "
                         "reaches elsewhere in this run."),
            suggestion="Check the transport this group uses (NCCL log: NET/Socket instead of IB or P2P?) and "
                       "contention from other traffic on its links.",
            metrics={"observed_busbw_gbps": float(rows["busbw_gbps"].median()), "expected_busbw_gbps": expected,
                     "threshold_fraction": BANDWIDTH_FRACTION},
            evidence=[{"type": "collective", "group": group, "op": op, "seq": int(s), "bytes": float(b)}
                      for s, b in zip(rows["seq"], rows["bytes"])][:10],
        ))
    return findings
