"""PyTorch's flight recorder: the last collectives each rank issued, dumped as JSON.

``TORCH_FR_BUFFER_SIZE`` (set by `diagtrain run` before the process group starts) turns it on;
with gloo on torch 2.13 it records every collective with its group and sequence number.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from diagtrain.profiler.run_dir import write_bytes_atomic


def dump(path: Path) -> bool:
    """Write this process's flight recorder buffer to ``path``; False when there is nothing."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.distributed.is_available():
        return False
    raw = torch._C._distributed_c10d._dump_fr_trace_json(includeCollectives=True)
    data = raw if isinstance(raw, str) else raw.decode()
    if not json.loads(data).get("entries"):
        return False
    write_bytes_atomic(path, data.encode())
    return True
