"""The `diagtrain` command line: one module per verb. Exit code 2 means the command was used wrongly.

The verbs are the only code that calls across the stages of the flow (collect, analyze, compare,
present): `run` hands a finished job to the analyzer, `compare` and `dashboard` analyze a run
that has no analysis yet. The stages themselves only read what the stage before them wrote.
"""

from __future__ import annotations

import argparse
import sys

from diagtrain.profiler.util.exit_codes import EXIT_INTERRUPTED


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subcommand per verb."""
    parser = argparse.ArgumentParser(
        prog="diagtrain",
        description="Find out why a distributed PyTorch job is slow, stuck or out of memory: "
        "which rank, which step, which operation.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    from diagtrain.profiler.cli import analyze, compare, dashboard, export, plan, run
    from diagtrain.reference_trainers import launch

    run.add_parser(subparsers)
    analyze.add_parser(subparsers)
    dashboard.add_parser(subparsers)
    export.add_parser(subparsers)
    compare.add_parsers(subparsers)
    plan.add_parser(subparsers)
    launch.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``diagtrain`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args, argv[1:])
    except KeyboardInterrupt:  # Ctrl-C outside a job (an analysis, the dashboard): stop, no traceback
        print("diagtrain: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
