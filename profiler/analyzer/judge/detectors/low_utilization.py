"""low_utilization: a rank's GPU sits without any kernel for much of the steps.

NVML's utilization says whether any kernel ran during the sample window, so low values mean the
GPU waits (for data, the host, or communication), not that its SMs are partly used.
"""

from __future__ import annotations

import numpy as np

from diagtrain.profiler.analyzer.judge.findings import Candidate
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.util.groups import distinct
from diagtrain.profiler.util.settings import section, setting


@section("low_utilization")
class LowUtilization:
    """When a rank's GPU runs kernels too little of the time during steps."""

    low_util_percent: float = setting(50.0, "a GPU with no kernel half of the time is waiting on something")
    min_samples: int = setting(3, "fewer samples during steps say nothing")


SETTINGS = (LowUtilization,)


def detect(tables: Tables) -> list[Candidate]:
    """Ranks whose GPU's median utilization during steps is below ``low_util_percent``."""
    s = LowUtilization.active()
    t = tables.telemetry
    if t is None or "gpu_util_percent" not in t:
        return []
    gpu = t[(t["kind"] == "gpu") & t["rank"].notna() & t["step"].notna()]
    findings = []
    for rank, rows in gpu.groupby("rank"):
        util = float(rows["gpu_util_percent"].median())
        if len(rows) < s.min_samples or util >= s.low_util_percent:
            continue
        findings.append(Candidate(
            kind="low_utilization", ranks=[int(rank)],
            steps=distinct(rows["step"]).astype(np.int64).tolist(),  # a week of 1 Hz samples: arrays
            facts={"rank": int(rank), "util_percent": util, "samples": int(len(rows))},
            metrics={"observed_percent": util, "threshold_percent": s.low_util_percent, "samples": int(len(rows))},
            evidence=[{"type": "telemetry", "rank": int(rank), "median_gpu_util_percent": util}],
        ))
    return findings
