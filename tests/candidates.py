"""Candidates as the detectors propose them, for the tests of what judgement and the report make of them."""

from __future__ import annotations

from typing import Any


def straggler_facts(**changes: Any) -> dict[str, Any]:
    """A straggler's facts (judge/detectors/straggler.py): its forward phase 12 ms a step over its peers', in every
    step it was seen in, rank 0 waiting for it."""
    return {"phase": "forward phase", "value_ms": 32.0, "excess_ms": 12.0, "peer_ms": 20.0, "others": [0],
            "onset": None, "blips": 0, "cause": None, "work_ratio": None, "same_work": False, "seen_share": 1.0,
            "lost_ms_per_step": 12.0, **changes}
