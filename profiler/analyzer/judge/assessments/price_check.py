"""The ledger's price against the critical path's replay of the same profiled steps: where they disagree beyond the
noise, a finding claims the range between them, not one number it cannot stand behind."""

from __future__ import annotations

from diagtrain.profiler.analyzer.judge.assessments.critical_path import ReplayCheck
from diagtrain.profiler.analyzer.judge.assessments.ledger_price import Cost, LedgerPrice
from diagtrain.profiler.analyzer.judge.findings import Finding
from diagtrain.profiler.analyzer.judge.verdict import DISPUTE, Assessed, Assessment, Results


def disputed(findings: list[Finding], prior: list[Results]) -> Assessed:
    """Each finding the ledger priced and the replay checked, where the two disagree (or the replay models too few
    of the ranks' waits to be a check)."""
    c = Cost.active()
    out = Assessed()
    for i, f in enumerate(findings):
        price, check = prior[i].of(LedgerPrice), prior[i].of(ReplayCheck)
        if price is None or check is None or price.profiled_ms is None:
            continue
        replay, ledger = check.ms, price.profiled_ms
        coverage = check.wait_coverage
        if coverage is not None and coverage < c.min_replay_coverage:
            # Why the replay is no check of the price, as data (report/wording.py words it in report.json).
            out.add(i, Assessment(DISPUTE, metrics={"impact_replay_skipped": {"wait_coverage": coverage}}))
            continue
        gap = abs(replay - ledger)
        if gap > c.disagree_share * max(replay, ledger) and gap > price.noise_ms and f.impact_ms and ledger > 0:
            # Both price the profiled steps; the claim is over the whole run: it is widened by their ratio.
            ratio = replay / ledger
            out.add(i, Assessment(DISPUTE, metrics={
                "impact_range_ms": [round(f.impact_ms * min(ratio, 1.0), 3), round(f.impact_ms * max(ratio, 1.0), 3)],
                "impact_disputed": {"replay_ms": replay, "ledger_ms": ledger}}))
    return out
