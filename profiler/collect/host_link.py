"""This wrapper among the other hosts of one run: its heartbeat, the clock handshake, who still runs.

Several `diagtrain run` wrappers (one per node, or per torchrun agent) share one run directory.
While its job runs, each one rewrites ``hosts/<name>/heartbeat`` every HOST_BEAT_S, answers the
clock pings of the others and measures its clock against every host it sees running
(:mod:`diagtrain.profiler.collect.clock_sync`), all in one daemon thread. When its job ends, it
asks which other hosts still run, so that exactly one of them (the last) analyzes the run.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from diagtrain.profiler.collect.clock_sync import ClockSync
from diagtrain.profiler.run_dir import (
    HOSTS_DIR,
    HOST_BEAT_S,
    HOST_HEARTBEAT,
    HOST_RECORD,
    Heartbeat,
    host_dir,
    read_hosts,
    read_json,
)
from diagtrain.profiler.util import processes

FAST_POLL_S = 0.0005  # while a handshake is under way: its error is half the round trip
SLOW_POLL_S = 0.05  # otherwise: a new pinger waits this long at most for its first answer
# A wrapper on another machine is alive when its heartbeat advances within this time; several
# beats, so a busy host's late beat is not taken for a lost one.
OBSERVE_S = 3.5 * HOST_BEAT_S
MAX_PEERS = 3  # hosts each wrapper measures its clock against (see _pick_peers)


class HostLink:
    """Heartbeat and clock handshake in a daemon thread, from start() to stop()."""

    def __init__(self, run_dir: Path, host_dir: Path) -> None:
        self.run_dir, self.host_dir, self.name = run_dir, host_dir, host_dir.name
        self.clock = ClockSync(run_dir, self.name)
        self._beat = Heartbeat(host_dir / HOST_HEARTBEAT)
        self._seq = 0
        self._looked_at: set[str] = set()  # peers this host measures against
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="diagtrain-hosts", daemon=True)

    def start(self) -> None:
        self._write_beat()
        self._thread.start()

    def stop(self) -> None:
        """Stop beating and answering; call after this host's final record is written."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.clock.close()
        self._beat.close()

    def _loop(self) -> None:
        next_beat = next_look = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_beat:
                self._write_beat()
                next_beat = now + HOST_BEAT_S
            if now >= next_look:  # hosts that joined since: measure against them too
                self._pick_peers()
                next_look = now + HOST_BEAT_S
            try:
                busy = self.clock.step()
            except OSError:
                busy = False  # a filesystem hiccup: the next pass tries again
            self._stop.wait(FAST_POLL_S if busy else SLOW_POLL_S)

    def _pick_peers(self) -> None:
        """Queue handshakes with running hosts, the first MAX_PEERS by name: every host picks among
        the same few, so all are connected through them at N * MAX_PEERS handshakes, not N squared."""
        try:
            names = sorted(set(os.listdir(self.run_dir / HOSTS_DIR)) - {self.name} - self._looked_at)
        except OSError:
            return
        for name in names:
            if len(self._looked_at) >= MAX_PEERS:
                return
            record = read_json(host_dir(self.run_dir, name) / HOST_RECORD)
            if isinstance(record, dict) and record.get("status") == "running":
                self._looked_at.add(name)
                self.clock.measure(name)

    def _write_beat(self) -> None:
        self._seq += 1
        try:
            self._beat.write({"seq": self._seq, "time": round(time.time(), 3)})
        except OSError:
            pass  # a full disk must not stop the wrapper; a late beat only delays a verdict

    def others(self) -> list[dict]:
        """The other hosts' records (a gone wrapper's reads as abandoned where this machine can tell)."""
        return [h for h in read_hosts(self.run_dir) if h.get("name") != self.name]

    def still_running(self) -> tuple[list[str], list[str]]:
        """(hosts whose wrappers still run, hosts whose records say running but whose wrappers are gone).

        Where the process cannot be checked (another machine), the heartbeat must advance within
        OBSERVE_S, by this host's clock alone, so clock skew cannot mislead it.
        """
        running, gone, unsure = [], [], {}
        for host in self.others():
            if host.get("status") == "abandoned":
                gone.append(host["name"])
            elif host.get("status") == "running":
                alive = processes.alive(host.get("process") or {})
                if alive is None:
                    unsure[host["name"]] = (host.get("heartbeat") or {}).get("seq")
                else:
                    (running if alive else gone).append(host["name"])
        deadline = time.monotonic() + OBSERVE_S
        while unsure and time.monotonic() < deadline:
            time.sleep(HOST_BEAT_S / 4)
            for name, seq in list(unsure.items()):
                record = read_json(host_dir(self.run_dir, name) / HOST_RECORD) or {}
                beat = read_json(host_dir(self.run_dir, name) / HOST_HEARTBEAT) or {}
                if record.get("status") != "running" or beat.get("seq") != seq:
                    running += [name] if record.get("status") == "running" else []
                    del unsure[name]
        return sorted(running), sorted(gone + list(unsure))
