"""Beside the job: the `diagtrain run` wrapper's side of collection.

Runs in the wrapper process, never in the ranks: starts the command and owns its process tree,
samples telemetry (NVML or psutil), shows progress, watches heartbeats for hangs and asks hung
ranks for their state, and writes each host's record and manifest.json.
"""
