"""A 2-rank job's records appended step by step, as a running job writes them: for tests of live judgement."""

from __future__ import annotations

import json
import time
from pathlib import Path

from diagtrain.profiler.run_dir import write_json_atomic


def two_ranks(run: Path) -> float:
    """The rank records of a 2-rank job started a minute ago (its step records are appended by the test)."""
    for rank in (0, 1):
        folder = run / "ranks" / str(rank)
        folder.mkdir(parents=True)
        write_json_atomic(folder / "rank.json", {"rank": rank, "world_size": 2, "host": "h", "pid": 1})
    return time.time() - 60


def append_step(run: Path, rank: int, step: int, start: float, late_ms: float, slowest_ms: float) -> None:
    """One step record of a 100 ms step (+ the slowest rank's ``slowest_ms``) in which ``rank`` spends
    ``late_ms`` more in its forward and waits for the slowest rank for the rest."""
    t0 = start + 0.4 * step
    with open(run / "ranks" / str(rank) / "steps.jsonl", "a") as f:
        f.write(json.dumps({"rank": rank, "step": step, "start": t0, "end": t0 + (100.0 + slowest_ms) / 1e3,
                            "duration_ms": 100.0 + slowest_ms,
                            "phases_ms": {"forward": 40.0 + late_ms, "backward": 50.0 + slowest_ms - late_ms},
                            "phase_comm_ms": {"forward": 0.0, "backward": 20.0 + slowest_ms - late_ms},
                            "comm_ms": 20.0 + slowest_ms - late_ms}) + "\n")
