"""Distributed checkpoints with torch.distributed.checkpoint: every rank saves its own shards."""

from __future__ import annotations

from pathlib import Path

import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.optim import Optimizer

# Flat optimizer keys ("state.<fqn>.exp_avg") so the state of several pipeline stages merges
# into one dict, as torchtitan does.
_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def save(parts: list[nn.Module], optimizers: list[Optimizer], path: Path) -> None:
    """Save model and optimizer state of all parts to ``path`` (a folder, collective call)."""
    state: dict = {}
    for part, optimizer in zip(parts, optimizers):
        model_sd, optim_sd = get_state_dict(part, optimizer, options=_OPTIONS)
        state.update({f"model.{k}": v for k, v in model_sd.items()})
        state.update({f"optim.{k}": v for k, v in optim_sd.items()})
    dcp.save(state, checkpoint_id=str(path))
