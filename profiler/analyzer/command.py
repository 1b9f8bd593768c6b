"""`diagtrain analyze PATH`: findings and a report from a run directory or a folder of traces."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from diagtrain.profiler.analyzer import default_workers
from diagtrain.profiler.run_dir import check_writable

EXIT_USAGE = 2


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``diagtrain analyze``."""
    p = subparsers.add_parser(
        "analyze", help="find stragglers, bubbles, slow collectives, stalls and memory imbalance in a run",
        description="Analyze a diagtrain run directory, or any folder of PyTorch Profiler traces (one file per "
        "rank). Writes analysis/ (Parquet tables, findings.json) and report.md/json/html.",
        epilog="example: diagtrain analyze runs/20261122T010833Z-3d --format md,json,html",
    )
    p.add_argument("path", help="run directory or folder of traces")
    p.add_argument("--format", default="md,json,html", help="report formats, comma-separated: md,json,html")
    p.add_argument("--out", help="where to write analysis/ and the reports (default: PATH)")
    p.add_argument("--workers", type=int, default=default_workers(), help="processes that load ranks")
    p.add_argument("--flight-recorder", metavar="DIR",
                   help="flight-recorder dumps made outside diagtrain (TORCH_FR_DUMP_TEMP_FILE files, pickle or JSON, "
                   "one per rank, rank number ending the name) for the hang verdict")
    p.add_argument("--quiet", action="store_true", help="do not print the Markdown report")
    p.set_defaults(handler=run_analyze)


def run_analyze(args: argparse.Namespace, argv: list[str]) -> int:
    """Validate, analyze, print the report; 0 on success, 2 on bad usage."""
    from diagtrain.profiler.analyzer import report  # pandas and pyarrow: only once the command runs

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    path = Path(args.path)
    formats = [f.strip() for f in args.format.split(",") if f.strip()]
    bad = [f for f in formats if f not in report.FORMATS]
    if bad or not formats:
        return _usage(err, f"--format {args.format!r}: choose from {', '.join(report.FORMATS)}")
    if not path.is_dir():
        return _usage(err, f"{path}: no such directory")
    out = Path(args.out) if args.out else path
    try:
        check_writable(out / "analysis")
    except OSError as e:
        return _usage(err, f"{out}: cannot write the analysis there ({e.strerror or e}); pass --out DIR")
    if args.workers < 1:
        return _usage(err, "--workers must be at least 1")
    fr_dir = Path(args.flight_recorder) if args.flight_recorder else None
    if fr_dir is not None and not fr_dir.is_dir():
        return _usage(err, f"--flight-recorder {fr_dir}: no such directory")
    return analyze_and_print(path, out, formats, args.workers, err, quiet=args.quiet, flight_recorder=fr_dir)


def analyze_and_print(path: Path, out: Path, formats: list[str], workers: int, err: Console, quiet: bool = False,
                      flight_recorder: Path | None = None) -> int:
    """Run the analysis with progress on stderr and the Markdown report on stdout."""
    from diagtrain.profiler.analyzer import report
    from diagtrain.profiler.analyzer.analyze import analyze

    with err.status("analyzing", spinner="dots") as status:
        doc = analyze(path, out, formats, workers, progress=lambda m: status.update(f"analyzing: {m}"),
                      flight_recorder=flight_recorder)
    if not doc["ranks"] and doc["skipped"]:
        err.print(f"diagtrain analyze: nothing could be read in {path}:", markup=False)
        for s in doc["skipped"]:
            err.print(f"  {s['path']}: {s['reason']}", markup=False)
    if not quiet:
        sys.stdout.write(report.markdown(doc) + "\n")
    err.print(f"diagtrain: report {out / 'report.md'}", markup=False)
    return 0


def _usage(err: Console, message: str) -> int:
    err.print(f"diagtrain analyze: error: {message}", markup=False)
    return EXIT_USAGE
