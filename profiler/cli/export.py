"""`diagtrain export RUN --perfetto OUT.json.gz`: every rank of a run in one trace for Perfetto."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from diagtrain.profiler.analyzer import default_workers
from diagtrain.profiler.cli.analyze import analyze_and_print
from diagtrain.profiler.run_dir import check_writable
from diagtrain.profiler.util.exit_codes import EXIT_OK, EXIT_USAGE
from diagtrain.profiler.util.step_ranges import parse_step_ranges

ANALYSIS = ("report.json", "analysis/steps.parquet")  # what an export reads besides the spans and collectives


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``diagtrain export``."""
    p = subparsers.add_parser(
        "export", help="write a run as one trace of every rank for Perfetto (ui.perfetto.dev)",
        description="Write RUN's analysis as one Trace Event Format file: a process per rank (ordered by rank, its "
        "host as a label) on the run's clock, each step as a slice (every step; the profiled ones say so), the "
        "profiled compute, communication and memory spans, each collective call with a flow from the last rank to "
        "arrive to every rank that waited for it, and each finding over the steps it names on its ranks. Open it "
        "at ui.perfetto.dev (Open trace file). Runs the analysis first if RUN has none.",
        epilog="example: diagtrain export runs/20261122T010833Z-3d --perfetto 3d.json.gz --ranks 0-7 --steps 10-12",
    )
    p.add_argument("run", help="run directory (analyzed first if needed)")
    p.add_argument("--perfetto", required=True, metavar="OUT", help="the trace to write (.json, or .json.gz: gzipped)")
    p.add_argument("--ranks", metavar="RANGES", help="only these ranks, e.g. 0-7,12 (default: every rank)")
    p.add_argument("--steps", metavar="RANGES", help="only these steps, e.g. 10-12 (default: every step)")
    p.add_argument("--workers", type=int, default=default_workers(),
                   help="processes that load ranks when the analysis has to run first")
    p.set_defaults(handler=run_export)


def run_export(args: argparse.Namespace, argv: list[str]) -> int:
    """Validate, analyze if needed, write the trace; 0 on success, 2 on bad usage."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    run, out = Path(args.run), Path(args.perfetto)
    if not run.is_dir():
        return _usage(err, f"{run}: no such run directory")
    if not out.name.endswith((".json", ".json.gz")):
        return _usage(err, f"--perfetto {out}: name the trace .json or .json.gz")
    try:
        ranks = _selection(args.ranks, "--ranks")
        steps = _selection(args.steps, "--steps")
    except ValueError as e:
        return _usage(err, str(e))
    try:
        check_writable(out.parent if str(out.parent) else Path("."))
    except OSError as e:
        return _usage(err, f"--perfetto {out}: cannot write there ({e.strerror or e})")
    if not all((run / name).exists() for name in ANALYSIS):
        code = analyze_and_print(run, run, ["json"], args.workers, err, quiet=True)
        if code:
            return code
    from diagtrain.profiler.export.perfetto import ExportError, export

    try:
        done = export(run, out, ranks, steps, progress=lambda line: err.print(f"diagtrain export: {line}", markup=False))
    except ExportError as e:
        return _usage(err, str(e))
    err.print(f"diagtrain export: {done.ranks} ranks, {done.events:,} events, {done.bytes / 2**20:.1f} MiB -> {out} "
              "(open it at ui.perfetto.dev)", markup=False)
    return EXIT_OK


def _selection(text: str | None, option: str) -> set[int] | None:
    """The numbers a ranges option names (None when not given)."""
    if text is None:
        return None
    try:
        return {n for r in parse_step_ranges(text) for n in range(r.first, r.last + 1)}
    except ValueError as e:
        raise ValueError(f"{option} {text!r}: {e}") from None


def _usage(err: Console, message: str) -> int:
    err.print(f"diagtrain export: error: {message}", markup=False)
    return EXIT_USAGE
