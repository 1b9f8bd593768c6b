"""gpu_throttling's words (judge/detectors/gpu_throttling.py)."""

from __future__ import annotations

from diagtrain.profiler.analyzer.report.words import Facts, Words


def _explanation(f: Facts) -> str:
    peer = f["peer_sm_clock_mhz"]
    return (f"rank {f['rank']}'s GPU (device {f['device']}) is throttled in {f['share']:.0%} of the samples taken during "
            f"steps ({', '.join(f['reasons'])}); SM clock {f['sm_clock_mhz']:.0f} MHz"
            + (f" against {peer:.0f} MHz on the other GPUs." if peer else "."))


WORDS = {"gpu_throttling": Words(
    _explanation,
    "Check cooling and power limits of that GPU (nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE); a hardware slowdown "
    "that persists calls for moving the job off that node.")}
