"""The dashboard of a running job: a run directory appended to between refreshes, as a job and its
wrapper append to it (step records, telemetry samples, live findings), followed until its analysis
is there. The browser side, on a real running job, is in test_dashboard_browser.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import dash
import pytest
from dash.exceptions import PreventUpdate

from diagtrain.dashboard import app, live
from diagtrain.profiler.analyzer.run.so_far import ANALYZING, ENDED, RUNNING, job_state
from diagtrain.profiler.run_dir import ANALYSIS_CLAIM, write_json_atomic
from diagtrain.profiler.util import processes

HOST = "h"


def finding(kind: str, rank: int, event: str, step: int) -> dict:
    """A live event as judge/live_judge.py writes it: the report's finding record plus event, detected_at, step."""
    return {"kind": kind, "severity": "warning", "ranks": [rank], "steps": [step], "time_range": None,
            "explanation": f"{kind} on rank {rank}", "suggestion": "look at it", "metrics": {}, "evidence": [],
            "event": event, "detected_at": time.time(), "step": step}


class Job:
    """A run directory written as `diagtrain run` of a 2-rank job writes it, a step at a time."""

    def __init__(self, out: Path) -> None:
        self.out, self.t0, self.steps = out, time.time() - 60, 0
        host = out / "hosts" / HOST
        host.mkdir(parents=True)
        # This process stands for the wrapper: it runs, so the job does.
        self.record = {"name": HOST, "status": "running", "process": processes.identity(), "command": ["python", "x.py"],
                       "started_at": self.t0, "exit_code": None}
        write_json_atomic(host / "host.json", self.record)
        for rank in (0, 1):
            folder = out / "ranks" / str(rank)
            folder.mkdir(parents=True)
            write_json_atomic(folder / "rank.json", {"rank": rank, "world_size": 2, "host": HOST, "pid": 1})

    def step(self, n: int) -> None:
        """Both ranks finish ``n`` more steps (rank 1's forward slower); a telemetry sample each."""
        for _ in range(n):
            self.steps += 1
            start = self.t0 + 0.5 * self.steps
            for rank in (0, 1):
                self._append(f"ranks/{rank}/steps.jsonl", {
                    "rank": rank, "step": self.steps, "start": start, "end": start + 0.4, "duration_ms": 400.0,
                    "phases_ms": {"forward": 300.0 if rank else 50.0, "backward": 40.0}})
                self._append(f"hosts/{HOST}/telemetry.jsonl", {"time": start + 0.2, "kind": "process", "rank": rank,
                                                              "host": HOST, "cpu_percent": 90.0, "rss_bytes": 2 << 20})

    def event(self, record: dict) -> None:
        self._append("live/findings.jsonl", record)

    def end(self, status: str = "ok") -> None:
        write_json_atomic(self.out / "hosts" / HOST / "host.json", {**self.record, "status": status, "exit_code": 0})

    def _append(self, name: str, record: dict) -> None:
        path = self.out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


def test_a_running_job_is_followed_as_it_is_appended_to(tmp_path):
    job = Job(tmp_path)
    job.step(3)
    job.event(finding("straggler", 1, "new", 3))
    job.event(finding("dataloader_stall", 0, "new", 3))
    assert live.follows(tmp_path) and job_state(tmp_path) == RUNNING
    follower = live.LiveRun(tmp_path)
    run = follower.refresh()
    assert run.live.state == RUNNING and run.live.step == 3
    assert sorted(run.steps["step"].unique()) == [1, 2, 3] and run.steps["start"].min() == pytest.approx(0.0)
    assert run.phases == ["forward", "backward"] and set(run.telemetry["rank"]) == {0, 1}
    assert {f["kind"] for f in run.findings} == {"straggler", "dataloader_stall"}
    assert live.marker(run).startswith("live: step 3, updated ")
    version = follower.version
    assert follower.refresh() is run and follower.version == version  # nothing new: the same view

    job.step(4)
    job.event(finding("dataloader_stall", 0, "resolved", 6))
    job.event(finding("memory_growth", 1, "new", 7))
    job.event(finding("straggler", 1, "update", 7))
    run = follower.refresh()
    assert follower.version == version + 1
    assert sorted(run.steps["step"].unique()) == list(range(1, 8)) and len(run.steps) == 14
    assert run.live.step == 7 and len(run.telemetry) == 14
    assert sorted(f["kind"] for f in run.findings) == ["memory_growth", "straggler"]  # the resolved one is gone
    assert next(f for f in run.findings if f["kind"] == "straggler")["step"] == 7  # its latest record

    # The app: a live badge, the steps and findings so far, a clear line where the analysis is needed.
    board = app.Dashboard([run], {0: follower})
    job.step(1)
    badge, stopped, seen = board.refresh_live({"generation": 0})
    assert "live: step 8" in badge.children and not stopped and seen == {"generation": 1}
    assert board.refresh_live(seen)[2] is dash.no_update  # this page has seen the latest
    overview = str(board.render_tab("overview", 0))
    assert "Live findings (2)" in overview and "memory_growth" in overview and "dataloader_stall" not in overview
    for tab in ("communication", "expected", "hang", "memory"):
        assert live.PENDING in str(board.render_tab(tab, 0))
    with pytest.raises(PreventUpdate):  # a new step redraws the heatmap in place: the metric chosen stays
        board.render_tab("steps", 0, app.LIVE_VERSION)
    assert board.update_heatmap(None, "forward_ms", "relative", None, 0)["layout"]["meta"]["marked"] == [1]
    figure, _ = board.update_timeline(None, None, None, None, 0)
    assert figure["layout"]["meta"]["ranks"] == [0, 1]


def test_the_job_ended_then_analyzed_or_not(tmp_path):
    job = Job(tmp_path)
    job.step(2)
    follower = live.LiveRun(tmp_path)
    follower.refresh()
    job.end()
    assert job_state(tmp_path) == ENDED and not live.follows(tmp_path)  # not running, no analysis: not followed
    run = follower.refresh()
    assert run.live.state == ENDED and "not analyzed" in live.marker(run) and follower.final() is None
    (tmp_path / ANALYSIS_CLAIM).parent.mkdir()
    (tmp_path / ANALYSIS_CLAIM).write_text(HOST + "\n")  # this process, "the wrapper", analyzes it now
    assert job_state(tmp_path) == ANALYZING and live.follows(tmp_path)
    assert "analyzing" in live.marker(follower.refresh())
