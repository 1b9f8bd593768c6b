"""`diagtrain compare BASE NEW` and `diagtrain baseline RUN [RUN...] -o FILE`: regressions CI can act on.

Exit codes: 0 no regression, 1 regression, 2 bad input (missing run, unreadable file, runs of a
different strategy or world size unless --allow-mismatch), 3 inconclusive (a change the data cannot
tell from machine noise: one baseline run, or NEW ran on another machine or beside more load).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from diagtrain.profiler.compare.report import FORMATS, headline, render
from diagtrain.profiler.compare.thresholds import CompareSettings
from diagtrain.profiler.run_dir import write_bytes_atomic, write_json_atomic
from diagtrain.profiler.util import settings
from diagtrain.profiler.util.exit_codes import EXIT_INCONCLUSIVE, EXIT_OK, EXIT_REGRESSION, EXIT_USAGE

EXIT_CODES = {"no regression": EXIT_OK, "regression": EXIT_REGRESSION, "inconclusive": EXIT_INCONCLUSIVE}
DEFAULT_THRESHOLD_PCT = 5.0


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    """Register ``diagtrain compare`` and ``diagtrain baseline``."""
    p = subparsers.add_parser(
        "compare", help="compare two runs (or a baseline and a run); exit 1 on a real regression",
        description="Compare NEW against BASE (a run directory or a `diagtrain baseline` file of one or more "
        "runs): step time, throughput, compute / exposed communication / idle per step, per-rank phases and "
        "peak memory, collective times, findings by cause. A metric regresses when NEW's pace (p25 of its steps; "
        "p75 for throughput, median for memory) lies outside the noise band of the baseline runs' paces (the 95% t "
        "prediction interval of one more run, on their logs) "
        "and beyond --threshold. One baseline run cannot measure that band: a change below x2.5 (x1.5 for "
        "memory) is then inconclusive. Keep 3 baseline runs: diagtrain baseline RUN1 RUN2 RUN3 -o base.json.",
        epilog="exit codes: 0 no regression, 1 regression, 2 bad input, 3 inconclusive (the data cannot tell a "
        "code change from machine noise: too few baseline runs, or NEW ran on another machine or beside more "
        "load; the report says which)",
    )
    p.add_argument("base", help="BASE run directory or baseline file")
    p.add_argument("new", help="NEW run directory")
    p.add_argument("--threshold", default=f"{DEFAULT_THRESHOLD_PCT:g}%", help="smallest change that counts (default 5%%)")
    p.add_argument("--format", default="md", choices=FORMATS, help="output format (default md)")
    p.add_argument("--output", metavar="FILE", help="write the report to FILE instead of standard output")
    p.add_argument("--allow-mismatch", action="store_true", help="compare runs of different strategy or world size")
    p.add_argument("--same-machine", action="store_true",
                   help="differently named hosts are the same hardware (CI runners): judge times anyway")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="compare.NAME=VALUE",
                   help="change one threshold of the comparison, e.g. compare.one_run_ceiling=2.0 (repeatable; "
                   "`diagtrain analyze --settings` lists them, with defaults and reasons); the report records them")
    p.set_defaults(handler=run_compare)
    b = subparsers.add_parser("baseline", help="store runs' summaries for later comparisons",
                              description="Write, for each run, the per-step samples and machine facts "
                              "`diagtrain compare` needs, so CI can keep a small file instead of whole runs. Give "
                              "3 clean runs of the job: their spread is the noise a change must exceed.")
    b.add_argument("runs", nargs="+", metavar="RUN", help="run directories (3 recommended)")
    b.add_argument("-o", "--output", required=True, metavar="FILE", help="baseline file to write")
    b.set_defaults(handler=run_baseline)


def run_compare(args: argparse.Namespace, argv: list[str]) -> int:
    """Compare NEW against BASE; the exit code is the verdict."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        overrides = settings.parse(args.overrides)
        if set(overrides) - {CompareSettings.section}:
            raise settings.SettingError(f"{', '.join(sorted(set(overrides) - {CompareSettings.section}))}: compare's "
                                        "settings are compare.NAME (the analysis' are set with diagtrain analyze --set)")
    except settings.SettingError as e:
        return _usage(err, "compare", f"--set {e}")
    with settings.overriding(overrides):
        return _compare(args, err)


def _compare(args: argparse.Namespace, err: Console) -> int:
    from diagtrain.profiler.compare import regression  # pandas: only once the command runs
    from diagtrain.profiler.compare import summary as run_summary

    try:
        threshold = float(args.threshold.rstrip("%"))
        if not threshold >= 0:
            raise ValueError
    except ValueError:
        return _usage(err, "compare", f"--threshold {args.threshold!r}: expected a percentage such as 5%")
    try:
        base = run_summary.load(_analyzed(Path(args.base)))
        news = run_summary.load(_analyzed(Path(args.new)))
    except run_summary.SummaryError as e:
        return _usage(err, "compare", str(e))
    if len(news) != 1:
        return _usage(err, "compare", f"{args.new}: NEW must be one run (a run directory or a baseline of one run)")
    new = news[0]
    problem = next((p for b in base if (p := regression.mismatch(b, new))), None)
    if problem and not args.allow_mismatch:
        return _usage(err, "compare", f"{problem}; pass --allow-mismatch to compare anyway")
    result = regression.compare_anyway(base, new, threshold, same_machine=args.same_machine)
    text = render(result, args.format)
    if args.output:
        try:
            write_bytes_atomic(Path(args.output), text.encode())
        except OSError as e:
            return _usage(err, "compare", f"--output {args.output}: cannot write ({e.strerror or e})")
        err.print(f"diagtrain compare: {headline(result)}; report {args.output}", markup=False)
    else:
        sys.stdout.write(text)
    return EXIT_CODES[result.verdict]


def run_baseline(args: argparse.Namespace, argv: list[str]) -> int:
    """Store the runs' summaries as one baseline file."""
    from diagtrain.profiler.compare import regression
    from diagtrain.profiler.compare import summary as run_summary

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    runs = [Path(r) for r in args.runs]
    missing = [str(r) for r in runs if not r.is_dir()]
    if missing:
        return _usage(err, "baseline", f"{', '.join(missing)}: no such run directory")
    try:
        summaries = []
        for run in runs:
            err.print(f"diagtrain baseline: reading {run}", markup=False)
            summaries.append(run_summary.summarize(_analyzed(run)))
        problem = next((p for s in summaries[1:] if (p := regression.mismatch(summaries[0], s))), None)
        if problem:
            return _usage(err, "baseline", f"the runs are not of one job: {problem}")
        write_json_atomic(Path(args.output), run_summary.baseline(summaries))
    except run_summary.SummaryError as e:
        return _usage(err, "baseline", str(e))
    except OSError as e:
        return _usage(err, "baseline", f"{args.output}: cannot write ({e.strerror or e})")
    steps = ", ".join(str(len(s["steps_used"])) for s in summaries)
    err.print(f"diagtrain baseline: {len(summaries)} run(s) ({steps} steps) -> {args.output}", markup=False)
    wanted = CompareSettings.active().recommended_runs
    if len(summaries) < wanted:
        err.print(f"diagtrain baseline: with fewer than {wanted} runs the noise between runs is measured "
                  "poorly or not at all, and most changes will be inconclusive (exit 3)", markup=False)
    return EXIT_OK


def _analyzed(path: Path) -> Path:
    """``path``, analyzed first when it is a run directory without an analysis."""
    from diagtrain.profiler.compare import summary as run_summary

    if path.is_dir() and not run_summary.is_analyzed(path):
        from diagtrain.profiler.analyzer import default_workers
        from diagtrain.profiler.analyzer.analyze import analyze

        analyze(path, path, ["json"], default_workers())
    return path


def _usage(err: Console, verb: str, message: str) -> int:
    err.print(f"diagtrain {verb}: error: {message}", markup=False)
    return EXIT_USAGE
