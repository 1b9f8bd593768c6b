"""`diagtrain plan`: choose the parallel layout before the run, or ask what-ifs of a finished one.

    diagtrain plan --params 70B --gpus 64 --gpu h100-80gb [--gpus-per-node 8] [--format md|json]
    diagtrain plan --from RUN [--gpus N] [--gpu NAME]

Exit codes: 0 a plan was made (also when nothing fits: the output says what would), 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from diagtrain.profiler.run_dir import write_bytes_atomic
from diagtrain.profiler.util.exit_codes import EXIT_OK, EXIT_USAGE

DEFAULT_GPU = "h100-80gb"
DEFAULT_TOP = 10


class UsageError(ValueError):
    """Bad input; the message names the argument and the problem."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``diagtrain plan``."""
    p = subparsers.add_parser(
        "plan", help="rank parallel layouts (DDP, ZeRO/FSDP, TP, PP, 3D) by memory and estimated step time",
        description="Enumerate every layout of a model on a cluster (dp x tp x pp, ZeRO stage, microbatches, "
        "activation checkpointing), keep those that fit in memory and rank them by estimated step time: memory per "
        "GPU by part, bytes and time per collective per link, pipeline bubble, and why each wins or loses. "
        "With --from RUN: the same model with the speeds a run measured, and what-if answers for that job.",
        epilog="examples:\n  diagtrain plan --params 70B --gpus 64 --gpu h100-80gb\n"
               "  diagtrain plan --params 30B --gpus 32 --gpu a100-80gb --seq 2048 --global-batch 1024\n"
               "  diagtrain plan --from runs/20261122T010833Z-pp --gpus 16 --gpu a100-80gb\n"
               "exit codes: 0 plan made (also when nothing fits), 2 bad input",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_argument_group("what to plan (one of)")
    src.add_argument("--params", metavar="N", help="model parameters, e.g. 70B, 350M, 7e9")
    src.add_argument("--from", dest="from_run", metavar="RUN", help="a run directory: its model, layout and speeds")
    hw = p.add_argument_group("cluster")
    hw.add_argument("--gpus", type=int, help="GPUs in all (with --from: plan the job on this many)")
    hw.add_argument("--gpus-per-node", type=int, help="GPUs per node (default: the GPU table's, 8)")
    hw.add_argument("--gpu", help=f"GPU kind, e.g. h100-80gb, a100-80gb, mi300x (default {DEFAULT_GPU}; "
                                  "with --from: sets the memory limit)")
    hw.add_argument("--intra-node-bw", metavar="BW", help="bus bandwidth inside a node, e.g. 450GB/s "
                                                          "(default: half the GPU's NVLink figure)")
    hw.add_argument("--inter-node-bw", metavar="BW", help="network bandwidth per GPU, e.g. 400Gb/s (default: the GPU "
                                                          "table's reference system)")
    mdl = p.add_argument_group("model shape (default: the nearest well-known model of that size)")
    for flag, what in (("--layers", "transformer layers"), ("--hidden", "hidden size"), ("--heads", "attention heads"),
                       ("--seq", "sequence length"), ("--vocab", "vocabulary size"),
                       ("--global-batch", "sequences per optimizer step")):
        mdl.add_argument(flag, type=int, metavar="N", help=what)
    mdl.add_argument("--precision", choices=("bf16", "fp32"), default="bf16",
                     help="bf16: mixed precision with fp32 master weights (default); fp32")
    opt = p.add_argument_group("search and output")
    opt.add_argument("--tp", type=int, help="only layouts with this tensor-parallel degree")
    opt.add_argument("--pp", type=int, help="only layouts with this pipeline depth")
    opt.add_argument("--zero", type=int, choices=(0, 1, 2, 3), help="only this ZeRO stage (0: DDP, 3: FSDP)")
    opt.add_argument("--peak-fraction", type=float, default=None, metavar="F",
                     help="achieved share of the GPU's dense BF16 peak (default 0.4)")
    opt.add_argument("--top", type=int, default=DEFAULT_TOP, help=f"layouts shown (default {DEFAULT_TOP})")
    opt.add_argument("--format", choices=("md", "json"), default="md", help="output format (default md)")
    opt.add_argument("--output", metavar="FILE", help="write to FILE instead of standard output")
    p.set_defaults(handler=run_plan)


def run_plan(args: argparse.Namespace, argv: list[str]) -> int:
    """Make the plan (or the run's what-ifs) and print it; 2 on bad input."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        text = _from_run(args, err) if args.from_run else _plan(args)
    except UsageError as e:
        err.print(f"diagtrain plan: error: {e}", markup=False)
        return EXIT_USAGE
    if args.output:
        try:
            write_bytes_atomic(Path(args.output), text.encode())
        except OSError as e:
            err.print(f"diagtrain plan: error: --output {args.output}: cannot write ({e.strerror or e})", markup=False)
            return EXIT_USAGE
        err.print(f"diagtrain plan: written to {args.output}", markup=False)
    else:
        sys.stdout.write(text)
    return EXIT_OK


def _plan(args: argparse.Namespace) -> str:
    from diagtrain.profiler.model.precision import PRECISIONS
    from diagtrain.profiler.plan import model as plan_model
    from diagtrain.profiler.plan import planner, render
    from diagtrain.profiler.plan.units import parse_count

    if not args.params:
        raise UsageError("give --params N (the model's size) or --from RUN")
    if args.gpus is None:
        raise UsageError("--gpus is required with --params")
    params = _parse(parse_count, args.params, "--params")
    cluster = _cluster(args, args.gpus)
    shape = {k: getattr(args, k) for k in ("layers", "hidden", "heads", "vocab")}
    _positive(args, "layers", "hidden", "heads", "seq", "vocab", "global_batch", "top")
    model = plan_model.shape_for(params, **shape, seq_len=args.seq)
    _check_model(model)
    batch = args.global_batch or plan_model.default_batch(params, model.seq_len)
    fraction = _peak_fraction(args)
    _check_filters(args, cluster, model, batch)
    result = planner.plan(model, cluster, PRECISIONS[args.precision], batch, fraction,
                          where=_filter(args))
    if args.format == "json":
        return render.dumps(render.plan_json(result, args.top))
    return render.plan_markdown(result, args.top) + "\n"


def _from_run(args: argparse.Namespace, err: Console) -> str:
    from diagtrain.profiler.analyzer.judge.model_check import measured
    from diagtrain.profiler.plan import render, whatif
    from diagtrain.profiler.plan.estimate import usable_memory

    if args.params:
        raise UsageError("--params and --from exclude each other: --from reads the size from the run")
    path = Path(args.from_run)
    if not path.is_dir():
        raise UsageError(f"--from {path}: no such run directory")
    _positive(args, "gpus", "top")
    _ensure_analyzed(path, err)
    _positive(args, "layers", "hidden", "heads", "seq", "vocab")
    try:
        files = measured.read_run(path)
        rm = files.describe()
        rm = _reshaped(args, rm, files.trainer is not None)
        m = files.measure(rm)
    except measured.RunInputError as e:
        raise UsageError(str(e)) from None
    if not m.flops:
        raise UsageError(f"--from {path}: the run has no profiled steps to measure its compute speed from; "
                         "run it again with --profile-steps (e.g. --profile-steps 3-4)")
    cluster = _cluster(args, args.gpus or rm.world_size) if (args.gpu or args.gpus) else None
    capacity = usable_memory(cluster) if args.gpu else None
    report = whatif.answer(str(path), rm, m, capacity=capacity, cluster=cluster, gpus=args.gpus)
    if args.format == "json":
        return render.dumps(render.run_json(report, args.top))
    return render.run_markdown(report, args.top) + "\n"


def _reshaped(args: argparse.Namespace, rm, exact: bool):
    """A foreign run's assumed shape, corrected by --layers/--hidden/--heads/--seq/--vocab."""
    from dataclasses import replace

    from diagtrain.profiler.plan.model import shape_for

    given = {"layers": args.layers, "hidden": args.hidden, "heads": args.heads, "seq_len": args.seq, "vocab": args.vocab}
    if not any(v is not None for v in given.values()):
        return rm
    if exact:
        raise UsageError(f"--from {args.from_run}: its trainer.json gives the model's shape; "
                         "--layers/--hidden/--heads/--seq/--vocab apply to runs without one")
    model = shape_for(rm.model.params, **given)
    _check_model(model)
    notes = [n for n in rm.notes if not n.startswith("shape assumed")] + ["shape as given on the command line"]
    return replace(rm, model=model, notes=notes)


def _ensure_analyzed(path: Path, err: Console) -> None:
    """``plan --from`` reads the analysis; a run without one is analyzed first (with progress)."""
    from diagtrain.profiler.analyzer.judge.model_check.measured import ANALYSIS_FILES

    if all((path / name).exists() for name in ANALYSIS_FILES):
        return
    from diagtrain.profiler.analyzer import default_workers
    from diagtrain.profiler.analyzer.analyze import analyze

    with err.status("analyzing the run first", spinner="dots") as status:
        analyze(path, path, ["json"], default_workers(), progress=lambda msg: status.update(f"analyzing: {msg}"))


def _cluster(args: argparse.Namespace, gpus: int):
    from diagtrain.profiler.plan.hardware import Cluster, find_gpu
    from diagtrain.profiler.plan.units import parse_bandwidth

    if gpus < 1:
        raise UsageError(f"--gpus must be at least 1, got {gpus}")
    gpu = _parse(find_gpu, args.gpu or DEFAULT_GPU, "--gpu")
    per_node = args.gpus_per_node or gpu.gpus_per_node
    if per_node < 1:
        raise UsageError(f"--gpus-per-node must be at least 1, got {per_node}")
    per_node = min(per_node, gpus)
    if gpus % per_node:
        raise UsageError(f"--gpus {gpus} does not fill nodes of {per_node} GPUs (--gpus-per-node)")
    intra = _parse(parse_bandwidth, args.intra_node_bw, "--intra-node-bw") if args.intra_node_bw else gpu.intra_node_bw
    inter = _parse(parse_bandwidth, args.inter_node_bw, "--inter-node-bw") if args.inter_node_bw else gpu.network_bw
    return Cluster(gpu, gpus, per_node, intra, inter)


def _parse(parse, text: str, flag: str):
    try:
        return parse(text)
    except ValueError as e:
        raise UsageError(f"{flag} {e}") from None


def _positive(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {value}")


def _peak_fraction(args: argparse.Namespace) -> float:
    from diagtrain.profiler.plan.compute import DEFAULT_PEAK_FRACTION

    fraction = DEFAULT_PEAK_FRACTION if args.peak_fraction is None else args.peak_fraction
    if not 0 < fraction <= 1:
        raise UsageError(f"--peak-fraction must be in (0, 1], got {fraction}")
    return fraction


def _check_model(model) -> None:
    if model.hidden % model.heads:
        raise UsageError(f"--hidden {model.hidden} is not divisible by --heads {model.heads}")


def _check_filters(args: argparse.Namespace, cluster, model, batch: int) -> None:
    """A fixed --tp/--pp must divide the GPUs and the model; the batch must split over some replicas."""
    tp, pp = args.tp or 1, args.pp or 1
    _positive(args, "tp", "pp")
    if cluster.gpus % (tp * pp):
        raise UsageError(f"--tp {tp} x --pp {pp} does not divide {cluster.gpus} GPUs")
    if args.tp and args.tp > cluster.gpus_per_node:
        raise UsageError(f"--tp {args.tp} spans more than a node ({cluster.gpus_per_node} GPUs): tensor parallelism "
                         "stays on NVLink")
    if args.tp and model.heads % args.tp:
        raise UsageError(f"--tp {args.tp} does not divide the {model.heads} attention heads")
    if args.pp and args.pp > model.layers:
        raise UsageError(f"--pp {args.pp} is deeper than the model's {model.layers} layers")
    if args.tp and args.pp and batch % (cluster.gpus // (tp * pp)):
        raise UsageError(f"--global-batch {batch} does not split over {cluster.gpus // (tp * pp)} data-parallel "
                         "replicas")


def _filter(args: argparse.Namespace):
    def keep(layout) -> bool:
        return ((args.tp is None or layout.tp == args.tp) and (args.pp is None or layout.pp == args.pp)
                and (args.zero is None or layout.zero == args.zero or layout.dp == 1))
    return keep
