"""--profile-steps auto (the default): which windows the wrapper asks for, and ranks that profile
exactly those steps, all the same ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import torch
from conftest import diagtrain_run, load_trace, torchrun

from diagtrain.profiler.collect.auto_profile import (
    COOLDOWN_STEPS,
    MAX_WARMUP_STEPS,
    AutoProfiler,
    Window,
)
from diagtrain.profiler.rank.instrument import StepRecorder
from diagtrain.profiler.run_dir import PROFILE_WINDOWS_FILE, RankIndex, Records, write_json_atomic

pytestmark = pytest.mark.jobs  # every test here starts processes (tests/conftest.py)

PLAIN_JOB = Path(__file__).parent / "scripts" / "plain_job.py"


def decider(durations: list[float], windows: list[Window] | None = None) -> AutoProfiler:
    """An AutoProfiler that has seen these step times (step 1 first)."""
    profiler = AutoProfiler(Path("."), RankIndex(Path(".")), "host")
    profiler.durations = {step: ms for step, ms in enumerate(durations, start=1)}
    profiler.windows = windows or []
    return profiler


def test_the_first_window_comes_once_step_times_settle_with_a_lead_of_half_a_second():
    assert decider([900, 60, 140, 50]).decide() is None  # steps 2-4 still vary
    window = decider([900, 60, 140, 50, 52, 51]).decide()
    # 50 ms steps: half a second ahead is 10 steps after the last one seen.
    assert (window.first, window.last, window.reason) == (16, 18, "after warm-up")


def test_on_one_host_the_window_starts_two_steps_ahead(tmp_path):
    def placed(hosts: list[str]) -> AutoProfiler:
        for rank, host in enumerate(hosts):
            (tmp_path / "ranks" / str(rank)).mkdir(parents=True, exist_ok=True)
            write_json_atomic(tmp_path / "ranks" / str(rank) / "rank.json",
                              {"rank": rank, "world_size": len(hosts), "host": host})
        profiler = decider([900, 60, 140, 50, 52, 51])
        profiler.ranks, profiler.host = RankIndex(tmp_path), "host"
        return profiler

    # Every rank here: the request file is there as soon as it is written; three steps ahead (the step in
    # flight may end before the write), so a 10-step job still gets a trace (steps 9-10 at least).
    assert placed(["host", "host"]).decide().first == 9
    # A rank on another host reads it over a shared filesystem: half a second ahead.
    assert placed(["host", "host", "other"]).decide().first == 16


def test_a_job_that_never_settles_is_profiled_after_a_while():
    erratic = [900] + [50, 150] * MAX_WARMUP_STEPS
    assert decider(erratic[:MAX_WARMUP_STEPS - 1]).decide() is None
    assert "not settled" in decider(erratic[:MAX_WARMUP_STEPS]).decide().reason


def test_a_slowdown_gets_a_second_window_a_single_slow_step_does_not():
    warm = [Window(6, 8, "after warm-up", 0.0, 4)]
    steady = [900] + [50.0] * (8 + COOLDOWN_STEPS + 5)
    assert decider(steady + [500], warm).decide() is None  # one slow step: a hiccup
    assert decider(steady + [500, 50, 500], warm).decide() is None
    window = decider(steady + [500, 480], warm).decide()
    assert window is not None and "took 480 ms, 9.6x the median 50 ms" in window.reason
    assert window.first > len(steady) + 2
    # Profiled steps are slower: they never count as a slowdown, nor in the baseline.
    profiled_slow = [900] + [50.0] * 5 + [75.0] * 3 + [50.0] * COOLDOWN_STEPS
    assert decider(profiled_slow, warm).decide() is None
    # Seen up to step 17: within COOLDOWN_STEPS of the window that ended at step 8.
    assert decider(steady[:8 + COOLDOWN_STEPS - 3] + [500, 480], warm).decide() is None
    many = warm + [Window(20 * i, 20 * i + 2, "slow", 0.0, 0, severity=9.0 + i) for i in (1, 2)]
    assert len(many) == Records().max_profiled_windows
    replacing = decider([900] + [50.0] * 100 + [500, 480], many).decide()  # the warm-up window's traces give way
    assert (replacing.replaces, replacing.severity) == (6, 9.6)
    many[0] = Window(6, 8, "slow", 0.0, 4, severity=8.0)
    assert decider([900] + [50.0] * 100 + [500, 480], many).decide() is None  # enough traces, each of a slowdown as bad
    many[0] = Window(6, 8, "slow", 0.0, 4, severity=7.6)  # 9.6x is 1.26 times 7.6x: worse by the margin
    assert decider([900] + [50.0] * 100 + [500, 480], many).decide().replaces == 6


def test_a_replaced_windows_traces_are_removed_only_where_the_new_ones_are_written(tmp_path):
    for rank in (0, 1):
        (tmp_path / "ranks" / str(rank)).mkdir(parents=True)
        write_json_atomic(tmp_path / "ranks" / str(rank) / "rank.json", {"rank": rank, "world_size": 2, "host": "h"})
    old, new = Window(6, 8, "after warm-up", 0.0, 4), Window(50, 52, "slow", 0.0, 40, severity=3.0, replaces=6)
    profiler = AutoProfiler(tmp_path, RankIndex(tmp_path), "h", windows=[old, new])
    for rank in (0, 1):
        (tmp_path / "ranks" / str(rank) / old.trace_name(rank)).write_bytes(b"old")
    (tmp_path / "ranks" / "0" / new.trace_name(0)).write_bytes(b"new")  # rank 1's not written yet
    profiler.remove_replaced()
    assert not (tmp_path / "ranks/0" / old.trace_name(0)).exists() and (tmp_path / "ranks/1" / old.trace_name(1)).exists()
    assert not old.traces_removed
    (tmp_path / "ranks" / "1" / new.trace_name(1)).write_bytes(b"new")
    profiler.remove_replaced()
    assert not (tmp_path / "ranks/1" / old.trace_name(1)).exists() and old.traces_removed
    written = json.loads((tmp_path / PROFILE_WINDOWS_FILE).read_text())["windows"]
    assert [(w["first"], w["replaces"], w["traces_removed"]) for w in written] == [(6, None, True), (50, 6, False)]


def test_a_rank_profiles_the_windows_written_while_it_runs_and_skips_one_begun(tmp_path):
    with StepRecorder(tmp_path, rank=0, profile_steps="auto") as rec:
        for step in range(1, 9):
            if step == 2:  # requested while step 2 runs: 5-6 ahead, 2-3 already begun
                write_json_atomic(tmp_path / PROFILE_WINDOWS_FILE,
                                  {"windows": [{"first": 2, "last": 3}, {"first": 5, "last": 6}]})
            torch.randn(32, 32) @ torch.randn(32, 32)
            rec.step()
    [trace] = list((tmp_path / "ranks/0").glob("trace-*"))
    assert trace.name == "trace-rank0-steps5-6.json.gz"
    names = {e.get("name") for e in load_trace(trace)["traceEvents"]}
    assert {"ProfilerStep#5", "ProfilerStep#6"} <= names and not {"ProfilerStep#4", "ProfilerStep#7"} & names


def test_with_no_flags_every_rank_profiles_after_warm_up_and_again_when_steps_slow_down(tmp_path):
    run = diagtrain_run(tmp_path / "run", "--no-analyze", "--", *torchrun(2), str(PLAIN_JOB),
                        env={"MODE": "ddp", "STEPS": "60", "STEP_MS": "50", "SLOW_FROM": "40", "SLOW_FROM_MS": "150"})
    windows = json.loads((run.out / PROFILE_WINDOWS_FILE).read_text())["windows"]
    assert [w["reason"] for w in windows][0] == "after warm-up" and len(windows) == 2, windows
    assert windows[1]["first"] > 40 and "x the median" in windows[1]["reason"]
    expected = [f"trace-rank{{}}-steps{w['first']}-{w['last']}.json.gz" for w in windows]
    for rank in (0, 1):
        assert [p.name for p in run.traces(rank)] == sorted(e.format(rank) for e in expected)
    assert run.manifest["hosts"][0]["profile_steps"] == "auto"
    assert "profiling steps" in run.stderr
