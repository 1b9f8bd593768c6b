"""Each host reduces its own ranks' step records (read/host_summary.py): live judgement reads one file per
host and judges exactly what it judged reading every rank's file (issue 53). No process: step records written
as a running job's ranks append them, 64 ranks on 8 hosts."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import pytest

from diagtrain.profiler.analyzer.judge.live_judge import LiveJudge
from diagtrain.profiler.analyzer.read.host_summary import HostReducer, HostSummary, set_aside, summary_path
from diagtrain.profiler.analyzer.read.step_tail import RankSteps
from diagtrain.profiler.analyzer.run.tables import step_table
from diagtrain.profiler.run_dir import write_json_atomic
from diagtrain.profiler.util import settings

RANKS, PER_HOST = 64, 8
STRAGGLER = 13  # on node-1: +60 ms forward every step
T0 = time.time() - 3600


def host_of(rank: int) -> str:
    return f"node-{rank // PER_HOST}"


class Job:
    """Step records of a synchronous job on 8 hosts: phases, counters, memory (rank 40 leaks), a rank whose
    records are damaged now and then; ``p2p``: the edges of two pipeline stages count their sends and receives."""

    def __init__(self, root: Path, p2p: bool = False, device: bool = False) -> None:
        self.root, self.step, self.clock, self.p2p, self.device = root, 0, T0, p2p, device
        for r in range(RANKS):
            (root / "ranks" / str(r)).mkdir(parents=True)
            write_json_atomic(root / "ranks" / str(r) / "rank.json",
                              {"rank": r, "host": host_of(r), "pid": 1, "world_size": RANKS})

    def append(self, steps: int) -> None:
        lines: dict[int, list[str]] = {r: [] for r in range(RANKS)}
        for _ in range(steps):
            self.step += 1
            forward = {r: 20.0 + 0.5 * ((r * self.step) % 3) + (60.0 if r == STRAGGLER else 0.0) for r in range(RANKS)}
            slowest = max(forward.values())
            for r in range(RANKS):
                wait = slowest - forward[r] + 1.0
                phases = {"data": 1.0 + 0.2 * ((r + self.step) % 4), "forward": forward[r], "backward": 40.0 + wait}
                wall = sum(phases.values()) + 2.0
                record = {"rank": r, "step": self.step, "start": self.clock, "end": self.clock + wall / 1e3,
                          "duration_ms": wall, "phases_ms": phases, "phase_comm_ms": {"backward": wait},
                          "comm_ms": wait, "comm_calls": 2, "cpu_ms": wall - wait, "runq_ms": 0.2,
                          "rss_bytes": (1000 + r + (3 * self.step if r == 40 else 0)) * 2**20}
                if self.device and self.step > 1:  # CUDA and NCCL: the host never waits, the device says who did
                    record["comm_ms"], record["phase_comm_ms"] = 0.01, {"backward": 0.01}
                    record["device_steps"] = [{"step": self.step - 1, "step_ms": wall - 2.0, "idle_before_ms": 0.5}]
                    record["device_colls"] = [{"step": self.step - 1, "group": "0", "seq": self.step - 1,
                                               "op": "allreduce", "ms": wait}]
                if self.p2p and r in (31, 32):  # stage 0's last rank sends to stage 1's first
                    record["p2p"] = {"first": ["send", 32] if r == 31 else ["recv", 31],
                                     "send": {"32": 4} if r == 31 else {}, "recv": {"31": 4} if r == 32 else {}}
                lines[r].append(json.dumps(record))
            if self.step % 7 == 0:
                lines[21].append('{"rank": 21, "step": "not a number"}')  # refused the same way either way
            self.clock += (slowest + 45.0) / 1e3
        for r, new in lines.items():
            with open(self.root / "ranks" / str(r) / "steps.jsonl", "a") as f:
                f.write("\n".join(new) + "\n")


def verdicts(judge: LiveJudge, now: float) -> list[tuple]:
    found = judge.judge(now=now).active
    return sorted((f["kind"], tuple(f["ranks"]), f["severity"], f["explanation"], json.dumps(f["metrics"], sort_keys=True))
                  for f in found)


@pytest.mark.parametrize("p2p,device", [(False, False), (True, False), (False, True)],
                         ids=["data-parallel", "two-stages", "timed-on-the-device"])
def test_judging_the_hosts_summaries_is_judging_every_ranks_file(tmp_path, p2p, device):
    direct_run, summarized_run = tmp_path / "direct", tmp_path / "summarized"
    jobs = [Job(direct_run, p2p, device), Job(summarized_run, p2p, device)]
    reducers = [HostReducer(summarized_run, f"node-{h}") for h in range(RANKS // PER_HOST)]
    direct, summarized = LiveJudge(direct_run), LiveJudge(summarized_run)
    for steps in (25, 3, 1, 6):  # the first window, then as judgements would find the job
        for job in jobs:
            job.append(steps)
        for reducer in reducers:
            reducer.reduce()
        now = jobs[0].clock + 1.0
        assert verdicts(direct, now) == verdicts(summarized, now)
        a, b = direct.steps.window().tables, summarized.steps.window().tables
        pd.testing.assert_frame_equal(a.steps, b.steps)
        pd.testing.assert_frame_equal(a.ledger, b.ledger)
        assert a.structure.to_json() == b.structure.to_json()
        # The window is cut from tables made once per read: as if made from every held row's dict at once.
        held, last = summarized.steps, summarized.steps.window().finished
        first = last - summarized.settings.window_steps
        at_once = pd.DataFrame([row for h in held.steps.values() for s, row in h.rows.items() if first < s <= last])
        pd.testing.assert_frame_equal(step_table(held.rows.between(first, last)), step_table(at_once), check_like=True)
    found = {v[:2] for v in verdicts(summarized, now)}
    assert ("memory_growth", (40,)) in found and (p2p or ("straggler", (STRAGGLER,)) in found), found
    # One file a host read, none of the ranks' own; the refused lines counted as from the files.
    assert len(summarized.steps.summaries) == 8 and not summarized.steps.direct
    assert summarized.steps.steps[21].found.bad_count == direct.steps.steps[21].found.bad_count == 5
    assert summarized.steps.steps[31].found.p2p == direct.steps.steps[31].found.p2p
    assert bool(summarized.steps.steps[31].found.p2p) == p2p
    if device:  # the device's timings came through the summaries as through the files: the waits are the device's
        steps = summarized.steps.window().tables.steps
        assert (steps["time_source"] == "device").any() and steps["device_comm_wait_ms"].notna().any()
        # ... and the end-of-run line with the last step's timings (no step of its own).
        for job in jobs:
            with open(job.root / "ranks" / "3" / "steps.jsonl", "a") as f:
                f.write(json.dumps({"kind": "device", "rank": 3, "device_steps": [
                    {"step": job.step, "step_ms": 70.0, "idle_before_ms": 0.5}]}) + "\n")
        for reducer in reducers:
            reducer.reduce()
        direct.steps.read(), summarized.steps.read()
        assert summarized.steps.steps[3].found.device == direct.steps.steps[3].found.device != {}


def test_a_summary_that_falls_silent_is_named_and_its_ranks_read_from_their_files(tmp_path):
    job = Job(tmp_path)
    reducers = {h: HostReducer(tmp_path, f"node-{h}") for h in range(RANKS // PER_HOST)}
    judge = LiveJudge(tmp_path)
    job.append(25)
    for reducer in reducers.values():
        reducer.reduce()
    judge.judge(now=job.clock + 1.0)
    assert not judge.steps.direct
    # node-3's wrapper stops reducing (its thread failed, its host is gone) while its ranks go on.
    job.append(5)
    for h, reducer in reducers.items():
        if h != 3:
            reducer.reduce()
    judge.steps.summaries["node-3"].heard_at -= 3600  # as if it had been silent for an hour
    verdict = judge.judge(now=job.clock + 1.0)
    assert any("node-3" in note and "steps_summary.jsonl" in note for note in verdict.notes)
    assert sorted(judge.steps.direct) == list(range(24, 32)) and "node-3" not in judge.steps.summaries
    assert {judge.steps.steps[r].last_step for r in range(RANKS)} == {30}  # nothing lost in the switch


def test_a_judge_that_reads_late_takes_no_host_for_silent_that_wrote_meanwhile(tmp_path):
    """A judge paced to its CPU reads every ~50 s at 8,192 ranks, and a starved one later still: what the hosts
    wrote meanwhile is read before any of them is judged silent (every host was, and every rank read from its file)."""
    job = Job(tmp_path)
    reducers = [HostReducer(tmp_path, f"node-{h}") for h in range(RANKS // PER_HOST)]
    judge = LiveJudge(tmp_path)
    job.append(25)
    for reducer in reducers:
        reducer.reduce()
    judge.judge(now=job.clock + 1.0)
    job.append(5)
    for reducer in reducers:
        reducer.reduce()
    for summary in judge.steps.summaries.values():
        summary.heard_at -= 3600  # the judge last read an hour ago
    verdict = judge.judge(now=job.clock + 1.0)
    assert not verdict.notes and not judge.steps.direct and len(judge.steps.summaries) == RANKS // PER_HOST
    assert {judge.steps.steps[r].last_step for r in range(RANKS)} == {30}


def test_a_damaged_summary_line_is_left_out_and_beats_keep_a_quiet_host_heard(tmp_path):
    job = Job(tmp_path)
    reducer = HostReducer(tmp_path, "node-0")
    job.append(22)
    reducer.reduce()
    with open(summary_path(tmp_path, "node-0"), "a") as f:
        f.write('{"groups": [{"columns": ["rank", "step"], "rows": [[3, 999\n')  # a wrapper killed mid-line
        f.write('{"groups": [{"columns": ["rank", "step"], "rows": [[3]]}, "not a group"], "extra": []}\n')
    with settings.overriding({"live": {"window_steps": 10}}):
        judge = LiveJudge(tmp_path)
    judge.steps.read()
    assert judge.steps.steps[3].last_step == 22 and 999 not in judge.steps.steps[3].rows
    # A quiet host (no new step) still beats, so it is not taken for a silent one.
    reducer.said_at -= 60
    assert reducer.reduce() == 0
    heard = judge.steps.summaries["node-0"].heard_at
    time.sleep(0.01)
    judge.steps.read()
    assert judge.steps.summaries["node-0"].heard_at > heard


def test_a_full_summary_is_set_aside_and_its_reader_loses_no_line(tmp_path):
    job = Job(tmp_path)
    # A fresh summary every few steps' lines; the first line alone fills one, set aside before the first read.
    reducer = HostReducer(tmp_path, "node-2", max_bytes=3_000)
    summary = HostSummary(summary_path(tmp_path, "node-2"), keep=None)
    summary.ranks = {r: RankSteps(r, None) for r in range(16, 24)}
    for steps in (2, 3, 1, 4, 2, 5, 3):
        job.append(steps)
        reducer.reduce()
        reducer.reduce()  # nothing new: no line
        summary.read()
    assert set_aside(summary_path(tmp_path, "node-2")).exists()
    assert summary_path(tmp_path, "node-2").stat().st_size < 2 * 3_000  # bounded: a line past the size, at most
    assert all(sorted(held.rows) == list(range(1, 21)) for held in summary.ranks.values())


def test_rows_that_come_before_their_rank_is_seen_are_kept_and_ranks_read_elsewhere_skipped(tmp_path):
    job = Job(tmp_path)
    reducer = HostReducer(tmp_path, "node-1")
    job.append(3)
    reducer.reduce()
    summary = HostSummary(summary_path(tmp_path, "node-1"), keep=None)  # no rank placed yet (a reader's race)
    summary.elsewhere = {9}  # read from its own file
    summary.read()
    assert sorted(summary.ranks) == [8, *range(10, 16)]
    assert all(sorted(held.rows) == [1, 2, 3] for held in summary.ranks.values())


def test_the_phases_named_are_gathered_again_only_when_a_rank_names_one_first(tmp_path, monkeypatch):
    """LiveSteps keeps the phases its ranks named until a read places a rank or finds one naming a phase first."""
    from diagtrain.profiler.analyzer.run.live_tables import LiveSteps

    job = Job(tmp_path)
    reducers = [HostReducer(tmp_path, f"node-{h}") for h in range(RANKS // PER_HOST)]
    job.append(2)
    for reducer in reducers:
        reducer.reduce()
    live = LiveSteps(tmp_path, window_steps=5)
    live.read()
    gathered = []
    named = live._named
    monkeypatch.setattr(live, "_named", lambda: gathered.append(1) or named())
    assert live.phases() == ["data", "forward", "backward"] and len(gathered) == 1
    job.append(1)
    for reducer in reducers:
        reducer.reduce()
    live.read()
    assert live.phases() == ["data", "forward", "backward"] and len(gathered) == 1  # no phase first named: kept
    record = {"rank": 3, "step": job.step + 1, "start": job.clock, "end": job.clock + 0.1, "duration_ms": 100.0,
              "phases_ms": {"forward": 50.0, "optimizer": 20.0}}
    with open(tmp_path / "ranks" / "3" / "steps.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    reducers[0].reduce()
    live.read()
    assert live.phases() == ["data", "forward", "backward", "optimizer"] and len(gathered) == 2
