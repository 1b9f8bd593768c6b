"""Telemetry field handling: NVML samples (no GPU here) and the psutil rows of live processes."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pandas as pd
import pytest

from diagtrain.profiler.collect import nvml
from diagtrain.profiler.collect.telemetry import TelemetrySampler, write_parquet
from diagtrain.profiler.run_dir import write_json_atomic

SAMPLES = json.loads((Path(__file__).parent / "fixtures" / "nvml_samples.json").read_text())["samples"]


def test_nvml_sample_becomes_a_row_in_si_units():
    row = nvml.to_row(SAMPLES[0])
    assert row["uuid"] == "5c3a9f1e-8d2b-4c1a-9e7f-0a1b2c3d4e5f"  # torch's spelling, for the join
    assert row["power_w"] == pytest.approx(689.512)
    assert row["gpu_util_percent"] == 97 and row["mem_used_bytes"] == 71940702208
    assert row["sm_clock_mhz"] == 1410 and row["temperature_c"] == 83
    assert row["throttle"] == "sw_power_cap,sw_thermal_slowdown" and row["throttled"] is True
    assert row["pcie_rx_bytes_s"] == 20480 * 1024 and row["nvlink_tx_bytes_total"] == 1048576 * 1024


def test_unsupported_queries_read_as_none_and_idle_is_not_a_slowdown():
    row = nvml.to_row(SAMPLES[1])
    assert row["throttle"] == "gpu_idle" and row["throttled"] is False
    assert row["pcie_tx_bytes_s"] is None and row["nvlink_rx_bytes_total"] is None


def test_nvml_is_unavailable_here_with_a_reason():
    with pytest.raises(nvml.NvmlUnavailable) as e:
        nvml.NvmlReader()
    assert str(e.value)


class _Replay:
    """Plays recorded samples in place of NVML (the one part that cannot run without a GPU)."""

    driver = "550.54.15"

    def read(self):
        return SAMPLES


def test_gpu_rows_are_joined_to_the_rank_that_uses_the_device(tmp_path):
    host_dir = tmp_path / "hosts" / "h"
    host_dir.mkdir(parents=True)
    (tmp_path / "ranks" / "3").mkdir(parents=True)
    write_json_atomic(tmp_path / "ranks/3/rank.json", {
        "rank": 3, "host": "h", "hostname": socket.gethostname(), "pid": os.getpid(),
        "device_uuid": "5c3a9f1e-8d2b-4c1a-9e7f-0a1b2c3d4e5f"})
    messages = []
    sampler = TelemetrySampler(tmp_path, host_dir, "h", 0.01, messages.append, gpus=_Replay())
    assert sampler.source == "nvml+psutil" and messages == []
    rows = sampler.sample()
    gpus = {r["device"]: r for r in rows if r["kind"] == "gpu"}
    assert gpus[0]["rank"] == 3 and gpus[1]["rank"] is None
    [process] = [r for r in rows if r["kind"] == "process"]
    assert process["rank"] == 3 and process["pid"] == os.getpid() and process["rss_bytes"] > 0
    assert all(r["host"] == "h" and r["time"] > 0 for r in rows)


def test_jsonl_rows_of_all_hosts_become_one_parquet_table(tmp_path):
    for host, rank in (("a", 0), ("b", 1)):
        folder = tmp_path / "hosts" / host
        folder.mkdir(parents=True)
        rows = [{"kind": "process", "rank": rank, "pid": 10 + rank, "rss_bytes": 5, "time": 1.0, "host": host}]
        (folder / "telemetry.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + '\n{"kind": "hos')
    table = pd.read_parquet(write_parquet(tmp_path))
    assert list(table["host"]) == ["a", "b"] and list(table["rank"]) == [0, 1]  # the torn line is skipped
    assert str(table["rank"].dtype) == "Int64"



# A process as busy as the host allows: a thread per core in hashlib, which releases the GIL.
ALL_CORES_BUSY = ("import hashlib, os, threading\ndata = b'x' * (1 << 22)\n"
                  "def burn():\n    while True: hashlib.sha256(data).digest()\n"
                  "for _ in range(os.cpu_count()): threading.Thread(target=burn).start()\n")


@pytest.mark.jobs
def test_no_cpu_sample_exceeds_the_hosts_cores(tmp_path):
    """CPU times count in 10 ms clock ticks: over a short window a process using every core read 450%
    on 2 cores, and the first sample of a new process (a window of microseconds) ~5,800%."""
    import subprocess
    import sys
    import time

    import psutil

    busy = subprocess.Popen([sys.executable, "-c", ALL_CORES_BUSY])
    try:
        host_dir = tmp_path / "hosts" / "h"
        host_dir.mkdir(parents=True)
        (tmp_path / "ranks" / "0").mkdir(parents=True)
        info = {"rank": 0, "host": "h", "hostname": socket.gethostname(), "pid": busy.pid}
        write_json_atomic(tmp_path / "ranks/0/rank.json", info)
        sampler = TelemetrySampler(tmp_path, host_dir, "h", 0.01, lambda _: None)
        limit = (psutil.cpu_count() or 1) * 100
        time.sleep(0.3)  # its threads are running
        first = sampler._process_row(0, info)["cpu_percent"]  # since it started: a real figure
        short = []
        for _ in range(300):
            time.sleep(0.002)
            short.append(sampler._process_row(0, info)["cpu_percent"])
        assert 0 < first <= limit and 0 <= min(short) and max(short) <= limit
        assert max(short) == limit  # some windows did round above the cores: held at their sum
        [row] = [r for r in sampler.sample() if r["kind"] == "process"]
        assert 0 <= row["cpu_percent"] <= limit
    finally:
        busy.kill()
        busy.wait()
