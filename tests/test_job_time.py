"""Where the whole job's time went (run/job_time.py): the job's wall time in categories that add up to it, and
the findings of time every rank loses together (input_bound, periodic_stall, slow_startup), judged from
synthetic step records without a job; one real job of a plain script at the end."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from prometheus_client import CollectorRegistry, generate_latest

import diagtrain
from conftest import diagtrain_run, torchrun
from diagtrain.profiler.analyzer.analyze import analyze
from diagtrain.profiler.analyzer.judge.detectors.periodic_stall import PeriodicStall, period
from diagtrain.profiler.analyzer.judge.live_judge import JobSoFar
from diagtrain.profiler.analyzer.run import job_time
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.collect.metrics import LiveMetrics
from diagtrain.profiler.compare.regression import compare
from diagtrain.profiler.compare.summary import summarize
from synthetic_runs import FIRST_STEP_AT, STEPS, T0, TEARDOWN_S, job_run

def analyzed(run: Path) -> dict:
    return analyze(run, run, ["json", "md"], workers=1)


def of_kind(report: dict, kind: str) -> list[dict]:
    return [f for f in report["findings"] if f["kind"] == kind]


def test_the_categories_add_up_to_the_wall_time_and_the_start_up_splits_where_the_ranks_said(tmp_path):
    report = analyzed(job_run(tmp_path / "run", gaps={12: 30.0}))
    section = report["job_time"]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert sum(section["seconds"].values()) == pytest.approx(manifest["ended_at"] - manifest["started_at"], abs=1e-3)
    assert section["wall_s"] == pytest.approx(manifest["ended_at"] - manifest["started_at"], abs=1e-3)
    assert section["seconds"]["teardown"] == pytest.approx(TEARDOWN_S, abs=1e-3)
    s = section["startup"]
    assert s["launch"] == pytest.approx(1.0, abs=1e-3) and s["imports"] == pytest.approx(2.0, abs=1e-3)
    assert s["process group"] == pytest.approx(0.5, abs=1e-3)
    # Launch to step 1's start (1.5 s after the process group), and step 1's 900 ms of start-up beyond a steady step.
    assert s["set-up and first steps"] == pytest.approx(1.5 + 0.9, abs=0.01)
    # A steady step: 68 ms of work (data 1, compute 65, outside 2) and 1 ms of all-reduce.
    per_step = section["per_step_ms"]
    assert per_step["data"] == pytest.approx(1.0, abs=0.05) and per_step["other"] == pytest.approx(2.0, abs=0.05)
    assert per_step["compute"] == pytest.approx(65.0, abs=0.5)
    assert per_step["communication"] == pytest.approx(1.0, abs=0.1)
    # The 30 ms between steps 11 and 12 is between steps, not any step's work.
    assert per_step["between"] * section["steady_steps"] == pytest.approx(30.0, abs=0.01)
    assert section["goodput"] == pytest.approx(section["seconds"]["compute"] / section["wall_s"], abs=1e-3)
    steps = pd.read_parquet(tmp_path / "run" / "analysis" / "job_steps.parquet")
    parts = steps[[job_time.column(c) for c in job_time.STEP_CATEGORIES]].sum(axis=1)
    assert parts.to_numpy() == pytest.approx(steps["time_ms"].to_numpy(), abs=1e-6)


def test_every_rank_waiting_for_its_own_data_is_a_job_bound_by_its_input(tmp_path):
    report = analyzed(job_run(tmp_path / "run", lambda r, s: {"data": 60.0 + r}))
    [found] = of_kind(report, "input_bound")
    assert found["severity"] == "error"  # 60 ms of a 129 ms step: nearly half the run
    assert found["ranks"] == [0, 1]
    assert found["impact_ms"] == pytest.approx(61.0, abs=1.5)  # what a loader ahead of the model takes off a step
    assert found["metrics"]["share_of_step"] == pytest.approx(61.0 / 130.0, abs=0.02)
    assert "num_workers" in found["suggestion"] and "in every step" in found["explanation"]
    # Nobody's excess: no rank's stall, and the job's ledger holds it as data loading.
    assert not of_kind(report, "dataloader_stall") and not of_kind(report, "straggler")
    assert report["job_time"]["seconds"]["data"] > 0.4 * sum(
        v for c, v in report["job_time"]["seconds"].items() if c not in ("startup", "teardown"))


def test_one_rank_waiting_for_its_data_is_its_own_stall_not_the_jobs(tmp_path):
    report = analyzed(job_run(tmp_path / "run", lambda r, s: {"data": 60.0} if r == 1 else {}))
    assert not of_kind(report, "input_bound")
    assert [f["ranks"] for f in of_kind(report, "dataloader_stall")] == [[1]]
    # The job's ledger holds rank 1's excess as the wait for a slower rank, not as every rank's data loading.
    seconds = report["job_time"]["seconds"]
    assert seconds["imbalance"] > 10 * seconds["data"]


def test_every_rank_waiting_for_data_in_the_same_steps_is_the_jobs_wait_not_one_ranks_for_another(tmp_path):
    # 30 ms every 7th step: under a periodic stall's bar (half a step), a data stall of every rank at once.
    report = analyzed(job_run(tmp_path / "run", lambda r, s: {"data": 30.0} if s % 7 == 0 else {}, steps=60))
    [found] = of_kind(report, "dataloader_stall")
    assert found["ranks"] == [0, 1] and found["steps"] == [7, 14, 21, 28, 35, 42, 49, 56]
    assert "every rank waits, in the same steps," in found["explanation"]
    assert "the job waits for its input" in found["explanation"] and "wait for it" not in found["explanation"]
    assert found["impact_ms"] == pytest.approx(8 * 30.0 / 59, rel=0.1)  # the job loses each stall once, not per rank


def test_every_rank_slow_every_fifth_step_is_a_periodic_stall_named_with_its_period_and_part(tmp_path):
    stalled = lambda r, s: {"outside": 100.0 + 5 * r} if s % 5 == 0 else {}  # noqa: E731 - a checkpoint every 5
    report = analyzed(job_run(tmp_path / "run", stalled))
    [found] = of_kind(report, "periodic_stall")
    assert found["steps"] == [5, 10, 15, 20] and found["metrics"]["period_steps"] == 5
    assert found["metrics"]["part"] == "outside phases"
    # Four stalls of ~105 ms over 23 steady steps; one rank's 5 ms more is part of the stall, not a straggler.
    assert found["impact_ms"] == pytest.approx(4 * 105.0 / 23, rel=0.05)
    assert found["severity"] == "warning"  # 18 ms a step of an ~87 ms average step: a fifth of the run
    assert "every 5 steps" in found["explanation"] and "async_save" in found["suggestion"]
    assert not of_kind(report, "straggler")


# The data wait (ms) and the checkpoint after steps 4, 8, 12 and 16 (work outside the phases) of the real job below, in
# a run that missed its periodic_stall: the transform's CPU time in the main process, on a host the suite shared, varied
# from 65 to 137 ms.
LOADED_DATA_MS = [84.0, 68.1, 97.7, 94.0, 112.1, 137.2, 98.9, 102.0, 65.3, 65.2, 108.7, 108.3, 118.6, 65.3, 65.3, 102.6,
                  107.3, 109.5]
CHECKPOINT_MS = {5: 170.2, 9: 189.9, 13: 112.6, 17: 152.9}


def test_a_checkpoint_every_four_steps_is_found_beside_a_data_wait_that_a_busy_host_makes_noisy(tmp_path):
    def loaded(r, s):
        return {"data": LOADED_DATA_MS[s - 1] - 1.0, "outside": CHECKPOINT_MS.get(s, 0.0)}
    report = analyzed(job_run(tmp_path / "run", loaded, steps=len(LOADED_DATA_MS)))
    # The whole step's noise (the data wait's: 51 ms) put its bar 153 ms above the typical step, over the checkpoints
    # after steps 8 and 12 (153 and 129 ms above it, the data wait short in step 13): two stalls of four left, no
    # period. The work outside the phases, 2 ms in every other step, holds each checkpoint far above its own noise.
    [found] = of_kind(report, "periodic_stall")
    assert found["steps"] == [5, 9, 13, 17] and found["metrics"]["period_steps"] == 4
    assert found["metrics"]["part"] == "outside phases" and found["metrics"]["unperiodic_stalls"] == []
    assert found["metrics"]["stall_ms"] == pytest.approx(161.0, abs=25.0)  # the checkpoints' median, with the data wait


def test_one_rank_slow_every_fifth_step_is_its_straggler_not_a_stall_of_the_job(tmp_path):
    report = analyzed(job_run(tmp_path / "run", lambda r, s: {"outside": 150.0} if s % 5 == 0 and r == 0 else {}))
    assert not of_kind(report, "periodic_stall")
    assert [f["ranks"] for f in of_kind(report, "straggler")] == [[0]]


def test_a_clean_job_loses_nothing_together(tmp_path):
    """A warm-up step, a batch size that changes (its data wait 1-4 ms), gradient accumulation's longer steps
    every other step (twice the forward and backward): no finding of the job's."""
    def varied(r, s):
        return {"data": float(s % 4), **({"forward": 20.0, "backward": 40.0} if s % 2 == 0 else {})}
    report = analyzed(job_run(tmp_path / "run", varied))
    assert not [f for f in report["findings"] if f["kind"] in ("input_bound", "periodic_stall", "slow_startup")]


def test_a_long_start_up_is_slow_startup_with_its_longest_part(tmp_path):
    report = analyzed(job_run(tmp_path / "run", launch_s=300.0))  # the process group ready 296.5 s after the launch
    [found] = of_kind(report, "slow_startup")
    assert found["metrics"]["longest"] == "set-up and first steps"
    assert found["metrics"]["startup_s"] == pytest.approx(300.0 + 0.9, abs=0.1)
    assert found["severity"] == "warning"  # nearly all of the run, once
    assert not of_kind(analyzed(job_run(tmp_path / "short")), "slow_startup")  # 5 s: not worth a look


def test_diagtrains_profiler_writing_a_trace_is_its_own_category():
    """Steps 2-3 profiled: the 40 ms before step 4 is the trace being written; the 20 ms before step 6 is the job's."""
    gaps = {4: 40.0, 6: 20.0}
    rows, start = [], T0
    for s in range(1, 7):
        start += gaps.get(s, 0.0) / 1e3
        rows += [{"rank": r, "step": s, "start": start, "end": start + 0.1, "wall_ms": 100.0, "profiled": s in (2, 3)}
                 for r in (0, 1)]
        start += 0.1
    steps = pd.DataFrame(rows)
    ledger = steps[["rank", "step", "wall_ms"]].assign(lost_ms=0.0, work_forward_ms=100.0, excess_forward_ms=0.0)
    job = job_time.build(Tables(steps=steps, ranks=pd.DataFrame(), collectives=pd.DataFrame(), phases=["forward"],
                                ledger=ledger)).set_index("step")
    assert job["profiler_ms"].to_dict() == {1: 0.0, 2: 0.0, 3: 0.0, 4: pytest.approx(40.0, abs=1e-3), 5: 0.0, 6: 0.0}
    assert job["between_ms"].to_dict() == {1: 0.0, 2: 0.0, 3: 0.0, 4: 0.0, 5: 0.0, 6: pytest.approx(20.0, abs=1e-3)}
    assert job.loc[4, "time_ms"] == pytest.approx(140.0, abs=1e-3) and job.loc[4, "compute_ms"] == pytest.approx(100.0)


def test_a_device_idle_before_its_steps_is_data_loading_up_to_its_hosts_data_wait():
    """On a GPU (steps timed on the device) the host's phases say nothing of the device's step: its busy time is
    computing, its idle time before the step data loading up to its host's data wait, and the rest other work."""
    ledger = pd.DataFrame({"rank": [0, 1], "step": [3, 3], "wall_ms": [100.0, 100.0], "lost_ms": [0.0, 0.0],
                           "work_device_busy_ms": [70.0, 70.0], "work_device_idle_ms": [30.0, 30.0],
                           "work_data_ms": [0.0, 0.0], "work_outside_phases_ms": [0.0, 0.0],
                           "excess_device_busy_ms": [0.0, 0.0], "excess_device_idle_ms": [0.0, 0.0]})
    steps = pd.DataFrame({"rank": [0, 1], "step": [3, 3], "start": [T0, T0], "end": [T0 + 0.1, T0 + 0.1],
                          "data_ms": [20.0, 20.0], "wall_ms": [100.0, 100.0]})
    [row] = job_time.build(Tables(steps=steps, ranks=pd.DataFrame(), collectives=pd.DataFrame(), phases=["data"],
                                  ledger=ledger)).to_dict("records")
    assert (row["compute_ms"], row["data_ms"], row["other_ms"]) == pytest.approx((70.0, 20.0, 10.0))


def test_a_period_survives_one_stall_hidden_in_the_noise_and_needs_three():
    assert period([5, 10, 20, 25, 30]) == (5, [5, 10, 20, 25, 30])
    assert period([5, 10, 13]) is None  # two at one interval: not yet a period
    assert period([5, 10]) is None
    assert period([3, 7, 12, 18, 25]) is None  # stalls at growing intervals: no period
    assert period([4, 8, 12], PeriodicStall(min_stalls=4)) is None
    assert period([5, 9, 11, 13]) == (4, [5, 9, 13])  # an odd stall between two of every 4


def test_live_judgement_counts_each_step_once_for_counters_that_only_grow(tmp_path):
    report_run = job_run(tmp_path / "run", lambda r, s: {"data": 30.0})
    analyzed(report_run)
    steps = pd.read_parquet(report_run / "analysis" / "job_steps.parquet")
    so_far = JobSoFar()
    manifest = {"started_at": T0 - FIRST_STEP_AT}
    for window in (steps[steps["step"] <= 10], steps[(steps["step"] > 4) & (steps["step"] <= 18)], steps):
        so_far.add(Tables(steps=pd.DataFrame(), ranks=pd.DataFrame(), collectives=pd.DataFrame(), phases=[],
                          manifest=manifest, job_steps=window))
    assert so_far.seconds["data"] == pytest.approx(steps["data_ms"].sum() / 1e3)
    assert so_far.seconds["startup"] == pytest.approx(FIRST_STEP_AT)
    metrics = LiveMetrics()
    metrics.update({}, [], so_far.seconds)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    scraped = generate_latest(registry).decode()
    assert f'diagtrain_job_seconds_total{{category="data"}} {so_far.seconds["data"]}' in scraped
    assert "diagtrain_goodput " in scraped


def test_compare_a_job_whose_data_wait_grew_is_a_regression_and_the_notebook_has_its_time(tmp_path):
    base = [summarize(_analyzed_run(tmp_path / f"clean{i}", lambda r, s: {})) for i in range(3)]
    slower = _analyzed_run(tmp_path / "slow", lambda r, s: {"data": 40.0})
    result = compare(base, summarize(slower), threshold_pct=5.0)
    grown = [r for r in result.regressions if r.metric == "job data wait per step"]
    assert grown and grown[0].new_value == pytest.approx(41.0, abs=1.0)
    assert result.goodput["new"] < result.goodput["base"]
    run = diagtrain.load(slower)
    assert run.job_time["seconds"].sum() == pytest.approx(run.document["job_time"]["wall_s"], abs=1e-3)
    assert run.goodput == run.document["job_time"]["goodput"] and len(run.job_steps) == STEPS
    assert run.job_time_figure() is not None


def _analyzed_run(root: Path, extra) -> Path:
    analyzed(job_run(root, extra))
    return root


# -- one real job: a plain script whose every rank transforms its samples in the main process and saves a
# checkpoint every 4 steps (benchmarks/user_scripts/ddp_loader.py; nothing of diagtrain's in it), steps 8-10 profiled.
# 160 MB a checkpoint: 64 MB saved in 110-190 ms, while the typical step of a host loaded by two more processes grew
# to 230-265 ms (its ranks waiting for each other in the all-reduce): half a step, a stall's own bar
# (periodic_stall.min_extra_share), missed now and then. 160 MB stands well above it.


@pytest.mark.jobs
def test_a_plain_script_bound_by_its_input_that_checkpoints_every_four_steps(tmp_path):
    out = tmp_path / "run"
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "user_scripts" / "ddp_loader.py"
    run = diagtrain_run(out, "--profile-steps", "8-10", "--", *torchrun(2), str(script), "--steps", "18", "--transform-ms", "2",
                        "--checkpoint-rank", "all", "--checkpoint-every", "4", "--checkpoint-mb", "160")
    report = json.loads((out / "report.json").read_text())
    [bound] = of_kind(report, "input_bound")
    assert bound["severity"] in ("warning", "error") and bound["ranks"] == [0, 1]
    assert bound["metrics"]["data_ms_per_step"] > 40.0  # 32 samples x 2 ms, in the main process
    [stall] = of_kind(report, "periodic_stall")
    # Saved after steps 4, 8, 12, 16: one may hide in a busy host's noise.
    assert stall["metrics"]["period_steps"] == 4 and len(set(stall["steps"]) & {5, 9, 13, 17}) >= 3
    assert stall["metrics"]["part"] == "outside phases"
    # Step 9 was profiled: torch.save and its fsync are no operator of the trace, the stall's time is outside them.
    if 9 in stall["steps"]:
        assert stall["metrics"]["traced_steps"] == [9] and "outside any operator" in stall["explanation"]
    manifest = run.manifest
    assert report["job_time"]["wall_s"] == pytest.approx(manifest["ended_at"] - manifest["started_at"], abs=0.01)
    info = json.loads((out / "ranks" / "0" / "rank.json").read_text())
    assert info["process_started_at"] <= info["torch_imported_at"] <= info["process_group_ready_at"]
    assert set(report["job_time"]["startup"]) == {"launch", "imports", "process group", "set-up and first steps"}
    assert "goodput" in (out / "report.html").read_text()
