"""The `diagtrain` command line. Exit code 2 means the command was used wrongly."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subcommand per verb."""
    parser = argparse.ArgumentParser(
        prog="diagtrain",
        description="Find out why a distributed PyTorch job is slow, stuck or out of memory: "
        "which rank, which step, which operation.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    from diagtrain.dashboard import command as dashboard_command
    from diagtrain.profiler import compare_command, run_command
    from diagtrain.profiler.analyzer import command as analyze_command
    from diagtrain.reference_trainers import launch

    run_command.add_parser(subparsers)
    analyze_command.add_parser(subparsers)
    dashboard_command.add_parser(subparsers)
    compare_command.add_parsers(subparsers)
    launch.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``diagtrain`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.handler(args, argv[1:])


if __name__ == "__main__":
    sys.exit(main())
