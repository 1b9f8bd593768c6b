"""`diagtrain dashboard RUN [RUN2]`: the analysis of one run (or two, compared) in the browser."""

from __future__ import annotations

import argparse
import errno
import logging
import socket
from pathlib import Path

from rich.console import Console

from diagtrain.profiler.analyzer import default_workers
from diagtrain.profiler.cli.analyze import analyze_and_print
from diagtrain.profiler.run_dir import check_writable
from diagtrain.profiler.util.exit_codes import EXIT_OK, EXIT_USAGE

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``diagtrain dashboard``."""
    p = subparsers.add_parser(
        "dashboard", help="open a run's findings, timeline, steps, communication, memory and hang views in a browser",
        description="Serve the analysis of RUN (and RUN2, for a side-by-side comparison) as a Dash app. Runs the "
        "analysis first if RUN has none. A job still running under `diagtrain run` is followed live: its steps, "
        "telemetry and live findings appear as they come, and the final report once the job ends and is analyzed. "
        "Serves only the run directories given here, on 127.0.0.1 unless --host says otherwise.",
        epilog="example: diagtrain dashboard runs/20261122T010833Z-3d --port 8050",
    )
    p.add_argument("run", help="run directory (analyzed first if needed)")
    p.add_argument("run2", nargs="?", help="a second run directory: the Compare tab shows RUN (base) against it")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8050, help="port (default 8050)")
    p.add_argument("--workers", type=int, default=default_workers(),
                   help="processes that load ranks when the analysis has to run first")
    p.set_defaults(handler=run_dashboard)


def run_dashboard(args: argparse.Namespace, argv: list[str]) -> int:
    """Validate, analyze what lacks an analysis, serve until Ctrl-C."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    paths = [Path(p) for p in (args.run, args.run2) if p]
    for path in paths:
        if not path.is_dir():
            return _usage(err, f"{path}: no such run directory")
    if not 0 < args.port < 65536:
        return _usage(err, f"--port {args.port}: not a TCP port")
    if args.workers < 1:
        return _usage(err, "--workers must be at least 1")
    from diagtrain.dashboard import app, data, live

    runs, following = [], {}
    for path in paths:
        if live.follows(path):  # still running (or being analyzed): followed until its report is there
            follower = following[len(runs)] = live.LiveRun(path)
            runs.append(follower.refresh())
            continue
        missing = data.missing_analysis(path)
        if missing:
            try:
                check_writable(path / "analysis")
            except OSError as e:
                return _usage(err, f"{path}: no analysis, and it cannot be written there ({e.strerror or e}); "
                              f"run `diagtrain analyze {path} --out DIR` and copy DIR's analysis into it")
            code = analyze_and_print(path, path, ["md", "json", "html"], args.workers, err, quiet=True)
            if code:
                return code
        try:
            runs.append(data.load(path))
        except data.RunError as e:
            return _usage(err, str(e))
    if args.host not in LOOPBACK:
        err.print(f"diagtrain dashboard: serving on {args.host}: anyone who can reach this address can see these runs",
                  markup=False)
    if not _port_free(args.host, args.port):
        return _usage(err, f"--port {args.port}: already in use on {args.host}; choose another")
    dash_app = app.build(runs, host=args.host, following=following)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    err.print(f"diagtrain dashboard: http://{_url_host(args.host)}:{args.port}/  (Ctrl-C to stop)", markup=False)
    try:
        dash_app.run(host=args.host, port=args.port, debug=False)
    except KeyboardInterrupt:
        pass
    return EXIT_OK


def _port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e.errno not in (errno.EADDRINUSE, errno.EACCES)
    return True


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _usage(err: Console, message: str) -> int:
    err.print(f"diagtrain dashboard: error: {message}", markup=False)
    return EXIT_USAGE
