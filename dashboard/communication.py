"""Communication: the collectives table, per collective or summarized, and NCCL's topology."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from diagtrain.dashboard.data import RunData

PER_COLLECTIVE, SUMMARY = "each", "summary"
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
    c = c.assign(group=c["pg_desc"].fillna(c["pg"]).astype(str), mib=c["bytes"] / 2**20, duration_ms=c["dur"] / 1e3,
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
