"""One schema for what every detector finds (see DESIGN.md, "Findings")."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SEVERITIES = ("info", "warning", "error", "critical")


@dataclass
class Finding:
    """A problem, located (ranks, steps, time) and explained in words a person can act on.

    ``metrics`` holds ``observed``, ``expected`` and ``threshold`` (and anything else useful);
    ``evidence`` holds references: trace events, log lines, flight-recorder entries, files.
    ``impact_ms`` is the step time saved per step if the cause were removed (what-if replay).
    """

    kind: str
    severity: str
    explanation: str
    suggestion: str
    ranks: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    time_range: tuple[float, float] | None = None  # Unix seconds
    metrics: dict[str, Any] = field(default_factory=dict)
    evidence: list[dict[str, Any]] = field(default_factory=list)
    impact_ms: float | None = None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} is not one of {SEVERITIES}")

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the findings.json / report.json record)."""
        d = asdict(self)
        d["time_range"] = list(self.time_range) if self.time_range else None
        return d
