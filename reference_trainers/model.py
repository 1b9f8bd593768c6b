"""A small decoder-only transformer, written so that every strategy can cut it.

Layers live in a ``ModuleDict`` keyed by their global index, and the embedding, final norm and
output may be ``None``: a pipeline stage is this same model with the parts it does not own
removed, so parameter names stay the same on every stage (as in torchtitan).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class ModelArgs:
    """Shape of the transformer."""

    vocab: int = 256
    dim: int = 64
    heads: int = 4
    layers: int = 4
    seq_len: int = 32

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


class Attention(nn.Module):
    """Causal multi-head self-attention; under TP each rank holds a slice of the heads."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.head_dim = args.head_dim
        self.wq = nn.Linear(args.dim, args.dim, bias=False)
        self.wk = nn.Linear(args.dim, args.dim, bias=False)
        self.wv = nn.Linear(args.dim, args.dim, bias=False)
        self.wo = nn.Linear(args.dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: the local head count, which is heads / tp once wq..wv are column-sharded.
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """Two-layer GELU MLP, four times the model width."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.w1 = nn.Linear(args.dim, 4 * args.dim, bias=False)
        self.w2 = nn.Linear(4 * args.dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(args.dim)
        self.attention = Attention(args)
        self.ffn_norm = nn.LayerNorm(args.dim)
        self.feed_forward = FeedForward(args)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    """Token ids in, logits out; a pipeline stage takes or returns hidden states instead."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings: nn.Module | None = nn.Embedding(args.vocab, args.dim)
        # Learned positions rather than a rotary buffer: DDP would broadcast a buffer every step.
        self.pos_embeddings: nn.Module | None = nn.Embedding(args.seq_len, args.dim)
        self.layers = nn.ModuleDict({str(i): Block(args) for i in range(args.layers)})
        self.norm: nn.Module | None = nn.LayerNorm(args.dim)
        self.output: nn.Module | None = nn.Linear(args.dim, args.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok_embeddings is not None:
            positions = torch.arange(x.shape[1], device=x.device)
            x = self.tok_embeddings(x) + self.pos_embeddings(positions)
        for layer in self.layers.values():
            x = layer(x)
        if self.norm is not None:
            x = self.norm(x)
        if self.output is not None:
            x = self.output(x)
        return x

    def keep_only(self, layer_ids: list[int], *, first: bool, last: bool) -> "Transformer":
        """Turn this model into a pipeline stage holding ``layer_ids`` (and the ends it owns)."""
        for key in list(self.layers.keys()):
            if int(key) not in layer_ids:
                del self.layers[key]
        if not first:
            self.tok_embeddings = self.pos_embeddings = None
        if not last:
            self.norm = self.output = None
        return self


def build_model(args: ModelArgs, seed: int) -> Transformer:
    """The full model, initialized identically on every rank from ``seed``."""
    torch.manual_seed(seed)
    return Transformer(args)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))
