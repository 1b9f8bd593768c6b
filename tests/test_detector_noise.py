"""The straggler and late-rank rules against noise, on records shaped like real runs.

Real runs cannot make noise on demand; these records can: seeded jitter, a data stall on one
rank that the other waits for in backward, a real straggler inside the same jitter, and ranks
that arrive at collectives late by turns or one that is late every time.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.judge.detectors import straggler
from diagtrain.profiler.analyzer.judge.detectors.base import persistently_late
from diagtrain.profiler.analyzer.judge.verdict import verdict
from diagtrain.profiler.analyzer.run.tables import Tables

PHASES = ["data", "forward", "backward", "optimizer"]
STEPS = 12


def steps_table(phases_of, ranks: int = 2) -> pd.DataFrame:
    """Step records; ``phases_of(rank, step, rng)`` gives each step's phases (ms)."""
    rng = np.random.default_rng(7)
    rows = []
    for step in range(1, STEPS + 1):
        for rank in range(ranks):
            phases = phases_of(rank, step, rng)
            wall = sum(phases.values())
            rows.append({"rank": rank, "step": step, "start": step * 1.0, "end": step * 1.0 + wall / 1e3,
                         "wall_ms": wall, "profiled": False, **{f"{k}_ms": v for k, v in phases.items()}})
    return pd.DataFrame(rows)


def detect(steps: pd.DataFrame) -> list:
    """The straggler detector's candidates as their own proposals decide them (no assessment weighs them here)."""
    tables = Tables(steps=steps, ranks=pd.DataFrame(), collectives=pd.DataFrame(), phases=PHASES)
    return [verdict(c, []) for c in straggler.detect(tables)]


def jitter(rng, ms: float) -> float:
    return float(rng.normal(0, ms))


def test_phase_jitter_on_a_shared_host_is_not_a_straggler():
    # Either rank's optimizer now and then 10 ms slower: the noise of 2 ranks sharing 2 cores.
    steps = steps_table(lambda r, s, rng: {"data": 1.0, "forward": 20 + jitter(rng, 1), "backward": 60 + jitter(rng, 2),
                                           "optimizer": 18 + abs(jitter(rng, 6))})
    # Delays only add: the right tail beats the robust deviation now and then, but in a few steps
    # only, so it is information, not a warning.
    assert [f for f in detect(steps) if f.severity != "info"] == []


def test_the_peer_of_a_stalled_rank_waits_and_is_not_a_straggler():
    def phases(rank, step, rng):
        stalled = step % 2 == 0
        return {"data": 80.0 if rank == 1 and stalled else 1.0, "forward": 20 + jitter(rng, 1),
                "backward": 60 + (80.0 if rank == 0 and stalled else 0.0) + jitter(rng, 2), "optimizer": 15.0}
    assert detect(steps_table(phases)) == []


def test_a_straggler_in_the_steps_another_rank_stalls_in_is_still_found():
    # 4 ranks: rank 2 stalls 80 ms for data every third step, rank 1 is 80 ms slow in forward.
    def phases(rank, step, rng):
        stalled = step % 3 == 0
        waits = 80.0 if stalled and rank != 2 else 0.0
        return {"data": 80.0 if rank == 2 and stalled else 1.0, "forward": 20 + (80.0 if rank == 1 else 0.0),
                "backward": 60 + waits + jitter(rng, 2), "optimizer": 15.0}
    [f] = detect(steps_table(phases, ranks=4))
    assert f.ranks == [1] and set(f.steps) == set(range(2, STEPS + 1))


def test_a_consistent_straggler_inside_the_same_jitter_is_found():
    steps = steps_table(lambda r, s, rng: {"data": 1.0, "forward": 20 + (30.0 if r == 1 else 0.0) + jitter(rng, 1),
                                           "backward": 60 + jitter(rng, 2), "optimizer": 18 + abs(jitter(rng, 6))})
    [f] = detect(steps)
    assert f.ranks == [1] and f.metrics["phase"] == "forward phase"
    assert 25 < f.metrics["excess_ms"] < 35 and set(f.steps) == set(range(2, STEPS + 1))


def collectives(arrivals_ms: list[list[float]]) -> pd.DataFrame:
    """All-reduces of 4 ranks: ``arrivals_ms[seq][rank]`` is when each rank arrived (ms)."""
    rows = [{"rank": rank, "group": "0:0,1,2,3", "op": "all_reduce", "seq": seq, "ranks_seen": 4,
             "ts": seq * 1e6 + at * 1e3} for seq, row in enumerate(arrivals_ms, 1) for rank, at in enumerate(row)]
    table = pd.DataFrame(rows)
    last = table.sort_values("ts").groupby("seq")["rank"].last()
    return table.assign(last_rank=table["seq"].map(last))


def test_ranks_late_by_turns_on_a_busy_host_are_not_persistently_late():
    # A clean 4-rank run on 2 cores: rank 1 last at 3 of 4, 8.8 ms late on average, the others 2.5-4.3 ms.
    late = collectives([[0, 12, 4, 3], [2, 10, 0, 5], [3, 0, 8, 1], [5, 13, 5, 0]])
    assert persistently_late(late) == set()


def test_a_rank_late_at_every_collective_is():
    late = collectives([[0, 31, 4, 3], [2, 30, 0, 5], [3, 29, 8, 1], [5, 33, 5, 0]])
    assert persistently_late(late) == {1}


def test_a_long_run_of_collectives_is_judged_without_overflow():
    # 1,500 collectives (a long FSDP window): chance's distribution over them must not overflow.
    rng = np.random.default_rng(3)
    arrivals = [[float(x) for x in rng.uniform(0, 3, 4)] for _ in range(1500)]
    for row in arrivals:
        row[2] += 20.0  # rank 2 late every time
    assert persistently_late(collectives(arrivals)) == {2}



def ddp_window(late_by_ms: dict[tuple[str, int], float], burst: tuple[str, int, float] | None = None) -> pd.DataFrame:
    """The collectives of a 2-rank DDP run's 3 profiled steps, as a real one (tests/test_analyze.py's slow_comm job)
    matched them: each step an all-reduce in the default group and one in DDP's, rank 1 pausing ``late_by_ms`` right
    before each of its calls (its issue gap); ``burst``: (group, seq, ms) a busy host held rank 0 up that long before
    that call, after the previous operator (its arrival late, its gap as ever)."""
    rows = []
    for step in range(3):
        for group, seq0, at in (("0:0,1", 10, 0.0), ("5:0,1", 3, 70.0)):
            seq = seq0 + step
            pause = late_by_ms[(group, seq)]
            held = burst[2] if burst is not None and burst[:2] == (group, seq) else 0.0
            arrive = {0: step * 130.0 + at + held, 1: step * 130.0 + at + pause}
            for rank in (0, 1):
                rows.append({"rank": rank, "group": group, "pg": group.split(":")[0], "pg_desc": "", "op": "all_reduce",
                             "seq": seq, "ranks_seen": 2, "group_ranks": [0, 1], "is_p2p": False,
                             "ts": arrive[rank] * 1e3, "issue_gap_us": 20.0 + (pause * 1e3 if rank == 1 else 0.0),
                             "bytes": 4096.0, "busbw_gbps": float("nan"), "transfer_us": 50.0,
                             "wait_us": max(0.0, max(arrive.values()) - arrive[rank]) * 1e3})
    table = pd.DataFrame(rows)
    last = table.sort_values("ts").groupby(["group", "seq"])["rank"].last()
    return table.assign(last_rank=[last[(g, s)] for g, s in zip(table["group"], table["seq"])])


HOOK_DELAYS = {("0:0,1", 10 + k): 60.0 for k in range(3)} | {("5:0,1", 3 + k): 30.0 for k in range(3)}


def test_a_rank_paused_before_every_call_stays_late_when_a_busy_host_holds_its_peer_up_once():
    """The flake of test_slow_comm_is_a_late_rank_at_collectives: rank 1 paused 30-60 ms before each of its 6 calls of
    a 3-step window; once, a busy host held rank 0 up 38 ms before its call, so it came last there, by 8 ms. A count of
    who came last (5 of 6: p = 0.11) lost the late rank, and with it the slow_collective finding; its lateness summed
    against chance (this one collective weighs 8 ms, not one sixth of the evidence) keeps it."""
    from diagtrain.profiler.analyzer.judge.detectors import slow_collective

    window = ddp_window(HOOK_DELAYS, burst=("5:0,1", 4, 38.0))
    assert window.loc[window["seq"] == 4, "last_rank"].eq(0).all()  # rank 0 came last there
    assert persistently_late(window) == {1}
    steps = pd.DataFrame({"rank": [0, 1] * 3, "step": [3, 3, 4, 4, 5, 5], "profiled": True})
    [late] = slow_collective.detect(Tables(steps=steps, ranks=pd.DataFrame(), collectives=window, phases=[]))
    assert late.ranks == [1] and late.metrics["cause"] == "late_arrival" and late.metrics["before_calls"] is True
    assert verdict(late, []).severity == "warning"  # everyone waits for it: as in a window without the burst
    assert persistently_late(ddp_window(HOOK_DELAYS)) == {1}


def test_a_peer_held_up_as_long_as_the_rank_pauses_leaves_the_window_in_doubt():
    # Rank 0 held up 90 ms once, last there by 60 ms, as late as rank 1 ever was: in DDP's group neither rank is later
    # than the other on the whole, and 3 calls of the default group alone are as late by chance once in 8 windows.
    assert persistently_late(ddp_window(HOOK_DELAYS, burst=("5:0,1", 4, 90.0))) == set()
