"""One schema for what every detector finds (the kinds: judge/kinds.py)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields, is_dataclass
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
        d = copied(self, as_dicts=True)
        d["time_range"] = list(self.time_range) if self.time_range else None
        return d


_SCALARS = (int, float, str, bool, type(None))


def copied(value: Any, as_dicts: bool = False) -> Any:
    """``copy.deepcopy`` of a finding's values (with ``as_dicts``, what ``dataclasses.asdict`` makes of them:
    dataclasses as dicts), a list or tuple of plain numbers and strings copied whole: each element through deepcopy
    was a long run's hundreds of thousands of steps, and 8,191 peers of a straggler at 8,192 ranks cost 25 ms a live
    judgement, twice (its verdict, its record)."""
    if as_dicts and is_dataclass(value) and not isinstance(value, type):
        return {f.name: copied(getattr(value, f.name), as_dicts) for f in fields(value)}
    if type(value) in (list, tuple):  # a named tuple or a subclass: deepcopy's (asdict's) own case
        if all(isinstance(v, _SCALARS) for v in value):
            return type(value)(value)
        return type(value)(copied(v, as_dicts) for v in value)
    if type(value) is dict:
        return {copied(k, as_dicts): copied(v, as_dicts) for k, v in value.items()}
    return value if type(value) in _SCALARS else copy.deepcopy(value)


def order(findings: list[Finding]) -> list[Finding]:
    """Most worth fixing first: why the run stopped, warnings and worse by impact, then the
    informational ones."""
    actionable = SEVERITIES.index("warning")
    return sorted(findings, key=lambda f: (f.severity != "critical" and f.kind not in STOP_KINDS,
                                           SEVERITIES.index(f.severity) < actionable,
                                           -(f.impact_ms or 0.0), -SEVERITIES.index(f.severity)))
