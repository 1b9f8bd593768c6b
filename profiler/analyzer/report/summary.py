"""What the console says when an analysis ends: one screen, the findings worth acting on first.

The full report (the ledger, the tables of ranks and collectives, every informational finding) can
run to hundreds of lines and bury the top finding; it stays in report.md/html and behind
``diagtrain analyze RUN --format md``. This summary gives the run's status, one line per finding
that matters (kind, ranks, impact), a count of the rest, and where to look next.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diagtrain.profiler.analyzer.judge.findings import SEVERITIES, STOP_KINDS
from diagtrain.profiler.analyzer.report.sections import goodput_line
from diagtrain.profiler.analyzer.report.wording import saving_text
from diagtrain.profiler.util.bounded_read import display
from diagtrain.profiler.util.text import ranges

MAX_SCREEN = 40  # lines the summary may take at most: one screen after the progress lines
MAX_LISTED = 12  # findings listed one per line; the rest are counted (the screen holds the summary whole)
MAX_LINE = 120  # characters of a finding's line: a terminal's width, not the explanation's paragraph
MAX_RANKS_NAMED = 8  # ranks named one by one; more are written as ranges


def matters(finding: dict[str, Any]) -> bool:
    """A finding listed on the console: a warning or worse, or a verdict on why the run stopped."""
    return SEVERITIES.index(finding["severity"]) >= SEVERITIES.index("warning") or finding["kind"] in STOP_KINDS


def lines(report: dict[str, Any], source: Path, out: Path, written: list[Path]) -> list[str]:
    """The console summary of ``report`` (a report.json document): the analysis of ``source``, whose
    files are ``written`` under ``out``."""
    findings = report["findings"]
    listed = [f for f in findings if matters(f)]
    rest = len(findings) - len(listed)
    text = [_headline(report, len(listed), rest)]
    goodput = goodput_line(report.get("job_time"))
    if goodput:
        text.append(f"  {goodput}")
    text += [_finding_line(i, f) for i, f in enumerate(listed[:MAX_LISTED], 1)]
    if len(listed) > MAX_LISTED:
        text.append(f"  ... {len(listed) - MAX_LISTED} more findings to act on in the report")
    warnings = [h for h in report.get("health", []) if h.get("severity") != "info"]
    if warnings:
        text.append(f"  {len(warnings)} trace health warning{_s(len(warnings))}: see the report's \"Trace health\"")
    if report.get("skipped"):
        text.append(f"  {len(report['skipped'])} input{_s(len(report['skipped']))} skipped: see the report's "
                    "\"Skipped inputs\"")
    where = display(out)
    # The command that prints the full report analyzes the same input into the same place again.
    again = display(source) if source == out else f"{display(source)} --out {where}"
    text += [f"  written to     {where}",
             f"  full report    {', '.join(p.name for p in written) or 'none written'}; on the console: "
             f"diagtrain analyze {again} --format md",
             f"  dashboard      diagtrain dashboard {where}"]
    return text


def _headline(report: dict[str, Any], acted_on: int, informational: int) -> str:
    run = report["run"]
    facts = [f"status {run['status']}" if run.get("status") else None,
             run.get("strategy"),
             f"{run['world_size']} ranks" if run.get("world_size") else None,
             f"{run['steps']} steps" if run.get("steps") else None]
    counts = (f"{acted_on} finding{_s(acted_on)} to act on" if acted_on else "nothing to act on")
    if informational:
        counts += f", {informational} informational (in the report)"
    return "diagtrain: " + ", ".join(f for f in facts if f) + f"; {counts}"


def _finding_line(number: int, finding: dict[str, Any]) -> str:
    """``  1. WARNING straggler · rank 3 · ~129.0 ms/step · <the explanation's first clause>``."""
    parts = [f"  {number}. {finding['severity'].upper()} {finding['kind']}", _ranks(finding.get("ranks") or [])]
    saving = saving_text(finding)
    if saving:
        parts.append(saving)
    head = " · ".join(p for p in parts if p)
    return _cut(f"{head} · {_first_clause(finding['explanation'])}", MAX_LINE)


def _ranks(ranks: list[int]) -> str:
    if not ranks:
        return ""
    if len(ranks) > MAX_RANKS_NAMED:
        return f"ranks {ranges(ranks)}"
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(str(r) for r in sorted(ranks))}"


def _first_clause(explanation: str) -> str:
    """The explanation up to its first sentence or clause end: the rest is in the report."""
    for end in ("; ", ". "):
        head, found, _ = explanation.partition(end)
        if found:
            explanation = head
    return explanation.rstrip(".")


def _cut(text: str, width: int) -> str:
    """``text`` within ``width`` characters, cut at a word with an ellipsis."""
    return text if len(text) <= width else text[: width - 2].rsplit(" ", 1)[0] + " …"


def _s(count: int) -> str:
    return "" if count == 1 else "s"
