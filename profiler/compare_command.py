"""`diagtrain compare BASE NEW` and `diagtrain baseline RUN -o FILE`: regressions CI can act on.

Exit codes: 0 no regression, 1 regression, 2 bad input (missing run, unreadable file, runs of a
different strategy or world size unless --allow-mismatch).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from xml.sax.saxutils import quoteattr

from rich.console import Console

from diagtrain.profiler import regression
from diagtrain.profiler.run_dir import write_bytes_atomic, write_json_atomic

EXIT_OK, EXIT_REGRESSION, EXIT_USAGE = 0, 1, 2
FORMATS = ("md", "json", "junit")
DEFAULT_THRESHOLD_PCT = 5.0


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    """Register ``diagtrain compare`` and ``diagtrain baseline``."""
    p = subparsers.add_parser(
        "compare", help="compare two runs (or a baseline and a run); exit 1 on a real regression",
        description="Compare NEW against BASE (a run directory or a `diagtrain baseline` file): step time, "
        "throughput, compute / exposed communication / idle per step, per-rank phases and peak memory, "
        "collective times, findings. A regression needs a change beyond --threshold AND a Mann-Whitney U "
        "test (p < 0.01) AND a bootstrap 95%% interval of the ratio of medians beyond 1.",
        epilog="exit codes: 0 no regression, 1 regression, 2 bad input",
    )
    p.add_argument("base", help="BASE run directory or baseline file")
    p.add_argument("new", help="NEW run directory")
    p.add_argument("--threshold", default=f"{DEFAULT_THRESHOLD_PCT:g}%", help="smallest change that counts (default 5%%)")
    p.add_argument("--format", default="md", choices=FORMATS, help="output format (default md)")
    p.add_argument("--output", metavar="FILE", help="write the report to FILE instead of standard output")
    p.add_argument("--allow-mismatch", action="store_true", help="compare runs of different strategy or world size")
    p.set_defaults(handler=run_compare)
    b = subparsers.add_parser("baseline", help="store a run's summary for later comparisons",
                              description="Write the per-step samples and facts `diagtrain compare` needs, so CI "
                              "can keep a small file instead of a whole run.")
    b.add_argument("run", help="run directory")
    b.add_argument("-o", "--output", required=True, metavar="FILE", help="baseline file to write")
    b.set_defaults(handler=run_baseline)


def run_compare(args: argparse.Namespace, argv: list[str]) -> int:
    from diagtrain.profiler import run_summary  # pandas: only once the command runs

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        threshold = float(args.threshold.rstrip("%"))
        if not threshold >= 0:
            raise ValueError
    except ValueError:
        return _usage(err, "compare", f"--threshold {args.threshold!r}: expected a percentage such as 5%")
    try:
        base = run_summary.load(Path(args.base))
        new = run_summary.load(Path(args.new))
    except run_summary.SummaryError as e:
        return _usage(err, "compare", str(e))
    problem = regression.mismatch(base, new)
    if problem and not args.allow_mismatch:
        return _usage(err, "compare", f"{problem}; pass --allow-mismatch to compare anyway")
    result = regression.compare(base, new, threshold)
    if problem:
        result.notes.append(f"compared despite a mismatch: {problem}")
    text = {"md": markdown, "json": lambda c: json.dumps(c.to_json(), indent=2) + "\n", "junit": junit}[args.format](result)
    if args.output:
        write_bytes_atomic(Path(args.output), text.encode())
        err.print(f"diagtrain compare: {'regression' if result.regressions else 'no regression'}; report {args.output}",
                  markup=False)
    else:
        sys.stdout.write(text)
    return EXIT_REGRESSION if result.regressions else EXIT_OK


def run_baseline(args: argparse.Namespace, argv: list[str]) -> int:
    from diagtrain.profiler import run_summary

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    run = Path(args.run)
    if not run.is_dir():
        return _usage(err, "baseline", f"{run}: no such run directory")
    try:
        summary = run_summary.summarize(run)
        write_json_atomic(Path(args.output), summary)
    except run_summary.SummaryError as e:
        return _usage(err, "baseline", str(e))
    except OSError as e:
        return _usage(err, "baseline", f"{args.output}: cannot write ({e.strerror or e})")
    err.print(f"diagtrain baseline: {len(summary['steps_used'])} steps of {run} -> {args.output}", markup=False)
    return EXIT_OK


def markdown(c: regression.Comparison) -> str:
    """A pull-request comment: the verdict first, then the table."""
    regressions = c.regressions
    head = (f"## diagtrain compare: **regression** in {len(regressions)} metric{'s' if len(regressions) != 1 else ''}"
            if regressions else "## diagtrain compare: no regression")
    lines = [head, "", f"BASE `{c.base}` · NEW `{c.new}` · threshold {c.threshold_pct:g}%, "
             f"Mann-Whitney U p < {regression.ALPHA}, bootstrap 95% interval of the ratio of medians", ""]
    actionable = [f for f in c.findings_new if f["severity"] in ("warning", "error", "critical")]
    for f in actionable:
        lines.append(f"- new finding, **{f['kind']}** on rank{'s' if len(f['ranks']) != 1 else ''} "
                     f"{', '.join(map(str, f['ranks']))}: {f['explanation']}")
    for r in regressions:
        lines.append(f"- **{r.metric}** ({r.scope}): {_num(r.base_median)} → {_num(r.new_median)} {r.unit} "
                     f"({r.change_pct:+.1f}%, 95% CI x{r.ci_low:.3f}-x{r.ci_high:.3f}, p = {r.p_value:.2g})")
    lines += c.notes and [""] + [f"> {n}" for n in c.notes] or []
    lines += ["", "| metric | scope | BASE | NEW | change | 95% CI of ratio | p | p90 BASE → NEW | verdict |",
              "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | --- |"]
    shown = sorted(c.results, key=lambda r: (r.verdict != "regression", r.verdict != "improvement", r.scope != "run"))
    for r in shown:
        lines.append(f"| {r.metric} | {r.scope} | {_num(r.base_median)} {r.unit} | {_num(r.new_median)} {r.unit} | "
                     f"{r.change_pct:+.1f}% | x{r.ci_low:.3f} - x{r.ci_high:.3f} | {r.p_value:.2g} | "
                     f"{_num(r.base_p90)} → {_num(r.new_p90)} | "
                     f"{'**regression**' if r.verdict == 'regression' else r.verdict} |")
    lines += ["", "### Findings", ""]
    for label, found in (("new", c.findings_new), ("resolved", c.findings_resolved), ("unchanged", c.findings_unchanged)):
        lines += [f"- {label}: {f['severity']} {f['kind']} {f['ranks']}: {f['explanation']}" for f in found] or [f"- {label}: none"]
    return "\n".join(lines) + "\n"


def junit(c: regression.Comparison) -> str:
    """JUnit XML: one test case per metric, a failure per regression."""
    cases = []
    for r in c.results:
        name = quoteattr(f"{r.metric} ({r.scope})")
        body = ""
        if r.verdict == "regression":
            message = quoteattr(f"{r.change_pct:+.1f}%: {_num(r.base_median)} -> {_num(r.new_median)} {r.unit}, "
                                f"95% CI x{r.ci_low:.3f}-x{r.ci_high:.3f}, p={r.p_value:.2g}")
            body = f"<failure message={message} type=\"regression\"/>"
        cases.append(f"  <testcase classname=\"diagtrain.compare\" name={name}>{body}</testcase>")
    return (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuite name=\"diagtrain.compare\" tests=\"{len(c.results)}\" "
            f"failures=\"{len(c.regressions)}\">\n" + "\n".join(cases) + "\n</testsuite>\n")


def _num(value: float) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.4g}"


def _usage(err: Console, verb: str, message: str) -> int:
    err.print(f"diagtrain {verb}: error: {message}", markup=False)
    return EXIT_USAGE
