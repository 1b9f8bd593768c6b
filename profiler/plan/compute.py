"""Compute time from FLOPs: 6 per parameter per token (forward 2, backward 4) plus attention.

Per token and layer, attention's two matmuls over the sequence (QK^T and AV) cost 4·s·h forward and
twice that backward: 12·s·h (PaLM, Chowdhery et al. 2022, appendix B). The input embedding is a
lookup and costs nothing; the output projection is a matmul like any other. Activation
checkpointing runs each layer's forward again in backward (+2 per parameter, +4·s·h).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from diagtrain.profiler.plan.layout import Layout
from diagtrain.profiler.plan.memory import rank_stages, stage_layers, stage_tensors
from diagtrain.profiler.plan.model import Transformer

# Achieved share of the GPU's dense BF16 peak (model FLOPs utilization) for a tuned dense
# transformer: PaLM reports 46%, Llama 3 38-43%, MegaScale 55%; 40% is a conservative middle.
DEFAULT_PEAK_FRACTION = 0.40
FORWARD_SHARE = 1 / 3  # forward is a third of forward + backward (2 of 6 FLOPs per parameter)


@dataclass
class StageFlops:
    """FLOPs one microbatch costs on one pipeline rank (already divided by tensor parallelism)."""

    forward: float
    backward: float
    recompute: float  # the forward run again in backward under activation checkpointing

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.recompute


@lru_cache(maxsize=64)
def flops_per_token(model: Transformer) -> float:
    """Training FLOPs per token of the whole model (6N over the matmul parameters, plus attention)."""
    matmul_params = sum(t.numel for t in model.tensors() if not t.name.endswith("embeddings.weight")) * model.scale
    return 6 * matmul_params + 12 * model.layers * model.seq_len * model.hidden


def rank_flops(model: Transformer, layout: Layout, pp_rank: int, layers_per_stage: list[int] | None = None) -> StageFlops:
    """FLOPs of one microbatch on a rank at pipeline position ``pp_rank``."""
    counts = tuple(layers_per_stage or stage_layers(model.layers, layout.stages))
    matmul, layer_params, layers = _rank_params(model, layout.pp, layout.virtual_stages, pp_rank, counts)
    tokens = layout.micro_batch * model.seq_len
    attention = 4 * model.seq_len * model.hidden * layers  # forward, per token
    forward = tokens * (2 * matmul + attention) / layout.tp
    layer_forward = tokens * (2 * layer_params + attention) / layout.tp
    return StageFlops(forward=forward, backward=2 * forward,
                      recompute=layer_forward if layout.activation_checkpointing else 0.0)


@lru_cache(maxsize=4096)
def _rank_params(model: Transformer, pp: int, virtual_stages: int, pp_rank: int,
                 counts: tuple[int, ...]) -> tuple[float, float, int]:
    """(matmul parameters, layer parameters, layers) of the stages a pipeline rank runs."""
    layout = Layout(pp=pp, virtual_stages=virtual_stages)
    matmul = layer_params = 0.0
    layers = set()
    for stage in rank_stages(layout, pp_rank):
        for t in stage_tensors(model, layout, stage, list(counts)):
            if not t.name.endswith("embeddings.weight"):
                matmul += t.numel * model.scale
            if t.layer is not None:
                layer_params += t.numel * model.scale
                layers.add(t.layer)
    return matmul, layer_params, len(layers)
