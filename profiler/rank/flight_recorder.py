"""PyTorch's flight recorder: the last collectives each rank issued, dumped as JSON.

``TORCH_FR_BUFFER_SIZE`` (set by `diagtrain run` before the process group starts) turns it on;
with gloo on torch 2.13 it records every collective with its group and sequence number. A CUDA
build has two recorders, not one: ProcessGroupNCCL keeps its own (``_dump_nccl_trace_json``), and
the generic one holds gloo's and CPU collectives only; the dump holds the entries of both, each once (a
PyTorch whose two dump functions read one recorder would otherwise write every entry twice).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Iterable

from diagtrain.profiler.run_dir import write_bytes_atomic

# The recorders' dump functions, NCCL's first; a CPU build has only the generic one.
_RECORDERS = ("_dump_nccl_trace_json", "_dump_fr_trace_json")
# What tells one recorded call from another across the two dumps (record ids alone repeat: one counter a recorder).
_IDENTITY = ("record_id", "process_group", "collective_seq_id", "p2p_seq_id", "op_id", "time_created_ns")


def dump(path: Path) -> bool:
    """Write this process's flight recorder buffers to ``path``; False when there is nothing."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.distributed.is_available():
        return False
    dumps = [_read(fn) for fn in (getattr(torch._C._distributed_c10d, name, None) for name in _RECORDERS) if fn]
    dumps = [d for d in dumps if d.get("entries")]
    if not dumps:
        return False
    merged = {**dumps[0], "entries": _each_once(e for d in dumps for e in d["entries"])}
    for key in ("pg_config", "pg_status"):  # per process group: the union of both recorders'
        if any(isinstance(d.get(key), dict) for d in dumps):
            merged[key] = {k: v for d in reversed(dumps) if isinstance(d.get(key), dict) for k, v in d[key].items()}
    write_bytes_atomic(path, json.dumps(merged).encode())
    return True


def _read(dump_json: Any) -> dict[str, Any]:
    raw = dump_json(True, False)  # includeCollectives, onlyActive
    return json.loads(raw if isinstance(raw, str) else raw.decode())


def _each_once(entries: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries, one per collective call: the later dump's state of an entry read twice, in its first place."""
    unique: dict[tuple, dict[str, Any]] = {}
    for e in entries:
        unique[tuple(str(e.get(k)) for k in _IDENTITY)] = e
    return list(unique.values())
