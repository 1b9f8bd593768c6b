"""The words of what only a running job shows (judge/live_judge.py)."""

from __future__ import annotations

from diagtrain.profiler.analyzer.report.words import Words

WORDS = {"no_progress": Words(
    lambda f: (f"no step finished on rank {f['ranks'][0]} for {f['idle_s']:.0f} s, "
               f"{f['idle_s'] * 1e3 / f['typical_ms']:.0f} typical steps of {f['typical_ms']:.0f} ms, since it finished "
               f"step {f['last_step']}."),
    lambda f: (f"Look at what rank {f['ranks'][0]} is doing now (py-spy dump --pid of its process): if it is blocked in "
               "a collective, another rank is the cause. If no rank finishes a step for --hang-timeout, the wrapper "
               "dumps every rank's stacks and flight recorder."))}
