"""Every independent origin of a hang (issue 51): blocked collectives grouped by the ranks missing from them and
by whether one origin explains another. A recorded 4-rank gloo job where rank 1 and rank 3 stop, one in each
data-parallel group, and small flight-record tables for the shapes a real job can take."""

from __future__ import annotations

from recorded import copy_run
from diagtrain.profiler.analyzer.analyze import analyze
from diagtrain.profiler.analyzer.judge.detectors.hang import origins
from diagtrain.profiler.analyzer.read.flight_records import Blocked


def blocked(pg: str, seq: int, waiting: list[int], missing: list[int], since: int) -> Blocked:
    return Blocked(pg=pg, pg_desc=None, seq=seq, op="nccl:all_reduce", since_ns=since, waiting=waiting,
                   missing=missing, missing_last={})


def test_two_ranks_stopped_in_two_groups_are_two_findings(tmp_path):
    run = copy_run("two-hangs", tmp_path / "run")
    hangs = [f for f in analyze(run, run, ["json"], workers=1)["findings"] if f["kind"] == "hang"]
    assert sorted(f["ranks"] for f in hangs) == [[1], [3]], [f["explanation"] for f in hangs]
    for f in hangs:
        assert f["severity"] == "critical" and f["metrics"]["independent_origins"] == 2
        other = 3 if f["ranks"] == [1] else 1
        assert f"Independently, rank {other} never entered all_reduce" in f["explanation"], f["explanation"]
        # A group made without a description is named by its members, not torch's "undefined".
        assert "undefined" not in f["explanation"] and "on the group of ranks" in f["explanation"]


def test_the_same_rank_missing_again_and_ranks_waiting_behind_it_are_consequences():
    # Rank 1 froze: missing from its TP group's collective and from its DP group's; rank 2 waits for rank 0 in a
    # PP collective only because rank 0 waits in the TP one. One origin, three consequences.
    tp = blocked("tp:0,1", 5, [0], [1], 10)
    dp = blocked("dp:1,3", 5, [3], [1], 20)
    pp = blocked("pp:0,2", 9, [2], [0], 5)  # entered first by the clock: the old verdict named rank 0
    [origin] = origins([pp, tp, dp])
    assert origin.first is tp and origin.roots == {1} and origin.consequences == [pp, dp]


def test_ranks_waiting_for_each_other_keep_the_first_blocked_collective_as_the_one_origin():
    # Rank 1 skipped a collective and waits in the next one, where rank 0 (waiting in the skipped one) is missing.
    skipped = blocked("g:0,1", 3, [0], [1], 10)
    next_one = blocked("g:0,1", 4, [1], [0], 20)
    [origin] = origins([skipped, next_one])
    assert origin.first is skipped and origin.consequences == [next_one]


def test_a_third_rank_waiting_behind_the_second_origin_is_listed_under_it():
    a = blocked("a:0,1", 7, [0], [1], 10)
    b = blocked("b:2,3", 7, [2], [3], 11)
    behind_b = blocked("c:2,4", 2, [4], [2], 12)  # rank 4 waits for rank 2, which waits for rank 3
    first, second = origins([a, b, behind_b])
    assert (first.first, first.consequences) == (a, []) and (second.first, second.consequences) == (b, [behind_b])
