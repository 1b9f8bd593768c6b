"""Memory over time: the always-on memory counters in every step record, and the memory_growth
detector on hand-made records (a leak, a warm-up plateau, a single jump) and on a real leaking job."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import diagtrain_run, on_training, torchrun

from diagtrain.profiler.analyzer.analyze import analyze
from diagtrain.profiler.analyzer.judge.detectors import memory_growth
from diagtrain.profiler.analyzer.judge.detectors.memory_growth import theil_sen
from diagtrain.profiler.analyzer.judge.verdict import verdict
from diagtrain.profiler.analyzer.report.wording import explanation
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.rank.counters import Counters, gpu_memory_fields
from diagtrain.profiler.run_dir import write_json_atomic

MIB = 2**20
T0 = 1_790_000_000.0
STEP_S = 0.5
DDP_LOADER = Path(__file__).resolve().parent.parent / "benchmarks" / "user_scripts" / "ddp_loader.py"


def fake_run(root: Path, memory: dict[int, list[float]], column: str = "rss_bytes") -> Path:
    """Ranks' step records (as `diagtrain run` writes them) with ``column`` taking the given bytes, step by step."""
    for rank, values in memory.items():
        folder = root / "ranks" / str(rank)
        folder.mkdir(parents=True)
        write_json_atomic(folder / "rank.json", {"rank": rank, "host": "node-a", "hostname": "node-a", "pid": 1,
                                                 "world_size": len(memory)})
        lines = [json.dumps({"rank": rank, "step": s, "start": T0 + (s - 1) * STEP_S, "end": T0 + s * STEP_S,
                             "duration_ms": STEP_S * 1e3, "phases_ms": {"forward": 150.0, "backward": 300.0},
                             "peak_mem_bytes": int(v), column: int(v)}) for s, v in enumerate(values, start=1)]
        (folder / "steps.jsonl").write_text("\n".join(lines) + "\n")
    return root


def growth_findings(run: Path) -> list[dict]:
    report = analyze(run, run, ["json"], workers=1)
    return [f for f in report["findings"] if f["kind"] == "memory_growth"]


def noisy(values: list[float], seed: int, mib: float = 0.3) -> list[float]:
    """The values with the page-level jitter of a real heap (a few hundred KiB either way)."""
    return list(np.asarray(values) + np.random.default_rng(seed).normal(0.0, mib * MIB, len(values)))


STEPS = 14
WARMUP = [300 * MIB, 330 * MIB, 345 * MIB]  # a clean rank's first steps: pools and caches filling
PLATEAU = WARMUP + [350 * MIB] * (STEPS - len(WARMUP))


def test_a_steady_rise_on_one_rank_is_found_with_its_rate(tmp_path):
    leak = WARMUP + [350 * MIB + 6 * MIB * i for i in range(STEPS - len(WARMUP))]
    run = fake_run(tmp_path, {0: noisy(PLATEAU, 0), 1: noisy(leak, 1)})
    [found] = growth_findings(run)
    assert found["ranks"] == [1] and found["steps"] == list(range(4, STEPS + 1))
    assert found["severity"] == "warning"  # no telemetry: no capacity to project
    assert found["metrics"]["observed_mib_per_step"] == pytest.approx(6.0, rel=0.05)
    assert found["metrics"]["mib_per_min"] == pytest.approx(6.0 * 60 / STEP_S, rel=0.05)
    assert found["metrics"]["growth_bytes"] == pytest.approx(60 * MIB, rel=0.05)
    assert "rank 1" in found["explanation"] and "6.0 MiB a step" in found["explanation"]
    assert "loss.item()" in found["suggestion"]
    assert found["settings"]["memory_growth.min_rate_mib"] == 1.0


def test_a_rise_that_movements_every_rank_shares_hide_is_growth_against_its_peers(tmp_path):
    """Every rank's heap moves by up to 12 MiB a step together (gc, the allocator); rank 1 also keeps 5 MiB a step.
    Its own series rises in too few steps to be called a leak; less its peers' movements it rises in every one."""
    steps = 40
    shared = np.random.default_rng(7).normal(0.0, 8 * MIB, steps)
    flat = [350 * MIB + x for x in shared]
    leak = [360 * MIB + 5 * MIB * max(i - 3, 0) + x for i, x in enumerate(shared)]
    [found] = growth_findings(fake_run(tmp_path / "leak", {0: flat, 1: leak, 2: list(np.asarray(flat) + MIB)}))
    assert found["ranks"] == [1] and found["metrics"]["against_peers"] is True
    assert found["metrics"]["observed_mib_per_step"] == pytest.approx(5.0, abs=0.5)
    assert "against its peers" in found["explanation"]
    # The same rank alone, its peers' movements not its own: not enough rising steps to be sure of a leak.
    own = memory_growth._growth(1, "rss_bytes", pd.DataFrame({"step": range(5, steps + 1), "rss_bytes": leak[4:],
                                                               "wall_ms": 500.0}), memory_growth.MemoryGrowth())
    assert own is None
    # A one-off jump on one rank (a cache filled once) is no growth against its peers either.
    jump = [360 * MIB + (60 * MIB if i >= 20 else 0.0) + x for i, x in enumerate(shared)]
    assert not growth_findings(fake_run(tmp_path / "jump", {0: flat, 1: jump, 2: list(np.asarray(flat) + MIB)}))
    # Every rank rising alike is each rank's own growth, or none: never one rank's against the others.
    alike = growth_findings(fake_run(tmp_path / "alike", {0: leak, 1: list(np.asarray(leak) + MIB)}))
    assert not any(f["metrics"].get("against_peers") for f in alike)


def test_a_plateau_after_warm_up_and_a_single_jump_are_not_leaks(tmp_path):
    # Rank 1: flat, then 200 MiB at once (a cache filled once), with a heap's creep of 8 KiB a step.
    jump = [350 * MIB + (200 * MIB if s >= 8 else 0) + 8 * 1024 * s for s in range(STEPS)]
    # Rank 2: a slow creep well under a MiB a step, in every step.
    creep = [350 * MIB + 0.4 * MIB * s for s in range(STEPS)]
    # Rank 3: a staircase of an allocator's pools, 3 rises of 40 MiB in 11 steps.
    stairs = [350 * MIB + 40 * MIB * (s // 4) for s in range(STEPS)]
    run = fake_run(tmp_path, {0: noisy(PLATEAU, 0), 1: jump, 2: noisy(creep, 2, mib=0.05), 3: stairs})
    assert growth_findings(run) == []


def test_gpu_memory_that_will_fill_the_device_is_an_error(tmp_path):
    allocated = [2**30 + 64 * MIB * s for s in range(STEPS)]  # 64 MiB a step from 1 GiB
    run = fake_run(tmp_path, {0: [2**30] * STEPS, 1: allocated}, column="gpu_allocated_bytes")
    rows = [{"time": pd.Timestamp(T0 + 0.5 * i + 0.25, unit="s", tz="UTC"), "host": "node-a", "kind": "gpu",
             "rank": rank, "device": rank, "mem_total_bytes": 80 * 2**30,
             "mem_used_bytes": (allocated[min(i, STEPS - 1)] if rank == 1 else 2**30) + 512 * MIB}
            for rank in (0, 1) for i in range(STEPS)]
    pd.DataFrame(rows).to_parquet(run / "telemetry.parquet")
    [found] = growth_findings(run)
    assert found["ranks"] == [1] and found["severity"] == "error"
    assert found["metrics"]["memory"] == "gpu_allocated_bytes"
    assert found["metrics"]["capacity_bytes"] == 80 * 2**30
    # (80 GiB - 1 GiB - 13 * 64 MiB - 512 MiB) / 64 MiB a step after step 14
    headroom = 80 * 2**30 - allocated[-1] - 512 * MIB
    assert found["metrics"]["projected_full_step"] == STEPS + int(np.ceil(headroom / (64 * MIB)))
    assert "would be full by step" in found["explanation"]


def steps_table(memory: dict[int, list[float]], profiled: range) -> pd.DataFrame:
    """The analysis' steps table of ranks with this RSS per step, ``profiled`` steps traced."""
    return pd.DataFrame([{"rank": rank, "step": s, "start": T0 + s * STEP_S, "end": T0 + (s + 1) * STEP_S,
                          "wall_ms": STEP_S * 1e3, "rss_bytes": v, "profiled": s in profiled}
                         for rank, values in memory.items() for s, v in enumerate(values, start=1)])


def test_the_profilers_own_memory_is_not_a_leak():
    """Kineto keeps its events in host memory while it records (FSDP2 here: 14-19 MiB a step) and
    builds its trace after the window: a clean rank's RSS rises in steps 4-8 of a 10-step run
    profiled in steps 4-7. A leak of 16 MiB a step is still found from the steps left (9, 10)."""
    clean = [346, 350, 363, 378, 392, 408, 424, 431, 430, 423]  # MiB, a real FSDP2 rank
    leak = [362, 381, 397, 413, 441, 469, 497, 511, 527, 543]
    table = steps_table({0: [v * MIB for v in clean], 1: [v * MIB for v in leak]}, profiled=range(4, 8))
    [found] = memory_growth.detect(Tables(steps=table, ranks=pd.DataFrame(), collectives=pd.DataFrame(), phases=[]))
    assert found.ranks == [1] and found.metrics["observed_mib_per_step"] == pytest.approx(16.0)
    assert found.metrics["own_growth_bytes"] == 32 * MIB and "steps 5-8, profiled" in explanation(verdict(found, []))


def test_theil_sen_ignores_a_few_outliers():
    x = np.arange(20, dtype=float)
    y = 3.0 * x + 10.0
    y[[4, 11]] += 500.0
    assert theil_sen(x, y) == pytest.approx(3.0)


def test_gpu_memory_fields_from_the_allocators_statistics():
    # torch.cuda.memory_stats_as_nested_dict(device), trimmed, as an H100 rank gave it mid-training.
    stats = {"allocated_bytes": {"all": {"current": 3_221_225_472, "peak": 5_368_709_120, "allocated": 9 * 2**40,
                                         "freed": 9 * 2**40 - 3_221_225_472},
                                 "large_pool": {"current": 3_200_000_000, "peak": 5_300_000_000}},
             "reserved_bytes": {"all": {"current": 6_442_450_944, "peak": 6_442_450_944}},
             "num_alloc_retries": 0, "num_ooms": 0}
    assert gpu_memory_fields(stats) == {"gpu_allocated_bytes": 3_221_225_472, "gpu_reserved_bytes": 6_442_450_944,
                                        "gpu_peak_bytes": 5_368_709_120, "gpu_peak_since": "start"}
    assert gpu_memory_fields(stats, peak_since_step=True)["gpu_peak_since"] == "step"
    assert gpu_memory_fields({}) == {}  # an allocator that keeps no statistics
    assert gpu_memory_fields({"allocated_bytes": None}) == {}


def test_no_gpu_fields_and_no_cuda_start_on_a_cpu_job():
    import torch

    counters = Counters()
    assert counters.gpu_memory() == {} and counters.gpu_memory(torch.device("cpu")) == {}
    assert not torch.cuda.is_initialized()
    reading = counters.read()
    assert reading.rss_bytes > 50 * MIB  # this process, with torch imported
    assert reading.since(reading)["rss_bytes"] == reading.rss_bytes


@pytest.mark.jobs
def test_a_leaking_rank_of_a_real_job(tmp_path):
    """A 2-rank DDP job in which rank 1 keeps each step's loss and 16 MiB of outputs: memory_growth names
    rank 1, rank 0 stays clean, and steps.parquet carries rss_bytes for every step."""
    steps = 12
    run = diagtrain_run(tmp_path / "run", "--profile-steps", "none", "--", *torchrun(2), str(DDP_LOADER),
                        "--steps", str(steps), "--leak-rank", "1", "--leak-mb", "16")
    for rank in (0, 1):
        records = run.steps(rank)
        assert [r["step"] for r in records] == list(range(1, steps + 1))
        assert all(r["rss_bytes"] > 50 * MIB and "gpu_allocated_bytes" not in r for r in records)
    leaked = [r["rss_bytes"] for r in run.steps(1)]
    assert leaked[-1] - leaked[3] >= 0.8 * 16 * MIB * (steps - 4)
    findings = on_training(run.json("report.json")["findings"])
    growth = [f for f in findings if f["kind"] == "memory_growth"]
    assert [f["ranks"] for f in growth] == [[1]], growth
    assert growth[0]["metrics"]["observed_mib_per_step"] == pytest.approx(16.0, rel=0.25)
    # Its peak stands above rank 0's because of the growth: one finding for one cause.
    assert not [f for f in findings if f["kind"] == "memory_imbalance"]
    table = pd.read_parquet(run.out / "analysis" / "steps.parquet")
    assert len(table) == 2 * steps and table["rss_bytes"].notna().all()
    assert "gpu_allocated_bytes" not in table  # a CPU job: no GPU columns at all
