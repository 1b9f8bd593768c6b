"""slow_collective: collectives slower than they should be, and the rank or link responsible.

Two causes, told apart by the matched collectives:

- A rank that arrives last at nearly every collective of a process group, because it pauses right
  before its calls (a comm hook, work before each collective): the others wait each time. A rank
  that is last because its own work earlier in the step is slower is a straggler, and is said so.
- Transfers slow for what they move. Bandwidth comes from the transfer time only, once the last
  rank had arrived (collectives.match), never from a duration that includes waiting, and is
  compared with something real: the same op and size on the group's twin groups (the other
  groups of its mesh dimension), or the group's own best for that size. On CPU (gloo) a run's
  transfer times follow the host's scheduling more than any link, so these are information only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from diagtrain.profiler.util.settings import section, setting
from diagtrain.profiler.analyzer.judge.detectors.base import (
    LateArrival,
    held_before_calls,
    is_persistently_late,
    late_arrivals,
)
from diagtrain.profiler.analyzer.judge.quantities import SlowCause
from diagtrain.profiler.analyzer.judge.findings import Candidate
from diagtrain.profiler.analyzer.run.tables import Tables


@section("slow_collective")
class SlowCollective:
    """When transfers are slow for what they move, and how much a late rank's finding says and shows."""

    bandwidth_fraction: float = setting(0.25, "busbw under a quarter of what it is compared with is slow")
    min_bytes: int = setting(1 << 20, "small messages are latency-bound: bandwidth says nothing about them")
    min_samples: int = setting(4, "transfers of one op and size needed on each side of a comparison")
    best_quantile: float = setting(0.9, "a group's \"best\" for a size: robust to one lucky transfer")
    slow_share: float = setting(0.25, "intermittently slow: at least this share of a group's transfers of a size")
    max_evidence: int = setting(10, "the collectives listed as evidence in a finding")
    min_gap_ms: float = setting(1.0, "a pause before a call shorter than this is scheduling, not worth a mention")


# Who is late (late_arrival) is judged in base.py, shared with the straggler detector.
SETTINGS = (SlowCollective, LateArrival)


def detect(tables: Tables) -> list[Candidate]:
    """Ranks persistently late at collectives, and groups whose transfers are slow for their size."""
    s = SlowCollective.active()
    c = tables.collectives
    if c.empty or "group" not in c:
        return []
    profiled_steps = int(tables.steps.loc[tables.steps["profiled"], "step"].nunique()) if "profiled" in tables.steps else 0
    return _late_ranks(c, profiled_steps, s) + _slow_twin_groups(tables, s) + _intermittent(tables, s)


def _late_ranks(c: pd.DataFrame, profiled_steps: int, s: SlowCollective) -> list[Candidate]:
    """One finding per rank that is persistently late in some process group (each judged alone)."""
    findings = []
    late_arrival = LateArrival.active()
    late = late_arrivals(c)
    late = late[is_persistently_late(late)].assign(held=lambda t: held_before_calls(t))
    for rank, rows in late.groupby("rank"):
        # Unknown gaps (NaN: GPU traces) leave the delay where it shows: before the calls.
        before_calls = bool((rows["held"] != 0.0).any())
        rows = rows[rows["held"] != 0.0] if before_calls else rows
        mine = c[(c["rank"] == rank) & c["group"].isin(rows["group"])]
        keys = mine.set_index(["group", "op", "seq"]).index
        waited = c[(c["rank"] != rank) & c.set_index(["group", "op", "seq"]).index.isin(keys)]
        per_collective = float(waited.groupby(["group", "op", "seq"])["wait_us"].max().median() / 1e3) if len(waited) else 0.0
        gap = rows["extra_gap_ms"].median()
        lateness, count = float(rows["lateness_ms"].mean()), int(rows["collectives"].sum())
        findings.append(Candidate(
            kind="slow_collective", ranks=[int(rank)],
            facts={"case": "late_arrival", "before_calls": before_calls, "peer_wait_ms": per_collective,
                   "groups": [{"group": _label(mine[mine["group"] == r.group]), "late_share": float(r.late_share),
                               "collectives": int(r.collectives), "lateness_ms": float(r.lateness_ms)}
                              for r in rows.itertuples()],
                   # The pause before its calls (None where unknown: GPU traces), and whether it stands out.
                   "extra_gap_ms": None if pd.isna(gap) else float(gap), "paused": bool(gap >= s.min_gap_ms),
                   # Everyone waits this long at each of the rank's collectives in a step.
                   "lost_ms_per_step": lateness * count / profiled_steps if profiled_steps else None},
            metrics={"cause": SlowCause.LATE_ARRIVAL.value, "observed_late_share": float(rows["late_share"].min()),
                     "threshold_late_share": late_arrival.persistent_share,
                     "lateness_ms": lateness, "threshold_lateness_ms": late_arrival.min_lateness_ms,
                     "peer_wait_ms": per_collective, "before_calls": before_calls,
                     "groups": [str(g) for g in rows["group"]],
                     "extra_gap_before_calls_ms": None if pd.isna(gap) else float(gap)},
            evidence=[{"type": "collective", "rank": int(rank), "group": g, "op": o, "seq": int(seq)}
                      for g, o, seq in mine[["group", "op", "seq"]].head(s.max_evidence).itertuples(index=False)],
        ))
    return findings


def _transfers(c: pd.DataFrame, s: SlowCollective) -> pd.DataFrame:
    """One row per collective whose bandwidth is known and meaningful (size, complete group)."""
    p2p = c["is_p2p"].fillna(False).astype(bool) if "is_p2p" in c else pd.Series(False, index=c.index)
    known = c[(c["bytes"] >= s.min_bytes) & c["busbw_gbps"].notna() & ~p2p]
    known = known.drop_duplicates(["group", "op", "seq"])
    return known.assign(size_bucket=np.floor(np.log2(known["bytes"])), label=_labels(known),
                        size=known["group_ranks"].map(len))


def _slow_twin_groups(tables: Tables, s: SlowCollective) -> list[Candidate]:
    """Groups far slower than the other groups of the same kind moving the same sizes."""
    t = _transfers(tables.collectives, s)
    findings = []
    for (label, size, op, bucket), rows in t.groupby(["label", "size", "op", "size_bucket"]):
        per_group = rows.groupby("group")["busbw_gbps"].agg(["median", "size"])
        per_group = per_group[per_group["size"] >= s.min_samples]
        if len(per_group) < 2:
            continue
        for group, g in per_group.iterrows():
            twins = float(per_group.drop(group)["median"].median())
            if g["median"] < s.bandwidth_fraction * twins:
                findings.append(_bandwidth_finding(
                    tables, rows[rows["group"] == group], op, bucket,
                    {"case": "twin_groups", "busbw_gbps": float(g["median"]), "twin_label": str(label)}, twins, s))
    return findings


def _intermittent(tables: Tables, s: SlowCollective) -> list[Candidate]:
    """A group whose transfers of one size are often far slower than its own best for that size."""
    if not tables.on_gpu:
        return []  # on gloo, transfer times vary with the host's scheduling: not a link's doing
    t = _transfers(tables.collectives, s)
    findings = []
    for (group, op, bucket), rows in t.groupby(["group", "op", "size_bucket"]):
        if len(rows) < s.min_samples:
            continue
        best = float(rows["busbw_gbps"].quantile(s.best_quantile))
        slow = rows[rows["busbw_gbps"] < s.bandwidth_fraction * best]
        if len(slow) >= s.slow_share * len(rows):
            findings.append(_bandwidth_finding(
                tables, slow, op, bucket, {"case": "intermittent", "busbw_gbps": float(slow["busbw_gbps"].median()),
                                           "slow_transfers": len(slow), "transfers": len(rows)}, best, s))
    return findings


def _bandwidth_finding(tables: Tables, rows: pd.DataFrame, op: str, bucket: float, measured: dict[str, Any],
                       expected: float, s: SlowCollective) -> Candidate:
    """A group's transfers slow for their size: ``measured`` says against what (its case) and how slow."""
    group = rows["group"].iloc[0]
    ranks = sorted(int(r) for r in rows["group_ranks"].iloc[0]) or sorted(
        int(r) for r in tables.collectives.loc[tables.collectives["group"] == group, "rank"].unique())
    transports = sorted({e.via for r in ranks for e in (tables.nccl_logs.get(r).transports
                                                        if tables.nccl_logs.get(r) else [])})
    return Candidate(
        kind="slow_collective", ranks=ranks,
        facts={**measured, "op": op, "bytes": float(2 ** bucket), "group": _label(rows), "expected_busbw_gbps": expected,
               "fraction": s.bandwidth_fraction, "transports": transports[:3], "on_gpu": tables.on_gpu},
        metrics={"cause": SlowCause.BANDWIDTH.value,
                 "observed_busbw_gbps": float(rows["busbw_gbps"].median()), "expected_busbw_gbps": expected,
                 "threshold_fraction": s.bandwidth_fraction, "group": group, "op": op, "bytes": float(2 ** bucket)},
        evidence=[{"type": "collective", "group": group, "op": op, "seq": int(seq), "bytes": float(b),
                   "transfer_us": float(us)}
                  for seq, b, us in zip(rows["seq"], rows["bytes"], rows["transfer_us"])][:s.max_evidence],
    )


def _labels(c: pd.DataFrame) -> pd.Series:
    """What kind of group each row's is: its description (mesh_dp, default_pg), else its name."""
    return c["pg_desc"].where(c["pg_desc"].notna() & (c["pg_desc"].astype(str) != ""), c["pg"]).astype(str)


def _label(rows: pd.DataFrame) -> str:
    return str(_labels(rows.head(1)).iloc[0]) if len(rows) else "?"

