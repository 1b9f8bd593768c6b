"""Detectors whose inputs only a GPU cluster produces (NCCL logs, NVML telemetry), on fixtures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd

from diagtrain.profiler.analyzer.analyze import analyze
from diagtrain.profiler.run_dir import write_json_atomic

LOGS = Path(__file__).parent / "fixtures" / "logs"
T0 = 1_790_000_000.0  # Unix seconds of the fake run's first step


def fake_run(root: Path, hosts: dict[int, str], steps: int = 6, step_s: float = 1.0) -> Path:
    """A run directory with step records and rank facts, as `diagtrain run` writes them."""
    for rank, host in hosts.items():
        folder = root / "ranks" / str(rank)
        folder.mkdir(parents=True)
        write_json_atomic(folder / "rank.json", {"rank": rank, "host": host, "hostname": host, "pid": 1,
                                                 "world_size": len(hosts)})
        lines = [json.dumps({"rank": rank, "step": s, "start": T0 + (s - 1) * step_s, "end": T0 + s * step_s,
                             "duration_ms": step_s * 1e3, "phases_ms": {"forward": 300.0, "backward": 600.0},
                             "peak_mem_bytes": 2**30}) for s in range(1, steps + 1)]
        (folder / "steps.jsonl").write_text("\n".join(lines) + "\n")
    return root


def findings(run: Path, kind: str) -> list[dict]:
    report = analyze(run, run, ["json"], workers=1)
    return [f for f in report["findings"] if f["kind"] == kind]


def test_sockets_and_nccl_warnings_from_the_nccl_log(tmp_path):
    run = fake_run(tmp_path, {r: "node-a" if r < 4 else "node-b" for r in range(8)})
    shutil.copy(LOGS / "nccl_info_8rank.log", run / "ranks/0/nccl.log")
    found = findings(run, "nccl_transport")
    sockets = [f for f in found if "NET/Socket" in f["explanation"]]
    assert len(sockets) == 1 and sockets[0]["ranks"] == [0] and sockets[0]["evidence"][0]["via"] == "NET/Socket/0"
    assert not [f for f in found if "same host" in f["explanation"]]  # 3 -> 4 crosses hosts: IB is right
    assert any("warnings" in f["explanation"] for f in found)


def test_gpus_on_one_host_talking_over_the_network(tmp_path):
    run = fake_run(tmp_path, {r: "node-a" for r in range(8)})
    shutil.copy(LOGS / "nccl_info_8rank.log", run / "ranks/0/nccl.log")
    [same_host] = [f for f in findings(run, "nccl_transport") if "same host" in f["explanation"]]
    assert same_host["ranks"] == [0]


def _telemetry(run: Path, throttled_rank: int) -> None:
    rows = []
    for rank in (0, 1):
        for i in range(12):
            slow = rank == throttled_rank
            rows.append({"time": pd.Timestamp(T0 + 0.5 * i + 0.25, unit="s", tz="UTC"), "host": "node-a", "kind": "gpu",
                         "rank": rank, "device": rank, "gpu_util_percent": 30 if slow else 97,
                         "sm_clock_mhz": 1100 if slow else 1980, "throttled": slow,
                         "throttle": "sw_thermal_slowdown,hw_slowdown" if slow else "",
                         "throttle_reasons": 0x28 if slow else 0})
    pd.DataFrame(rows).to_parquet(run / "telemetry.parquet")


def test_throttled_and_idle_gpu_named_by_rank_and_steps(tmp_path):
    run = fake_run(tmp_path, {0: "node-a", 1: "node-a"})
    _telemetry(run, throttled_rank=1)
    [throttling] = findings(run, "gpu_throttling")
    assert throttling["ranks"] == [1] and throttling["steps"] == [1, 2, 3, 4, 5, 6]
    assert "sw_thermal_slowdown" in throttling["explanation"] and "1100 MHz against 1980 MHz" in throttling["explanation"]
    [idle] = findings(run, "low_utilization")
    assert idle["ranks"] == [1] and idle["metrics"]["observed_percent"] == 30
