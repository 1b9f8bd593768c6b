"""Live diagnosis: `diagtrain run` judges the job while it runs (live/findings.jsonl, the console,
/metrics), with the final report's detectors and settings.

The jobs are real (torchrun, gloo, the plain script every rank runs unchanged); the straggler sleeps
300 ms a step against a 50 ms step, far above the noise of a shared 2-core machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

from conftest import JOB_TIMEOUT_S, diagtrain_run, torchrun
from live_helpers import append_step, two_ranks
from diagtrain.profiler.analyzer.report.wording import worded
from diagtrain.profiler.util import settings
from diagtrain.profiler.analyzer.judge.detectors.base import Steady
from diagtrain.profiler.analyzer.judge.live_judge import NO_PROGRESS, LiveJudge
from diagtrain.profiler.analyzer.read import step_cache
from diagtrain.profiler.analyzer.read.step_cache import read_steps
from diagtrain.profiler.analyzer.read.step_tail import StepTail
from diagtrain.profiler.analyzer.read.host_summary import HostReducer, HostSummary
from diagtrain.profiler.analyzer.read.step_tail import RankSteps
from diagtrain.profiler.analyzer.read.run_read import requested_profile_steps
from diagtrain.profiler.analyzer.run.live_traces import LiveTraces
from diagtrain.profiler.run_dir import clear_run, write_json_atomic

PLAIN_JOB = Path(__file__).parent / "scripts" / "plain_job.py"
ACTIONABLE = ("warning", "error", "critical")
USAGE = 2
EXIT_SIGINT = 130


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def events(out: Path) -> list[dict]:
    """live/findings.jsonl's events so far (a line being written is left for later)."""
    try:
        text = (out / "live" / "findings.jsonl").read_text()
    except OSError:
        return []
    return [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines()]


def scrape(port: int) -> dict[str, float]:
    """``/metrics`` read with a real HTTP client: sample name with labels -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def start(out: Path, *options: str, **knobs: str) -> subprocess.Popen:
    """``diagtrain run`` of the plain script on 2 ranks, not analyzed, in the background."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MODE": "ddp", "STEP_MS": "50", **knobs}
    env.pop("DIAGTRAIN_RUN_DIR", None)
    return subprocess.Popen([sys.executable, "-m", "diagtrain.profiler.cli", "run", "--out", str(out),
                             "--profile-steps", "none", "--no-analyze", *options, "--", *torchrun(2), str(PLAIN_JOB)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def clean_job(tmp_path_factory) -> tuple[Path, subprocess.Popen]:
    """A clean job, started beside the straggler's (the straggler test asks for it first): it shares the
    busy host with that job, as a clean run shares a crowded node, and the two cost the time of one."""
    out = tmp_path_factory.mktemp("clean") / "run"
    job = start(out, STEPS="150")  # ~10 s of steps: judged several times
    yield out, job
    if job.poll() is None:
        job.kill()


@pytest.mark.jobs
def test_a_straggler_is_found_and_served_while_the_job_runs(tmp_path, clean_job):
    out, port = tmp_path / "run", free_port()
    # Long enough for the verdict to come well before its end; stopped once it has.
    job = start(out, "--metrics-port", str(port), STEPS="80", SLEEP_RANK="1", SLEEP_MS="300")
    try:
        found, metrics = None, {}
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while job.poll() is None and time.monotonic() < deadline and not (found and metrics):
            found = found or next((e for e in events(out) if e["kind"] == "straggler" and e["event"] == "new"), None)
            if found and not metrics:
                samples = scrape(port)
                if all(f'diagtrain_step_seconds{{rank="{r}"}}' in samples for r in (0, 1)):
                    metrics = samples
            time.sleep(0.5)
        running = job.poll() is None  # the verdict came while the job still ran
        job.send_signal(signal.SIGINT)  # seen: no need to wait for the rest of its steps
        stdout, stderr = job.communicate(timeout=JOB_TIMEOUT_S)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == EXIT_SIGINT, stderr[-3000:]
    assert found is not None and running, f"no live straggler event while the job ran: {events(out)}"
    assert found["ranks"] == [1] and found["severity"] in ACTIONABLE
    assert found["step"] < 40 and found["detected_at"] > 0 and found["since_step"] <= found["step"]
    assert {"explanation", "suggestion", "metrics", "settings", "steps"} <= set(found)  # the report's schema
    # Each rank's step lasts as long as the slowest's (~350 ms); rank 0 spends most of it waiting for rank 1.
    assert all(metrics[f'diagtrain_step_seconds{{rank="{r}"}}'] > 0.25 for r in (0, 1))
    assert metrics['diagtrain_collective_wait_seconds{rank="0"}'] > 0.2 > metrics['diagtrain_collective_wait_seconds{rank="1"}']
    assert metrics['diagtrain_memory_bytes{kind="rss",rank="1"}'] > 10 * 2**20
    assert any(k.startswith('diagtrain_live_findings{kind="straggler"') for k in metrics)
    # One plain line (stderr is no terminal) when the warning started.
    assert "live: " in stderr and "straggler on rank 1 since step" in stderr


@pytest.mark.jobs
def test_a_clean_run_has_no_live_warning(clean_job):
    out, job = clean_job
    _, stderr = job.communicate(timeout=JOB_TIMEOUT_S)
    assert job.returncode == 0, stderr[-3000:]
    assert [e for e in events(out) if e["severity"] in ACTIONABLE] == []
    [host] = out.glob("hosts/*/host.json")
    live = json.loads(host.read_text())["live"]
    # It judged the clean steps: at least once past warm-up, where the detectors run. Not a step count:
    # a judgement is paced by the CPU it took (~6 s here), and the job's last 100 steps can all fall
    # after the last one (CI saw the last judgement at step 38 of 150).
    steady = Steady.active()
    assert live["failed"] is None and live["judgements"] >= 2, live
    assert live["last_step"] > steady.warmup_steps + steady.min_steady_steps, live
    assert "live: " not in stderr
    # The wrapper reduced its ranks' step records into its host's summary as they came (what the judge read, up
    # to the last step it judged; the steps after its last round are in the ranks' files only).
    summary = HostSummary(host.parent / "steps_summary.jsonl", keep=None)
    summary.ranks = {r: RankSteps(r, None) for r in (0, 1)}
    summary.read()
    for r, held in summary.ranks.items():
        recorded = list(read_steps(out / "ranks" / str(r) / "steps.jsonl", r).table["step"])
        assert live["last_step"] <= len(held.rows) and sorted(held.rows) == recorded[:len(held.rows)]


@pytest.mark.jobs
@pytest.mark.parametrize("reduced", [False, True], ids=["read-by-the-judge", "reduced-by-its-host"])
def test_the_final_analysis_parses_only_what_live_judgement_had_not_cached(clean_job, tmp_path, reduced):
    """The clean job's real step records appended again in pieces, as its ranks wrote them, and judged
    after each as the wrapper judges: the judgements (or, where a host reduces its ranks' records for the
    judge, that host's wrapper) fill the final analysis' step cache."""
    out, job = clean_job
    job.wait(timeout=JOB_TIMEOUT_S)
    run = tmp_path / "run"
    shutil.copytree(out, run, ignore=shutil.ignore_patterns("analysis", "live", "steps_summary.jsonl"))
    records = {r: (run / "ranks" / str(r) / "steps.jsonl").read_text().splitlines(keepends=True) for r in (0, 1)}
    for r in records:
        (run / "ranks" / str(r) / "steps.jsonl").write_text("")
    with settings.overriding({"live": {"cache_lines": 30, "cache_cpu_s": 10.0}}):
        [host] = [p.name for p in (run / "hosts").iterdir()]
        reducer = HostReducer(run, host) if reduced else None
        judge = LiveJudge(run)
        for first in range(0, max(map(len, records.values())), 25):
            for r, lines in records.items():
                with open(run / "ranks" / str(r) / "steps.jsonl", "a") as f:
                    f.writelines(lines[first:first + 25])
            if reducer is not None:
                reducer.reduce(30, 10.0)
            judge.judge()
        assert bool(judge.steps.summaries) == reduced and bool(judge.steps.direct) != reduced
    for r, lines in records.items():
        path, cache = run / "ranks" / str(r) / "steps.jsonl", step_cache.cache_dir(run / "analysis" / "cache", r)
        state = json.loads((cache / step_cache.STATE_FILE).read_text())
        assert len(lines) - 30 <= state["number"] < len(lines)  # at most cache_lines left for the final analysis
        cached, full = step_cache.read_steps_cached(path, r, cache), read_steps(path, r)
        assert cached.parsed == len(lines) - state["number"]
        pd.testing.assert_frame_equal(cached.table, full.table, check_like=True)


@pytest.mark.jobs
def test_a_profiled_window_is_judged_live_with_the_final_analysis_loader(late_hook_job):
    """A comm hook that makes rank 0 late at every all-reduce: only the traces show that the delay sits
    right before its calls. Live judgement loads steps 3-6's traces once every rank is past them (no
    flight recorder yet: ranks dump it at the end) and names the late rank and its pause, as the final
    report does."""
    out, report = late_hook_job
    late = [e for e in events(out) if e["kind"] == "slow_collective" and e["event"] == "new"]
    assert [e["ranks"] for e in late] == [[0]], [(e["kind"], e["ranks"], e["severity"]) for e in events(out)]
    assert late[0]["step"] >= 7 and late[0]["severity"] in ACTIONABLE and late[0]["metrics"]["before_calls"], late[0]
    assert late[0]["metrics"]["extra_gap_before_calls_ms"] == pytest.approx(40, rel=0.3), late[0]  # the hook's own pause
    assert [f["ranks"] for f in report["findings"] if f["kind"] == "slow_collective" and f["severity"] in ACTIONABLE] == [[0]]


@pytest.mark.jobs
def test_a_window_s_traces_are_loaded_once_every_rank_is_past_it_and_within_the_size_allowed(user_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(user_run.out, run)  # steps 2-3 profiled, 6 steps
    requested = requested_profile_steps(run)
    assert requested == {2, 3}
    traces = LiveTraces(run, max_bytes=1e9)
    assert not traces.update(finished=3, requested=requested) and traces.collectives.empty  # may still be writing it
    assert traces.update(finished=4, requested=requested)
    assert set(traces.collectives["rank"]) == {0, 1} and traces.collectives["ranks_seen"].eq(2).all()
    assert not traces.update(finished=5, requested=requested)  # loaded once
    small = LiveTraces(run, max_bytes=1000)
    assert small.update(finished=4, requested=requested) and small.collectives.empty \
        and "live.max_trace_mb" in small.problem


@pytest.mark.jobs
def test_a_metrics_port_in_use_is_refused_before_the_job_starts(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = diagtrain_run(tmp_path / "run", "--metrics-port", str(port), "--", sys.executable, "-c", "print('ran')",
                            check=False)
    assert run.returncode == USAGE
    assert f"--metrics-port {port}" in run.stderr and f"127.0.0.1:{port}" in run.stderr
    assert "ran" not in run.stdout and not (tmp_path / "run").exists()


def test_step_records_are_read_as_appended_and_a_cut_line_waits(tmp_path):
    path = tmp_path / "steps.jsonl"
    record = {"rank": 0, "start": 1.0, "end": 1.1, "duration_ms": 100.0, "phases_ms": {"forward": 60.0}}
    lines = [json.dumps({**record, "step": s}) for s in (1, 2, 3)]
    path.write_text(lines[0] + "\n" + lines[1] + "\n" + lines[2][:20])
    tail = StepTail(path, 0, keep=2)
    assert tail.read() == 2 and sorted(tail.rows) == [1, 2] and tail.rows[2]["forward_ms"] == 60.0
    with open(path, "a") as f:
        f.write(lines[2][20:] + "\n" + '{"rank": 0, "step": "four"}\n')
    assert tail.read() == 2 and sorted(tail.rows) == [2, 3]  # the older steps are let go
    assert len(tail.found.bad_lines) == 1 and tail.last_step == 3


def test_a_rank_without_progress_is_said_before_the_hang_watchdog(tmp_path):
    """Step records as two ranks wrote them: rank 1 stopped after step 6, rank 0 went on to step 8."""
    start = time.time() - 60
    for rank, last in ((0, 8), (1, 6)):
        folder = tmp_path / "ranks" / str(rank)
        folder.mkdir(parents=True)
        write_json_atomic(folder / "rank.json", {"rank": rank, "world_size": 2, "host": "h", "pid": 1})
        with open(folder / "steps.jsonl", "w") as f:
            for step in range(1, last + 1):
                t0 = start + 0.1 * step if step <= 6 else start + 29 + (step - 7)  # rank 0 goes on 30 s later
                f.write(json.dumps({"rank": rank, "step": step, "start": t0, "end": t0 + 0.1, "duration_ms": 100.0,
                                    "phases_ms": {}, "comm_ms": 10.0}) + "\n")
    judge = LiveJudge(tmp_path)
    first = judge.judge(now=start + 0.7 + 5)  # 5 s: fewer than min_stalled_s
    assert not [e for e in first.events if e.record["kind"] == NO_PROGRESS]
    later = worded(judge.judge(now=start + 0.7 + 30))  # rank 1 has finished no step for 30 s, rank 0 one just now
    [event] = [e for e in later.events if e.record["kind"] == NO_PROGRESS]
    assert event.record["event"] == "new" and event.record["ranks"] == [1] and event.record["steps"] == [7]
    assert event.record["severity"] == "warning" and "rank 1" in event.line and "since step 7" in event.line


def test_ranks_are_compared_only_once_the_steps_after_warm_up_are_there(tmp_path):
    """Rank 1 is 60 ms slower in steps 1 and 3 of 3 (start-up, a slow first steps): the final analysis of
    such a short run would have to judge its warm-up step too; live judgement waits for the steps after
    it, and with steps 2-5 there, rank 1 slow in one of them is no straggler."""
    start = two_ranks(tmp_path)

    def append(step: int) -> None:
        for rank in (0, 1):
            append_step(tmp_path, rank, step, start, 60.0 if rank == 1 and step in (1, 3) else 0.0,
                        60.0 if step in (1, 3) else 0.0)

    judge = LiveJudge(tmp_path)
    for step in (1, 2, 3):
        append(step)
        assert judge.judge(now=start + 1).active == []
    for step in (4, 5):
        append(step)
        assert [f["kind"] for f in judge.judge(now=start + 1.5).active if f["severity"] in ACTIONABLE] == []
    assert judge.judged_step == 5 and judge._judged is not None


def test_replace_removes_the_live_findings_of_the_run_it_replaces(tmp_path):
    (tmp_path / "live").mkdir()
    (tmp_path / "live" / "findings.jsonl").write_text('{"event": "new"}\n')
    (tmp_path / "notes.txt").write_text("the project's own")
    clear_run(tmp_path)
    assert not (tmp_path / "live").exists() and (tmp_path / "notes.txt").exists()


def test_each_event_is_appended_and_said_and_warnings_stand_until_they_end(tmp_path):
    """The wrapper's side with a real judge on step records written as a job would: rank 1's forward
    takes 300 ms more than rank 0's in every step, rank 0 waits for it in the gradient all-reduce."""
    from diagtrain.profiler.collect.live import LiveDiagnosis, LiveWork

    t0 = time.time() - 30
    for rank in (0, 1):
        folder = tmp_path / "ranks" / str(rank)
        folder.mkdir(parents=True)
        write_json_atomic(folder / "rank.json", {"rank": rank, "world_size": 2, "host": "h", "pid": 1})
        with open(folder / "steps.jsonl", "w") as f:
            for step in range(1, 13):
                start = t0 + 0.4 * step
                f.write(json.dumps({"rank": rank, "step": step, "start": start, "end": start + 0.4, "duration_ms": 400.0,
                                    "phases_ms": {"forward": 350.0 if rank else 50.0 + step % 3, "backward": 40.0},
                                    "comm_ms": 2.0 if rank else 300.0, "phase_comm_ms": {"backward": 2.0 if rank else 300.0}})
                        + "\n")
    said = []
    judge = LiveJudge(tmp_path)
    # As the run verb gives it: the judgement worded (its lines composed in report/wording.py).
    live = LiveDiagnosis(tmp_path, "h", lambda: LiveWork(lambda: worded(judge.judge()), 1.0,
                                                         HostReducer(tmp_path, "h").reduce))
    work, live._say = live.make(), said.append  # what its thread does first
    live.judge, live.interval_s, live.reduce = work.judge, work.interval_s, work.reduce
    live.round()
    # The host reduced its ranks into its summary, and the judge read them from there, not from their files.
    assert list(judge.steps.summaries) == ["h"] and not judge.steps.direct
    [event] = [e for e in events(tmp_path) if e["kind"] == "straggler"]
    assert event["event"] == "new" and event["ranks"] == [1] and event["severity"] in ACTIONABLE
    assert any("straggler on rank 1 since step" in line for line in said)
    assert [line for line in live.standing() if "straggler on rank 1" in line]


def test_a_finding_that_starts_below_warning_is_judged_again_at_the_next_interval(tmp_path):
    """Judgements are paced by their CPU (here made to wait for hours), except the one after a finding
    starts: rank 1 late by 150 ms from step 12 is a straggler in too few steps at first (info), and the
    judgement after the next interval names it a warning or worse."""
    start = two_ranks(tmp_path)
    # A share so small that even a judgement of a few microseconds' CPU (a fast host) waits for hours.
    with settings.overriding({"live": {"max_cpu_share": 1e-10}}):
        judge = LiveJudge(tmp_path)
        waits, said = {}, {}
        for step in range(1, 16):
            for rank in (0, 1):
                append_step(tmp_path, rank, step, start, 150.0 if rank == 1 and step >= 12 else 0.0, 150.0 * (step >= 12))
            verdict = judge.judge(now=start + 0.4 * step + 0.3)
            waits[step] = verdict.next_in_s
            said[step] = [(e.record["event"], e.record["ranks"], e.record["severity"]) for e in verdict.events
                          if e.record["kind"] == "straggler"]
    started = min(s for s in said if said[s])
    assert said[started] == [("new", [1], "info")], said
    assert waits[started] == judge.settings.interval_s
    # Actionable at the next interval: a warning, or an error where its steps since it began cost that much.
    assert {("update", (1,), severity) for severity in ("warning", "error")} & {
        (e, tuple(r), sev) for e, r, sev in said[started + 1]}, said
    assert all(w > 3600 for s, w in waits.items() if 1 < s != started), waits  # paced: nothing started

