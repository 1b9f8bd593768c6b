"""The training loop every strategy shares, instrumented with diagtrain's StepRecorder."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist

from diagtrain.profiler.rank.instrument import StepRecorder
from diagtrain.profiler.run_dir import RUN_DIR_ENV, WRAPPER_PID_ENV, default_run_dir, rank_dir, write_json_atomic
from diagtrain.profiler.util.exit_codes import EXIT_OK, EXIT_USAGE
from diagtrain.profiler.util.step_ranges import parse_step_ranges
from diagtrain.reference_trainers import checkpoint
from diagtrain.reference_trainers.config import ConfigError, TrainConfig, add_train_arguments, config_from_args
from diagtrain.reference_trainers.data import local_batch
from diagtrain.reference_trainers.faults import FaultInjector
from diagtrain.reference_trainers.model import loss_fn
from diagtrain.reference_trainers.parallelize import Parallelized, init_distributed, parallelize, unwrap


def main(argv: list[str] | None = None) -> int:
    """Run one rank: parse and validate arguments, train, write the rank's files."""
    parser = argparse.ArgumentParser(
        prog="python -m diagtrain.reference_trainers",
        description="One rank of a reference trainer; start it with torchrun or `diagtrain train`.",
    )
    add_train_arguments(parser, with_nproc=False)
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args, nproc=int(os.environ.get("WORLD_SIZE", "1")))
    except ConfigError as e:
        print(f"diagtrain train: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    train(config)
    return EXIT_OK


def train(config: TrainConfig) -> None:
    """Train for ``config.steps`` optimizer steps on this rank."""
    device, mesh = init_distributed(config)
    try:
        _train(config, device, mesh)
    finally:
        dist.destroy_process_group()


def _train(config: TrainConfig, device: torch.device, mesh) -> None:
    rank = dist.get_rank()
    out = _agree_on_run_dir(config)
    model = parallelize(config, device, mesh)
    forward_calls = config.grad_accum * (config.n_microbatches if model.schedule else 1)
    faults = FaultInjector(config.inject, rank, forward_calls_per_step=forward_calls)
    faults.hold_memory(device)
    faults.slow_forward([unwrap(p) for p in model.parts])
    faults.slow_collectives(model.parts[0] if config.strategy == "ddp" else None)
    if rank == 0:
        write_json_atomic(out / "injected.json", [f.to_json() for f in config.inject])
        write_json_atomic(out / "trainer.json", config.to_json())
    rank_dir(out, rank).mkdir(parents=True, exist_ok=True)
    write_json_atomic(rank_dir(out, rank) / "parameters.json", describe_parameters(model))

    optimizers = [torch.optim.AdamW(p.parameters(), lr=config.lr) for p in model.parts]
    # Loss logging gets its own group so that a rank skipping it (the hang fault) deadlocks
    # cleanly instead of pairing the skipped all-reduce with a gradient all-reduce.
    metrics_group = dist.new_group(group_desc="metrics")
    # Without --profile-steps, the recorder takes $DIAGTRAIN_PROFILE_STEPS (set by `diagtrain run`).
    windows = parse_step_ranges(config.profile_steps) if config.profile_steps else None
    progress = _Progress(config.steps)
    with StepRecorder(out, rank=rank, profile_steps=windows, device=device) as rec:
        for step in range(1, config.steps + 1):
            faults.step = step
            loss_sum, loss_count = _train_step(config, model, device, rec, faults, step)
            with rec.phase("optimizer"):
                for opt in optimizers:
                    opt.step()
                    opt.zero_grad(set_to_none=True)
            with rec.phase("metrics"):
                loss = _global_mean(loss_sum, loss_count, device, metrics_group, skip=faults.skips_metrics_collective())
            if config.checkpoint_every and step % config.checkpoint_every == 0:
                with rec.phase("checkpoint"):
                    checkpoint.save(model.parts, optimizers, out / "checkpoints" / f"step-{step}")
            samples = config.global_batch * config.grad_accum
            rec.step(samples=samples, tokens=samples * config.seq_len, loss=loss)
            if rank == 0:
                progress.update(step, loss, rec.last_step_ms)
    if rank == 0:  # under `diagtrain run` the wrapper names the run directory
        where = "" if WRAPPER_PID_ENV in os.environ else f"; run directory {out}"
        print(f"[diagtrain] done: {config.steps} steps of {config.strategy} on {config.nproc} ranks{where}", flush=True)


def _train_step(config: TrainConfig, model: Parallelized, device: torch.device, rec: StepRecorder,
                faults: FaultInjector, step: int) -> tuple[float, int]:
    """Forward and backward over all micro-steps; returns this rank's loss sum and count."""
    loss_sum, count = 0.0, 0
    dims = config.dims
    for micro in range(config.grad_accum):
        with rec.phase("data"):
            faults.data_delay()
            x, y = local_batch(step, micro, dp_rank=model.dp_rank, dp_size=dims.dp, batch=config.global_batch,
                               seq_len=config.seq_len, vocab=config.vocab, seed=config.seed)
            x, y = x.to(device), y.to(device)
        last_micro = micro == config.grad_accum - 1
        with _grad_sync(config, model, enabled=last_micro), _autocast(config, device):
            if model.schedule is not None:
                with rec.phase("forward_backward"):
                    losses: list[torch.Tensor] = []
                    kwargs = {"target": y, "losses": losses} if model.is_last_stage else {}
                    model.schedule.step(*([x] if model.is_first_stage else []), **kwargs)
                if losses:
                    loss_sum += torch.stack(losses).float().mean().item()
                    count += 1
            else:
                with rec.phase("forward"):
                    loss = loss_fn(model.parts[0](x), y)
                with rec.phase("backward"):
                    (loss / config.grad_accum).backward()
                loss_sum += loss.item()
                count += 1
    return loss_sum, count


@contextlib.contextmanager
def _grad_sync(config: TrainConfig, model: Parallelized, *, enabled: bool) -> Iterator[None]:
    """Skip the data-parallel gradient reduction on all but the last micro-step."""
    if enabled or config.grad_accum == 1:
        yield
    elif config.strategy == "ddp":
        with model.parts[0].no_sync():
            yield
    else:
        for part in model.parts:
            if hasattr(part, "set_requires_gradient_sync"):
                part.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            for part in model.parts:
                if hasattr(part, "set_requires_gradient_sync"):
                    part.set_requires_gradient_sync(True)


def _autocast(config: TrainConfig, device: torch.device) -> contextlib.AbstractContextManager:
    if not config.bf16:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def _global_mean(total: float, count: int, device: torch.device, group, *, skip: bool) -> float | None:
    """Mean loss over every rank that computed one (pipeline: the last stages only)."""
    t = torch.tensor([total, float(count)], dtype=torch.float64, device=device)
    if not skip:
        dist.all_reduce(t, group=group)
    return (t[0] / t[1]).item() if t[1] > 0 else None


class _Progress:
    """Rank 0's log line about every tenth of the run: step, loss, and the mean step time since the
    last line, as steps.jsonl records it; time spent between steps (writing a profiled window's
    trace) is named apart, never counted into the steps."""

    LINES_PER_RUN = 10  # enough to see the loss fall, few enough to read
    SHOWN_GAP_MS = 100.0  # time outside steps worth naming: a trace export takes seconds, the loop's bookkeeping < 1 ms

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.every = max(1, steps // self.LINES_PER_RUN)
        self.last_time, self.last_step = time.perf_counter(), 0
        self.step_ms: list[float] = []  # the recorded durations of the steps since the last line

    def update(self, step: int, loss: float | None, step_ms: float | None) -> None:
        """After step ``step``; ``step_ms`` is its duration_ms in steps.jsonl (None when not recorded)."""
        if step_ms is not None:
            self.step_ms.append(step_ms)
        if step % self.every and step != self.steps:
            return
        print(f"[diagtrain] step {step}/{self.steps}  loss {_loss_text(loss)}  {self._timing(step)}", flush=True)
        self.last_time, self.last_step, self.step_ms = time.perf_counter(), step, []

    def _timing(self, step: int) -> str:
        count = step - self.last_step
        steps = f"step {step}" if count == 1 else f"steps {self.last_step + 1}-{step}"
        wall_ms = (time.perf_counter() - self.last_time) * 1e3
        if len(self.step_ms) != count:  # steps not recorded (no run directory): the wall clock is all there is
            return f"{wall_ms / count:.0f} ms/step (wall time, {steps})"
        text = f"{sum(self.step_ms) / count:.0f} ms/step ({steps}, as in steps.jsonl)"
        outside_ms = wall_ms - sum(self.step_ms)
        if outside_ms >= self.SHOWN_GAP_MS:
            text += f"; +{outside_ms / 1e3:.1f} s outside steps (profiler trace export), not counted"
        return text


def _loss_text(loss: float | None) -> str:
    return f"{loss:.4f}" if loss is not None else "n/a"


def _agree_on_run_dir(config: TrainConfig) -> Path:
    """The run directory: --out, else $DIAGTRAIN_RUN_DIR, else one rank 0 picks for all."""
    chosen = [config.out or os.environ.get(RUN_DIR_ENV) or str(default_run_dir(config.strategy))]
    dist.broadcast_object_list(chosen, src=0)
    out = Path(chosen[0]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    return out


def describe_parameters(model: Parallelized) -> dict:
    """What this rank holds: each parameter's global and local shape, and how it is sharded."""
    from torch.distributed.tensor import DTensor

    params = []
    for stage, part in zip(model.stage_ids, model.parts):
        for name, p in unwrap(part).named_parameters():
            is_dtensor = isinstance(p, DTensor)
            local = p.to_local() if is_dtensor else p
            params.append({
                "name": name,
                "stage": stage,
                "dtype": str(p.dtype).removeprefix("torch."),
                "shape": list(p.shape),
                "local_shape": list(local.shape),
                "local_numel": local.numel(),
                "dtensor": is_dtensor,
                "placements": [str(pl) for pl in p.placements] if is_dtensor else None,
                "mesh_dims": list(p.device_mesh.mesh_dim_names or ()) if is_dtensor else None,
            })
    return {"rank": dist.get_rank(), "stages": model.stage_ids, "parameters": params}
