"""The cross-rank critical path: a hand-built step with exact numbers, and a real straggler run."""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from candidates import straggler_facts
from conftest import STRAGGLER_MS

from diagtrain.profiler.analyzer.judge.assessments import ledger_price as cost
from diagtrain.profiler.analyzer.judge.assessments import critical_path as cp
from diagtrain.profiler.analyzer.judge.assessments import price_check
from diagtrain.profiler.analyzer.report import critical_path_section as words
from diagtrain.profiler.analyzer.report.wording import finding_json
from diagtrain.profiler.analyzer.run import replay as rp
from diagtrain.profiler.analyzer.run import step_graph
from diagtrain.profiler.analyzer.per_rank import load
from diagtrain.profiler.analyzer.read.discover import discover
from diagtrain.profiler.analyzer.run import tables
from diagtrain.profiler.analyzer.per_rank.collectives import match
from diagtrain.profiler.analyzer.judge.findings import Finding
from diagtrain.profiler.analyzer.judge.verdict import Results, applied
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.analyzer.per_rank.work_segments import COLUMNS

T0 = 1_700_000_000.0  # a Unix time (s): the hand-built step starts here
MS = 1e3


def _segment(rank: int, start_ms: float, end_ms: float, phase: str, gap_phase: str, op: str) -> dict:
    return {"rank": rank, "step": 7, "start_us": T0 * 1e6 + start_ms * MS, "end_us": T0 * 1e6 + end_ms * MS,
            "busy_us": (end_ms - start_ms) * MS, "phase": phase, "gap_phase": gap_phase, "op": op}


def _collective(rank: int, ts_ms: float, dur_ms: float, seq: int = 1) -> dict:
    return {"rank": rank, "pg": "0", "pg_desc": "dp", "group_ranks": (0, 1), "op": "all_reduce", "seq": seq,
            "ts": T0 * 1e6 + ts_ms * MS, "dur": dur_ms * MS, "bytes": 4e6}


def _slow_forward_step(optimizer_ms: float, wall_ms: list[float], collectives: list[dict]) -> Tables:
    """Step 7 of two ranks: forward 20 ms on rank 0 and 60 on rank 1, 10 ms of backward, each rank's
    optimizer step (10 ms) from ``optimizer_ms``."""
    segments = pd.DataFrame([
        _segment(0, 1, 21, "forward", "data", "DDP.forward"), _segment(0, 22, 32, "backward", "backward", "mm"),
        _segment(0, optimizer_ms, optimizer_ms + 10, "optimizer", "optimizer", "AdamW.step"),
        _segment(1, 1, 61, "forward", "data", "DDP.forward"), _segment(1, 62, 72, "backward", "backward", "mm"),
        _segment(1, optimizer_ms, optimizer_ms + 10, "optimizer", "optimizer", "AdamW.step"),
    ], columns=COLUMNS)
    steps = pd.DataFrame({"rank": [0, 1], "step": [7, 7], "wall_ms": wall_ms, "profiled": True,
                          "trace_start": [T0, T0], "trace_end": [T0 + w / 1e3 for w in wall_ms]})
    return Tables(steps=steps, ranks=pd.DataFrame(), collectives=match(pd.DataFrame(collectives)), phases=[],
                  segments=segments)


@pytest.fixture
def two_ranks() -> Tables:
    """Rank 1's forward takes 60 ms, rank 0's 20: rank 0 arrives at the all-reduce at 32 ms and waits
    until rank 1 arrives at 72; both resume 1 ms after it ends (82) with a 10 ms optimizer step."""
    return _slow_forward_step(83, [95.0, 94.0], [_collective(0, 32, 50), _collective(1, 72, 10)])


def test_the_path_runs_through_the_late_rank_with_exact_numbers(two_ranks):
    run = rp.analyze(two_ranks)
    [path] = run.paths
    assert path.length_us == pytest.approx(95 * MS, abs=1)
    assert words.line(path) == ("rank 1 data 1.0 ms → rank 1 forward 60.0 ms → rank 1 backward 11.0 ms → "
                           "all_reduce(dp) waits 40.0 ms on rank 1 (transfer 10.0 ms) → rank 0 optimizer 11.0 ms → "
                           "rank 0 outside phases 2.0 ms")
    spent = {k: round(v / MS, 3) for k, v in path.totals.items()}
    assert spent == {"compute": 80.0, "transfer": 10.0, "waiting": 0.0, "data": 1.0, "host_overhead": 4.0}
    [collective] = [h for h in path.hops if h.kind == "collective"]
    assert (collective.rank, collective.released_rank) == (1, 0)
    # On the timeline: from rank 1's arrival to the moment the all-reduce was done.
    assert (collective.start_us - T0 * 1e6, collective.end_us - T0 * 1e6) == pytest.approx((72 * MS, 82 * MS), abs=1)
    assert words.top(run.paths)[0] == {"rank": 1, "op": "DDP.forward", "ms": pytest.approx(60.0), "share": pytest.approx(60 / 95)}


def test_the_replay_gives_back_the_measured_times(two_ranks):
    [g] = step_graph.graphs(two_ranks)
    r = rp.replay(g)
    assert r.start == pytest.approx(g.start) and r.c_end == pytest.approx(g.c_end)
    assert r.finish == pytest.approx(T0 * 1e6 + 95 * MS)


def test_what_if_the_slow_forward_ran_at_its_peers_median(two_ranks):
    [g] = step_graph.graphs(two_ranks)
    # Rank 1's forward (with the 1 ms before it) 61 ms against rank 0's 21: the all-reduce, and so
    # the step, ends 40 ms sooner. Rank 0's forward is not above its peer: nothing to save.
    assert rp.saving_us(g, rp.peer_scale(g, 1, "forward")) == pytest.approx(40 * MS, abs=1)
    assert rp.saving_us(g, rp.peer_scale(g, 0, "forward")) == 0.0
    straggler = Finding(kind="straggler", severity="warning", explanation="", suggestion="", ranks=[1], steps=[7],
                        metrics={"phase": "forward phase", "quantity": "phase:forward"}, impact_ms=55.0)
    [straggler] = applied([straggler], cp.with_impacts([straggler], [Results()], rp.analyze(two_ranks)))
    assert straggler.impact_ms == pytest.approx(40.0, abs=1e-3)
    assert straggler.metrics["detector_impact_ms"] == 55.0 and straggler.metrics["impact_source"] == "critical_path"



def test_a_ledger_priced_straggler_is_checked_by_replaying_the_ledgers_excess(two_ranks):
    # The ledger says rank 1 ran 30 ms longer than its peer in step 7; the counters, that rank 0 was blocked
    # 70 ms in collectives (20 ms of it inside an operator the graph holds as work), rank 1 10 ms.
    ledger = pd.DataFrame({"rank": [0, 1], "step": [7, 7], "excess_ms": [0.0, 30.0], "wait_ms": [70.0, 10.0]})
    straggler = Finding(kind="straggler", severity="warning", explanation="", suggestion="", ranks=[1], steps=[7],
                        metrics={"quantity": "phase:forward"}, impact_ms=33.0)
    priced = Results([_price(profiled_ms=30.0)])
    [straggler] = applied([straggler], cp.with_impacts([straggler], [priced], rp.analyze(two_ranks), ledger))
    assert straggler.impact_ms == 33.0  # the ledger's price stands
    assert straggler.metrics["critical_path_ms"] == pytest.approx(30.0, abs=0.01)  # 30 ms off its forward: the step too
    # The graph models rank 0's 50 ms and rank 1's 10 ms in the all-reduce as waits, not the 20 ms inside an op.
    assert straggler.metrics["critical_path_wait_coverage"] == pytest.approx(60 / 80, abs=0.01)


def test_a_replay_that_models_few_waits_is_no_check_of_a_price():
    def priced(coverage: float) -> Finding:
        f = Finding(kind="straggler", severity="warning", ranks=[3], steps=[4], impact_ms=129.0, facts=straggler_facts())
        prior = Results([_price(profiled_ms=190.0, noise_ms=5.0), cp.ReplayCheck(0.1, coverage)])
        return applied([f], price_check.disputed([f], [prior]))[0]

    trusted, untrusted = priced(0.9), priced(0.47)
    assert trusted.metrics["impact_range_ms"][0] < 1.0 and trusted.metrics["impact_range_ms"][1] == 129.0
    assert "impact_range_ms" not in untrusted.metrics and untrusted.metrics["impact_replay_skipped"] == \
        {"wait_coverage": 0.47}
    # report.json says why in words.
    assert "only 47% of the ranks' blocked time" in finding_json(untrusted)["metrics"]["impact_replay_skipped"]
    assert finding_json(trusted)["metrics"]["impact_disputed"] == ("the critical path's what-if of the profiled steps "
                                                                   "says 0.1 ms/step, the step records' ledger 190.0 ms/step")


def _price(profiled_ms: float, noise_ms: float = 1.0) -> cost.LedgerPrice:
    """The ledger's price of rank 1's straggler (or 3's) as the assessments after it read it."""
    return cost.LedgerPrice(lost_ms=99.0, per_step_ms=33.0, share=0.3, pattern=cost.EVERY_STEP, period=1,
                            charged_steps=[7], charged_ms_per_step=30.0, noise_ms=noise_ms, profiled_ms=profiled_ms)


def test_a_collective_queued_behind_another_moves_with_it():
    """DDP's two buckets: rank 0 issues both by 32 ms, but its group runs one at a time, so the second starts
    when the first ends (82), after rank 1's slow forward. Removing that slowness moves both."""
    [g] = step_graph.graphs(_slow_forward_step(93, [105.0, 105.0], [
        _collective(0, 32, 50, seq=1), _collective(0, 82, 10, seq=2), _collective(1, 72, 10, seq=1),
        _collective(1, 82, 10, seq=2)]))
    assert sorted(g.c_queued.tolist()) == [-1, -1, 0, 2]  # each rank's second bucket waited for its first
    assert rp.replay(g).finish == pytest.approx(T0 * 1e6 + 105 * MS)
    # The forward at its peer's 21 ms: the first bucket ends at 42, the second at 52, the step 40 ms sooner
    # (without the queue, rank 0's second bucket stayed at 82 and the step saved nothing).
    assert rp.saving_us(g, rp.peer_scale(g, 1, "forward")) == pytest.approx(40 * MS, abs=1)


def _late_wake(rank1_forward_ms: float, rank0_resumes_ms: float) -> rp.StepPath:
    """Rank 0 goes idle in the all-reduce at 32 ms; rank 1 arrives after its forward, the all-reduce
    takes 10 ms; rank 0 resumes at ``rank0_resumes_ms`` with a 10 ms optimizer step."""
    arrives = 12 + rank1_forward_ms
    segments = pd.DataFrame([
        _segment(0, 1, 21, "forward", "data", "DDP.forward"), _segment(0, 22, 32, "backward", "backward", "mm"),
        _segment(0, rank0_resumes_ms, rank0_resumes_ms + 10, "optimizer", "optimizer", "AdamW.step"),
        _segment(1, 1, 1 + rank1_forward_ms, "forward", "data", "DDP.forward"),
        _segment(1, 2 + rank1_forward_ms, arrives, "backward", "backward", "mm"),
        _segment(1, arrives + 11, arrives + 21, "optimizer", "optimizer", "AdamW.step"),
    ], columns=COLUMNS)
    ends = [rank0_resumes_ms + 12, arrives + 22]
    steps = pd.DataFrame({"rank": [0, 1], "step": [7, 7], "wall_ms": ends, "profiled": True,
                          "trace_start": [T0, T0], "trace_end": [T0 + e / 1e3 for e in ends]})
    collectives = match(pd.DataFrame([_collective(0, 32, arrives + 10 - 32), _collective(1, arrives, 10)]))
    [path] = rp.analyze(Tables(steps=steps, ranks=pd.DataFrame(), collectives=collectives, phases=[],
                               segments=segments)).paths
    return path


def test_a_rank_woken_late_after_a_long_wait_was_still_waiting():
    """On a busy host rank 0 wakes 8 ms after the all-reduce it waited 50 ms in: the wait is rank 1's."""
    path = _late_wake(rank1_forward_ms=60, rank0_resumes_ms=90)
    # Rank 0's optimizer hop: its 8 ms wake-up (its own) and its 10 ms of work.
    assert words.line(path) == ("rank 1 forward 60.0 ms → rank 1 backward 11.0 ms → all_reduce(dp) waits 40.0 ms on "
                           "rank 1 (transfer 10.0 ms) → rank 0 optimizer 18.0 ms → rank 0 outside phases 2.0 ms")
    assert path.length_us == pytest.approx(102 * MS, abs=1)


def test_a_rank_that_sleeps_past_a_short_wait_keeps_its_own_time():
    """Rank 1 arrives 2 ms after rank 0; rank 0 then sits idle 37 ms more than the all-reduce took."""
    path = _late_wake(rank1_forward_ms=22, rank0_resumes_ms=83)
    assert {h.rank for h in path.hops} == {0} and not [h for h in path.hops if h.kind == "collective"]
    assert path.length_us == pytest.approx(95 * MS, abs=1)


def test_a_recv_waits_for_its_send_across_ranks():
    """Two pipeline stages: rank 1's recv is posted at 2 ms and ends when rank 0 sends, after its
    50 ms forward; rank 1 then works 20 ms. The path crosses from rank 0's forward to rank 1."""
    segments = pd.DataFrame([_segment(0, 1, 51, "forward", "data", "stage0"), _segment(0, 53, 60, "forward", "forward", "x"),
                             _segment(1, 53, 73, "backward", "backward", "stage1")], columns=COLUMNS)
    steps = pd.DataFrame({"rank": [0, 1], "step": [7, 7], "wall_ms": [62.0, 75.0], "profiled": True,
                          "trace_start": [T0, T0], "trace_end": [T0 + 0.062, T0 + 0.075]})
    p2p = [{**_collective(0, 51, 1), "op": "send"}, {**_collective(1, 2, 50), "op": "recv"}]
    p2p = pd.DataFrame(p2p).assign(pg="?", pg_desc=None, group_ranks=[(), ()])
    run = rp.analyze(Tables(steps=steps, ranks=pd.DataFrame(), collectives=match(p2p), phases=[], segments=segments))
    [path] = run.paths
    assert words.line(path) == ("rank 0 data 1.0 ms → rank 0 forward 50.0 ms → recv(p2p) waits 49.0 ms on rank 0 "
                           "(transfer 1.0 ms) → rank 1 backward 21.0 ms → rank 1 outside phases 2.0 ms")
    assert path.length_us == pytest.approx(75 * MS, abs=1)
    [g] = run.graphs
    assert rp.saving_us(g, rp.peer_scale(g, 0, "forward")) == 0.0  # no peer in forward to compare with
    halved = np.where((g.rank == 0) & (g.phase == "forward"), 0.5, 1.0)
    assert rp.saving_us(g, halved) == pytest.approx(25.5 * MS, abs=1)  # its forward and the 1 ms before it


AFFECTED = (4, 5, 6)  # straggler_job's (tests/conftest.py)
CLEAN = (2, 3, 7)  # profiled steps of the same run the straggler did not slow: its clean twin


@pytest.fixture(scope="module")
def straggler_run(straggler_job) -> tuple[Path, dict]:
    run, report = straggler_job
    return run.out, report


@pytest.mark.jobs
def test_the_path_of_a_straggling_step_runs_through_its_forward(straggler_run):
    out, report = straggler_run
    section = report["critical_path"]
    assert section["available"] and set(AFFECTED) <= set(section["steps"])
    worst = section["worst_step"]
    assert worst["step"] in AFFECTED
    [forward] = [h for h in worst["hops"] if h["kind"] == "work" and h["rank"] == 1 and h["label"] == "forward"]
    assert forward["ms"] >= 0.9 * STRAGGLER_MS
    assert section["top"][0]["rank"] == 1 and "forward" in section["top"][0]["op"]
    markdown = (out.parent / "analysis" / "report.md").read_text()
    assert f"worst step (step {worst['step']}" in markdown and "rank 1 forward" in markdown


@pytest.mark.jobs
def test_removing_the_straggler_saves_what_was_injected(straggler_run, tmp_path):
    out, report = straggler_run
    inputs, _ = discover(out)
    results, _ = load.load(inputs, tmp_path / "cache", workers=1)
    run = rp.analyze(tables.build(out, results))
    saved = {g.step: rp.saving_us(g, rp.peer_scale(g, 1, "forward")) / MS for g in run.graphs}
    length = {p.step: p.length_us / MS for p in run.paths}
    median_saving = statistics.median(saved[s] for s in AFFECTED)
    assert median_saving == pytest.approx(STRAGGLER_MS, rel=0.2), (saved, length)
    # What the delay cost, from the clean twin: the steps it slowed against those it did not. Looser:
    # the other rank computes alone while the straggler sleeps, so its steps differ by more than noise.
    cost = statistics.median(length[s] for s in AFFECTED) - statistics.median(length[s] for s in CLEAN)
    assert median_saving == pytest.approx(cost, rel=0.3), (saved, length)
    assert max(saved[s] for s in CLEAN) < 0.2 * STRAGGLER_MS, saved  # steps it did not slow: nothing to save


def test_a_step_of_many_short_collectives_keeps_a_one_line_path():
    """Two ranks in lockstep through 60 short all-reduces, rank 1 with one 30 ms op: the line is that op,
    the wait for it, and the work around it (it once listed all 120 collectives, each 0.0 ms)."""
    segments, collectives, at = [], [], 1.0
    for i in range(60):
        long_op = i == 30
        for rank in (0, 1):
            end = at + (30.0 if long_op and rank == 1 else 1.0)
            segments.append(_segment(rank, at, end, "backward", "backward", "big_mm" if long_op and rank == 1 else "mm"))
            collectives.append({**_collective(rank, end, 0.05 + (29.0 if long_op and rank == 0 else 0.0)), "seq": i + 1})
        at += 31.1 if long_op else 1.1
    steps = pd.DataFrame({"rank": [0, 1], "step": [7, 7], "wall_ms": [at, at], "profiled": True,
                          "trace_start": [T0, T0], "trace_end": [T0 + at / 1e3, T0 + at / 1e3]})
    run = rp.analyze(Tables(steps=steps, ranks=pd.DataFrame(), collectives=match(pd.DataFrame(collectives)),
                            phases=[], segments=pd.DataFrame(segments, columns=COLUMNS)))
    [path] = run.paths
    assert len(path.hops) > 100
    assert words.line(path) == ("rank 0 backward 32.5 ms → all_reduce(dp) waits 0.0 ms on rank 0 (transfer 0.1 ms) → "
                           "rank 1 backward 30.1 ms → all_reduce(dp) waits 29.0 ms on rank 1 (transfer 0.1 ms) → "
                           "rank 0 backward 31.4 ms")


def test_a_path_line_names_its_longest_hops_and_counts_the_rest():
    hops = [rp.Hop(rank=i % 2, kind="work", label=f"phase{i}", us=(i + 1) * MS) for i in range(30)]
    path = rp.StepPath(step=1, length_us=sum(h.us for h in hops), hops=hops, totals={}, waiting_on={})
    line = words.line(path)
    most = step_graph.CriticalPath.active().max_line_hops
    assert line.endswith(f"(and {30 - most} shorter hops)")
    named = [int(part.split()[2].removeprefix("phase")) for part in line.split(" (and")[0].split(" → ")]
    assert named == list(range(30 - most, 30))  # the longest ones, in path order
