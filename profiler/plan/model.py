"""What is trained: a decoder-only transformer's shape and its parameter tensors (the precision it trains in
is the shared cost model's, diagtrain.profiler.model.precision).

The tensors are listed the way the model defines them, each with the way tensor parallelism cuts
it (Megatron: column-parallel q, k, v and the MLP's first matrix, row-parallel output projections),
so the planner can count exactly what every rank holds. A model given only by its parameter count
takes the shape of the nearest well-known model (``shape_for``), scaled to that count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

COL, ROW, VOCAB, REPLICATE = "col", "row", "vocab", "replicate"  # how TP cuts a tensor (dim 0, dim 1, vocab rows, not)


@dataclass(frozen=True)
class Tensor:
    """One parameter tensor: its name, shape, the layer it belongs to (None: embeddings, final norm,
    output) and how tensor parallelism cuts it."""

    name: str
    shape: tuple[int, ...]
    layer: int | None
    tp: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Transformer:
    """A decoder-only transformer; defaults describe a Llama-style model."""

    layers: int
    hidden: int
    heads: int
    vocab: int = 32000
    seq_len: int = 4096
    ffn_hidden: int | None = None  # default: 4 x hidden (gelu) or Llama's 8/3 x hidden rounded (swiglu)
    kv_heads: int | None = None  # grouped-query attention; default: as many as heads
    mlp: str = "swiglu"  # swiglu (three matrices) | gelu (two)
    norm: str = "rmsnorm"  # rmsnorm (weight) | layernorm (weight and bias)
    learned_positions: bool = False
    tied_embeddings: bool = False
    vocab_parallel: bool = True  # TP cuts the embedding and output by vocabulary rows (Megatron)
    total_params: float | None = None  # a size given by the user: the tensors are scaled to it

    @property
    def ffn(self) -> int:
        if self.ffn_hidden:
            return self.ffn_hidden
        if self.mlp == "gelu":
            return 4 * self.hidden
        return 256 * math.ceil(8 * self.hidden / 3 / 256)  # Llama's multiple_of=256 rounding

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return (self.kv_heads or self.heads) * self.head_dim

    def tensors(self) -> tuple[Tensor, ...]:
        """Every parameter tensor, in the order the model registers them."""
        return _tensors(self)

    def _list_tensors(self) -> tuple[Tensor, ...]:
        h, norm = self.hidden, self._norm_shapes()
        embed_tp = VOCAB if self.vocab_parallel else REPLICATE
        out = [Tensor("tok_embeddings.weight", (self.vocab, h), None, embed_tp)]
        if self.learned_positions:
            out.append(Tensor("pos_embeddings.weight", (self.seq_len, h), None, REPLICATE))
        for i in range(self.layers):
            p = f"layers.{i}."
            out += [Tensor(p + "attention_norm." + n, s, i, REPLICATE) for n, s in norm]
            out += [Tensor(p + "attention.wq.weight", (h, h), i, COL),
                    Tensor(p + "attention.wk.weight", (self.kv_dim, h), i, COL),
                    Tensor(p + "attention.wv.weight", (self.kv_dim, h), i, COL),
                    Tensor(p + "attention.wo.weight", (h, h), i, ROW)]
            out += [Tensor(p + "ffn_norm." + n, s, i, REPLICATE) for n, s in norm]
            out.append(Tensor(p + "feed_forward.w1.weight", (self.ffn, h), i, COL))
            if self.mlp == "swiglu":
                out.append(Tensor(p + "feed_forward.w3.weight", (self.ffn, h), i, COL))
            out.append(Tensor(p + "feed_forward.w2.weight", (h, self.ffn), i, ROW))
        out += [Tensor("norm." + n, s, None, REPLICATE) for n, s in norm]
        if not self.tied_embeddings:
            out.append(Tensor("output.weight", (self.vocab, h), None, embed_tp))
        return tuple(out)

    def _norm_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        shapes = [("weight", (self.hidden,))]
        return shapes + [("bias", (self.hidden,))] if self.norm == "layernorm" else shapes

    @property
    def shape_params(self) -> int:
        """Parameters of the tensors as listed (before any scaling to ``total_params``)."""
        return _shape_params(self)

    @property
    def scale(self) -> float:
        """Factor from the listed tensors to the size the user gave (1 when none was given)."""
        return self.total_params / self.shape_params if self.total_params else 1.0

    @property
    def params(self) -> float:
        return self.total_params or float(self.shape_params)


@lru_cache(maxsize=64)
def _tensors(model: Transformer) -> tuple[Tensor, ...]:
    return model._list_tensors()


@lru_cache(maxsize=64)
def _shape_params(model: Transformer) -> int:
    return sum(t.numel for t in model.tensors())


GPT3 = dict(mlp="gelu", norm="layernorm", learned_positions=True, vocab=50257, seq_len=2048)
LLAMA = dict(mlp="swiglu", norm="rmsnorm", learned_positions=False, vocab=32000, seq_len=4096)
# Well-known shapes by parameter count, with the tokens per optimizer step they trained with:
# GPT-3 (Brown et al. 2020, table 2.1), Llama 2 (Touvron et al. 2023), OPT (Zhang et al. 2022,
# table 1) and Llama 3.1 (Dubey et al. 2024, table 3).
KNOWN_SHAPES: list[tuple[float, float, dict]] = [
    (125e6, 0.5e6, dict(GPT3, layers=12, hidden=768, heads=12)),
    (350e6, 0.5e6, dict(GPT3, layers=24, hidden=1024, heads=16)),
    (1.3e9, 1e6, dict(GPT3, layers=24, hidden=2048, heads=16)),
    (2.7e9, 1e6, dict(GPT3, layers=32, hidden=2560, heads=32)),
    (7e9, 4e6, dict(LLAMA, layers=32, hidden=4096, heads=32, ffn_hidden=11008)),
    (13e9, 4e6, dict(LLAMA, layers=40, hidden=5120, heads=40, ffn_hidden=13824)),
    (30e9, 2e6, dict(GPT3, layers=48, hidden=7168, heads=56, vocab=50272)),  # OPT-30B
    (70e9, 4e6, dict(LLAMA, layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672)),
    (175e9, 3.2e6, dict(GPT3, layers=96, hidden=12288, heads=96)),
    (405e9, 16e6, dict(LLAMA, layers=126, hidden=16384, heads=128, kv_heads=8, ffn_hidden=53248, vocab=128256,
                       seq_len=8192)),
]


def _nearest(params: float) -> tuple[float, float, dict]:
    return min(KNOWN_SHAPES, key=lambda s: abs(math.log(s[0] / params)))


def default_batch(params: float, seq_len: int) -> int:
    """Sequences per step: the nearest well-known model's tokens per step at ``seq_len``, rounded to a
    power of two (so that it splits over any power-of-two number of replicas)."""
    return 2 ** max(0, round(math.log2(_nearest(params)[1] / seq_len)))


def shape_for(params: float, **given) -> Transformer:
    """The nearest well-known shape to ``params`` (log scale), with ``given`` fields overriding it,
    scaled to exactly ``params`` parameters."""
    fields = dict(_nearest(params)[2])
    given = {k: v for k, v in given.items() if v is not None}
    if "hidden" in given:  # another width: its own heads (128 wide, as most large models use) and MLP
        fields.update(heads=max(1, given["hidden"] // 128), kv_heads=None, ffn_hidden=None)
    fields.update(given)
    return Transformer(**fields, total_params=params)


def reference_trainer(trainer: dict) -> Transformer:
    """The shape of diagtrain's reference transformer from a run's trainer.json."""
    return Transformer(layers=int(trainer["n_layers"]), hidden=int(trainer["dim"]), heads=int(trainer["heads"]),
                       vocab=int(trainer["vocab"]), seq_len=int(trainer["seq_len"]), mlp="gelu", norm="layernorm",
                       learned_positions=True, tied_embeddings=False, vocab_parallel=False)
