"""Trainer configuration: command-line arguments, the parallel layout, and their validation.

Everything a rank needs is checked here, in the launcher, before any process starts; each rank
checks it again so that a bare ``torchrun -m diagtrain.reference_trainers`` refuses the same input.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field

from diagtrain.reference_trainers.fault_specs import FaultSpec, parse_fault

STRATEGIES = ("ddp", "fsdp", "tp", "pp", "3d")
SCHEDULES = ("gpipe", "1f1b", "interleaved1f1b")
# Interleaved 1F1B runs this many stages ("virtual stages") on every pipeline rank.
STAGES_PER_RANK_INTERLEAVED = 2
DEFAULT_LAYERS = 4
MICROBATCHES_PER_STAGE = 4  # default microbatches: enough to keep the pipeline bubble small


class ConfigError(ValueError):
    """A configuration that cannot run; the message says which argument and why."""


@dataclass(frozen=True)
class ParallelDims:
    """The pp × dp × tp layout; one-strategy runs put every rank on a single dimension."""

    pp: int
    dp: int
    tp: int

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    def __str__(self) -> str:
        return f"{self.pp}x{self.dp}x{self.tp}"


@dataclass
class TrainConfig:
    """One reference-trainer run, as given on the command line."""

    strategy: str
    nproc: int
    steps: int = 20
    mesh: ParallelDims | None = None
    layers: int | None = None
    dim: int = 64
    heads: int = 8
    seq_len: int = 32
    vocab: int = 256
    global_batch: int = 8
    grad_accum: int = 1
    lr: float = 1e-2
    seed: int = 0
    bf16: bool = False
    activation_checkpoint: bool = False
    fsdp_reshard_after_forward: bool = True
    schedule: str = "1f1b"
    microbatches: int | None = None
    checkpoint_every: int = 0
    profile_steps: list[str] = field(default_factory=list)
    out: str | None = None
    pg_timeout: float = 600.0
    inject: list[FaultSpec] = field(default_factory=list)

    # -- derived layout ------------------------------------------------------------------------

    @property
    def dims(self) -> ParallelDims:
        """The parallel layout this strategy uses on ``nproc`` ranks."""
        n = self.nproc
        return {
            "ddp": ParallelDims(1, n, 1),
            "fsdp": ParallelDims(1, n, 1),
            "tp": ParallelDims(1, 1, n),
            "pp": ParallelDims(n, 1, 1),
            "3d": self.mesh or default_3d_mesh(n),
        }[self.strategy]

    @property
    def stages_per_rank(self) -> int:
        return STAGES_PER_RANK_INTERLEAVED if self.schedule == "interleaved1f1b" else 1

    @property
    def num_stages(self) -> int:
        return self.dims.pp * self.stages_per_rank

    @property
    def n_layers(self) -> int:
        return self.layers if self.layers is not None else max(DEFAULT_LAYERS, self.num_stages)

    @property
    def local_batch(self) -> int:
        """Sequences per data-parallel rank per micro-step."""
        return self.global_batch // self.dims.dp

    @property
    def n_microbatches(self) -> int:
        """Pipeline microbatches per step: a fault may lower it; by default as many as the batch
        allows up to 4 per stage (the bubble (p-1)/(m+p-1) then stays near 20%)."""
        for fault in self.inject:
            if fault.kind == "few_microbatches":
                return int(fault.params["microbatches"])
        if self.microbatches is not None:
            return self.microbatches
        fits = [m for m in range(1, MICROBATCHES_PER_STAGE * self.num_stages + 1) if self.local_batch % m == 0]
        return max(fits[-1], 1)

    def stage_layers(self) -> list[int]:
        """Number of transformer layers on each pipeline stage (``pp_imbalance`` makes it uneven)."""
        stages, layers = self.num_stages, self.n_layers
        fault = next((f for f in self.inject if f.kind == "pp_imbalance"), None)
        fixed = {int(fault.params["stage"]): int(fault.params["layers"])} if fault else {}
        rest = layers - sum(fixed.values())
        free = [s for s in range(stages) if s not in fixed]
        counts = []
        for s in range(stages):
            if s in fixed:
                counts.append(fixed[s])
            else:
                i = free.index(s)
                counts.append(rest // len(free) + (1 if i < rest % len(free) else 0))
        return counts

    def to_json(self) -> dict:
        """A JSON-ready description for ``trainer.json`` in the run directory."""
        d = asdict(self)
        d["mesh"] = {"pp": self.dims.pp, "dp": self.dims.dp, "tp": self.dims.tp}
        d["inject"] = [f.to_json() for f in self.inject]
        d["n_layers"] = self.n_layers
        d["n_microbatches"] = self.n_microbatches if self.dims.pp > 1 else None
        d["stage_layers"] = self.stage_layers() if self.dims.pp > 1 else None
        return d


def default_3d_mesh(n: int) -> ParallelDims:
    """Pick pp × dp × tp for ``n`` ranks: tp 2 first (cheapest to shard), then pp 2, rest dp."""
    tp = 2 if n % 2 == 0 else 1
    rest = n // tp
    pp = 2 if rest % 2 == 0 else 1
    return ParallelDims(pp, rest // pp, tp)


def parse_mesh(text: str) -> ParallelDims:
    """Parse ``PPxDPxTP`` such as ``2x2x2``."""
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected PPxDPxTP with positive integers, e.g. 2x2x2"
        )
    return ParallelDims(*(int(p) for p in parts))


def _fault(text: str) -> FaultSpec:
    try:
        return parse_fault(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_train_arguments(p: argparse.ArgumentParser, *, with_nproc: bool) -> None:
    """The trainer's arguments; the launcher adds ``--nproc``, a bare rank reads WORLD_SIZE."""
    p.add_argument("--strategy", required=True, choices=STRATEGIES, help="parallelism to train with")
    if with_nproc:
        p.add_argument("--nproc", type=int, default=2, help="ranks to start on this machine (default 2)")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps to run (default 20)")
    p.add_argument("--mesh", type=parse_mesh, help="3d only: PPxDPxTP, e.g. 2x2x2 (default from the rank count)")
    p.add_argument("--layers", type=int, help=f"transformer layers (default max({DEFAULT_LAYERS}, pipeline stages))")
    p.add_argument("--dim", type=int, default=64, help="model width (default 64)")
    p.add_argument("--heads", type=int, default=8, help="attention heads (default 8)")
    p.add_argument("--seq-len", type=int, default=32, help="tokens per sequence (default 32)")
    p.add_argument("--vocab", type=int, default=256, help="vocabulary size (default 256)")
    p.add_argument("--global-batch", type=int, default=8, help="sequences per micro-step over all data-parallel ranks (default 8)")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-steps per optimizer step (default 1)")
    p.add_argument("--lr", type=float, default=1e-2, help="AdamW learning rate (default 1e-2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model init and the synthetic data")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast for forward")
    p.add_argument("--activation-checkpoint", action="store_true", help="recompute each block in backward")
    p.add_argument("--fsdp-reshard-after-forward", type=_bool, default=True, metavar="BOOL",
                   help="false keeps parameters unsharded after forward (ZeRO-2-like); default true (ZeRO-3)")
    p.add_argument("--schedule", choices=SCHEDULES, default="1f1b", help="pipeline schedule (pp, 3d)")
    p.add_argument("--microbatches", type=int,
                   help="pipeline microbatches per step (default: up to 4 per stage, as the batch allows)")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                   help="save a distributed checkpoint every N steps into OUT/checkpoints (0: never)")
    p.add_argument("--profile-steps", action="append", default=[], metavar="A-B",
                   help="profile steps A to B with the PyTorch Profiler (repeatable)")
    p.add_argument("--out", help="run directory (default $DIAGTRAIN_RUN_DIR, else runs/<UTC time>-<strategy>)")
    p.add_argument("--pg-timeout", type=float, default=600.0, metavar="SECONDS",
                   help="collective timeout of the process groups (default 600)")
    p.add_argument("--inject", action="append", default=[], type=_fault, metavar="KIND:k=v,...",
                   help="inject a fault (repeatable): " + "; ".join(FAULT_HELP))


FAULT_HELP = [
    "straggler:rank=R,ms=M|factor=F[,steps=A-B]",
    "dataloader_stall:rank=R,ms=M[,every=N][,steps=A-B]",
    "slow_comm:rank=R,ms=M[,steps=A-B]",
    "mem_imbalance:rank=R,mb=M",
    "hang:rank=R,step=K",
    "stuck:rank=R,step=K",
    "crash:rank=R,step=K",
    "pp_imbalance:stage=S,layers=L",
    "few_microbatches:microbatches=M",
]


def config_from_args(args: argparse.Namespace, nproc: int) -> TrainConfig:
    """Build and validate a :class:`TrainConfig`; raise :class:`ConfigError` if it cannot run."""
    fields = {k: v for k, v in vars(args).items() if k in TrainConfig.__dataclass_fields__}
    fields["nproc"] = nproc
    config = TrainConfig(**fields)
    validate(config)
    return config


def validate(c: TrainConfig) -> None:
    """Refuse a configuration that cannot run, naming the argument and the problem."""
    from diagtrain.profiler.util.step_ranges import parse_step_ranges

    if c.nproc < 1:
        raise ConfigError(f"--nproc must be at least 1, got {c.nproc}")
    if c.mesh is not None and c.strategy != "3d":
        raise ConfigError("--mesh applies to --strategy 3d only")
    dims = c.dims
    if dims.world_size != c.nproc:
        raise ConfigError(
            f"--mesh {dims} (pp x dp x tp) has {dims.world_size} ranks, but --nproc is {c.nproc}"
        )
    for name in ("steps", "dim", "heads", "seq_len", "vocab", "global_batch", "grad_accum"):
        if getattr(c, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
    if c.dim % c.heads:
        raise ConfigError(f"--dim {c.dim} is not divisible by --heads {c.heads}")
    if c.heads % dims.tp:
        raise ConfigError(f"--heads {c.heads} is not divisible by the tensor-parallel degree {dims.tp}")
    if (4 * c.dim) % dims.tp:
        raise ConfigError(f"the MLP width {4 * c.dim} is not divisible by the tensor-parallel degree {dims.tp}")
    if c.global_batch % dims.dp:
        raise ConfigError(f"--global-batch {c.global_batch} is not divisible by the data-parallel degree {dims.dp}")
    try:
        parse_step_ranges(c.profile_steps)
    except ValueError as e:
        raise ConfigError(f"--profile-steps {e}") from None
    if dims.pp > 1:
        _validate_pipeline(c)
    elif c.schedule != "1f1b" or c.microbatches is not None:
        if c.schedule != "1f1b":
            raise ConfigError("--schedule applies to pipeline runs (pp, or 3d with pp > 1)")
        raise ConfigError("--microbatches applies to pipeline runs (pp, or 3d with pp > 1)")
    for fault in c.inject:
        _validate_fault(c, fault)


def _validate_pipeline(c: TrainConfig) -> None:
    m = c.n_microbatches
    if m < 1:
        raise ConfigError("--microbatches must be at least 1")
    if c.local_batch % m:
        raise ConfigError(
            f"{c.local_batch} sequences per data-parallel rank cannot be split into {m} microbatches; "
            "change --global-batch or --microbatches"
        )
    if c.schedule == "1f1b" and m < c.num_stages:
        raise ConfigError(
            f"the 1F1B schedule needs at least as many microbatches as stages ({c.num_stages}), got {m}; "
            "use --schedule gpipe to run fewer"
        )
    if c.schedule == "interleaved1f1b":
        rounds = max(1, m // c.dims.pp)
        if m % rounds:
            raise ConfigError(f"Interleaved 1F1B needs microbatches ({m}) to be a multiple of {rounds}")
    layers = c.stage_layers()
    if min(layers) < 1:
        raise ConfigError(
            f"{c.n_layers} layers cannot fill {c.num_stages} pipeline stages ({layers}); raise --layers"
        )


def _validate_fault(c: TrainConfig, fault: FaultSpec) -> None:
    """Check a parsed fault against the run it is injected into."""
    where = f"--inject {fault.text}"
    if fault.rank is not None and not 0 <= fault.rank < c.nproc:
        raise ConfigError(f"{where}: rank {fault.rank} is outside 0..{c.nproc - 1}")
    if fault.kind in ("hang", "stuck", "crash") and not 1 <= fault.step <= c.steps:
        raise ConfigError(f"{where}: step {fault.step} is outside 1..{c.steps}")
    if fault.kind in ("pp_imbalance", "few_microbatches") and c.dims.pp < 2:
        raise ConfigError(f"{where}: needs a pipeline (--strategy pp, or 3d with pp > 1)")
    if fault.kind == "pp_imbalance" and not 0 <= int(fault.params["stage"]) < c.num_stages:
        raise ConfigError(f"{where}: stage is outside 0..{c.num_stages - 1}")
    if fault.kind == "few_microbatches" and int(fault.params["microbatches"]) >= c.num_stages:
        raise ConfigError(
            f"{where}: {fault.params['microbatches']} microbatches is not fewer than the "
            f"{c.num_stages} stages"
        )
