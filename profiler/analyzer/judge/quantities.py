"""What a finding measured and what it blames, as types that cross modules (never parsed from its words).

A straggler is found in one part of a rank's step (:class:`Quantity`), on the device a slow GPU or a late
host (:class:`DeviceCause`); a slow collective has one of two causes (:class:`SlowCause`). Findings carry them in ``metrics["quantity"]`` and
``metrics["cause"]`` as the enum values; the English in ``metrics["phase"]`` is for people only.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Measure(str, Enum):
    """The kinds of a rank's own time that a straggler can stand out in."""

    IDLE = "idle"  # trace: time outside any operator (host stalls)
    COMPUTE = "compute"  # trace: time in operators or kernels
    OUTSIDE_COLLECTIVES = "outside_collectives"  # trace: step time less the time inside collectives
    PHASE = "phase"  # step records: one phase of the step (data, forward, backward, optimizer...)
    OWN_TIME = "own_time"  # always-on counters: step time less the time blocked in collectives
    DEVICE_IDLE = "device_idle"  # device timings: the device idle before the step, waiting for its host
    DEVICE_BUSY = "device_busy"  # device timings: the device's step less its idle time and its waits in collectives


LABELS = {Measure.IDLE: "time outside any operator", Measure.COMPUTE: "compute time",
          Measure.OUTSIDE_COLLECTIVES: "time outside collectives", Measure.OWN_TIME: "time outside collective waits",
          Measure.DEVICE_IDLE: "device idle time before the step", Measure.DEVICE_BUSY: "device busy time"}
DEVICE_MEASURES = (Measure.DEVICE_IDLE, Measure.DEVICE_BUSY)


@dataclass(frozen=True)
class Quantity:
    """One part of a rank's step: a measure, and for ``Measure.PHASE`` which phase."""

    measure: Measure
    phase: str | None = None

    @property
    def label(self) -> str:
        """The words a report uses for it ("compute time", "forward phase")."""
        return f"{self.phase} phase" if self.measure is Measure.PHASE else LABELS[self.measure]

    @property
    def key(self) -> str:
        """Its value in ``metrics["quantity"]``: the measure, ``phase:<name>`` for a phase."""
        return f"phase:{self.phase}" if self.measure is Measure.PHASE else self.measure.value

    @classmethod
    def from_key(cls, key: str) -> Quantity:
        """The quantity a finding's ``metrics["quantity"]`` names (ValueError for an unknown one)."""
        measure, _, phase = key.partition(":")
        return cls(Measure(measure), phase or None)


def phase(name: str) -> Quantity:
    """The quantity of one phase of the step."""
    return Quantity(Measure.PHASE, name)


class DeviceCause(str, Enum):
    """What a straggler found on the device (``metrics["cause"]``) blames: its GPU, or its host."""

    SLOW_DEVICE = "slow_device"  # its device is busy longer than its peers' and they wait for it there
    HOST_LATE = "host_late"  # its device idled before the step waiting for its host, and the others wait for it


CAUSE_OF = {Measure.DEVICE_BUSY: DeviceCause.SLOW_DEVICE, Measure.DEVICE_IDLE: DeviceCause.HOST_LATE}


class SlowCause(str, Enum):
    """Why a slow_collective finding says its collectives were slow."""

    LATE_ARRIVAL = "late_arrival"  # one rank reaches them last, held up on its way there
    BANDWIDTH = "bandwidth"  # the transfer itself is slower than the link should give
