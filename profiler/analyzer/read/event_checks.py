"""What makes a trace event unusable, named: the one definition both trace decoders apply.

A duration event needs a string name (or none), a numeric ``ts`` and ``dur``, thread and process ids
that are numbers or strings, and an object of arguments; its times must be finite, its duration
neither negative nor longer than a week, its start within a few thousand years of 1970. A number must
fit its field: ids (thread, stream, correlation) a 64-bit integer, counts (elements, group size) from
0 to 2**53. Other events
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
INT64 = (-(2**63), 2**63 - 1)  # what an id must fit: the tables hold ids as int64
MAX_COUNT = 2**53  # elements or ranks beyond this are corrupt (and no longer exact as floats)
_ID_ARGS = ("stream", "correlation")
_COUNT_ARGS = ("In msg nelems", "Group size")


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
    return _field_problem(event) or _time_problem(event["ts"], event["dur"]) or _range_problem(event)


def _field_problem(event: dict) -> str | None:
    for key in ("ts", "dur"):
        if key not in event:
            return f"{key} missing"
    for key, kinds in _TYPES:  # type(), not isinstance: a boolean is no number here
        if key in event and type(event[key]) not in kinds:
            return f"{key} is {_kind(event[key])}"
    return None


def _time_problem(ts: float, dur: float) -> str | None:
    for key, value in (("ts", ts), ("dur", dur)):
        if not fits_float(value):
            return f"{key} does not fit a number"
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


def _range_problem(event: dict) -> str | None:
    """An id or a count that does not fit its field (a number, not a name: names are kept as they are)."""
    args = event.get("args") or {}
    ids = [("tid", event.get("tid"))] + [(f"args.{k}", args.get(k)) for k in _ID_ARGS]
    for key, value in ids:
        if _number(value) and not fits_int64(value):
            return f"{key} does not fit a 64-bit integer"
    for key in _COUNT_ARGS:
        value = args.get(key)
        if unfit_count(value):
            return f"args.{key} is out of range"
    return None


def _number(value: Any) -> bool:
    return type(value) in (int, float)


def unfit_count(value: Any) -> bool:
    """Whether a count (elements, group size) is a number out of its range."""
    return _number(value) and not (fits_float(value) and 0 <= value <= MAX_COUNT)


def fits_float(value: Any) -> bool:
    """Whether a JSON number converts to a float (an integer of 400 digits does not)."""
    try:
        float(value)
    except OverflowError:
        return False
    return True


def fits_int64(value: Any) -> bool:
    """Whether a JSON number is a finite value that fits a 64-bit integer."""
    if isinstance(value, float):
        return math.isfinite(value) and INT64[0] <= value < 2.0**63
    return INT64[0] <= value <= INT64[1]


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
