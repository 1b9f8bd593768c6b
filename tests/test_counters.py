"""The always-on counters on plain user scripts (no diagtrain import, no --profile-steps): who waits
in collectives, who waits for data, and the verdicts drawn from them alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import Run, diagtrain_run, on_training, torchrun

from diagtrain.profiler.rank.counters import LEARN_STEPS, Counters, PhaseClock

pytestmark = pytest.mark.jobs  # every test here starts processes (tests/conftest.py)

PLAIN_JOB = Path(__file__).parent / "scripts" / "plain_job.py"
SLEEP_MS = 150  # rank 1's pause before forward: far above the ~10 ms a step takes here
STALL_MS = 120  # rank 0's slow batch, every 3rd step
STALLS = [3, 6]
# Every rank waits this long for the slowest at its collectives; far above scheduling noise.
MOST = 0.6


def plain_run(out: Path, mode: str, steps: int = 8, **knobs: object) -> Run:
    env = {"MODE": mode, "STEPS": str(steps), **{k: str(v) for k, v in knobs.items()}}
    return diagtrain_run(out, "--profile-steps", "none", "--", *torchrun(2), str(PLAIN_JOB), env=env)


@pytest.fixture(scope="module")
def ddp_faults(tmp_path_factory) -> Run:
    """DDP with a DataLoader: rank 1 pauses before forward every step, rank 0's data stalls every 3rd."""
    return plain_run(tmp_path_factory.mktemp("ddp") / "run", "ddp", SLEEP_RANK=1, SLEEP_MS=SLEEP_MS,
                     SLOW_DATA_RANK=0, SLOW_DATA_MS=STALL_MS, SLOW_EVERY=3)


def steady(run: Run, rank: int) -> dict[int, dict]:
    """Step records after step 2 (step 1 has start-up, step 2 DDP's bucket rebuild)."""
    return {r["step"]: r for r in run.steps(rank) if r["step"] > 2}


def report(run: Run) -> dict:
    return run.json("report.json")


def test_the_fast_rank_waits_in_collectives_the_slow_one_does_not(ddp_faults):
    fast, slow = steady(ddp_faults, 0), steady(ddp_faults, 1)
    for step in set(fast) - set(STALLS):
        # Rank 0 is blocked in DDP's gradient all-reduce (waited for in C++ at the end of backward).
        assert fast[step]["comm_ms"] >= MOST * SLEEP_MS, fast[step]
        assert fast[step]["phase_comm_ms"]["backward"] >= MOST * SLEEP_MS
        assert slow[step]["comm_ms"] < (1 - MOST) * SLEEP_MS, slow[step]
        own = {r: rec["duration_ms"] - rec["comm_ms"] for r, rec in ((0, fast[step]), (1, slow[step]))}
        assert own[1] - own[0] >= MOST * SLEEP_MS
    for record in [*fast.values(), *slow.values()]:
        assert record["comm_calls"] >= 1 and record["cpu_ms"] > 0 and record["runq_ms"] >= 0
        assert {"data", "forward", "backward", "optimizer"} <= set(record["phases_ms"])


def test_data_wait_is_counted_on_the_stalled_rank_only(ddp_faults):
    stalled, other = steady(ddp_faults, 0), steady(ddp_faults, 1)
    for step in stalled:
        data = stalled[step]["phases_ms"]["data"]
        assert data >= MOST * STALL_MS if step in STALLS else data < (1 - MOST) * STALL_MS, (step, data)
        assert other[step]["phases_ms"]["data"] < (1 - MOST) * STALL_MS


def test_straggler_and_data_stall_found_from_the_counters_alone(ddp_faults):
    assert not list(ddp_faults.out.glob("ranks/*/trace-*"))
    findings = report(ddp_faults)["findings"]
    [straggler] = [f for f in findings if f["kind"] == "straggler"]
    assert straggler["ranks"] == [1] and straggler["severity"] in ("warning", "error")
    assert straggler["metrics"]["source"] == "counters"
    assert straggler["metrics"]["excess_ms"] == pytest.approx(SLEEP_MS, rel=0.3)
    [stall] = [f for f in findings if f["kind"] == "dataloader_stall"]
    assert stall["ranks"] == [0] and stall["steps"] == STALLS and stall["metrics"]["period_steps"] == 3
    assert [f for f in on_training(findings)
            if f["severity"] != "info" and f["kind"] not in ("straggler", "dataloader_stall")] == []


@pytest.mark.parametrize("mode", ["fsdp", "pp"])
def test_a_straggler_in_fsdp_and_pipeline_scripts(tmp_path, mode):
    run = plain_run(tmp_path / "run", mode, steps=6, SLEEP_RANK=1, SLEEP_MS=SLEEP_MS)
    waiting, slow = steady(run, 0), steady(run, 1)
    for step in waiting:
        # FSDP2: rank 0 waits in the all-gathers of forward (Work.wait); pipelining: stage 0
        # waits to receive stage 1's gradients (p2p waits).
        assert waiting[step]["comm_ms"] >= MOST * SLEEP_MS, waiting[step]
        assert slow[step]["comm_ms"] < (1 - MOST) * SLEEP_MS, slow[step]
        assert waiting[step]["comm_calls"] == slow[step]["comm_calls"] > 0
    found = report(run)["findings"]
    if mode == "fsdp":
        [straggler] = [f for f in found if f["kind"] == "straggler"]
        assert straggler["ranks"] == [1] and straggler["metrics"]["source"] == "counters"
    else:  # the counted sends show two stages, which are not peers: the slow one is the pipeline's bottleneck
        [bottleneck] = [f for f in found if f["kind"] == "pipeline_bubble"]
        assert bottleneck["ranks"] == [1] and bottleneck["metrics"]["bottleneck_stage"] == 1, bottleneck["explanation"]
        assert bottleneck["metrics"]["compared_by"] == "time outside communication (counters)"
        assert not [f for f in found if f["kind"] == "straggler"]


def test_phases_never_overlap():
    clock = PhaseClock()
    clock.enter("backward")
    clock.enter("forward")  # activation checkpointing: forward re-run inside backward
    clock.exit("forward")
    clock.add_comm(0.5)
    clock.exit("backward")
    clock.exit("backward")  # an unmatched exit changes nothing
    clock.enter("forward")
    clock.enter("forward")  # a module inside the model
    clock.exit("forward")
    totals, comm = clock.take()
    assert set(totals) == {"backward", "forward"} and comm == {"backward": 0.5}
    clock.exit("forward")  # the outer module ends after the step boundary: counted in the next step
    later, _ = clock.take()
    assert set(later) == {"forward"} and clock.take() == ({}, {})


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="Linux's scheduler statistics")
def test_the_run_queue_inside_a_wait_is_told_apart():
    """A thread woken from a blocking wait queues for a CPU before the wait returns: on a CPU shared with a busy
    process the thread waits for it inside a timed wait as outside one, and the part inside is comm_runq_ms."""
    cpu = min(os.sched_getaffinity(0))
    hog = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}}); print(flush=True)\n"
                            "while True: pass"], stdout=subprocess.PIPE)
    mine = os.sched_getaffinity(0)
    try:
        hog.stdout.readline()  # it spins on that CPU now
        os.sched_setaffinity(0, {cpu})  # this thread: the one the counters follow
        counters = Counters()
        before = counters.read()
        _spin(0.2)  # half of it waiting for the CPU the hog holds
        started = counters.comm_begin()
        _spin(0.2)  # the same, inside a wait
        counters.comm_end(started)
        fields = counters.read().since(before)
    finally:
        os.sched_setaffinity(0, mine)
        hog.kill()
        hog.wait()
    assert fields["runq_ms"] > 100.0, fields  # two threads on one CPU: ~200 ms of the 400 waiting
    assert 0.3 * fields["runq_ms"] < fields["comm_runq_ms"] < 0.7 * fields["runq_ms"], fields
    assert fields["comm_runq_ms"] < counters.comm_s * 1e3 < 250.0  # inside the wait's time, which is the second spin


def test_the_hooks_never_break_the_program(capsys):
    class Unhashable(torch.nn.Linear):  # __eq__ without __hash__: not a set member
        __eq__ = lambda self, other: self is other  # noqa: E731

    counters = Counters()
    counters.set_phase_tracking(True)
    try:
        model = Unhashable(4, 4)
        for _ in range(LEARN_STEPS + 1):
            model(torch.randn(2, 4))
            counters.step_ended()
        totals, _ = counters.phases.take()
        assert totals["forward"] > 0 and counters._global_hooks  # no root learned: the global hooks stay
    finally:
        counters.set_phase_tracking(False)
    os.close(counters._schedstat)  # a failure of the counters' own: they stand down, once, and say so
    assert counters.read() is None and counters.read() is None and counters.comm_begin() is None
    assert capsys.readouterr().err.count("diagtrain: step counters disabled: OSError") == 1


@pytest.mark.parametrize("batch,samples", [
    (torch.zeros(16, 3), 16),
    ((torch.zeros(8, 3), torch.zeros(8)), 8),
    ({"input_ids": torch.zeros(4, 128, dtype=torch.long), "labels": torch.zeros(4, 128)}, 4),
    ([[torch.zeros(2, 5)]], 2),
    (["a caption", "another"], None),  # no tensor to tell
    (torch.tensor(3.0), None),  # a scalar is not a batch
    ((), None),
])
def test_the_samples_of_a_batch(batch, samples):
    counters = Counters()
    counters.batch_loaded(batch)
    counters.batch_loaded(batch)  # two batches in one step (gradient accumulation) add up
    assert counters.take_samples() == (2 * samples if samples else None) and counters.take_samples() is None
