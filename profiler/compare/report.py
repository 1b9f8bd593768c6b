"""The comparison as a reader gets it: Markdown for a pull-request comment, JUnit XML for CI, JSON."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

from diagtrain.profiler.util.text import rank_words

if TYPE_CHECKING:  # regression needs pandas: `diagtrain --help` and `run` need only FORMATS from here
    from diagtrain.profiler.compare import regression

FORMATS = ("md", "json", "junit")


def render(c: regression.Comparison, fmt: str) -> str:
    """The comparison in one of :data:`FORMATS`."""
    return {"md": markdown, "json": lambda c: json.dumps(c.to_json(), indent=2) + "\n", "junit": junit}[fmt](c)


def headline(c: regression.Comparison) -> str:
    """The verdict in one line: what CI and the dashboard say first."""
    runs = f"{c.base_runs} baseline run{'s' if c.base_runs != 1 else ''}"
    if c.regressions:
        return f"regression in {_count(c.regressions, 'metric')} beyond the noise of {runs}"
    if c.inconclusive:
        return f"inconclusive: {_count(c.inconclusive, 'metric')} changed, but {runs} cannot tell code from machine noise"
    if not c.judged:
        from diagtrain.profiler.compare.thresholds import CompareSettings

        return (f"inconclusive: no metric has enough steps to be judged (at least "
                f"{CompareSettings.active().min_samples} per run)")
    return f"no regression beyond the noise of {runs}"


def lines(c: regression.Comparison) -> list[str]:
    """The causes, then the regressions (root cause first), then what stays undecided and why."""
    out = [f"new finding, **{f.kind}** on {rank_words(f.ranks)}: {f.explanation}" if f.change == "new" else
           f"worse finding: {f.words}" for f in c.findings if f.actionable]
    out += [f"**{r.metric}** ({r.scope}): {_change(r)}, outside the noise band {r.noise_band}" for r in c.regressions]
    out += [f"inconclusive: **{r.metric}** ({r.scope}): {_change(r)}: {r.reason}" for r in c.inconclusive]
    out += [f"the machine differed: {d}" for d in c.machine.different + c.machine.contention + c.machine.loaded_base]
    return out


def markdown(c: regression.Comparison) -> str:
    """A pull-request comment: the verdict first, the causes, then the table."""
    verdict = headline(c)
    emphasised = verdict.replace("regression", "**regression**", 1) if c.regressions else verdict
    out = [f"## diagtrain compare: {emphasised}", "",
           f"BASE `{c.base}` · NEW `{c.new}` · threshold {c.threshold_pct:g}% · the verdict: NEW's pace (p25 of its "
           f"steps; p75 for throughput, median for memory) against the baseline runs' noise band; per-step evidence: Mann-Whitney U, bootstrap 95% interval of the ratio", ""]
    goodput = goodput_line(c)
    out += [goodput, ""] if goodput else []
    out += [f"- {line}" for line in lines(c)]
    out += c.notes and [""] + [f"> {n}" for n in c.notes] or []
    changed = (c.settings or {}).get("overridden") or {}
    out += changed and ["", "Settings changed for this comparison: " + ", ".join(f"{k}={v}" for k, v in changed.items())] or []
    out += ["", "| metric | scope | BASE | NEW | change | noise band | verdict | 95% CI of ratio (steps) | p (steps) "
            "| p90 BASE → NEW |", "| --- | --- | ---: | ---: | ---: | --- | --- | --- | ---: | ---: |"]
    for r in shown(c):
        out.append(f"| {r.metric} | {r.scope} | {_num(r.base_value)} {r.unit} | {_num(r.new_value)} {r.unit} | "
                   f"{r.change_pct:+.1f}% | {r.noise_band} | {_bold(r.verdict)} | x{r.ci_low:.3f} - x{r.ci_high:.3f} | "
                   f"{r.p_value:.2g} | {_num(r.base_p90)} → {_num(r.new_p90)} |")
    out += ["", "### Findings, by cause", ""]
    out += [f"- {line}" for line in by_cause(c)]
    if c.time_lost:
        out += ["", "### Time lost per cause (job time per step, from each run's ledger)", "",
                "| cause | BASE | NEW |", "| --- | ---: | ---: |"]
        out += [f"| rank {x['rank']}, {x['part']} | {x['base_ms_per_step']:.1f} ms | {x['new_ms_per_step']:.1f} ms |"
                for x in c.time_lost[:10]]
    return "\n".join(out) + "\n"


def goodput_line(c: regression.Comparison) -> str:
    """``Goodput: BASE 41% (mean of 3 runs) → NEW 23%``, and where NEW's time went; '' where a run has none."""
    if not c.goodput or c.goodput.get("new") is None or c.goodput.get("base") is None:
        return ""
    return (f"Goodput (share of the wall time spent computing): BASE {c.goodput['base']:.0%}"
            + (f" (mean of {c.base_runs} runs)" if c.base_runs > 1 else "") + f" → NEW {c.goodput['new']:.0%}")


def by_cause(c: regression.Comparison) -> list[str]:
    """The findings of both runs, matched by cause, each with how it changed: the one findings diff
    that the Markdown report and the dashboard's Compare tab both show."""
    return [f"{f.change}: {f.words}" for f in c.findings] or ["none in either run"]


def junit(c: regression.Comparison) -> str:
    """JUnit XML: one test case per metric, a failure per regression, a skipped case per inconclusive one."""
    from xml.sax.saxutils import quoteattr  # here: its import (urllib, email, ssl) costs every CLI start ~30 ms

    cases = []
    for r in shown(c):
        name = quoteattr(f"{r.metric} ({r.scope})")
        message = quoteattr(f"{_change(r)}: {r.reason}")
        body = {"regression": f"<failure message={message} type=\"regression\"/>",
                "inconclusive": f"<skipped message={message}/>"}.get(r.verdict, "")
        cases.append(f"  <testcase classname=\"diagtrain.compare\" name={name}>{body}</testcase>")
    return (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuite name=\"diagtrain.compare\" tests=\"{len(c.results)}\" "
            f"failures=\"{len(c.regressions)}\" skipped=\"{len(c.inconclusive)}\">\n" + "\n".join(cases) + "\n</testsuite>\n")


def shown(c: regression.Comparison) -> list[regression.MetricResult]:
    """Every metric in the order a reader wants: regressions (root cause first), inconclusive ones, the rest."""
    return c.regressions + c.inconclusive + [r for r in c.results if r.verdict not in ("regression", "inconclusive")]


def _change(r: regression.MetricResult) -> str:
    return f"{_num(r.base_value)} → {_num(r.new_value)} {r.unit} ({r.change_pct:+.1f}%)"


def _bold(verdict: str) -> str:
    return f"**{verdict}**" if verdict in ("regression", "inconclusive") else verdict


def _count(items: list, noun: str) -> str:
    return f"{len(items)} {noun}{'s' if len(items) != 1 else ''}"


def _num(value: float) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.4g}"
