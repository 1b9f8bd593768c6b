"""A big job as the dashboard sees it, built in memory: the timeline's tests at 64 to 1,024 ranks
without analyzing a thousand traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from diagtrain.dashboard.data import Lane, RunData, Spans


def cluster_run(world: int, straggler: int, steps: int = 8, named: bool = True) -> RunData:
    """``world`` ranks of ``steps`` steps in three phases, steps 4-5 profiled; ``straggler``'s forward is slow
    (0.3 s against 0.1 s), and a straggler finding names it when ``named``."""
    records, spans = [], {}
    for rank in range(world):
        t = 0.0
        for step in range(1, steps + 1):
            forward = 0.3 if rank == straggler else 0.1
            wall = forward + 0.15 + 0.05
            records.append({"rank": rank, "step": step, "start": t, "end": t + wall, "wall_ms": wall * 1e3,
                            "forward_ms": forward * 1e3, "backward_ms": 150.0, "optimizer_ms": 50.0,
                            "profiled": step in (4, 5)})
            t += wall + (0.4 if step == 5 else 0.01)  # the profiler's export after the window
        window = [r for r in records if r["rank"] == rank and r["profiled"]]
        compute = np.array([r["start"] for r in window]), np.array([r["start"] + 0.25 for r in window])
        comm = compute[1], np.array([r["end"] for r in window])
        spans[rank] = Spans({"compute": compute[0], "comm": comm[0], "memory": np.empty(0), "idle": np.empty(0)},
                            {"compute": compute[1], "comm": comm[1], "memory": np.empty(0), "idle": np.empty(0)},
                            {"compute": np.full(2, "aten::mm"), "comm": np.full(2, "gloo:all_reduce"),
                             "memory": np.empty(0, dtype=str), "idle": np.empty(0, dtype=str)})
    finding = {"kind": "straggler", "severity": "warning", "ranks": [straggler], "steps": list(range(1, steps + 1)),
               "time_range": None, "metrics": {}, "evidence": [], "explanation": "slow forward", "suggestion": "look"}
    run = RunData(path=Path(f"synthetic-{world}"), report={"findings": [finding] if named else [], "run": {
                      "phases": ["forward", "backward", "optimizer"]}},
                  steps=pd.DataFrame(records), ranks=pd.DataFrame(), collectives=pd.DataFrame(),
                  telemetry=pd.DataFrame(), nccl={}, hang={}, timeline={"ranks": {}}, t0=0.0,
                  lanes=[Lane(r, "", f"r{r}") for r in range(world)])
    run._spans.update(spans)
    return run
