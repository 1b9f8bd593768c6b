"""What `diagtrain run` shows on the user's terminal: the job's own output and ours, without the
profiler's chatter, the run directory once, a progress line whose number says what it is."""

from __future__ import annotations

import re
import time

import pandas as pd
import pytest

from diagtrain.profiler.analyzer.judge.findings import UPPER_BOUND
from diagtrain.profiler.analyzer.report.wording import saving_text
from diagtrain.profiler.analyzer.report import summary as summary_lines
from diagtrain.profiler.collect.profiler_noise import NoiseFilter
from diagtrain.reference_trainers.train import _Progress

# Lines as a 3D run of the README printed them (8 ranks, steps 5-7 profiled): two ranks' messages
# glued on one line leave the second one's newline as a blank line after it.
RECORDED = [
    b"[diagtrain] step 2/20  loss 5.5817  1065 ms/step (steps 1-2, as in steps.jsonl)\n",
    b"USDT:2026-11-23 11:20:56 12286:12286 SyncActivityProfilerHandler.cpp:52] profiler_start\n",
    b"[rank6]:[W1123 11:20:56.256717421 CPUAllocator.cpp:245] Memory block of unknown size was allocated before "
    b"the profiling started, profiler results will not include the deallocation event\n",
    b"USDT:2026-11-23 11:21:00 12284:12284 SyncActivityProfilerHandler.cpp:59] profiler_stop"
    b"USDT:2026-11-23 11:21:00 12280:12280 SyncActivityProfilerHandler.cpp:59] profiler_stop\n",
    b"\n",
    b"[diagtrain] step 8/20  loss 5.2273  1057 ms/step (steps 7-8, as in steps.jsonl)\n",
    b"\n",
    b"my own lineUSDT:2026-11-23 11:21:00 12281:12281 SyncActivityProfilerHandler.cpp:59] profiler_stop\n",
    b"\n",
    b"Memory block of unknown size: a user's message that only looks alike\n",
]


def test_the_profilers_messages_are_cut_and_everything_else_is_kept():
    shown = NoiseFilter()
    kept = [line for line in map(shown, RECORDED) if line is not None]
    assert kept == [RECORDED[0], RECORDED[5], b"\n", b"my own line\n", RECORDED[-1]]
    assert shown.dropped == 5


def console(run) -> str:
    return run.stdout + run.stderr


@pytest.mark.jobs
def test_the_readme_command_keeps_the_profilers_messages_off_the_console(pipeline_job):
    """`diagtrain run --profile-steps A-B -- diagtrain train ...`, analyzed at the end, as the README runs it."""
    out = console(pipeline_job)
    logs = {r: pipeline_job.text(r, "stderr.log") for r in (0, 1)}
    # The messages were printed by every rank (the pipeline's last stage warns about memory too) ...
    assert all("profiler_start" in log and "profiler_stop" in log for log in logs.values())
    assert any("Memory block of unknown size" in log for log in logs.values())
    host_log = next(pipeline_job.out.glob("hosts/*/console.log")).read_text()
    assert "profiler_start" in host_log
    # ... and only the logs carry them.
    assert "USDT" not in out and "profiler_st" not in out and "CPUAllocator" not in out
    assert "Memory block of unknown size" not in out
    assert "[diagtrain] done: 3 steps" in pipeline_job.stdout
    # The run directory once (the wrapper's, not `diagtrain train`'s too), then the report's paths name it.
    assert out.count("run directory") == 1 and f"diagtrain: run directory {pipeline_job.out}\n" in pipeline_job.stderr
    assert pipeline_job.stderr.rstrip().endswith(f"{pipeline_job.out}/report.html")


@pytest.mark.jobs
def test_the_console_ends_with_one_screen_that_leads_with_the_top_finding(pipeline_job):
    """The end of `diagtrain run`: the summary, not the report (which stays in report.md)."""
    lines = pipeline_job.stdout.splitlines()
    [start] = [i for i, line in enumerate(lines) if line.startswith("diagtrain: status ")]
    shown = lines[start:]
    assert len(shown) <= summary_lines.MAX_SCREEN
    assert "## diagtrain report" not in pipeline_job.stdout  # the full report is a file ...
    assert "### Findings" in (pipeline_job.out / "report.md").read_text()  # ... and still whole there
    findings = pipeline_job.json("report.json")["findings"]
    listed = [f for f in findings if summary_lines.matters(f)]
    first = next((line for line in shown if re.match(r"  1\. ", line)), None)
    if listed:
        assert first is not None and f" {listed[0]['kind']} · " in first
        assert f"rank{'s' if len(listed[0]['ranks']) > 1 else ''} {listed[0]['ranks'][0]}" in first
    else:
        assert first is None and "nothing to act on" in shown[0]
    info = len(findings) - len(listed)
    assert (f"{info} informational" in shown[0]) == bool(info)
    assert f"  dashboard      diagtrain dashboard {pipeline_job.out}" in shown
    assert f"diagtrain analyze {pipeline_job.out} --format md" in "\n".join(shown)


def test_a_long_list_of_findings_still_fits_one_screen(tmp_path):
    """Many warnings are cut after MAX_LISTED lines and counted; info findings are never listed."""
    def finding(i: int, severity: str) -> dict:
        return {"kind": "straggler", "severity": severity, "ranks": list(range(i, i + 20)), "impact_ms": 100.0 - i,
                "metrics": {}, "explanation": "x" * 300 + f"; rank {i} waits"}
    report = {"run": {"status": "failed", "strategy": None, "world_size": 64, "steps": 9},
              "findings": [finding(i, "warning") for i in range(30)] + [finding(0, "info")] * 5,
              "health": [{"severity": "warning"}] * 3, "skipped": [{"path": "a"}]}
    lines = summary_lines.lines(report, tmp_path / "traces", tmp_path, [tmp_path / "report.md"])
    assert len(lines) <= summary_lines.MAX_SCREEN
    assert lines[0].startswith("diagtrain: status failed, 64 ranks, 9 steps; 30 findings to act on, 5 informational")
    listed = [line for line in lines if re.match(r"  \d+\. ", line)]
    assert len(listed) == summary_lines.MAX_LISTED and listed[0].startswith("  1. WARNING straggler · ranks 0-19 · ")
    assert all(len(line) <= summary_lines.MAX_LINE and line.endswith(" …") for line in listed)  # one line each
    assert f"  ... {30 - summary_lines.MAX_LISTED} more findings to act on in the report" in lines
    assert "  3 trace health warnings: see the report's \"Trace health\"" in lines
    # The input was analyzed elsewhere: the command for the full text says both.
    assert f"diagtrain analyze {tmp_path / 'traces'} --out {tmp_path} --format md" in lines[-2]


@pytest.mark.jobs
def test_the_progress_line_is_the_step_time_steps_jsonl_records(pipeline_job):
    durations = {r["step"]: r["duration_ms"] for r in pipeline_job.steps(0)}
    lines = re.findall(r"\[diagtrain\] step (\d+)/3 .* (\d+) ms/step \(step (\d+), as in steps\.jsonl\)",
                       pipeline_job.stdout)
    assert [int(step) for step, _, _ in lines] == [1, 2, 3]
    for step, shown, same in lines:
        assert step == same and int(shown) == round(durations[int(step)])


def test_time_outside_steps_is_named_apart_not_averaged_in(capsys):
    progress = _Progress(steps=2)
    progress.update(1, 5.0, step_ms=10.0)
    time.sleep(0.3)  # what writing a profiled window's trace does between two steps
    progress.update(2, 4.0, step_ms=20.0)
    first, second = capsys.readouterr().out.splitlines()
    assert first.endswith("loss 5.0000  10 ms/step (step 1, as in steps.jsonl)")
    assert "20 ms/step (step 2, as in steps.jsonl)" in second
    outside = float(re.search(r"\+(\d+\.\d) s outside steps", second).group(1))
    assert outside >= 0.2  # 0.3 s less step 2's own 20 ms, rounded


def test_without_step_records_the_number_says_it_is_wall_time(capsys):
    progress = _Progress(steps=1)
    progress.update(1, None, step_ms=None)
    assert re.search(r"loss n/a  \d+ ms/step \(wall time, step 1\)$", capsys.readouterr().out.strip())


# -- the report: what a number is, and no saving that nothing can realize ---------------------------

@pytest.mark.jobs
def test_a_saving_nothing_can_realize_is_not_claimed(pipeline_job):
    """Exposed communication on CPU (gloo) is informative: it claims no ms/step that would outrank a warning."""
    findings = pipeline_job.json("report.json")["findings"]
    [exposed] = [f for f in findings if f["kind"] == "exposed_communication"]
    assert exposed["severity"] == "info" and exposed["impact_ms"] is None
    assert "no saving is claimed" in exposed["explanation"]
    assert exposed["metrics"]["exposed_ms_per_step"] > 0  # the number is still there, as what it is
    md = (pipeline_job.out / "report.md").read_text()
    [line] = [x for x in md.splitlines() if "exposed_communication**" in x]
    assert "saves" not in line


def test_a_bound_is_said_as_a_bound():
    assert saving_text({"impact_ms": 12.34, "metrics": {}}) == "~12.3 ms/step"  # a what-if's saving
    assert saving_text({"impact_ms": 12.34, "metrics": {UPPER_BOUND: True}}) == "up to 12.3 ms/step"
    assert saving_text({"impact_ms": None, "metrics": {}}) == ""


@pytest.mark.jobs
def test_collective_totals_are_per_step_on_each_rank(pipeline_job):
    [exposed] = [f for f in pipeline_job.json("report.json")["findings"] if f["kind"] == "exposed_communication"]
    named = re.findall(r"(\w+) on ([\w-]+) \((\d+) ms per step on each of its (\d+) ranks\)", exposed["explanation"])
    assert named, exposed["explanation"]
    collectives = pd.read_parquet(pipeline_job.out / "analysis" / "collectives.parquet")
    for op, group, ms, ranks in named:
        rows = collectives[(collectives["op"] == op) & (collectives["pg_desc"].fillna("") == group)]
        assert int(ranks) == rows["rank"].nunique()
        assert int(ms) == round(rows["dur"].sum() / int(ranks) / 2 / 1e3)  # steps 2-3 profiled


@pytest.mark.jobs
def test_the_ranks_table_says_what_its_columns_sum_over(pipeline_job):
    ranks = pipeline_job.json("report.json")["ranks"]
    for r in ranks:
        assert r["profiled_steps"] == 2
        parts = r["compute_us"] + r["non_compute_us"] + r["idle_us"]
        assert parts == pytest.approx(r["window_us"], rel=1e-6)  # the columns make the window ...
        assert r["window_us"] > r["step_time_median_us"]  # ... which is longer than one step
    md = (pipeline_job.out / "report.md").read_text()
    assert "| profiled steps | traced window (ms) | compute in window (ms) |" in md
    assert "together they make the window, not one step" in md
    assert "- most critical time (summed over the 2 profiled steps): rank " in md
    assert "| transfer per call, median (ms) | ring model per call (ms) |" in md
