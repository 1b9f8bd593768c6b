"""Findings compared by cause: what is new, resolved, worse, better or unchanged between BASE and NEW.

A finding is matched by its kind and ranks (the same straggler on rank 1 in both runs is one cause).
A matched finding got worse when its severity rose, or when its impact (step time it costs) rose
beyond what the baseline runs' own impacts let noise explain (:mod:`noise`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diagtrain.profiler.compare import noise
from diagtrain.profiler.util.text import rank_words

# The analyzer's severity order (analyzer.findings.SEVERITIES); compare reads findings from report.json.
SEVERITIES = ("info", "warning", "error", "critical")
CHANGES = ("new", "worse", "resolved", "better", "unchanged")  # the order a reader wants them in


@dataclass
class FindingChange:
    """One cause (a finding's kind on its ranks) and how it changed from BASE to NEW."""

    change: str  # one of CHANGES
    kind: str
    ranks: list[int]
    severity: str  # NEW's severity (BASE's highest for a resolved finding)
    base_severity: str | None  # BASE's highest severity over its runs (None for a new finding)
    explanation: str  # NEW's explanation (BASE's for a resolved finding)
    words: str  # what changed, in a sentence

    @property
    def actionable(self) -> bool:
        """Worth a line above the table: a new or worse finding of warning severity or more."""
        return self.change in ("new", "worse") and SEVERITIES.index(self.severity) >= SEVERITIES.index("warning")


def compare_findings(base_runs: list[list[dict[str, Any]]], new: list[dict[str, Any]]) -> list[FindingChange]:
    """Each cause of the baseline runs' findings and NEW's, matched by kind and ranks, most urgent first."""
    seen: dict[tuple, list[dict[str, Any]]] = {}
    for findings in base_runs:
        for f in findings:
            seen.setdefault(_key(f), []).append(f)
    changes = []
    for f in new:
        base = seen.pop(_key(f), None)
        changes.append(_matched(f, base) if base else _change("new", f, None, f"new in NEW: {_said(f)}"))
    for base in seen.values():
        top = _highest(base)
        changes.append(_change("resolved", top, top["severity"],
                               f"{_said(top)} in {len(base)} of {len(base_runs)} BASE run(s), not in NEW"))
    return sorted(changes, key=lambda c: (CHANGES.index(c.change), -SEVERITIES.index(c.severity)))


def _matched(f: dict[str, Any], base: list[dict[str, Any]]) -> FindingChange:
    top = _highest(base)
    was, now = SEVERITIES.index(top["severity"]), SEVERITIES.index(f["severity"])
    if now != was:
        return _change("worse" if now > was else "better", f, top["severity"],
                       f"{f['kind']} on {_ranks(f)}: {top['severity']} in BASE, {f['severity']} in NEW")
    impacts = [b["impact_ms"] for b in base if b.get("impact_ms")]
    if impacts and f.get("impact_ms"):
        position = noise.band(impacts).position(f["impact_ms"])
        if position != "inside":
            change = "worse" if position == "above" else "better"
            return _change(change, f, top["severity"],
                           f"{f['kind']} on {_ranks(f)}: costs {max(impacts):.1f} → {f['impact_ms']:.1f} ms per step, "
                           f"beyond the BASE runs' noise")
    return _change("unchanged", f, top["severity"], f"{_said(f)}, as in BASE")


def _change(change: str, f: dict[str, Any], base_severity: str | None, words: str) -> FindingChange:
    return FindingChange(change, f["kind"], list(f["ranks"]), f["severity"], base_severity, f["explanation"], words)


def _key(f: dict[str, Any]) -> tuple:
    return f["kind"], tuple(f["ranks"])


def _highest(findings: list[dict[str, Any]]) -> dict[str, Any]:
    return max(findings, key=lambda f: (SEVERITIES.index(f["severity"]), f.get("impact_ms") or 0.0))


def _ranks(f: dict[str, Any]) -> str:
    return rank_words(f["ranks"]) if f["ranks"] else "the job"


def _said(f: dict[str, Any]) -> str:
    return f"{f['severity']} {f['kind']} on {_ranks(f)}"
