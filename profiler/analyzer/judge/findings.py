"""One schema for what every detector finds (the kinds: judge/kinds.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from diagtrain.profiler.analyzer.judge.kinds import stop_kinds

SEVERITIES = ("info", "warning", "error", "critical")
# metrics key of a finding whose impact_ms is what removing the cause could save at most (all exposed
# communication overlapped), not a what-if's measured saving: shown as "up to".
UPPER_BOUND = "impact_is_upper_bound"
# The verdicts on why a run stopped (detectors/hang.py): read first whatever their severity.
STOP_KINDS = stop_kinds()


@dataclass
class Candidate:
    """What a detector proposes (or an assessment, for a cause no detector named): a problem located (ranks, steps,
    time) and measured, as data. Its severity and impact are the proposal its kind's rule makes
    (judge/assessments/proposal.py), which ``verdict.verdict()`` weighs with the assessments' to make the
    :class:`Finding`; its words are report/'s (report/words/, composed by report/wording.py).

    ``metrics`` holds ``observed``, ``expected`` and ``threshold`` (and anything else useful);
    ``evidence`` holds references: trace events, log lines, flight-recorder entries, files.
    ``facts`` holds the JSON-ready values its words (and its proposal, where metrics lack one) are made of, with a
    ``"case"`` where its proposer says one kind in several ways.
    """

    kind: str
    ranks: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    time_range: tuple[float, float] | None = None  # Unix seconds
    metrics: dict[str, Any] = field(default_factory=dict)
    evidence: list[dict[str, Any]] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)  # "section.name" -> value it was judged with
    # What later judgements said of it, as data ({"says": <what>, ...its values}), in the order made: report/wording.py
    # words them after its own words (in report.json the explanation already holds those words).
    remarks: list[dict[str, Any]] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass
class Finding(Candidate):
    """The verdict on a candidate: made in one place, ``verdict.verdict()``, and read by the report, the dashboard,
    ``compare`` and the notebook. ``severity`` and ``impact_ms`` are decided: ``impact_ms`` is the step time saved
    per step if the cause were removed (what-if replay), or its upper bound (``metrics[UPPER_BOUND]``); None where
    nothing in the job could realize a saving.

    ``explanation`` and ``suggestion`` are its composed text: empty on a verdict (judgement writes no words), what
    report/wording.py composed in report.json and in a finding the notebook loads from it.
    """

    severity: str = field(kw_only=True)
    impact_ms: float | None = field(default=None, kw_only=True)
    explanation: str = field(default="", kw_only=True)
    suggestion: str = field(default="", kw_only=True)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} is not one of {SEVERITIES}")

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the findings.json / report.json record)."""
        # Its steps are ints: copied as one list (asdict walked a long run's hundreds of thousands one by one).
        d = asdict(replace(self, steps=[]))
        d["steps"] = list(self.steps)
        d["time_range"] = list(self.time_range) if self.time_range else None
        return d


def order(findings: list[Finding]) -> list[Finding]:
    """Most worth fixing first: why the run stopped, warnings and worse by impact, then the
    informational ones."""
    actionable = SEVERITIES.index("warning")
    return sorted(findings, key=lambda f: (f.severity != "critical" and f.kind not in STOP_KINDS,
                                           SEVERITIES.index(f.severity) < actionable,
                                           -(f.impact_ms or 0.0), -SEVERITIES.index(f.severity)))
