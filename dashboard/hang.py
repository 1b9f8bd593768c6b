"""Hang: the cross-rank flight-recorder table and each rank's Python stack, when a run stopped."""

from __future__ import annotations

from typing import Any

from diagtrain.dashboard.data import RunData
from diagtrain.profiler.run_dir import STOPPED

MAX_RANK_COLUMNS = 32  # beyond this many ranks, the table lists the missing ranks instead of a column each
ENTERED, MISSING = "✓", "—"


def stopped(run: RunData) -> bool:
    """Whether the run hung, failed or was interrupted (the hang view matters then)."""
    return run.report.get("run", {}).get("status") in STOPPED


def flight_recorder(run: RunData) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Rows (collectives some ranks never entered first, in the verdict's order) and columns for the DataTable."""
    entries = run.hang.get("flight_recorder") or []
    ranks = sorted({r for e in entries for r in e["entered"] + e["missing"]})
    per_rank = len(ranks) <= MAX_RANK_COLUMNS
    rows = []
    # The analysis's verdict order: the collective everything waits on first, then other gaps.
    verdict = {(b["group_key"], b["seq"]): i for i, b in enumerate(run.hang.get("blocked") or [])}
    for e in sorted(entries, key=lambda e: (not e["missing"], verdict.get((e["group_key"], e["seq"]), len(verdict)),
                                            e["created_ns"], e["group"], e["seq"])):
        row = {"group": e["group"], "seq": e["seq"], "op": e["op"].split(":", 1)[-1],
               "entered": f"{len(e['entered'])}/{len(e['entered']) + len(e['missing'])}",
               "missing": ", ".join(map(str, e["missing"]))}
        if per_rank:
            row.update({f"r{r}": ENTERED if r in e["entered"] else MISSING if r in e["missing"] else ""
                        for r in ranks})
        rows.append(row)
    columns = [{"name": n, "id": n} for n in ("group", "seq", "op", "entered", "missing")]
    if per_rank:
        columns += [{"name": f"rank {r}", "id": f"r{r}"} for r in ranks]
    return rows, columns


def stacks(run: RunData) -> list[dict[str, Any]]:
    """Per rank: where it was (innermost frame of the main thread) and its threads' stacks as text."""
    exits = run.hang.get("exits") or {}
    out = []
    for rank, threads in sorted((run.hang.get("stacks") or {}).items(), key=lambda kv: int(kv[0])):
        main = next((t for t in threads if t["main"]), threads[0] if threads else None)
        where = _frame(main["frames"][-1]) if main and main["frames"] else (exits.get(rank) or {}).get("where", "?")
        text = "\n\n".join(f"Thread {t['name']}{' (main)' if t['main'] else ''}, most recent call last:\n"
                           + "\n".join(f"  {_frame(f)}" for f in t["frames"]) for t in threads)
        out.append({"rank": int(rank), "where": where, "text": text})
    return out


def _frame(f: dict[str, Any]) -> str:
    return f"{f.get('file')}:{f.get('line')} in {f.get('function')}"
