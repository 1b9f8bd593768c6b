"""Communication: the collectives table, per collective or summarized, and NCCL's topology."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from diagtrain.dashboard.data import RunData
from diagtrain.profiler.analyzer.per_rank.collectives import P2P_GROUP_DESC, UNKNOWN_GROUP
from diagtrain.profiler.util.units import MIB

PER_COLLECTIVE, SUMMARY = "each", "summary"
UNNAMED = (P2P_GROUP_DESC, "undefined", "")  # descriptions that name no group (NCCL writes "undefined")
UNKNOWN_P2P = "point-to-point, group unknown: the traces name only the peer's place in it, and no group fits both sides"
UNKNOWN_CPU = "unknown: gloo's trace names no group and no flight-recorder entry matched this call"
UNKNOWN_GPU = "unknown: the kernel's arguments name no process group"
MAX_ROWS = 20_000  # the browser sorts and filters this many rows without strain
COLUMNS = {  # column -> header, for both tables
    "op": "op", "group": "group", "rank": "rank", "seq": "seq", "count": "count", "mib": "MiB",
    "duration_ms": "duration (ms)", "transfer_ms": "transfer (ms)", "algbw_gbps": "algbw (GB/s)",
    "busbw_gbps": "busbw (GB/s)", "wait_ms": "wait (ms)", "max_wait_ms": "max wait (ms)", "last_rank": "last to arrive",
}


def table(run: RunData, mode: str = SUMMARY) -> tuple[list[dict[str, Any]], list[dict[str, str]], str]:
    """Rows and columns for the DataTable, and a line saying what is shown."""
    c = run.collectives
    if c.empty:
        return [], [], "No collectives in the traces (run with --profile-steps to record them)."
    c = c.assign(group=group_labels(run), mib=c["bytes"] / MIB, duration_ms=c["dur"] / 1e3,
                 transfer_ms=c["transfer_us"] / 1e3, wait_ms=c["wait_us"] / 1e3)
    if mode == SUMMARY:
        rows = c.groupby(["op", "group", "mib"], dropna=False).agg(
            count=("seq", "size"), duration_ms=("duration_ms", "median"), transfer_ms=("transfer_ms", "median"),
            busbw_gbps=("busbw_gbps", "median"), algbw_gbps=("algbw_gbps", "median"), wait_ms=("wait_ms", "median"),
            max_wait_ms=("wait_ms", "max"),
            last_rank=("last_rank", lambda r: int(r.mode().iloc[0]) if r.notna().any() else None)).reset_index()
        rows = rows.sort_values("transfer_ms", ascending=False)
        note = (f"{len(c):,} collective calls in {len(rows)} kinds (op, group, size); medians, and the rank that "
                "arrived last most often.")
    else:
        rows = c[["rank", "op", "group", "seq", "mib", "duration_ms", "transfer_ms", "wait_ms", "algbw_gbps",
                  "busbw_gbps", "last_rank"]].sort_values(["group", "seq", "rank"])
        note = f"{len(c):,} collective calls, one row per rank and call."
        if len(rows) > MAX_ROWS:
            rows = rows.nlargest(MAX_ROWS, "wait_ms")
            note += f" The {MAX_ROWS:,} with the longest wait are shown."
    return _records(rows), [{"name": COLUMNS[k], "id": k} for k in rows.columns], note


def group_labels(run: RunData) -> pd.Series:
    """Each collective's group as a person reads it: its description, or, where the traces name no
    group, the one the analysis inferred, or why it is unknown (never a bare "?")."""
    c = run.collectives
    structure = run.report.get("structure") or {}
    via = {int(r): g.get("desc") or g.get("name") for r, g in (structure.get("p2p_groups") or {}).items()}
    on_gpu = bool(run.report.get("run", {}).get("on_gpu"))
    labels = []
    for rank, pg, desc, p2p in zip(c["rank"], c["pg"], c["pg_desc"], c["is_p2p"]):
        named = desc if isinstance(desc, str) and desc not in UNNAMED else None
        named = named or (None if pg is None or str(pg) == UNKNOWN_GROUP else f"group {pg}")
        if named:
            labels.append(named)
        elif p2p and via.get(int(rank)):
            labels.append(f"{via[int(rank)]} (point-to-point; group inferred from the peers)")
        elif p2p:
            labels.append(UNKNOWN_P2P)
        else:
            labels.append(UNKNOWN_GPU if on_gpu else UNKNOWN_CPU)
    return pd.Series(labels, index=c.index, dtype=object)


def topology(run: RunData) -> list[dict[str, Any]]:
    """Per rank, from its NCCL log: version, communicators, transports, rings, warnings."""
    rows = []
    for rank, log in sorted(run.nccl.items(), key=lambda kv: int(kv[0])):
        families: dict[str, int] = {}
        for edge in log.get("transports") or []:
            families[edge["family"]] = families.get(edge["family"], 0) + 1
        devices = sorted({f"cuda:{c['cuda_dev']} ({c['bus_id']})" for c in log.get("communicators") or []})
        rows.append({"rank": int(rank), "nccl": log.get("version") or "",
                     "communicators": len(log.get("communicators") or []), "devices": ", ".join(devices),
                     "transports": ", ".join(f"{k} {v}" for k, v in sorted(families.items())) or "none logged",
                     "rings": len(log.get("rings") or []), "trees": len(log.get("trees") or []),
                     "warnings": "; ".join(w["text"][:160] for w in (log.get("warnings") or [])[:3])})
    return rows


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    frame = frame.round({k: 3 for k in frame.columns if frame[k].dtype.kind == "f"})
    return [{k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in row.items()}
            for row in frame.to_dict("records")]
