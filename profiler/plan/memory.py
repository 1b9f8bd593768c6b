"""Memory per GPU, by part: the model state each layout leaves on a rank, activations, and what ZeRO-3 gathers.

Model state is counted tensor by tensor, cut the way the frameworks cut it (tensor parallelism on
the dimension its style names, ZeRO-3/FSDP in ``torch.chunk`` pieces along dim 0 of what TP left),
so a reference-trainer run's parameters.json can be checked against it to the element.
Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models"), for fused attention and no dropout; see ``activation_elements``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from diagtrain.profiler.model import precision as state
from diagtrain.profiler.model.pipeline import in_flight
from diagtrain.profiler.model.precision import Precision
from diagtrain.profiler.plan.layout import Layout
from diagtrain.profiler.plan.model import COL, ROW, VOCAB, Tensor, Transformer

# Part of the device's memory kept free for what the model does not count: the CUDA context,
# NCCL's buffers, the allocator's fragmentation and workspace (cuBLAS, attention). PyTorch runs
# commonly lose 5-15% of a GPU this way; the planner budgets 10%.
RESERVED_FRACTION = 0.10
LOSS_UPCAST_BYTES = 4  # the loss computes in fp32: the logits are copied to fp32 once
GATHERED_UNITS = 2  # ZeRO-3 holds the unit it computes and the one it prefetches
# torch's foreach AdamW allocates two fp32 temporaries the size of what it updates (the denominator
# and the update) while it steps; the step runs after backward has freed the activations.
OPTIMIZER_TEMP_BYTES = 8


def chunk(n: int, k: int, i: int) -> int:
    """Length of piece ``i`` when ``torch.chunk`` cuts ``n`` into ``k``: ceil(n/k), the tail shorter or empty."""
    size = -(-n // k)
    return max(0, min(size, n - i * size))


def stage_layers(layers: int, stages: int) -> list[int]:
    """Layers per pipeline stage, split as evenly as possible, the first stages taking the remainder."""
    return [layers // stages + (1 if s < layers % stages else 0) for s in range(stages)]


@dataclass
class Held:
    """What one rank holds of the model: after tensor and pipeline parallelism (``local``) and after
    ZeRO's data-parallel sharding (``shard``), in parameters, and its FSDP units (one per layer plus
    the root's embeddings, final norm and output)."""

    local: float = 0.0
    shard: float = 0.0
    units: dict[str, float] = field(default_factory=dict)  # unit -> local parameters

    @property
    def largest_unit(self) -> float:
        return max(self.units.values(), default=0.0)


def rank_stages(layout: Layout, pp_rank: int) -> list[int]:
    """The pipeline stages a rank at pipeline position ``pp_rank`` runs (several when interleaved)."""
    return [pp_rank + k * layout.pp for k in range(layout.virtual_stages)]


def stage_tensors(model: Transformer, layout: Layout, stage: int, layers_per_stage: list[int] | None = None) -> tuple[Tensor, ...]:
    """The tensors pipeline stage ``stage`` owns: its layers, plus the embeddings on the first stage and
    the final norm and output on the last (all of them without a pipeline)."""
    counts = tuple(layers_per_stage or stage_layers(model.layers, layout.stages))
    return _stage_tensors(model, len(counts), stage, counts)


@lru_cache(maxsize=4096)
def _stage_tensors(model: Transformer, stages: int, stage: int, counts: tuple[int, ...]) -> tuple[Tensor, ...]:
    first = sum(counts[:stage])
    mine = range(first, first + counts[stage])
    return tuple(t for t in model.tensors()
                 if (t.layer is not None and t.layer in mine)
                 or (t.layer is None and (stage == 0 if t.name.endswith("embeddings.weight") else stage == stages - 1)))


def tp_local_shape(t: Tensor, tp: int, tp_rank: int) -> tuple[int, ...]:
    """The shape of ``t`` a tensor-parallel rank holds."""
    if tp == 1 or len(t.shape) < 2:
        return t.shape
    if t.tp in (COL, VOCAB):
        return (chunk(t.shape[0], tp, tp_rank), *t.shape[1:])
    if t.tp == ROW:
        return (t.shape[0], chunk(t.shape[1], tp, tp_rank), *t.shape[2:])
    return t.shape


def held(model: Transformer, layout: Layout, rank: int, layers_per_stage: list[int] | None = None) -> Held:
    """Parameters ``rank`` holds, before and after ZeRO's sharding over its data-parallel group."""
    counts = tuple(layers_per_stage or stage_layers(model.layers, layout.stages))
    shape = Layout(dp=layout.dp, tp=layout.tp, pp=layout.pp, virtual_stages=layout.virtual_stages)
    return _held(model, shape, rank, counts)


@lru_cache(maxsize=4096)
def _held(model: Transformer, layout: Layout, rank: int, counts: tuple[int, ...]) -> Held:
    pp_rank, dp_rank, tp_rank = layout.coords(rank)
    out = Held()
    for stage in rank_stages(layout, pp_rank):
        for t in stage_tensors(model, layout, stage, list(counts)):
            shape = tp_local_shape(t, layout.tp, tp_rank)
            rest = _prod(shape[1:])
            local = shape[0] * rest * model.scale
            out.local += local
            out.shard += chunk(shape[0], layout.dp, dp_rank) * rest * model.scale
            unit = f"layers.{t.layer}" if t.layer is not None else "root"
            out.units[unit] = out.units.get(unit, 0.0) + local
    return out


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@dataclass
class Memory:
    """Bytes one GPU needs, by part."""

    weights: float
    grads: float
    master: float
    optimizer: float
    gathered: float  # ZeRO-3: full weights (and the gradient) of the units being computed
    activations: float
    buffers: float = 0.0  # communication buffers that copy the gradients (DDP's buckets)
    optimizer_step: float = 0.0  # the optimizer's temporaries while it steps (after backward)

    @property
    def model_state(self) -> float:
        return self.weights + self.grads + self.master + self.optimizer

    @property
    def total(self) -> float:
        """The peak: model state and buffers, plus the larger of forward-backward's and the optimizer step's needs."""
        return self.model_state + self.buffers + max(self.gathered + self.activations, self.optimizer_step)

    def parts(self) -> dict[str, float]:
        """Every part by name, and the total."""
        return {"weights": self.weights, "grads": self.grads, "master": self.master, "optimizer": self.optimizer,
                "gathered": self.gathered, "activations": self.activations, "buffers": self.buffers,
                "optimizer_step": self.optimizer_step, "total": self.total}


def model_state(h: Held, zero: int, precision: Precision) -> dict[str, float]:
    """Weights, gradients, master weights and optimizer states of a rank, as ZeRO stage ``zero`` shards them."""
    return state.model_state(h.local, h.shard, zero, precision)


def activation_elements(model: Transformer, tp: int) -> tuple[float, float]:
    """Activation elements one layer keeps per token for backward: (replicated across TP, cut by TP).

    Replicated: the two norms' inputs and outputs (4h). Cut by TP: q, k, v, the attention output and
    the output projection's input (3h + 2 kv), and the MLP's saved tensors (gelu: its input and
    output, 2 ffn; swiglu: w1's and w3's outputs, silu's output and the product, 4 ffn). With
    Korthikanti's counting this is their 34·s·b·h bytes at 2 bytes per element, less the dropout masks.
    """
    h, f = model.hidden, model.ffn
    mlp = (2 if model.mlp == "gelu" else 4) * f
    return 4.0 * h, (3 * h + 2 * model.kv_dim + mlp) / tp


def activations(model: Transformer, layout: Layout, precision: Precision, pp_rank: int,
                layers_per_stage: list[int] | None = None) -> float:
    """Activation bytes a pipeline rank keeps at its peak: each of its layers' saved tensors for every
    microbatch in flight (1F1B: the stages still ahead; GPipe: all), or only layer inputs under
    checkpointing, plus the logits on the last stage."""
    counts = layers_per_stage or stage_layers(model.layers, layout.stages)
    stages = rank_stages(layout, pp_rank)
    layers = sum(counts[s] for s in stages)
    tokens = layout.micro_batch * model.seq_len
    replicated, cut = activation_elements(model, layout.tp)
    per_layer = tokens * (replicated * precision.hidden + cut * precision.matmul)
    in_flight = microbatches_in_flight(layout, pp_rank)
    if layout.activation_checkpointing:  # layer inputs, and one layer's tensors while it is recomputed
        kept = layers * in_flight * tokens * model.hidden * precision.hidden + per_layer
    else:
        kept = layers * in_flight * per_layer
    if layout.stages - 1 in stages:  # the logits, and their fp32 copy for the loss
        vocab = model.vocab / (layout.tp if model.vocab_parallel else 1)
        kept += tokens * vocab * (precision.matmul + LOSS_UPCAST_BYTES)
    return kept


def microbatches_in_flight(layout: Layout, pp_rank: int) -> float:
    """Microbatches whose activations a pipeline rank holds at once."""
    return in_flight(layout.pp, pp_rank, layout.microbatches, layout.schedule, layout.virtual_stages)


def rank_memory(model: Transformer, layout: Layout, precision: Precision, rank: int,
                layers_per_stage: list[int] | None = None, bucket_copy: bool = True) -> Memory:
    """Memory by part on ``rank``; ``bucket_copy``: DDP keeps its gradient buckets beside the gradients
    (torch's default; Megatron's contiguous gradient buffer does not)."""
    h = held(model, layout, rank, layers_per_stage)
    state = model_state(h, layout.zero, precision)
    gathered = 0.0
    if layout.zero >= 3 and layout.dp > 1:
        if layout.reshard_after_forward:
            gathered = GATHERED_UNITS * h.largest_unit * precision.weight + h.largest_unit * precision.grad
        else:  # the stage's weights stay gathered from forward through backward
            gathered = (h.local - h.shard) * precision.weight + h.largest_unit * precision.grad
    acts = activations(model, layout, precision, layout.coords(rank)[0], layers_per_stage)
    updated = h.shard if layout.zero >= 1 else h.local
    buffers = h.local * precision.grad if layout.zero == 0 and layout.dp > 1 and bucket_copy else 0.0
    return Memory(gathered=gathered, activations=acts, buffers=buffers, optimizer_step=updated * OPTIMIZER_TEMP_BYTES,
                  **state)
