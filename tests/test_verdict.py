"""One verdict per finding (judge/verdict.py): severity and impact decided once, by one precedence, from a
candidate nothing edits and the assessments of it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from candidates import straggler_facts

from diagtrain.profiler.analyzer.judge.assessments.proposal import RULES
from diagtrain.profiler.analyzer.judge.findings import Candidate
from diagtrain.profiler.analyzer.judge.kinds import KINDS
from diagtrain.profiler.analyzer.judge.live_judge import LiveEvent, LiveVerdict
from diagtrain.profiler.analyzer.report.wording import PHRASES, WORDS, explanation, finding_json, worded
from diagtrain.profiler.analyzer.judge.judgement import ASSESSMENTS, Step, misordered
from diagtrain.profiler.analyzer.judge.verdict import (DISPUTE, EXPLAINED, HOST, LEAK_TIME, LEDGER, REPLAY, Assessed,
                                                       Assessment, Judged, verdict)

REPO = Path(__file__).resolve().parent.parent
FACTS = straggler_facts()  # a warning by its rule, 12 ms a step, and its words:
OWN = ("rank 1 is a straggler in steps 4-5: forward phase 32.0 ms, 12.0 ms more than its peers' 20.0 ms; rank 0 waits "
       "for it at the next collective.")


def candidate(**fields) -> Candidate:
    return Candidate(**{"kind": "straggler", "ranks": [1], "steps": [4, 5], "facts": FACTS,
                        "metrics": {"excess_ms": 12.0, "step_time_median_ms": 100.0}, **fields})


def test_the_ledgers_price_beats_the_replays_whatever_the_order_they_came_in():
    replay = Assessment(REPLAY, impact_ms=40.0, prices=True, metrics={"impact_source": "critical_path"})
    ledger = Assessment(LEDGER, impact_ms=30.0, prices=True, severity="error", metrics={"impact_source": "ledger"})
    for made in ([replay, ledger], [ledger, replay]):
        f = verdict(candidate(), made)
        assert f.impact_ms == 30.0 and f.severity == "error"
    assert verdict(candidate(), [replay]).impact_ms == 40.0  # no ledger price: the replay's
    # No price at all: the candidate's own proposal, its kind's rule on its facts.
    assert (verdict(candidate(), []).impact_ms, verdict(candidate(), []).severity) == (12.0, "warning")


def test_a_price_of_none_is_a_say_and_a_missing_price_is_none():
    assert verdict(candidate(), [Assessment(LEDGER, impact_ms=None, prices=True)]).impact_ms is None
    assert verdict(candidate(), [Assessment(DISPUTE, metrics={"impact_range_ms": [1.0, 2.0]})]).impact_ms == 12.0


def test_host_contention_makes_it_information_whatever_the_ledger_said():
    nothing = {"says": "ledger_charged_nothing", "rank": 1, "charged_above_ms": 2.5}
    starved = {"says": "not_own_work", "cause": "starved", "rank": 1, "evidence": "cpu_wait", "extra_ms": 9.0}
    made = [Assessment(LEDGER, severity="error", says=nothing),
            Assessment(HOST, severity="info", says=starved, metrics={"starved": True})]
    f = verdict(candidate(), made)
    assert f.severity == "info" and f.metrics["starved"] is True
    # The facts and remarks are data, the remarks in the order made; the report words them after the proposer's own.
    assert f.explanation == "" and f.facts == FACTS and f.remarks == [nothing, starved]
    assert explanation(f) == (OWN + " But the ledger of every step charged rank 1 nothing above this run's noise "
                              "(2.5 ms a step): seen in profiled steps alone, it cost the job nothing measurable. "
                              "But it waited 9.0 ms per step longer than its peers for a CPU: that is host contention "
                              "(see host_contention), not rank 1's own work.")
    # report.json holds the evidence in words, as its reason.
    assert finding_json(f)["remarks"][1] == {"says": "not_own_work", "cause": "starved", "rank": 1,
                                             "reason": "it waited 9.0 ms per step longer than its peers for a CPU"}


def test_a_leaks_time_is_added_to_its_own_and_an_explained_finding_is_gone():
    leak = candidate(kind="memory_growth", facts={"growths": []})  # a leak's proposal claims no saving
    assert verdict(leak, [Assessment(LEAK_TIME, extra_impact_ms=6.0), Assessment(LEAK_TIME, extra_impact_ms=2.5)]) \
        .impact_ms == pytest.approx(8.5)
    assert verdict(candidate(), [Assessment(EXPLAINED, drop=True)]) is None


def test_the_candidate_is_never_edited():
    c = candidate()
    verdict(c, [Assessment(LEDGER, severity="error", impact_ms=99.0, prices=True, metrics={"excess_ms": 1.0},
                           says={"says": "leak_time", "impact_ms": 1.0, "rank": 1, "phase": "step"},
                           settings={"cost.min_steps": 2})])
    assert (c.metrics, c.facts, c.settings, c.remarks) == \
        ({"excess_ms": 12.0, "step_time_median_ms": 100.0}, FACTS, {}, [])


def test_each_step_sees_the_findings_as_decided_so_far_and_new_candidates_join_after():
    late = {"case": "late_arrival", "before_calls": True, "lost_ms_per_step": 12.0}
    judged = Judged([candidate(), candidate(kind="slow_collective", ranks=[1], facts=late)])
    judged.take(Assessed(of={0: [Assessment(LEDGER, severity="error", impact_ms=30.0, prices=True)]},
                         new=[candidate(kind="dataloader_stall", ranks=[2], facts={"lost_ms_per_step": 12.0})]))
    seen = judged.findings()
    assert [(f.kind, f.severity, f.impact_ms) for f in seen] == \
        [("straggler", "error", 30.0), ("slow_collective", "warning", 12.0), ("dataloader_stall", "warning", 12.0)]
    judged.take(Assessed(of={1: [Assessment(EXPLAINED, drop=True)]}))
    assert [f.kind for f in judged.findings()] == ["straggler", "dataloader_stall"]
    # Positions are those of the list the step was given: the dropped finding is no longer in it.
    judged.take(Assessed(of={1: [Assessment(HOST, severity="info")]}))
    assert [(f.kind, f.severity) for f in judged.findings()] == [("straggler", "error"), ("dataloader_stall", "info")]


def test_an_assessment_with_an_unknown_severity_is_refused():
    with pytest.raises(ValueError, match="severity"):
        Assessment(LEDGER, severity="bad")


def test_every_kind_has_a_rule_for_its_proposal_and_words():
    def of_kind(table: dict) -> set[str]:
        return {key.split("/")[0] for key in table}
    kinds = {k.name for k in KINDS}
    assert of_kind(RULES) == kinds and of_kind(WORDS) == kinds
    # A case with a rule of its own has words of its own.
    assert {key for key in RULES if "/" in key} <= set(WORDS)


def test_every_remark_judgement_makes_has_its_words():
    judge_source = "".join(p.read_text() for p in (REPO / "profiler" / "analyzer" / "judge").rglob("*.py"))
    said = set(re.findall(r'"says": "(\w+)"', judge_source))
    assert len(said) >= 6 and said == set(PHRASES)


def test_the_live_verdict_is_worded_as_the_report():
    remark = {"says": "leak_time", "impact_ms": 6.25, "rank": 1, "phase": "backward"}
    f = verdict(candidate(), [Assessment(LEAK_TIME, extra_impact_ms=6.25, says=remark)])
    record = f.to_json()  # as live judgement keeps it: the facts and the remarks as data
    live = worded(LiveVerdict(events=[LiveEvent(dict(record), None)], active=[dict(record)], step=3, latest={}))
    expected = OWN + (" It also costs the job 6.2 ms a step: the pages it faults in hold up rank 1's backward (its "
                      "straggler finding).")
    assert live.events[0].record["explanation"] == live.active[0]["explanation"] == finding_json(f)["explanation"] \
        == expected


def test_each_assessment_step_comes_after_the_steps_whose_records_it_reads():
    assert misordered() == []
    by_name = {s.name: s for s in ASSESSMENTS}
    swapped = tuple(by_name[n] for n in ("traced excess", "cost"))  # the traced excess reads the ledger's price
    assert misordered(swapped) == ["traced excess reads LedgerPrice, which no step before it makes"]
    assert misordered((Step("lonely", lambda *_: Assessed(), reads=(float,)),)) == \
        ["lonely reads float, which no step before it makes"]


def test_a_step_reads_the_records_the_steps_before_it_left_on_each_finding():
    judged = Judged([candidate(), candidate(ranks=[2])])
    judged.take(Assessed(of={1: [Assessment(LEDGER, result=2.5)]}, new=[candidate(ranks=[3])],
                         new_results={0: ("new",)}))
    judged.take(Assessed(of={0: [Assessment(EXPLAINED, drop=True)]}))
    # By the position of the findings standing: the first is gone, the new candidate came with its own record.
    assert [(r.of(float), r.of(str)) for r in judged.results()] == [(2.5, None), (None, "new")]


def test_a_findings_record_is_what_asdict_makes_of_it():
    """to_json copies flat lists whole (a straggler's 8,191 peers at 8,192 ranks): the same record as asdict's, every
    container a copy (a record kept by live judgement must not change with the finding)."""
    from collections import namedtuple
    from dataclasses import asdict

    import numpy as np

    Span = namedtuple("Span", "first last")
    facts = {**FACTS, "others": list(range(2, 9000)), "span": Span(4, 5), "pair": (1, 2.5),
             "nested": [{"rank": 1, "steps": [4, 5]}, [np.float64(1.5), None]], "value": np.int64(7)}
    f = verdict(candidate(facts=facts, evidence=[{"type": "steps", "rank": 1}]), [])
    record, reference = f.to_json(), asdict(f)
    reference["time_range"] = None
    assert record == reference
    assert type(record["facts"]["pair"]) is tuple and type(record["facts"]["span"]) is Span
    assert record["facts"]["others"] is not f.facts["others"] and record["evidence"][0] is not f.evidence[0]
    assert record["facts"]["nested"][0]["steps"] is not f.facts["nested"][0]["steps"]


def test_a_verdict_copies_its_candidate_as_a_deep_copy_would():
    """Nothing edits a candidate: its finding holds copies of every container (flat lists copied whole)."""
    import copy
    from collections import namedtuple

    Span = namedtuple("Span", "first last")
    c = candidate(facts={**FACTS, "others": list(range(2, 9000)), "span": Span(4, 5),
                         "nested": [{"rank": 1, "steps": [4, 5]}]}, evidence=[{"type": "steps", "rank": 1}])
    reference = copy.deepcopy(c)
    f = verdict(c, [])
    assert {k: getattr(f, k) for k in ("ranks", "steps", "facts", "evidence", "metrics")} == \
        {k: getattr(reference, k) for k in ("ranks", "steps", "facts", "evidence")} | {"metrics": f.metrics}
    f.facts["others"].append(-1)
    f.facts["nested"][0]["steps"].append(6)
    f.steps.append(99)
    f.evidence[0]["rank"] = 7
    assert c.facts == reference.facts and c.steps == reference.steps and c.evidence == reference.evidence
    assert type(f.facts["span"]) is Span
