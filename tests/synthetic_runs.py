"""Step records of a synchronous job written as `diagtrain run` writes them, for tests of judgement without a job:
ranks that work the same phases, wait in one all-reduce for the slowest, start up and end as a manifest says."""

from __future__ import annotations

import json
from pathlib import Path

from diagtrain.profiler.run_dir import write_json_atomic

T0 = 1_790_000_000.0
STEPS = 24
WORK = {"data": 1.0, "forward": 20.0, "backward": 40.0, "optimizer": 5.0, "outside": 2.0}
# A rank's start-up, seconds after the launch: its process starts, torch is imported, its process group is ready.
STARTS = {"process_started_at": 1.0, "torch_imported_at": 3.0, "process_group_ready_at": 3.5}
FIRST_STEP_AT = 5.0  # the launch to step 1's start
TEARDOWN_S = 2.0


def job_run(root: Path, extra=None, ranks: int = 2, steps: int = STEPS, first_step_ms: float = 900.0,
            gaps: dict[int, float] | None = None, launch_s: float = FIRST_STEP_AT) -> Path:
    """Step records of a synchronous job whose ranks work WORK ms a step, then wait 1 ms in an all-reduce for the
    slowest; ``extra(rank, step)`` -> ms added per phase; ``gaps[step]``: ms between the step before and it, on
    every rank; step 1 takes ``first_step_ms`` more (start-up). A manifest from the launch (``launch_s`` before step 1)
    to TEARDOWN_S after the last step, and rank.json start-up times (STARTS)."""
    extra = extra or (lambda rank, step: {})
    work = {(r, s): {p: WORK[p] + extra(r, s).get(p, 0.0) + (first_step_ms if s == 1 and p == "outside" else 0.0)
                     for p in WORK} for r in range(ranks) for s in range(1, steps + 1)}
    launched = T0 - launch_s
    ends = {}
    for r in range(ranks):
        folder = root / "ranks" / str(r)
        folder.mkdir(parents=True)
        write_json_atomic(folder / "rank.json", {"rank": r, "host": "node-a", "world_size": ranks,
                                                 **{k: launched + v for k, v in STARTS.items()}})
        lines, start = [], T0
        for s in range(1, steps + 1):
            start += (gaps or {}).get(s, 0.0) / 1e3
            slowest = max(sum(work[(q, s)].values()) for q in range(ranks))
            mine = work[(r, s)]
            wait = slowest - sum(mine.values()) + 1.0
            phases = {p: mine[p] for p in ("data", "forward", "optimizer")} | {"backward": mine["backward"] + wait}
            wall = sum(phases.values()) + mine["outside"]
            lines.append(json.dumps({"rank": r, "step": s, "start": start, "end": start + wall / 1e3,
                                     "duration_ms": wall, "phases_ms": phases, "comm_ms": wait, "comm_calls": 1,
                                     "phase_comm_ms": {"data": 0.0, "forward": 0.0, "backward": wait, "optimizer": 0.0},
                                     "cpu_ms": wall - wait, "runq_ms": 0.1}))
            start += wall / 1e3
        ends[r] = start
        (folder / "steps.jsonl").write_text("\n".join(lines) + "\n")
    write_json_atomic(root / "manifest.json", {"schema_version": 1, "status": "ok", "world_size": ranks, "hosts": [],
                                               "command": ["python", "train.py"], "strategy": None, "injected": [],
                                               "exit_codes": {}, "started_at": launched,
                                               "ended_at": max(ends.values()) + TEARDOWN_S})
    return root
