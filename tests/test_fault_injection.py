"""Each injected fault visibly changes what it should, on a real 2-rank job."""

from __future__ import annotations

import statistics

import pytest

from conftest import Run, phase, train

pytestmark = pytest.mark.jobs  # every test here starts processes (tests/conftest.py)

STRAGGLER_MS = 80
STALL_MS = 60
SLOW_COMM_MS = 150
HELD_MB = 256
MB = 2**20
QUIET_MS = 40  # a tiny model's phase stays far below this on 2 cores; a delay lands far above


@pytest.fixture(scope="module")
def faulty(tmp_path_factory) -> Run:
    return train(
        tmp_path_factory.mktemp("faults"), "--strategy", "ddp", "--steps", "5",
        "--inject", f"straggler:rank=1,ms={STRAGGLER_MS},steps=3-4",
        "--inject", f"dataloader_stall:rank=1,ms={STALL_MS},every=2",
        "--inject", f"mem_imbalance:rank=0,mb={HELD_MB}",
        "--inject", f"slow_comm:rank=0,ms={SLOW_COMM_MS}",
    )


def test_ground_truth_is_written(faulty):
    injected = faulty.json("injected.json")
    assert [(f["kind"], f["rank"]) for f in injected] == [
        ("straggler", 1), ("dataloader_stall", 1), ("mem_imbalance", 0), ("slow_comm", 0)]
    assert injected[0]["params"] == {"ms": STRAGGLER_MS, "steps": "3-4"}
    assert faulty.json("trainer.json")["inject"] == injected


def test_straggler_slows_forward_on_its_rank_in_its_steps_only(faulty):
    extra = [a - b for a, b in zip(phase(faulty.steps(1), "forward"), phase(faulty.steps(0), "forward"))]
    assert extra[2] >= 0.9 * STRAGGLER_MS and extra[3] >= 0.9 * STRAGGLER_MS
    assert max(extra[0], extra[1], extra[4]) < QUIET_MS


def test_dataloader_stall_every_second_step(faulty):
    data = phase(faulty.steps(1), "data")
    assert data[1] >= STALL_MS and data[3] >= STALL_MS
    assert max(data[0], data[2], data[4]) < QUIET_MS
    assert max(phase(faulty.steps(0), "data")) < QUIET_MS


def test_held_memory_raises_the_peak_of_its_rank(faulty):
    for r0, r1 in zip(faulty.steps(0), faulty.steps(1)):
        assert r0["peak_mem_bytes"] - r1["peak_mem_bytes"] > 0.8 * HELD_MB * MB


def test_slow_comm_delays_each_collective_of_its_rank(faulty):
    steps = faulty.steps(0)
    # The loss all-reduce is a Python-level collective; the gradient all-reduce goes through
    # DDP's comm hook. Each waits SLOW_COMM_MS on rank 0.
    assert min(phase(steps, "metrics")) >= SLOW_COMM_MS
    assert min(phase(steps, "backward")) >= SLOW_COMM_MS
    # Rank 1 waits for rank 0 inside the same collectives.
    assert statistics.median(r["duration_ms"] for r in faulty.steps(1)) >= 2 * SLOW_COMM_MS


def test_slow_comm_reaches_fsdp_collectives(tmp_path):
    run = train(tmp_path, "--strategy", "fsdp", "--steps", "2", "--inject", "slow_comm:rank=1,ms=30")
    # FSDP2 issues one all-gather per block and the root in forward (5 here): each waits 30 ms.
    assert min(phase(run.steps(1), "forward")) >= 5 * 30


def test_hang_skips_a_collective_and_the_job_times_out(gloo_timeout_run):
    run = gloo_timeout_run
    assert run.returncode != 0
    # Rank 1 skipped step 3's loss all-reduce and finished that step; rank 0 waits in it.
    assert [r["step"] for r in run.steps(1)] == [1, 2, 3]
    assert [r["step"] for r in run.steps(0)] == [1, 2]
    assert "Timed out" in run.stderr or "timed out" in run.stderr.lower()
