"""`diagtrain run [options] -- CMD ...`: run any training command and collect what every rank did.

This verb hands the command to the launcher (:mod:`diagtrain.profiler.collect.launcher`), which puts
the in-rank bootstrap on the ranks' PYTHONPATH, and, when the job ends, hands the run directory to
the analyzer: the one place where collection and analysis meet.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from diagtrain.profiler.collect import manifest, telemetry, watchdog
from diagtrain.profiler.collect.launcher import Collection
from diagtrain.profiler.collect.live import LiveDiagnosis, LiveWork, Verdict
from diagtrain.profiler.collect.metrics import LiveMetrics
from diagtrain.profiler.collect.metrics import serve as serve_metrics
from diagtrain.profiler.rank import BOOTSTRAP_DIR
from diagtrain.profiler.run_dir import PROFILE_AUTO, PROFILE_NONE, check_writable, clear_run, default_run_dir
from diagtrain.profiler.util.exit_codes import EXIT_INTERRUPTED, EXIT_USAGE
from diagtrain.profiler.util.step_ranges import StepRange, parse_step_ranges

ON_HANG = ("dump-and-kill", "dump-and-wait")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``diagtrain run``."""
    p = subparsers.add_parser(
        "run",
        help="run any training command and collect steps, traces, logs and telemetry per rank",
        usage="diagtrain run [options] -- CMD ...",
        description="Run CMD (torchrun ..., diagtrain train ..., python script.py) unchanged and collect, "
        "for every rank: steps.jsonl (with each step's time blocked in collectives, data wait, forward/"
        "backward/optimizer and CPU time), heartbeat, PyTorch Profiler traces, stdout and "
        "stderr, NCCL_DEBUG log, flight recorder dump; beside the job: telemetry (NVML, or psutil). "
        "Without --profile-steps, steps are profiled when it matters (auto). "
        "Several hosts: run it on every node with the same --out on a shared filesystem; the wrappers measure "
        "their clocks against each other, and the last one to finish analyzes the run. "
        "Exit code: the command's; 128 + the signal if it was interrupted (130 after Ctrl-C, 143 after SIGTERM); "
        "124 if it hung and was stopped; 127 if it cannot be started; 2 for bad usage.",
        epilog="example: diagtrain run --profile-steps 5-6 -- torchrun --nproc-per-node 4 train.py",
    )
    p.add_argument("--out", metavar="DIR", help="run directory (default runs/<UTC time>-<strategy or command>); "
                   "one that holds a finished run is refused (exit 2), another host of the same running job joins it")
    p.add_argument("--replace", action="store_true",
                   help="if --out holds an earlier run, remove that run's files first (other files stay)")
    p.add_argument("--profile-steps", action="append", default=[], metavar="A-B|auto|none",
                   help="profile steps A to B in every rank (repeatable; steps count from 1); 'auto' (the "
                   "default): one short window after warm-up and one when step time rises well above its "
                   "recent median, the same steps on every rank; 'none': no profiling")
    p.add_argument("--telemetry-interval", type=float, default=telemetry.DEFAULT_INTERVAL_S, metavar="SECONDS",
                   help=f"seconds between telemetry samples (default {telemetry.DEFAULT_INTERVAL_S})")
    p.add_argument("--hang-timeout", type=float, default=watchdog.DEFAULT_HANG_TIMEOUT_S, metavar="SECONDS",
                   help="a hang is no rank finishing a step for this long while all are alive "
                   f"(default {watchdog.DEFAULT_HANG_TIMEOUT_S:.0f}; before the first step, at least "
                   f"{watchdog.STARTUP_GRACE_S:.0f}: start-up is slow on a busy host)")
    p.add_argument("--on-hang", choices=ON_HANG, default="dump-and-kill",
                   help="on a hang: dump stacks and flight recorder, analyze, then stop the job (default) or leave it")
    p.add_argument("--no-analyze", action="store_true", help="do not analyze the run when it ends")
    p.add_argument("--no-live", action="store_true",
                   help="do not judge the job while it runs (live/findings.jsonl, the console's live findings)")
    p.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="serve the live verdict as Prometheus metrics at http://HOST:PORT/metrics while the job runs")
    p.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                   help="the address --metrics-port listens on (default 127.0.0.1)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    p.set_defaults(handler=run_command)


def run_command(args: argparse.Namespace, argv: list[str]) -> int:
    """Validate, start the command, collect until it ends; return its exit code."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    if not command:
        return _usage(err, "no command given: diagtrain run [options] -- CMD ...")
    try:
        windows = profile_plan(args.profile_steps)
    except ValueError as e:
        return _usage(err, f"--profile-steps {e}")
    if args.telemetry_interval <= 0:
        return _usage(err, "--telemetry-interval must be positive")
    if args.hang_timeout <= 0:
        return _usage(err, "--hang-timeout must be positive")
    if args.metrics_port is not None and args.no_live:
        return _usage(err, "--metrics-port serves the live verdict: it cannot be combined with --no-live")
    if args.metrics_port is not None and not 0 < args.metrics_port < 65536:
        return _usage(err, f"--metrics-port {args.metrics_port} is not a port (1-65535)")
    try:
        metrics = serve_metrics(args.metrics_host, args.metrics_port) if args.metrics_port is not None else None
    except OSError as e:  # before the job starts: a port in use must not cost a run
        return _usage(err, f"--metrics-port {args.metrics_port}: cannot listen on {args.metrics_host}:"
                           f"{args.metrics_port} ({e.strerror or e})")
    out = Path(args.out).resolve() if args.out else _unused(default_run_dir(_label(command)).resolve())
    taken = manifest.occupied_by(out, command)
    if taken and not args.replace:
        return _usage(err, f"--out {out} {taken}. Choose another --out, or pass --replace to remove that run first")
    try:
        if taken:
            clear_run(out)
        check_writable(out)
    except OSError as e:
        return _usage(err, f"--out {out}: cannot write there ({e.strerror or e})")
    collection = Collection(out, command, argv, windows, args.telemetry_interval, err, BOOTSTRAP_DIR)
    if not args.no_live:
        collection.live = live_diagnosis(out, collection.host_dir.name, metrics)
    collection.watchdog = watchdog.Watchdog(collection.ranks, collection.host_dir.name, args.hang_timeout)
    collection.kill_on_hang = args.on_hang == "dump-and-kill"
    collection.analysis_follows = not args.no_analyze
    code = collection.run()
    # One analysis per run: by the last host to finish (the first to claim it, if several end at once).
    if not args.no_analyze and not collection.others_running:
        try:
            if collection.interrupted_after is not None:
                raise KeyboardInterrupt  # Ctrl-C while the records were written: no analysis either
            if manifest.claim_analysis(out, collection.host_dir.name):
                collection.finish_run()
                _analyze(out, err)
            else:
                err.print("diagtrain: another host that ended at the same time analyzes the run", markup=False)
        except KeyboardInterrupt:
            err.print(f"diagtrain: analysis interrupted; the run's data is complete: `diagtrain analyze {out}` "
                      "analyzes it", markup=False)
            return EXIT_INTERRUPTED
    return code


def live_diagnosis(out: Path, host: str, metrics: LiveMetrics | None) -> LiveDiagnosis:
    """The analyzer's live judgement, run beside the job by the launcher (made in its thread: the
    analyzer's imports take a second that the job's start should not wait for)."""
    def make() -> LiveWork:
        from diagtrain.profiler.analyzer.judge.live_judge import Live, LiveJudge
        from diagtrain.profiler.analyzer.read.host_summary import HostReducer
        from diagtrain.profiler.analyzer.report.wording import worded

        judge, reducer = LiveJudge(out), HostReducer(out, host)

        def judged() -> Verdict:
            verdict = worded(judge.judge())
            judge.spare_readers()  # this process is the wrapper's: what the judge holds, it holds to the end
            return verdict
        return LiveWork(judged, Live.active().interval_s,
                        lambda: reducer.reduce(Live.active().cache_lines, Live.active().cache_cpu_s))
    return LiveDiagnosis(out, host, make, metrics)


def profile_plan(values: list[str]) -> list[StepRange] | str:
    """``--profile-steps`` values: step ranges, or PROFILE_AUTO (also when none is given), or PROFILE_NONE."""
    modes = [v for v in values if v.strip().lower() in (PROFILE_AUTO, PROFILE_NONE)]
    if not modes:
        return parse_step_ranges(values) if values else PROFILE_AUTO
    if len(values) > 1:
        raise ValueError(f"{modes[0]!r} cannot be combined with other windows ({', '.join(values)})")
    return modes[0].strip().lower()


def _analyze(out: Path, err: Console) -> None:
    """Analyze what was collected; a failed analysis is reported and never changes the exit code."""
    from diagtrain.profiler.analyzer import default_workers
    from diagtrain.profiler.cli.analyze import analyze_and_print

    if not any(out.glob("ranks/*/rank.json")) and not any(out.glob("ranks/*/trace-*")):
        return  # no rank ever started: nothing to analyze
    try:
        analyze_and_print(out, out, ["md", "json", "html"], default_workers(), err)
    except Exception as e:  # noqa: BLE001 - the run's data is safe on disk; `diagtrain analyze` can retry
        if interrupted(e):
            raise KeyboardInterrupt from e
        err.print(f"diagtrain: analysis failed ({type(e).__name__}: {e}); run `diagtrain analyze {out}`", markup=False)


def interrupted(error: BaseException) -> bool:
    """Whether Ctrl-C caused ``error``: one landing while a module's classes are made reaches us wrapped
    (Python 3.11's RuntimeError "Error calling __set_name__"), not as a KeyboardInterrupt."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def _unused(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``... if a run started in the same second already took it."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def _usage(err: Console, message: str) -> int:
    err.print(f"diagtrain run: error: {message}", markup=False)
    return EXIT_USAGE


def _label(command: list[str]) -> str:
    """The run directory's suffix: the reference trainer's strategy, else the program's name."""
    if "--strategy" in command[:-1]:
        return command[command.index("--strategy") + 1]
    for token in reversed(command):
        if token.endswith(".py"):
            return Path(token).stem
    return Path(command[0]).name
