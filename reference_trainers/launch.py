"""`diagtrain train`: validate everything, then hand over to torch.distributed.run.

Validation happens here, before any process starts, so a bad spec costs nothing. The launcher then
replaces itself with ``python -m torch.distributed.run ... -m diagtrain.reference_trainers``, so
signals reach torchrun directly and the exit code is torchrun's, exactly as with a bare torchrun.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from diagtrain.profiler.run_dir import RUN_DIR_ENV, WRAPPER_PID_ENV, check_writable, default_run_dir
from diagtrain.profiler.util.exit_codes import EXIT_USAGE
from diagtrain.reference_trainers.config import ConfigError, add_train_arguments, config_from_args


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``diagtrain train``."""
    p = subparsers.add_parser(
        "train",
        help="run a reference trainer (DDP, FSDP, TP, PP, 3D) on N local ranks",
        description="Run a reference trainer through torch.distributed.run. Picks cuda+nccl when a "
        "GPU is present, cpu+gloo otherwise. Same as `torchrun --nproc-per-node N -m "
        "diagtrain.reference_trainers ...`.",
        epilog="example: diagtrain train --strategy 3d --nproc 8 --steps 10 --inject straggler:rank=3,ms=50",
    )
    add_train_arguments(p, with_nproc=True)
    p.set_defaults(handler=run_train)


def run_train(args: argparse.Namespace, argv: list[str]) -> int:
    """Validate, create the run directory, and exec torchrun (does not return on success)."""
    try:
        config = config_from_args(args, nproc=args.nproc)
    except ConfigError as e:
        print(f"diagtrain train: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    out = Path(config.out or os.environ.get(RUN_DIR_ENV) or default_run_dir(config.strategy)).resolve()
    try:
        check_writable(out)
    except OSError as e:
        print(f"diagtrain train: error: --out {out}: cannot write there ({e.strerror or e})", file=sys.stderr)
        return EXIT_USAGE
    if WRAPPER_PID_ENV not in os.environ:  # under `diagtrain run`, the wrapper has said it already
        print(f"diagtrain: run directory {out}", file=sys.stderr, flush=True)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={config.nproc}",
        "-m", "diagtrain.reference_trainers", *_without_nproc(argv), f"--out={out}",
    ]
    # torchrun would set 1 itself, with a warning per launch; ranks share the machine's cores.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.stdout.flush()
    os.execv(sys.executable, command)
    return 0  # not reached


def _without_nproc(argv: list[str]) -> list[str]:
    """The trainer's own arguments: everything but ``--nproc`` (a launcher option)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            kept.append(arg)
    return kept
