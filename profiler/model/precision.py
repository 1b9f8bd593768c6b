"""Bytes per parameter: what each part of the model state costs in a precision, and what ZeRO shards.

ZeRO-1 shards the optimizer states (and fp32 master weights) over the data-parallel ranks, ZeRO-2
the gradients too, ZeRO-3 (FSDP) the weights too.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter of each part of the model state, and per activation element."""

    name: str
    weight: int  # the weights the model computes with
    grad: int
    master: int  # the optimizer's fp32 copy of bf16 weights (0 when the weights are fp32)
    optimizer: int  # Adam's two moments
    hidden: int  # the residual stream between layers: what a pipeline sends, what backward reduces
    matmul: int  # matmul outputs: what a forward tensor-parallel all-reduce sums

    @property
    def state_bytes(self) -> int:
        """Model-state bytes per parameter (16 for mixed-precision Adam and for fp32 Adam)."""
        return self.weight + self.grad + self.master + self.optimizer


# bf16 weights and grads, fp32 master weights and Adam moments: 2 + 2 + 4 + 4 + 4.
MIXED_BF16 = Precision("bf16 mixed precision", 2, 2, 4, 8, 2, 2)
# fp32 weights, grads and Adam moments: 4 + 4 + 8, everything computed in fp32.
FP32 = Precision("fp32", 4, 4, 0, 8, 4, 4)
# fp32 weights under torch.autocast(bf16): matmuls run and return bf16, the residual stream stays fp32.
FP32_AUTOCAST_BF16 = Precision("fp32 weights, bf16 autocast", 4, 4, 0, 8, 4, 2)
PRECISIONS = {"bf16": MIXED_BF16, "fp32": FP32, "autocast": FP32_AUTOCAST_BF16}
# A run that does not say how it trains: AdamW in fp32, 4 bytes each for the weight, its gradient and
# the two moments (16 per parameter, as mixed precision's 2 + 2 + 4 master + 8 comes to as well).
ASSUMED = FP32


def model_state(local: float, shard: float, zero: int, precision: Precision) -> dict[str, float]:
    """Weights, gradients, master weights and optimizer states in bytes, of ``local`` parameters of which
    ZeRO stage ``zero`` leaves a rank ``shard``."""
    return {"weights": (shard if zero >= 3 else local) * precision.weight,
            "grads": (shard if zero >= 2 else local) * precision.grad,
            "master": (shard if zero >= 1 else local) * precision.master,
            "optimizer": (shard if zero >= 1 else local) * precision.optimizer}


def bytes_per_parameter(precision: Precision = ASSUMED, zero: int = 0, shards: int = 1) -> float:
    """Model-state bytes a rank keeps per parameter of what it computes with, when ZeRO stage ``zero``
    shards over ``shards`` ranks; ``precision.state_bytes`` (an int) unsharded: 16 by default."""
    if zero == 0 or shards == 1:
        return precision.state_bytes
    return sum(model_state(1.0, 1.0 / shards, zero, precision).values())
