"""gpu_throttling: a rank's GPU runs with lowered clocks (power cap, thermal or hardware slowdown)."""

from __future__ import annotations

import numpy as np

from diagtrain.profiler.analyzer.judge.findings import Candidate
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.util.groups import distinct
from diagtrain.profiler.util.settings import section, setting


@section("gpu_throttling")
class GpuThrottling:
    """When a rank's GPU is throttled often enough to report."""

    throttled_share: float = setting(0.2, "throttled in a fifth of the samples taken during steps")


SETTINGS = (GpuThrottling,)


def detect(tables: Tables) -> list[Candidate]:
    """Ranks whose GPU is throttled in at least ``throttled_share`` of the samples taken during steps."""
    s = GpuThrottling.active()
    t = tables.telemetry
    if t is None or "throttled" not in t:
        return []
    gpu = t[(t["kind"] == "gpu") & t["rank"].notna() & t["step"].notna()]
    findings = []
    for rank, rows in gpu.groupby("rank"):
        share = float(rows["throttled"].fillna(False).astype(bool).mean())
        if share < s.throttled_share:
            continue
        throttled = rows[rows["throttled"].fillna(False).astype(bool)]
        reasons = throttled["throttle"].str.split(",").explode().value_counts()
        others = gpu[gpu["rank"] != rank]["sm_clock_mhz"]
        clock, peer_clock = float(throttled["sm_clock_mhz"].median()), float(others.median()) if len(others) else None
        findings.append(Candidate(
            kind="gpu_throttling", ranks=[int(rank)],
            steps=distinct(throttled["step"]).astype(np.int64).tolist(),  # a week of 1 Hz samples: arrays
            facts={"rank": int(rank), "device": int(rows["device"].iloc[0]), "share": share,
                   "reasons": [str(r) for r in reasons.index[:3]], "sm_clock_mhz": clock, "peer_sm_clock_mhz": peer_clock},
            metrics={"observed_share": share, "threshold_share": s.throttled_share, "sm_clock_mhz": clock,
                     "expected_sm_clock_mhz": peer_clock, "reasons": reasons.to_dict()},
            evidence=[{"type": "telemetry", "rank": int(rank), "time": str(r.time), "throttle": r.throttle}
                      for r in throttled.head(5).itertuples()],
        ))
    return findings
