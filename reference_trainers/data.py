"""Synthetic token batches from a seeded generator: no downloads, identical on every launch.

Each sequence is an arithmetic progression modulo the vocabulary with a random start and a
random stride from a small set, so a small model can learn it and the loss visibly falls.
"""

from __future__ import annotations

import torch

_STRIDES = 7  # distinct strides: enough variety that the model must read the context


def global_batch(step: int, micro: int, batch: int, seq_len: int, vocab: int, seed: int) -> torch.Tensor:
    """The whole micro-batch of ``batch`` sequences (``seq_len + 1`` tokens) for one micro-step."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + micro)
    start = torch.randint(0, vocab, (batch, 1), generator=g)
    stride = torch.randint(1, _STRIDES + 1, (batch, 1), generator=g)
    return (start + stride * torch.arange(seq_len + 1)) % vocab


def local_batch(
    step: int, micro: int, *, dp_rank: int, dp_size: int, batch: int, seq_len: int, vocab: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """This data-parallel rank's slice of the global batch, as (inputs, next-token targets)."""
    tokens = global_batch(step, micro, batch, seq_len, vocab, seed).chunk(dp_size)[dp_rank]
    return tokens[:, :-1], tokens[:, 1:]
