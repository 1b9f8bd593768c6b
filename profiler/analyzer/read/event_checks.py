"""What makes a trace event unusable, named: the one definition both trace decoders apply.

A duration event needs a string name (or none), a numeric ``ts`` and ``dur``, thread and process ids
that are numbers or strings, and an object of arguments; its times must be finite, its duration
neither negative nor longer than a week, its start within a few thousand years of 1970. Other events
are never read past their phase. An event that fails is left out and counted by reason, with the first
few places it was found, for the health check.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# No profiled event lasts a week; longer (1e18 µs) or negative durations are corrupt, never used.
MAX_EVENT_US = 7 * 24 * 3600 * 1e6
# µs since 1970 or since the trace's base time: beyond 1e17 (year ~5100) a time is corrupt, and its
# end would swallow every idle gap of the rank.
MAX_TIME_US = 1e17
_IDS = {int, float, str, type(None)}  # real traces write thread and process ids as numbers, names or null
_TYPES = (("ts", {int, float}), ("dur", {int, float}), ("name", {str}), ("cat", {str, type(None)}), ("tid", _IDS),
          ("pid", _IDS), ("args", {dict}))
_SHOWN_PLACES = 3  # places named per reason


def problem(event: Any) -> str | None:
    """Why ``event`` (decoded JSON) cannot be used, as a short reason ("name is null"); None if it can."""
    if not isinstance(event, dict):
        return f"an event is {_kind(event)}"
    if "ph" not in event:
        return "ph missing"
    if not isinstance(event["ph"], str):
        return f"ph is {_kind(event['ph'])}"
    if event["ph"] != "X":  # never read further
        return None
    return _field_problem(event) or _time_problem(event["ts"], event["dur"])


def _field_problem(event: dict) -> str | None:
    for key in ("ts", "dur"):
        if key not in event:
            return f"{key} missing"
    for key, kinds in _TYPES:  # type(), not isinstance: a boolean is no number here
        if key in event and type(event[key]) not in kinds:
            return f"{key} is {_kind(event[key])}"
    return None


def _time_problem(ts: float, dur: float) -> str | None:
    if not math.isfinite(ts):
        return "ts is not finite"
    if not math.isfinite(dur):
        return "dur is not finite"
    if dur < 0:
        return "dur is negative"
    if dur > MAX_EVENT_US:
        return "dur is longer than a week"
    if abs(ts) > MAX_TIME_US:
        return "ts is out of range"
    return None


def usable_times(ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Which events' times pass the checks of :func:`problem` (finite, duration from 0 to a week, start in range)."""
    with np.errstate(invalid="ignore"):
        return np.isfinite(ts) & np.isfinite(dur) & (dur >= 0) & (dur <= MAX_EVENT_US) & (np.abs(ts) <= MAX_TIME_US)


@dataclass
class Damage:
    """The events left out of one trace, counted by reason, with the first places of each."""

    counts: Counter = field(default_factory=Counter)
    places: dict[str, list[str]] = field(default_factory=dict)

    def add(self, reason: str, place: str) -> None:
        """Count one event left out at ``place`` ("$.traceEvents[80]") because of ``reason``."""
        self.counts[reason] += 1
        shown = self.places.setdefault(reason, [])
        if len(shown) < _SHOWN_PLACES:
            shown.append(place)

    @property
    def total(self) -> int:
        """How many events were left out."""
        return sum(self.counts.values())

    def describe(self) -> str:
        """The reasons, most frequent first: "5 name is null ($.traceEvents[80], ...); 2 dur is negative (...)"."""
        parts = []
        for reason, n in self.counts.most_common():
            more = ", ..." if n > len(self.places[reason]) else ""
            parts.append(f"{n:,} {reason} ({', '.join(self.places[reason])}{more})")
        return "; ".join(parts)


def _kind(value: Any) -> str:
    """A JSON value's type in words: "null", "a string", "a list"."""
    if value is None:
        return "null"
    return {bool: "a boolean", str: "a string", list: "a list", dict: "an object",
            int: "a number", float: "a number"}.get(type(value), f"a {type(value).__name__}")
