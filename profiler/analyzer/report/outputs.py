"""What the analysis leaves under ``analysis/`` for the stages after it (dashboard, compare).

Tables as Parquet, small documents as JSON, each replaced atomically. The dashboard reads only
these files and report.json; nothing downstream reads the raw traces or logs again.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from diagtrain.profiler.analyzer.read import flight_records
from diagtrain.profiler.analyzer.judge.detectors.hang import blocked_in_order
from diagtrain.profiler.analyzer.rank.cache import spans_path
from diagtrain.profiler.analyzer.rank.result import RankResult
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.run_dir import SCHEMA_VERSION, write_json_atomic
from diagtrain.profiler.util.parquet import write_parquet

FLIGHT_RECORDER_TAIL = 32  # collectives per group in the cross-rank table: the hang is at the end


def write(analysis_dir: Path, tables: Tables, doc: dict[str, Any], results: list[RankResult]) -> None:
    """Every table and document of the analysis, under ``analysis_dir``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        write_parquet(analysis_dir / "steps.parquet", tables.steps)
        write_parquet(analysis_dir / "ranks.parquet", tables.ranks)
        if not tables.collectives.empty:
            # The members are in the group's key (run_dir.group_members reads them back): a list on
            # every row would hold ranks × collectives × group size integers.
            c = tables.collectives.drop(columns="group_ranks")
            write_parquet(analysis_dir / "collectives.parquet", c.assign(group=_categories(c["group"])))
        if not tables.ledger.empty:
            write_parquet(analysis_dir / "ledger.parquet", tables.ledger)
        if tables.telemetry is not None and not tables.telemetry.empty:
            write_parquet(analysis_dir / "telemetry.parquet", tables.telemetry)
    write_json_atomic(analysis_dir / "findings.json", doc["findings"])
    write_json_atomic(analysis_dir / "timeline.json", timeline_index(analysis_dir, tables, results))
    write_json_atomic(analysis_dir / "nccl.json", {str(r): asdict(log) for r, log in sorted(tables.nccl_logs.items())})
    write_json_atomic(analysis_dir / "hang.json", hang_document(tables))
    write_json_atomic(analysis_dir / "expected.json", doc.get("expected") or {})


def timeline_index(analysis_dir: Path, tables: Tables, results: list[RankResult]) -> dict[str, Any]:
    """Per rank: its spans file (relative to ``analysis_dir``) and the µs that line up its clock."""
    ranks = {}
    for result in results:
        path = spans_path(analysis_dir / "cache", result)
        if path.exists():
            ranks[str(result.rank)] = {"spans": str(path.relative_to(analysis_dir)),
                                       "clock_shift_us": tables.clock_shifts_us.get(result.rank, 0.0),
                                       "host": tables.rank_hosts.get(result.rank) or result.host_name}
    return {"schema_version": SCHEMA_VERSION, "ranks": ranks}


def hang_document(tables: Tables) -> dict[str, Any]:
    """The cross-rank flight-recorder table and each rank's stack (empty when nothing was dumped)."""
    stacks = {}
    for rank, dump in sorted(tables.stacks.items()):
        threads = (dump or {}).get("threads") or []
        stacks[str(rank)] = [{"name": t.get("name"), "main": bool(t.get("main")), "frames": t.get("frames") or []}
                             for t in threads]
    entries = tables.flight_records
    return {"schema_version": SCHEMA_VERSION,
            "flight_recorder": flight_records.cross_rank(entries, FLIGHT_RECORDER_TAIL),
            # What the hang verdict found blocked, the collective everything waits on first.
            "blocked": [{"group_key": b.pg, "seq": b.seq} for b in blocked_in_order(tables, entries)],
            "stacks": stacks,
            "exits": {str(r): e for r, e in sorted(tables.exits.items()) if e}}


def _categories(keys: pd.Series) -> pd.Categorical:
    """The rows' group keys as one string per group: ``astype("category")`` first made a string per
    row (200 MiB at 256 ranks, whose keys name all 256 members)."""
    codes, groups = pd.factorize(keys)
    return pd.Categorical.from_codes(codes, categories=pd.Index(groups, dtype=object))

