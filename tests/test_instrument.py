"""The StepRecorder in one process: records, phases, per-step peak memory, profiler windows."""

import json
import time

import torch
from conftest import load_trace

from diagtrain.profiler.rank.instrument import StepRecorder

MB = 2**20


def _loop(rec: StepRecorder, steps: int, hold_mb_at: int | None = None) -> None:
    for step in range(1, steps + 1):
        with rec.phase("data"):
            time.sleep(0.01)
        with rec.phase("forward"):
            x = torch.randn(64, 64) @ torch.randn(64, 64)
            if step == hold_mb_at:
                big = torch.ones(200 * MB // 4)  # touched, so resident
                del big
        rec.step(samples=4, loss=float(x.sum()))


def test_records_one_line_per_step_with_phases(tmp_path):
    with StepRecorder(tmp_path, rank=3) as rec:
        _loop(rec, 3)
    lines = (tmp_path / "ranks/3/steps.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert r["rank"] == 3 and r["samples"] == 4 and r["schema_version"] == 1
        assert set(r["phases_ms"]) == {"data", "forward"}
        assert r["phases_ms"]["data"] >= 10.0  # the sleep
        assert sum(r["phases_ms"].values()) <= r["duration_ms"] + 0.01
        assert r["end"] > r["start"]
    assert records[1]["start"] >= records[0]["end"] - 1e-3
    heartbeat = json.loads((tmp_path / "ranks/3/heartbeat").read_text())
    assert heartbeat["step"] == 3


def test_peak_memory_is_per_step(tmp_path):
    with StepRecorder(tmp_path, rank=0) as rec:
        _loop(rec, 3, hold_mb_at=2)
    peaks = [json.loads(line)["peak_mem_bytes"] for line in (tmp_path / "ranks/0/steps.jsonl").read_text().splitlines()]
    assert peaks[1] - peaks[0] > 150 * MB
    # The counter is reset each step on Linux, so step 3 no longer carries step 2's peak.
    assert peaks[1] - peaks[2] > 150 * MB


def test_profiles_only_the_asked_windows_with_step_annotations(tmp_path):
    with StepRecorder(tmp_path, rank=0, profile_steps="2-3,5") as rec:
        _loop(rec, 5)
    traces = sorted(p.name for p in (tmp_path / "ranks/0").glob("trace-*.json.gz"))
    assert traces == ["trace-rank0-steps2-3.json.gz", "trace-rank0-steps5-5.json.gz"]
    trace = load_trace(tmp_path / "ranks/0" / traces[0])
    names = [e.get("name", "") for e in trace["traceEvents"]]
    assert sorted(n for n in names if n.startswith("ProfilerStep#")) == ["ProfilerStep#2", "ProfilerStep#3"]
    assert names.count("diagtrain.phase.forward") == 2
    assert any(n == "aten::mm" for n in names)
    assert trace["record_shapes"] == 1 and trace["profile_memory"] == 1
    assert not list((tmp_path / "ranks/0").glob(".tmp*")), "temp files left behind"


def test_window_cut_short_is_still_exported(tmp_path):
    with StepRecorder(tmp_path, rank=0, profile_steps="3-10") as rec:
        _loop(rec, 4)
    trace = load_trace(tmp_path / "ranks/0/trace-rank0-steps3-10.json.gz")
    steps = sorted(e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#3", "ProfilerStep#4"]


def test_does_nothing_without_a_run_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("DIAGTRAIN_RUN_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    with StepRecorder(profile_steps="1-2") as rec:
        _loop(rec, 2)
    assert rec.step_num == 3
    assert list(tmp_path.iterdir()) == []


def test_run_directory_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAGTRAIN_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("DIAGTRAIN_PROFILE_STEPS", "1")
    with StepRecorder(rank=1) as rec:
        _loop(rec, 2)
    assert len((tmp_path / "ranks/1/steps.jsonl").read_text().splitlines()) == 2
    assert (tmp_path / "ranks/1/trace-rank1-steps1-1.json.gz").exists()
