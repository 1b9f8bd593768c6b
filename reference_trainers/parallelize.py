"""Turn the model into what each strategy runs: DDP, FSDP2, DTensor TP, pipeline stages, or 3D.

Every strategy is a point of one pp × dp × tp layout, so one path builds them all, in the order
torchtitan uses: cut pipeline stages, then per stage TP, activation checkpointing, data parallel.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from diagtrain.reference_trainers.config import TrainConfig
from diagtrain.reference_trainers.model import ModelArgs, build_model, loss_fn

MESH_DIMS = ("pp", "dp", "tp")


@dataclass
class Parallelized:
    """The model parts this rank runs, and how to drive them."""

    parts: list[nn.Module]  # one, or several pipeline stages under an interleaved schedule
    stage_ids: list[int]  # pipeline stage index of each part ([0] without a pipeline)
    mesh: DeviceMesh
    schedule: Any | None = None  # pipeline schedule; None when forward/backward run directly
    is_first_stage: bool = True
    is_last_stage: bool = True

    @property
    def dp_rank(self) -> int:
        return self.mesh["dp"].get_local_rank()


def init_distributed(config: TrainConfig) -> tuple[torch.device, DeviceMesh]:
    """Start the process group (cuda+nccl when a GPU is there, cpu+gloo otherwise) and the mesh."""
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=config.pg_timeout))
    dims = config.dims
    mesh = init_device_mesh(device.type, (dims.pp, dims.dp, dims.tp), mesh_dim_names=MESH_DIMS)
    return device, mesh


def model_args(config: TrainConfig) -> ModelArgs:
    """The transformer shape for this run."""
    return ModelArgs(config.vocab, config.dim, config.heads, config.n_layers, config.seq_len)


def parallelize(config: TrainConfig, device: torch.device, mesh: DeviceMesh) -> Parallelized:
    """Build this rank's model parts with the run's strategy applied."""
    dims = config.dims
    stage_ids = [mesh["pp"].get_local_rank() + i * dims.pp for i in range(config.stages_per_rank)]
    parts = [_build_stage(config, s) if dims.pp > 1 else build_model(model_args(config), config.seed)
             for s in stage_ids]
    parts = [_apply_parallelism(config, part.to(device), mesh, device) for part in parts]
    result = Parallelized(parts, stage_ids, mesh)
    if dims.pp > 1:
        result.schedule = _build_schedule(config, parts, stage_ids, mesh, device)
        result.is_first_stage = 0 in stage_ids
        result.is_last_stage = config.num_stages - 1 in stage_ids
    return result


def _build_stage(config: TrainConfig, stage: int) -> nn.Module:
    counts = config.stage_layers()
    first_layer = sum(counts[:stage])
    layer_ids = list(range(first_layer, first_layer + counts[stage]))
    # The whole model is built on every stage so each layer gets the same init as in the
    # unpipelined model for one seed; the stage then drops what it does not own.
    model = build_model(model_args(config), config.seed)
    return model.keep_only(layer_ids, first=stage == 0, last=stage == config.num_stages - 1)


def _apply_parallelism(config: TrainConfig, model: nn.Module, mesh: DeviceMesh, device: torch.device) -> nn.Module:
    dims = config.dims
    if dims.tp > 1:
        apply_tp(model, mesh["tp"])
    if config.activation_checkpoint:
        apply_activation_checkpointing(model)
    if config.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(
            model,
            process_group=mesh["dp"].get_group(),
            device_ids=[device.index] if device.type == "cuda" else None,
        )
    if config.strategy == "fsdp" or (config.strategy == "3d" and dims.dp > 1):
        apply_fsdp(model, mesh["dp"], reshard_after_forward=config.fsdp_reshard_after_forward)
    return model


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Megatron-style TP: q, k, v and w1 split by columns, wo and w2 by rows (one all-reduce each)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(),
    }
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, plan)


def apply_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each block in backward instead of keeping its activations."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for key, block in list(model.layers.items()):
        model.layers[key] = checkpoint_wrapper(block)


def apply_fsdp(model: nn.Module, dp_mesh: DeviceMesh, *, reshard_after_forward: bool) -> None:
    """FSDP2: one ``fully_shard`` per block and one at the root (ZeRO-3, or ZeRO-2-like)."""
    from torch.distributed.fsdp import fully_shard

    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)


def _build_schedule(
    config: TrainConfig, parts: list[nn.Module], stage_ids: list[int], mesh: DeviceMesh, device: torch.device
) -> Any:
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    group = mesh["pp"].get_group()
    stages = [PipelineStage(part, s, config.num_stages, device, group=group) for part, s in zip(parts, stage_ids)]
    m = config.n_microbatches
    if config.schedule == "interleaved1f1b":
        return ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=loss_fn)
    cls = ScheduleGPipe if config.schedule == "gpipe" else Schedule1F1B
    return cls(stages[0], n_microbatches=m, loss_fn=loss_fn)


def unwrap(part: nn.Module) -> nn.Module:
    """The model inside a DDP wrapper (FSDP2 and TP modify the module in place)."""
    return getattr(part, "module", part)
