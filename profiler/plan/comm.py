"""Communication per step: every collective a rank takes part in, its size, its link and its ring time.

Each call's time is the shared cost model's (diagtrain.profiler.model.collectives: nccl-tests'
bus-bandwidth factors at the bus bandwidth of the slowest link the call crosses; latency not modeled).

Who sends what, per step:
- data parallel: DDP all-reduces the gradients once per step, in buckets; ZeRO-1/2 reduce-scatter
  them and all-gather the updated weights; ZeRO-3/FSDP all-gathers each unit's weights before its
  forward and again before its backward (unless it keeps them), for every microbatch, and
  reduce-scatters its gradients once per step.
- tensor parallel (Megatron): per layer and microbatch two all-reduces of the layer's output in
  forward (attention and MLP) and one per column-parallel input in backward; checkpointing repeats
  the forward ones.
- pipeline parallel: per microbatch, each stage sends its activations forward and receives their
  gradients back.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from diagtrain.profiler.model.collectives import ALL_GATHER, ALL_REDUCE, RECV, REDUCE_SCATTER, SEND, bus_bytes, ring_time
from diagtrain.profiler.model.precision import Precision
from diagtrain.profiler.plan.hardware import NVLINK, Cluster
from diagtrain.profiler.plan.layout import TEXTBOOK, Implementation, Layout
from diagtrain.profiler.plan.memory import chunk, rank_stages, stage_layers, stage_tensors, tp_local_shape
from diagtrain.profiler.plan.model import Transformer

DP, TP, PP = "dp", "tp", "pp"


@dataclass(frozen=True)
class Collective:
    """Calls per step of one collective of one size in one group, from one rank's side.

    ``bytes`` is what each rank passes in: the whole tensor for an all-reduce and a reduce-scatter,
    its own shard for an all-gather, the tensor sent or received for point-to-point.
    """

    group: str  # dp | tp | pp
    op: str
    bytes: float
    calls: float
    group_size: int
    link: str = NVLINK
    purpose: str = ""

    @property
    def bus_bytes(self) -> float:
        """The nccl-tests buffer size S: the gathered output for an all-gather, else the input."""
        return bus_bytes(self.op, self.bytes, self.group_size)

    def seconds_per_call(self, bandwidth: float) -> float:
        """One call's ring time at bus bandwidth ``bandwidth`` (bytes/s)."""
        return ring_time(self.op, self.bus_bytes, self.group_size, bandwidth)

    def seconds(self, bandwidth: float) -> float:
        """All calls of one step."""
        return self.calls * self.seconds_per_call(bandwidth)


def collectives(model: Transformer, layout: Layout, precision: Precision, rank: int, cluster: Cluster | None = None,
                impl: Implementation = TEXTBOOK, layers_per_stage: list[int] | None = None) -> list[Collective]:
    """Every collective ``rank`` runs in one optimizer step."""
    links = _links(layout, cluster)
    out = _data_parallel(model, layout, precision, rank, impl, layers_per_stage, links[DP])
    out += _tensor_parallel(model, layout, precision, rank, impl, layers_per_stage, links[TP])
    out += _pipeline(model, layout, precision, rank, links[PP])
    return [c for c in out if c.calls > 0 and c.bytes > 0]


def _links(layout: Layout, cluster: Cluster | None) -> dict[str, str]:
    if cluster is None:
        return {DP: NVLINK, TP: NVLINK, PP: NVLINK}
    return {TP: cluster.link(layout.tp, 1), DP: cluster.link(layout.dp, layout.tp),
            PP: cluster.link(2, layout.dp * layout.tp)}


@lru_cache(maxsize=4096)
def _units(model: Transformer, tp: int, pp: int, virtual_stages: int, pp_rank: int, tp_rank: int,
           counts: tuple[int, ...]) -> tuple[tuple[str, tuple], ...]:
    """The rank's FSDP units in registration order (each stage's root first), with their TP-local shapes."""
    layout = Layout(tp=tp, pp=pp, virtual_stages=virtual_stages)
    units: dict[str, list] = {}
    for stage in rank_stages(layout, pp_rank):
        root = f"root{stage}"
        units.setdefault(root, [])
        for t in stage_tensors(model, layout, stage, list(counts)):
            key = f"layers.{t.layer}" if t.layer is not None else root
            units.setdefault(key, []).append(tp_local_shape(t, tp, tp_rank))
    return tuple((k, tuple(v)) for k, v in units.items() if v)


def _rest(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape[1:]:
        n *= d
    return n


@lru_cache(maxsize=8192)
def _unit_sizes(model: Transformer, tp: int, pp: int, virtual_stages: int, pp_rank: int, tp_rank: int,
                counts: tuple[int, ...], dp: int) -> tuple[tuple[float, float, int], ...]:
    """The rank's FSDP units by size: (elements a unit holds after TP, elements of its ZeRO shard with
    every tensor's dim 0 padded to a multiple of dp as FSDP pads it, how many units have that size)."""
    sizes: dict[tuple[float, float], int] = {}
    for _, shapes in _units(model, tp, pp, virtual_stages, pp_rank, tp_rank, counts):
        key = (sum(s[0] * _rest(s) for s in shapes) * model.scale,
               sum(chunk(s[0], dp, 0) * _rest(s) for s in shapes) * model.scale)
        sizes[key] = sizes.get(key, 0) + 1
    return tuple((local, shard, n) for (local, shard), n in sizes.items())


@lru_cache(maxsize=8192)
def _ddp_buckets(model: Transformer, tp: int, pp: int, virtual_stages: int, pp_rank: int, tp_rank: int,
                 counts: tuple[int, ...], grad_bytes: int, first_cap: int, cap: int) -> tuple[float, ...]:
    """DDP's gradient buckets in bytes: tensors in reverse registration order (the order gradients
    become ready), a bucket closed once it reaches its cap: 1 MiB for the first, 25 MiB after."""
    layout = Layout(tp=tp, pp=pp, virtual_stages=virtual_stages)
    shapes = [tp_local_shape(t, tp, tp_rank) for stage in rank_stages(layout, pp_rank)
              for t in stage_tensors(model, layout, stage, list(counts))]
    buckets, current, limit = [], 0.0, first_cap
    for shape in reversed(shapes):
        current += shape[0] * _rest(shape) * model.scale * grad_bytes
        if current >= limit:
            buckets.append(current)
            current, limit = 0.0, cap
    if current:
        buckets.append(current)
    return tuple(buckets)


def _data_parallel(model, layout, precision, rank, impl, layers_per_stage, link) -> list[Collective]:
    if layout.dp == 1:
        return []
    pp_rank, _, tp_rank = layout.coords(rank)
    key = (model, layout.tp, layout.pp, layout.virtual_stages, pp_rank, tp_rank,
           tuple(layers_per_stage or stage_layers(model.layers, layout.stages)))
    n = layout.dp
    # Gradients are synced once per step; a pipeline syncs them at the end of every pass
    # (torch.distributed.pipelining turns the sync back on for each schedule step).
    syncs = layout.grad_accum if layout.pp > 1 else 1
    if layout.zero == 0:
        buckets = _ddp_buckets(*key, precision.grad, impl.ddp_first_bucket_bytes, impl.ddp_bucket_bytes)
        return _merge([Collective(DP, ALL_REDUCE, b, syncs, n, link, "gradients") for b in buckets])
    if layout.zero in (1, 2):
        local = sum(local * units for local, _, units in _unit_sizes(*key, n))
        return [Collective(DP, REDUCE_SCATTER, local * precision.grad, syncs, n, link, "gradients"),
                Collective(DP, ALL_GATHER, -(-local // n) * precision.weight, 1, n, link, "updated weights")]
    gathers = layout.grad_accum * _gathers_per_pass(layout)
    reduce_op = ALL_REDUCE if impl.reduce_scatter_as_all_reduce else REDUCE_SCATTER
    out = []
    for _, shard, units in _unit_sizes(*key, n):
        out.append(Collective(DP, ALL_GATHER, shard * precision.weight, gathers * units, n, link,
                              "weights, per microbatch"))
        out.append(Collective(DP, reduce_op, shard * n * precision.grad, syncs * units, n, link, "gradients"))
    return _merge(out)


def _gathers_per_pass(layout: Layout) -> int:
    """ZeRO-3 all-gathers of one unit per pass. Without a pipeline: one for forward, one for backward
    (one only when weights stay gathered after forward). In a pipeline, weights stay gathered from a
    backward to the next forward and through the backwards (torch.distributed.pipelining keeps them;
    so does any schedule that avoids re-gathering): an action gathers only after a forward freed them,
    which makes m + 1 per pass of m microbatches (1 when weights stay gathered after forward too)."""
    if not layout.reshard_after_forward:
        return 1
    return layout.microbatches + 1 if layout.pp > 1 else 2


def _tensor_parallel(model, layout, precision, rank, impl, layers_per_stage, link) -> list[Collective]:
    if layout.tp == 1:
        return []
    pp_rank = layout.coords(rank)[0]
    counts = layers_per_stage or stage_layers(model.layers, layout.stages)
    stages = rank_stages(layout, pp_rank)
    layers = sum(counts[s] for s in stages)
    passes = layout.grad_accum * layout.microbatches
    tokens = layout.micro_batch * model.seq_len
    n = layout.tp
    forward = 2 * layers * (2 if layout.activation_checkpointing else 1)
    out = [Collective(TP, ALL_REDUCE, tokens * model.hidden * precision.matmul, forward * passes, n, link,
                      "layer outputs (forward)"),
           Collective(TP, ALL_REDUCE, tokens * model.hidden * precision.hidden,
                      impl.tp_backward_reduces_per_layer * layers * passes, n, link, "input gradients (backward)")]
    if model.vocab_parallel:  # vocabulary-parallel embedding (forward) and output layer (backward)
        ends = (0 in stages) + (layout.stages - 1 in stages)
        out.append(Collective(TP, ALL_REDUCE, tokens * model.hidden * precision.hidden, ends * passes, n, link,
                              "embedding and output layer"))
    return _merge(out)


def _pipeline(model, layout, precision, rank, link) -> list[Collective]:
    if layout.pp == 1:
        return []
    stages = rank_stages(layout, layout.coords(rank)[0])
    boundaries = sum(s < layout.stages - 1 for s in stages) + sum(s > 0 for s in stages)
    size = layout.micro_batch * model.seq_len * model.hidden * precision.hidden
    calls = boundaries * layout.grad_accum * layout.microbatches
    return [Collective(PP, SEND, size, calls, 2, link, "activations forward, gradients back"),
            Collective(PP, RECV, size, calls, 2, link, "activations forward, gradients back")]


def _merge(items: list[Collective]) -> list[Collective]:
    """One record per (group, op, size, purpose), calls added up."""
    merged: dict[tuple, Collective] = {}
    for c in items:
        key = (c.group, c.op, round(c.bytes, 3), c.purpose)
        prev = merged.get(key)
        merged[key] = c if prev is None else Collective(c.group, c.op, c.bytes, prev.calls + c.calls, c.group_size,
                                                        c.link, c.purpose)
    return list(merged.values())
