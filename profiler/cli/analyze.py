"""`diagtrain analyze PATH`: findings and a report from a run directory or a folder of traces."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
from pathlib import Path

from rich.console import Console

from diagtrain.profiler.analyzer import SCHEDULER_ENV, analysis_home, default_workers, holds_dumps, holds_inputs
from diagtrain.profiler.analyzer.per_rank.jobs import MixedJobs
from diagtrain.profiler.run_dir import check_writable
from diagtrain.profiler.util.bounded_read import display
from diagtrain.profiler.util.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from diagtrain.profiler.util.heap import arrow_on_the_c_heap


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``diagtrain analyze``."""
    p = subparsers.add_parser(
        "analyze", help="find stragglers, bubbles, slow collectives, stalls and memory imbalance in a run",
        description="Analyze a diagtrain run directory, any folder of PyTorch Profiler traces (one file per\n"
        "rank), or a folder of flight-recorder dumps of a hung job (the hang verdict alone). Writes analysis/ (Parquet tables, findings.json) and report.md/json/html.",
        epilog="examples:\n  diagtrain analyze runs/20261122T010833Z-3d --format md,json,html\n"
        "  diagtrain analyze /shared/runs/big-job --scheduler tcp://head-node:8786   # ranks load on a Dask cluster\n"
        "  diagtrain analyze /tmp/fr-dumps   # NCCL flight-recorder dumps (TORCH_FR_DUMP_TEMP_FILE=/tmp/fr-dumps/rank_)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", nargs="?", help="run directory, folder of traces, or folder of flight-recorder dumps "
                   "(one per rank, as TORCH_FR_DUMP_TEMP_FILE writes them)")
    p.add_argument("--format", metavar="md,json,html",
                   help="report formats to write, comma-separated (default md,json,html); naming md prints the full "
                   "Markdown report on stdout instead of the one-screen summary")
    p.add_argument("--out", help="where to write analysis/ and the reports (default: PATH for a diagtrain run "
                   "directory; beside any other folder, as PATH-diagtrain, so that folder is left as it was)")
    p.add_argument("--workers", type=int, default=default_workers(), help="processes that load ranks")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="load the ranks on the Dask cluster of this scheduler (e.g. tcp://head-node:8786; default: "
                   f"${SCHEDULER_ENV}, else this machine); its workers must see PATH and --out at the same paths "
                   "and have diagtrain installed (pip install 'diagtrain[dask]')")
    p.add_argument("--flight-recorder", metavar="DIR",
                   help="flight-recorder dumps made outside diagtrain (TORCH_FR_DUMP_TEMP_FILE files, pickle or JSON, "
                   "one per rank, rank number ending the name) for the hang verdict")
    p.add_argument("--quiet", action="store_true", help="print nothing on stdout (neither the summary nor the report)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.NAME=VALUE",
                   help="change one threshold of the judgement for this analysis, e.g. straggler.min_excess_ms=300 "
                   "(repeatable; --settings lists them all, with defaults and reasons)")
    p.add_argument("--settings", nargs="?", const="md", choices=("md", "json"), metavar="md|json",
                   help="print every setting of the analyzer and of compare (default, type, reason) as Markdown or JSON, "
                   "and exit")
    p.set_defaults(handler=run_analyze)


def run_analyze(args: argparse.Namespace, argv: list[str]) -> int:
    """Validate, analyze, print the report; 0 on success, 2 on bad usage."""
    arrow_on_the_c_heap()  # before pyarrow's import (by pandas'): all of Arrow's memory on the C heap
    from diagtrain.profiler.analyzer.report import document as report  # pandas and pyarrow: only once the command runs

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    from diagtrain.profiler.util import settings
    from diagtrain.profiler.analyzer.judge.judgement import all_sections

    all_sections()  # every judging module registers its settings on import
    import diagtrain.profiler.compare.thresholds  # noqa: F401 - compare's too: one list of every number that decides
    if args.settings:
        return print_settings(args.settings)
    try:
        overrides = settings.parse(args.overrides)
    except settings.SettingError as e:
        return _usage(err, f"--set {e}")
    if args.path is None:
        return _usage(err, "the following argument is required: path (or --settings to list the settings)")
    path = Path(args.path)
    asked = args.format if args.format is not None else ",".join(report.FORMATS)
    formats = [f.strip() for f in asked.split(",") if f.strip()]
    bad = [f for f in formats if f not in report.FORMATS]
    if bad or not formats:
        return _usage(err, f"--format {asked!r}: choose from {', '.join(report.FORMATS)}")
    if not path.is_dir():
        return _usage(err, f"{path}: no such directory")
    fr_dir = Path(args.flight_recorder) if args.flight_recorder else None
    if fr_dir is not None and not fr_dir.is_dir():
        return _usage(err, f"--flight-recorder {fr_dir}: no such directory")
    if not holds_inputs(path):
        if fr_dir is None and holds_dumps(path):
            fr_dir = path  # a folder of flight-recorder dumps alone, as a hung job leaves them
        elif fr_dir is None:
            return _usage(err, f"{display(path)}: nothing to analyze: no diagtrain run there (ranks/, manifest.json), "
                          "no PyTorch Profiler traces (*.json, *.json.gz) and no flight-recorder dumps")
    out = Path(args.out) if args.out else analysis_home(path)
    made_out = not out.exists()
    try:
        check_writable(out / "analysis")
    except OSError as e:
        return _usage(err, f"{out}: cannot write the analysis there ({e.strerror or e}); pass --out DIR")
    if not args.out and out != path:
        err.print(f"diagtrain analyze: {path} is not a diagtrain run directory, so it is left as it is; the analysis "
                  f"goes beside it, to {out} (--out DIR to choose)", markup=False)
    if args.workers < 1:
        return _usage(err, "--workers must be at least 1")
    scheduler = args.scheduler or os.environ.get(SCHEDULER_ENV) or None
    if scheduler:  # the workers run in other working directories: they are given whole paths
        path, out = Path(os.path.abspath(path)), Path(os.path.abspath(out))
    try:
        # An explicit --format that names md asks for the full report on stdout (to pipe or paste it).
        full = args.format is not None and "md" in formats
        return analyze_and_print(path, out, formats, args.workers, err, quiet=args.quiet, flight_recorder=fr_dir,
                                 scheduler=scheduler, overrides=overrides, full_report=full)
    except MixedJobs as e:
        if made_out:  # only what this command made: nothing of the user's
            shutil.rmtree(out, ignore_errors=True)
        return _usage(err, f"{display(path)} holds traces of more than one job, which would be merged into one run:\n"
                      + "\n".join(f"  {c}" for c in e.conflicts)
                      + "\nPut each job's traces (one window of one job: one file per rank) in a folder of its own "
                      "and analyze that folder")


def print_settings(fmt: str) -> int:
    """Every setting of the analyzer on stdout, as Markdown tables or a JSON list."""
    import json

    from diagtrain.profiler.util import settings

    rows = settings.describe()
    print(json.dumps(rows, indent=2) if fmt == "json" else settings.markdown(rows), end="" if fmt == "md" else "\n")
    return EXIT_OK


def analyze_and_print(path: Path, out: Path, formats: list[str], workers: int, err: Console, quiet: bool = False,
                      flight_recorder: Path | None = None, scheduler: str | None = None,
                      overrides: dict | None = None, full_report: bool = False) -> int:
    """Run the analysis (its ranks on the Dask cluster of ``scheduler`` if given) with progress on stderr and,
    on stdout, the one-screen summary (report/summary.py) or, with ``full_report``, the Markdown report.

    Returns 0, or 2 when nothing in ``path`` could be analyzed (it says what was looked for) or the
    scheduler cannot be used.
    """
    from diagtrain.profiler.analyzer.report import document as report
    from diagtrain.profiler.analyzer.report import summary
    from diagtrain.profiler.analyzer.analyze import analyze
    from diagtrain.profiler.analyzer.per_rank.cluster import SchedulerError

    try:
        with err.status("analyzing", spinner="dots") as status, _CtrlC() as ctrl_c:
            def progress(message: str) -> None:
                ctrl_c.check()
                status.update(f"analyzing: {message}")

            doc = analyze(path, out, formats, workers, progress=progress, flight_recorder=flight_recorder,
                          scheduler=scheduler, overrides=overrides)
    except SchedulerError as e:
        return _usage(err, str(e))
    except OSError as e:  # writing the results: a full disk, a quota (the inputs are read behind a guard)
        where = display(e.filename) if e.filename else display(out)
        err.print(f"diagtrain analyze: error: cannot write the analysis ({where}: {e.strerror or e}); "
                  f"free some space or pass --out DIR", markup=False)
        return EXIT_FAILED
    if not doc["ranks"]:
        if doc["skipped"]:
            err.print(f"diagtrain analyze: nothing could be read in {display(path)}:", markup=False)
            for s in doc["skipped"]:
                err.print(f"  {s['path']}: {s['reason']}", markup=False)
        else:
            err.print(f"diagtrain analyze: error: nothing to analyze in {display(path)}: no diagtrain run there "
                      "(ranks/<r>/steps.jsonl or trace-*.json.gz) and no PyTorch Profiler traces (*.json, *.json.gz)",
                      markup=False)
        return EXIT_USAGE
    written = [out / f"report.{f}" for f in formats]
    if not quiet:
        text = report.markdown(doc) if full_report else "\n".join(summary.lines(doc, path, out, written))
        sys.stdout.write(text + "\n")
        sys.stdout.flush()  # before the stderr line below, so a terminal shows the two in this order
    err.print(f"diagtrain: report {', '.join(display(p) for p in written)}", markup=False)
    return EXIT_OK


class _CtrlC:
    """Ctrl-C during an analysis: stop at the next step, where stopping is clean.

    A KeyboardInterrupt raised at an arbitrary point can land inside the process pool's own
    machinery (an at-fork callback drops it; a lock left held hangs the shutdown), so the first
    Ctrl-C is only remembered and acted on at the analysis' next progress step (its stages, each
    rank loaded, a tick while ranks load). A second one stops at once.
    """

    def __enter__(self) -> "_CtrlC":
        self.seen = False
        self.previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def _on_sigint(self, signum: int, frame: object) -> None:
        if self.seen:
            raise KeyboardInterrupt
        self.seen = True

    def check(self) -> None:
        """Raise KeyboardInterrupt if a Ctrl-C came."""
        if self.seen:
            raise KeyboardInterrupt

    def __exit__(self, exc_type: type | None, *exc: object) -> None:
        signal.signal(signal.SIGINT, self.previous)
        if exc_type is None:
            self.check()


def _usage(err: Console, message: str) -> int:
    err.print(f"diagtrain analyze: error: {message}", markup=False)
    return EXIT_USAGE
