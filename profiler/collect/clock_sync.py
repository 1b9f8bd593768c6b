"""The clock handshake between the wrappers of one run, through the shared run directory.

Hosts' wall clocks differ (by milliseconds under NTP, by seconds without it), and everything a
host records (steps, telemetry, logs, flight recorder, heartbeats, exit records) carries its own
clock. The wrappers measure the differences while they run, the way NTP does, with files as
messages: host B writes a ping into ``hosts/A/pings/B`` at B's time t1; A answers into
``hosts/B/pongs/A`` with its time t2; B sees the answer at t3. B's clock minus A's is then
``(t1 + t3) / 2 - t2``, within half the round trip; the best of several rounds is kept in
``hosts/B/clock.json``. It needs no clock shared by the filesystem, only that a file rewritten in
place by one host is seen by another when it opens it (close-to-open, as NFS gives).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from diagtrain.profiler.run_dir import (
    CLOCK_RECORD,
    SCHEMA_VERSION,
    Heartbeat,
    host_dir,
    read_json,
    write_json_atomic,
)

ROUNDS = 12  # round trips per peer: the shortest one bounds the error, and some land between polls
FIRST_ROUND_TIMEOUT_S = 3.0  # the peer notices a new pinger at its slow poll (and may be busy starting)
ROUND_TIMEOUT_S = 0.5  # a later round that takes longer than this is lost, not waited for
MAX_LOST_ROUNDS = 4  # a peer that misses this many rounds has ended (or never serves): give up on it


@dataclass
class Measurement:
    """This host's clock minus a peer's, from the best round trip."""

    peer: str
    offset_s: float
    uncertainty_s: float  # half the round trip of the best round: the offset is within this
    rounds: int  # round trips answered
    at: float  # this host's clock when it was measured


@dataclass
class _Probe:
    """The measurement in progress against one peer."""

    peer: str
    ping: Heartbeat
    seq: int = 0
    sent: float = 0.0
    deadline: float = 0.0
    lost: int = 0
    best: tuple[float, float] | None = None  # (uncertainty, offset)
    answered: int = 0


class ClockSync:
    """Answers the pings of other wrappers and measures this host against peers, without blocking.

    ``step()`` does one pass of both and says whether work is under way (then call it again soon).
    """

    def __init__(self, run_dir: Path, me: str) -> None:
        self.run_dir, self.me = run_dir, me
        self.pings = host_dir(run_dir, me) / "pings"
        self.pings.mkdir(parents=True, exist_ok=True)
        self.answered: dict[str, int] = {}  # pinger -> last seq answered
        self.pongs: dict[str, Heartbeat] = {}
        self.queue: list[str] = []
        self.probe: _Probe | None = None
        self.results: dict[str, Measurement] = {}
        self.last_ping_seen = 0.0

    def measure(self, peer: str) -> None:
        """Measure against ``peer`` once the measurements queued before it are done."""
        if peer != self.me and peer not in self.queue and peer not in self.results and \
                (self.probe is None or self.probe.peer != peer):
            self.queue.append(peer)

    def step(self) -> bool:
        """Answer waiting pings, advance the measurement; True while either is under way."""
        self._answer()
        self._advance()
        serving = time.monotonic() - self.last_ping_seen < ROUND_TIMEOUT_S * 2
        return serving or self.probe is not None

    def close(self) -> None:
        for record in self.pongs.values():
            record.close()
        if self.probe is not None:
            self.probe.ping.close()

    # -- answering --

    def _answer(self) -> None:
        try:
            pingers = os.listdir(self.pings)
        except OSError:
            return
        for pinger in pingers:
            ping = read_json(self.pings / pinger)
            if not isinstance(ping, dict) or ping.get("seq", 0) <= self.answered.get(pinger, 0):
                continue
            now = time.time()
            if pinger not in self.pongs:
                folder = host_dir(self.run_dir, pinger) / "pongs"
                folder.mkdir(parents=True, exist_ok=True)
                self.pongs[pinger] = Heartbeat(folder / self.me)
            self.pongs[pinger].write({"seq": ping["seq"], "t": now})
            self.answered[pinger] = ping["seq"]
            self.last_ping_seen = time.monotonic()

    # -- measuring --

    def _advance(self) -> None:
        if self.probe is None:
            if not self.queue:
                return
            peer = self.queue.pop(0)
            target = host_dir(self.run_dir, peer) / "pings"
            target.mkdir(parents=True, exist_ok=True)
            self.probe = _Probe(peer, Heartbeat(target / self.me))
            self._send(FIRST_ROUND_TIMEOUT_S)
            return
        probe = self.probe
        pong = read_json(host_dir(self.run_dir, self.me) / "pongs" / probe.peer)
        if isinstance(pong, dict) and pong.get("seq") == probe.seq:
            received = time.time()
            uncertainty, offset = (received - probe.sent) / 2, (probe.sent + received) / 2 - pong["t"]
            if probe.best is None or uncertainty < probe.best[0]:
                probe.best = (uncertainty, offset)
            probe.answered += 1
        elif time.monotonic() > probe.deadline:
            probe.lost += 1
        else:
            return
        if probe.answered + probe.lost >= ROUNDS or probe.lost >= MAX_LOST_ROUNDS:
            self._finish()
        else:
            self._send(ROUND_TIMEOUT_S)

    def _send(self, timeout_s: float) -> None:
        probe = self.probe
        probe.seq += 1
        probe.deadline = time.monotonic() + timeout_s
        probe.sent = time.time()
        probe.ping.write({"seq": probe.seq, "t": probe.sent})

    def _finish(self) -> None:
        probe, self.probe = self.probe, None
        probe.ping.close()
        if probe.best is None:
            return  # the peer never answered: it ended, or its wrapper predates the handshake
        uncertainty, offset = probe.best
        self.results[probe.peer] = Measurement(probe.peer, offset, uncertainty, probe.answered, time.time())
        write_json_atomic(host_dir(self.run_dir, self.me) / CLOCK_RECORD,
                          {"schema_version": SCHEMA_VERSION, "host": self.me,
                           "measurements": [asdict(m) for m in self.results.values()]})
