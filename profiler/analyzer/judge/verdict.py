"""One finding from a detector's candidate and the assessments of it: severity and impact decided here, once.

A detector proposes a candidate (a ``Candidate``: kind, ranks, steps, evidence, the facts its words are made of).
Nothing edits a candidate afterwards. Its kind's rule makes its first :class:`Assessment`, the proposal
(judge/assessments/proposal.py: the severity and impact its own measurements say); each later judgement
(judge/judgement.py ``ASSESSMENTS``) returns assessments of candidates too: the ledger's price, the host-contention
and allocator-churn judgement, "explained by" another finding, the traced operators, the critical path's replay, the
check of the two prices against each other. :func:`verdict` turns a candidate and its assessments into the finding:
the one place a ``Finding`` is made.
An assessment's typed record of a finding (``Assessment.result``: the ledger's ``LedgerPrice``, the replay's
``ReplayCheck``...) is what later assessments read of it (:class:`Results`), never its metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Iterable, TypeVar

from diagtrain.profiler.analyzer.judge.findings import SEVERITIES, Candidate, Finding, copied

# The assessments, by name (``Assessment.by``), in the order they are made and their remarks are read.
LEDGER = "ledger"  # what the cause cost the job over every step (judge/assessments/ledger_price.py)
JOB_PRICE = "job_price"  # what time every rank lost together cost the job (judge/assessments/job_price.py)
HOST = "host_contention"  # the rank's excess was not its own work (judge/assessments/contention.py)
MORE_WORK = "more_work"  # the rank does more work than its peers, which a crowded host hides (judge/assessments/contention.py)
LEAK_TIME = "leak_time"  # the time a memory growth costs, found as a straggler's excess (judge/assessments/contention.py)
EXPLAINED = "explained"  # another finding names the cause (judge/assessments/explained.py)
TRACED = "traced_operators"  # where the excess went in the profiled steps (judge/assessments/traced_excess.py)
REPLAY = "critical_path"  # the what-if on the profiled steps' graphs (judge/assessments/critical_path.py)
DISPUTE = "price_check"  # the ledger and the replay against each other (judge/assessments/price_check.py)
PROPOSAL = "proposal"  # the candidate's own: its kind's rule on its measurements (judge/assessments/proposal.py)

# Who decides, first that has a say: the ledger prices over every step, the replay only the profiled ones
# (it prices what the ledger did not); a rank that waited for a CPU, or churned its allocator, is information
# whatever its price said, unless it does more work than its peers, which its crowded host hid from the price.
# The job's own ledger prices what every rank lost together, which no rank's excess holds. The candidate's own
# proposal decides where none of them has a say.
IMPACT_FROM = (LEDGER, JOB_PRICE, REPLAY, PROPOSAL)
SEVERITY_FROM = (MORE_WORK, HOST, LEDGER, JOB_PRICE, PROPOSAL)


@dataclass(frozen=True)
class Assessment:
    """One judgement of a candidate: what it adds to the finding's metrics and remarks, and its say (if any) on
    the finding's severity and impact."""

    by: str  # one of the names above
    metrics: dict[str, Any] = field(default_factory=dict)
    says: dict[str, Any] | None = None  # its remark on the finding, as data (report/wording.py words it)
    settings: dict[str, Any] = field(default_factory=dict)  # "section.name" -> value it judged with
    severity: str | None = None  # None: no say
    impact_ms: float | None = None  # ... and with ``prices``, the impact it decides (None: no saving)
    prices: bool = False
    extra_impact_ms: float = 0.0  # time added to the finding's own (a leak's cost found in a straggler; the time of
    # a rank's other straggler findings where more work is its one cause)
    drop: bool = False  # another finding says this one's cause
    result: Any = None  # its typed record of the finding (a dataclass), which later assessments read (Results)

    def __post_init__(self) -> None:
        if self.severity is not None and self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} is not one of {SEVERITIES}")


def verdict(candidate: Candidate, assessments: list[Assessment]) -> Finding | None:
    """The finding: the candidate's fields, each assessment's metrics, settings and remarks in the order made,
    severity and impact from the first in ``SEVERITY_FROM`` and ``IMPACT_FROM`` that has a say (the candidate's
    own proposal last); None when another finding explains it."""
    if any(a.drop for a in assessments):
        return None
    # Made here, for every candidate whoever proposed it (a detector, the model's check, live judgement, an
    # assessment's new cause): no path to a finding skips it.
    assessments = [_proposal(candidate), *assessments]
    said = next((a for by in SEVERITY_FROM for a in assessments if a.by == by and a.severity is not None), None)
    if said is None:
        raise ValueError(f"no severity proposed for a {candidate.kind} candidate")
    priced = next((a for by in IMPACT_FROM for a in assessments if a.by == by and a.prices), None)
    f = _made(candidate, said.severity, priced.impact_ms if priced is not None else None)
    for a in assessments:
        f.metrics.update(a.metrics)
        f.settings.update(a.settings)
        if a.says is not None:
            f.remarks.append(a.says)
    extra = sum(a.extra_impact_ms for a in assessments)
    if extra:
        f.impact_ms = (f.impact_ms or 0.0) + extra
    return f


def _proposal(candidate: Candidate) -> Assessment:
    # Imported here: the kinds' rules read the detectors' settings, and the detectors' modules import this one.
    from diagtrain.profiler.analyzer.judge.assessments.proposal import proposed
    return proposed(candidate)


def _made(candidate: Candidate, severity: str, impact_ms: float | None) -> Finding:
    """The finding of a candidate's fields, copied: nothing edits a candidate."""
    values = {f.name: copied(getattr(candidate, f.name)) for f in fields(Candidate)}
    return Finding(**values, severity=severity, impact_ms=impact_ms)


R = TypeVar("R")


class Results:
    """What the assessments so far found of one finding: their typed records (``Assessment.result``), one of each
    type, the latest."""

    def __init__(self, records: Iterable[Any] = ()) -> None:
        self._by_type = {type(r): r for r in records if r is not None}

    def of(self, kind: type[R]) -> R | None:
        """The record of type ``kind`` an earlier assessment left (None: none did)."""
        return self._by_type.get(kind)


@dataclass
class Assessed:
    """What one assessment step made: its assessments by the position of the finding in the list it was given,
    and new candidates (causes the ledger charged that no detector named) with their records."""

    of: dict[int, list[Assessment]] = field(default_factory=dict)
    new: list[Candidate] = field(default_factory=list)
    new_results: dict[int, tuple[Any, ...]] = field(default_factory=dict)  # position in ``new`` -> its records

    def add(self, position: int, assessment: Assessment | None) -> None:
        """Record ``assessment`` of the finding at ``position`` (None: nothing to say)."""
        if assessment is not None:
            self.of.setdefault(position, []).append(assessment)

    def add_new(self, candidate: Candidate, *results: Any) -> None:
        """A new candidate, and the typed records of what the step found of it (as ``Assessment.result``)."""
        if results:
            self.new_results[len(self.new)] = results
        self.new.append(candidate)


class Judged:
    """Candidates and their assessments as judgement goes: each step sees the findings as decided so far (a
    finding's verdict made again only when a step assessed it)."""

    def __init__(self, candidates: list[Candidate]) -> None:
        self.entries: list[_Entry] = [_Entry(c) for c in candidates]

    def findings(self) -> list[Finding]:
        """The verdicts so far (those another finding explains left out)."""
        return [e.finding for e in self._standing()]

    def results(self) -> list[Results]:
        """The records the assessments so far left, by finding (in the order of :meth:`findings`)."""
        return [Results([*e.records, *(a.result for a in e.assessments)]) for e in self._standing()]

    def take(self, assessed: Assessed) -> None:
        """Add a step's assessments (by position in :meth:`findings`) and its new candidates."""
        standing = self._standing()
        for position, made in assessed.of.items():
            standing[position].add(made)
        self.entries += [_Entry(c, assessed.new_results.get(i, ())) for i, c in enumerate(assessed.new)]

    def _standing(self) -> list[_Entry]:
        return [e for e in self.entries if e.finding is not None]


class _Entry:
    """One candidate, its assessments, and the verdict they make (``records``: those of the step that proposed it)."""

    def __init__(self, candidate: Candidate, records: tuple[Any, ...] = ()) -> None:
        self.candidate, self.assessments, self.records = candidate, [], records
        self.finding: Finding | None = verdict(candidate, [])

    def add(self, made: list[Assessment]) -> None:
        self.assessments += made
        self.finding = verdict(self.candidate, self.assessments)


def applied(findings: list[Finding], assessed: Assessed) -> list[Finding]:
    """The verdicts on ``findings`` after one step's assessments (its new candidates after them)."""
    judged = Judged(findings)
    judged.take(assessed)
    return judged.findings()
