"""Fault specs: ``--inject KIND:key=value,...`` parsed and checked, before any process starts.

Kept free of torch so the launcher can refuse a bad spec at once; faults.py applies them in ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diagtrain.profiler.util.step_ranges import StepRange, parse_step_range

# kind -> (required keys, optional keys); "ms|factor" means exactly one of the two.
FAULT_KINDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "straggler": (("rank", "ms|factor"), ("steps",)),
    "dataloader_stall": (("rank", "ms"), ("every", "steps")),
    "slow_comm": (("rank", "ms"), ("steps",)),
    "mem_imbalance": (("rank", "mb"), ()),
    "hang": (("rank", "step"), ()),
    "stuck": (("rank", "step"), ()),
    "crash": (("rank", "step"), ()),
    "pp_imbalance": (("stage", "layers"), ()),
    "few_microbatches": (("microbatches",), ()),
}
_INT_KEYS = {"rank", "step", "every", "stage", "layers", "microbatches"}
_FLOAT_KEYS = {"ms", "factor", "mb"}


@dataclass(frozen=True)
class FaultSpec:
    """One injected fault: what, on which rank, at which step, with which parameters."""

    kind: str
    rank: int | None = None
    step: int | None = None
    params: dict[str, Any] = field(default_factory=dict)
    text: str = ""

    @property
    def steps(self) -> StepRange | None:
        """The steps it is active in (``None``: every step)."""
        return parse_step_range(self.params["steps"]) if "steps" in self.params else None

    def active(self, step: int) -> bool:
        """Whether the fault acts at ``step``."""
        return self.steps is None or step in self.steps

    def to_json(self) -> dict[str, Any]:
        """The ground-truth record: ``{kind, rank, step, params}``."""
        return {"kind": self.kind, "rank": self.rank, "step": self.step, "params": dict(self.params)}


def parse_fault(text: str) -> FaultSpec:
    """Parse ``KIND:key=value,...``; raise ``ValueError`` naming the spec and the problem."""
    kind, _, rest = text.partition(":")
    kind = kind.strip()
    if kind not in FAULT_KINDS:
        raise ValueError(f"{text!r}: unknown fault kind {kind!r}; known: {', '.join(FAULT_KINDS)}")
    required, optional = FAULT_KINDS[kind]
    allowed = {k for key in required + optional for k in key.split("|")}
    values: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, raw = item.partition("=")
        if not eq or not raw:
            raise ValueError(f"{text!r}: {item!r} is not key=value")
        if key not in allowed:
            raise ValueError(f"{text!r}: {kind} takes {', '.join(sorted(allowed))}, not {key!r}")
        values[key] = _convert(text, key, raw)
    for key in required:
        present = [k for k in key.split("|") if k in values]
        if len(present) != 1:
            raise ValueError(f"{text!r}: {kind} needs exactly one of {key.replace('|', ' or ')}")
    rank, step = values.pop("rank", None), values.pop("step", None)
    return FaultSpec(kind, rank, step, values, text)


def _convert(text: str, key: str, raw: str) -> Any:
    try:
        if key == "steps":
            return str(parse_step_range(raw))
        value = int(raw) if key in _INT_KEYS else float(raw)
    except ValueError:
        kind = "a step range" if key == "steps" else "an integer" if key in _INT_KEYS else "a number"
        raise ValueError(f"{text!r}: {key}={raw!r} is not {kind}") from None
    minimum = 0 if key in ("rank", "stage") else 1 if key in _INT_KEYS else 0
    if value < minimum or (key == "factor" and value < 1):
        raise ValueError(f"{text!r}: {key}={raw} is out of range")
    return value
