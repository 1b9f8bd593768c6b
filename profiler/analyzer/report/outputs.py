"""What the analysis leaves under ``analysis/`` for the stages after it (dashboard, compare).

Tables as Parquet, small documents as JSON, each replaced atomically. The dashboard reads only
these files and report.json; nothing downstream reads the raw traces or logs again.
"""

from __future__ import annotations

import os
import shutil
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from diagtrain.profiler.analyzer.read import flight_records
from diagtrain.profiler.analyzer.judge.detectors.hang import blocked_in_order
from diagtrain.profiler.analyzer.per_rank.cache import spans_path
from diagtrain.profiler.analyzer.per_rank.result import RankResult
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.run_dir import SCHEMA_VERSION, write_json_atomic
from diagtrain.profiler.util.parquet import write_parquet

SPANS_DIR = "spans"  # analysis/spans/rank<N>.parquet: each rank's timeline spans on the run's clock
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
        if not tables.job_steps.empty:
            write_parquet(analysis_dir / "job_steps.parquet", tables.job_steps)
        if tables.telemetry is not None and not tables.telemetry.empty:
            write_parquet(analysis_dir / "telemetry.parquet", tables.telemetry)
    write_json_atomic(analysis_dir / "findings.json", doc["findings"])
    write_json_atomic(analysis_dir / "timeline.json", timeline_index(analysis_dir, tables, results))
    write_json_atomic(analysis_dir / "nccl.json", {str(r): asdict(log) for r, log in sorted(tables.nccl_logs.items())})
    write_json_atomic(analysis_dir / "hang.json", hang_document(tables))
    write_json_atomic(analysis_dir / "expected.json", doc.get("expected") or {})


def timeline_index(analysis_dir: Path, tables: Tables, results: list[RankResult]) -> dict[str, Any]:
    """Per rank: its published spans file (relative to ``analysis_dir``, on the run's clock) and its host."""
    ranks = {}
    published = analysis_dir / SPANS_DIR
    shutil.rmtree(published, ignore_errors=True)  # a previous analysis' ranks
    for result in results:
        path = spans_path(analysis_dir / "cache", result)
        if path.exists():
            out = published / f"rank{result.rank}.parquet"
            _publish_spans(path, out, tables.clock_shifts_us.get(result.rank, 0.0))
            ranks[str(result.rank)] = {"spans": str(out.relative_to(analysis_dir)),
                                       "host": tables.rank_hosts.get(result.rank) or result.host_name}
    return {"schema_version": SCHEMA_VERSION, "ranks": ranks}


def _publish_spans(cached: Path, out: Path, shift_us: float) -> None:
    """A rank's spans as its loader cached them (on its own clock), moved onto the run's clock at ``out``: one
    place adds the shift, and the dashboard never reads the analysis' cache."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if not shift_us:
        try:
            os.link(cached, out)  # the same bytes: no copy of a large rank's spans
            return
        except OSError:
            pass  # another file system, or links refused: a copy
    table = pq.read_table(cached)
    for column in ("start_us", "end_us"):
        moved = pc.add(table.column(column), pa.scalar(shift_us, table.schema.field(column).type))
        table = table.set_column(table.schema.get_field_index(column), column, moved)
    tmp = out.with_suffix(".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, out)


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

