"""How a model is spread over GPUs: the dp x tp x pp mesh, the ZeRO stage, the batch split, the schedule.

The mesh is ordered pp, dp, tp with tp innermost (as torchtitan's and Megatron's default order):
a tensor-parallel group is consecutive ranks inside one node, pipeline stages are farthest apart.
"""

from __future__ import annotations

from dataclasses import dataclass

ZERO_NAMES = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3/FSDP"}


@dataclass(frozen=True)
class Layout:
    """One way to train: parallel degrees, what ZeRO shards, and how each step's batch is cut.

    A step is ``grad_accum`` passes; each pass pushes ``microbatches`` microbatches of
    ``micro_batch`` sequences through the pipeline (1 without a pipeline) on every data-parallel rank.
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 0  # 0: replicated (DDP); 1: optimizer states sharded; 2: and gradients; 3: and weights (FSDP)
    micro_batch: int = 1
    microbatches: int = 1
    grad_accum: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1  # pipeline stages per rank (interleaved schedules)
    activation_checkpointing: bool = False
    reshard_after_forward: bool = True  # ZeRO-3: free gathered weights after forward, gather again in backward

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def stages(self) -> int:
        return self.pp * self.virtual_stages

    @property
    def sequences_per_step(self) -> int:
        """The global batch: sequences every optimizer step consumes over all replicas."""
        return self.dp * self.micro_batch * self.microbatches * self.grad_accum

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(pp, dp, tp) coordinates of ``rank`` in the mesh."""
        return rank // (self.dp * self.tp), rank // self.tp % self.dp, rank % self.tp

    def name(self) -> str:
        """'TP-8 x DP-4, ZeRO-1' style: the dimensions in use, then the sharding."""
        dims = [f"{k}-{v}" for k, v in (("TP", self.tp), ("PP", self.pp)) if v > 1]
        if self.dp > 1 or not dims:
            dims.append(f"DP-{self.dp}")
        text = " x ".join(dims)
        if self.dp > 1:
            text += f", {ZERO_NAMES[self.zero]}" if self.zero else ", replicated (DDP)"
        return text


@dataclass(frozen=True)
class Implementation:
    """Where frameworks differ in what they send: the textbook (Megatron, ZeRO) by default."""

    # Backward all-reduces per column-parallel boundary: 1 when one input feeds q, k and v together
    # (Megatron's fused QKV, torchtitan's PrepareModuleInput); per linear when each converts its own
    # input (a ColwiseParallel plan applied to wq, wk, wv separately).
    tp_backward_reduces_per_layer: int = 2
    # gloo has no reduce-scatter: FSDP's reduce-scatter runs as an all-reduce of the whole gradient.
    reduce_scatter_as_all_reduce: bool = False
    ddp_first_bucket_bytes: int = 1 << 20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
    ddp_bucket_bytes: int = 25 << 20  # DistributedDataParallel's bucket_cap_mb default
    # DDP copies the gradients into its buckets (torch's default, gradient_as_bucket_view=False).
    ddp_bucket_copy: bool = True
    # FSDP units: one per transformer layer plus the root (embeddings, final norm, output).
    fsdp_per_layer: bool = True


TEXTBOOK = Implementation()
# diagtrain's reference trainers: their TP plan converts the input of each of wq, wk, wv and w1 on its own.
REFERENCE_TP_BACKWARD_REDUCES = 4
