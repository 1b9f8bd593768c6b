"""Telemetry beside the job: NVML per GPU where there is one, psutil per rank process always, and
the processes on the host that are not the job's while they take CPU (who competes with the ranks).

The sampler runs in a thread of the `diagtrain run` wrapper (never in the ranks), appends one
JSON line per row to ``hosts/<host>/telemetry.jsonl`` while the job runs, and the rows of every
host become ``telemetry.parquet`` at the end.

A long run's telemetry is bounded: every ``records.telemetry_horizon_s`` the sampler closes telemetry.jsonl into a
numbered segment (as a rank closes its steps.jsonl: run_dir.JsonlAppender), and thins each segment older than that,
all but the newest, to one sample per ``records.telemetry_coarse_s`` (every row of the first sample in each such
interval), compressed. The last one to two horizons stay at the sampling interval; readers take the segments in
order, then telemetry.jsonl (run_dir.telemetry_rows, the live tables' tail).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

import psutil

from diagtrain.profiler.collect import nvml
from diagtrain.profiler.run_dir import (TELEMETRY_FILE, JsonlAppender, RankIndex, Records, closed_segments,
                                        compress_segments, telemetry_rows, telemetry_table, write_bytes_atomic)

DEFAULT_INTERVAL_S = 1.0  # one sample a second: fine enough for step-level joins, cheap on 2 cores
# Listing every process on the host costs a few milliseconds, so it is done only while this much
# of the host's CPU (in cores) is used by something other than the rank processes.
OTHERS_GATE_CORES = 0.25
OTHERS_NAMED = 8  # the busiest other processes named per sample ...
OTHERS_NAMED_MIN_PERCENT = 10.0  # ... that use at least this much of one core


class TelemetrySampler:
    """Samples host, rank processes and GPUs every ``interval`` seconds in a daemon thread."""

    def __init__(self, run_dir: Path, host_dir: Path, host: str, interval: float,
                 say: Callable[[str], None], gpus: Any = None, bounds: Records | None = None) -> None:
        """``bounds``: the horizon and coarse interval (read here: the sampling thread does not see overrides)."""
        self.host, self.interval = host, interval
        self.ranks = RankIndex(run_dir)
        self.out = JsonlAppender(host_dir / TELEMETRY_FILE)
        self.bounds = bounds or Records.active()
        self._segment_began = time.monotonic()
        self._stop = threading.Event()
        self._processes: dict[int, psutil.Process] = {}
        self.cores = psutil.cpu_count() or 1
        self.others = OtherProcesses(os.getpid())
        self._thread = threading.Thread(target=self._loop, name="diagtrain-telemetry", daemon=True)
        self.error: str | None = None  # why sampling stopped early, if it did
        try:
            self.gpus = gpus or nvml.NvmlReader()  # anything with read() -> raw samples, and driver
            self.source, self.driver = "nvml+psutil", self.gpus.driver
        except nvml.NvmlUnavailable as e:
            self.gpus, self.source, self.driver = None, "psutil", None
            say(f"no NVIDIA GPU telemetry here ({e}); sampling CPU and memory of each rank with psutil")
        psutil.cpu_percent(None)  # the first call only starts the measurement window

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Take a last sample and stop."""
        self._stop.set()
        if self._thread.is_alive() or self._thread.ident is not None:
            self._thread.join()
        try:
            self.out.close()
        except OSError:
            pass  # its last line could not be flushed: what was written stays readable

    def _loop(self) -> None:
        while True:
            stopping = self._stop.wait(self.interval)
            try:
                for row in self.sample():
                    self.out.append(row)
            except OSError as e:  # a full disk: stop sampling, never the job
                self.error = f"telemetry stopped: cannot write telemetry.jsonl ({e.strerror or e})"
                return
            if stopping:
                return
            if time.monotonic() - self._segment_began >= self.bounds.telemetry_horizon_s:
                self._close_horizon()

    def _close_horizon(self) -> None:
        """Close the horizon's samples into a segment, and thin and compress those older than it (not the newest)."""
        self._segment_began = time.monotonic()
        self.out.close_segment()
        segments = closed_segments(self.out.path)
        if len(segments) < 2:
            return
        coarse_s = self.bounds.telemetry_coarse_s
        try:
            compress_segments(self.out.path, segments[-2][0], lambda data: thin_samples(data, coarse_s))
        except OSError:
            pass  # a full disk: the segment stays plain and fine, and is thinned at the next horizon

    def sample(self) -> list[dict[str, Any]]:
        """One row for the host, one per live rank process on it, one per GPU."""
        now = time.time()
        ranks = self.ranks.on_host(self.host)
        vm = psutil.virtual_memory()
        host = {"kind": "host", "cpu_percent": psutil.cpu_percent(None),
                "mem_used_bytes": vm.total - vm.available, "mem_total_bytes": vm.total}
        processes = [row for rank, info in sorted(ranks.items()) if (row := self._process_row(rank, info))]
        host["others_cpu_percent"], others = self.others.sample(
            host["cpu_percent"], sum(r["cpu_percent"] for r in processes))
        rows = [host, *processes, *others]
        if self.gpus is not None:
            by_uuid = {i.get("device_uuid"): r for r, i in ranks.items() if i.get("device_uuid")}
            for raw in self.gpus.read():
                row = nvml.to_row(raw)
                row["rank"] = by_uuid.get(row["uuid"])
                rows.append(row)
        for row in rows:
            row.update(time=now, host=self.host)
        return rows

    def _process_row(self, rank: int, info: dict[str, Any]) -> dict[str, Any] | None:
        pid = info["pid"]
        proc = self._processes.get(pid)
        try:
            first = proc is None
            if first:
                proc = self._processes[pid] = psutil.Process(pid)
            with proc.oneshot():
                rss = proc.memory_info().rss
                if rss == 0 or proc.status() == psutil.STATUS_ZOMBIE:
                    return None  # exiting or exited: its counters read as zero
                cpu = _lifetime_cpu_percent(proc) if first else proc.cpu_percent(None)
                if first:
                    proc.cpu_percent(None)  # starts the window the next sample measures
                return {"kind": "process", "rank": rank, "pid": pid, "cpu_percent": _at_most(cpu, self.cores),
                        "rss_bytes": rss, "threads": proc.num_threads()}
        except psutil.Error:
            return None  # the rank has exited


class OtherProcesses:
    """CPU used on the host by processes that are not the job's (the wrapper and everything it
    started): ``others_cpu_percent`` on the host row, in percent of one core, and a row of kind
    ``other`` (pid, name, cpu_percent) for each of the busiest."""

    def __init__(self, wrapper_pid: int) -> None:
        self.wrapper_pid = wrapper_pid
        self.cores = psutil.cpu_count() or 1
        self._cpu: dict[int, float] = {}  # pid -> CPU seconds at the previous listing
        self._listed_at: float | None = None

    def sample(self, host_percent: float, ranks_percent: float) -> tuple[float, list[dict[str, Any]]]:
        """(CPU of other processes in % of one core, rows naming the busiest) for this sample."""
        now = time.monotonic()
        unexplained = max(0.0, host_percent * self.cores - ranks_percent)
        if unexplained < OTHERS_GATE_CORES * 100:
            self._listed_at = None  # the next listing starts over: its deltas need a fresh baseline
            return round(unexplained, 1), []
        cpu, parents, names = {}, {}, {}
        for proc in psutil.process_iter(["ppid", "name", "cpu_times"]):
            times = proc.info["cpu_times"]
            if times is not None:
                cpu[proc.pid], parents[proc.pid], names[proc.pid] = times.user + times.system, proc.info["ppid"], proc.info["name"]
        previous, listed_at = self._cpu, self._listed_at
        self._cpu, self._listed_at = cpu, now
        if listed_at is None or now <= listed_at:
            return round(unexplained, 1), []  # a baseline: exact figures from the next sample on
        job = _descendants(self.wrapper_pid, parents)
        usage = {pid: (seconds - previous[pid]) / (now - listed_at) * 100
                 for pid, seconds in cpu.items() if pid in previous and pid not in job}
        busiest = sorted((pid for pid, pct in usage.items() if pct >= OTHERS_NAMED_MIN_PERCENT),
                         key=usage.get, reverse=True)[:OTHERS_NAMED]
        return (_at_most(sum(max(0.0, pct) for pct in usage.values()), self.cores),
                [{"kind": "other", "pid": pid, "name": names[pid], "cpu_percent": _at_most(usage[pid], self.cores)}
                 for pid in busiest])


def _lifetime_cpu_percent(proc: psutil.Process) -> float:
    """A new process's CPU since it started, in % of one core. Its first ``cpu_percent(None)`` would
    measure the microseconds since that call: one 10 ms clock tick in them read 5,800% on 2 cores."""
    times = proc.cpu_times()
    alive_s = time.time() - proc.create_time()
    return (times.user + times.system) / alive_s * 100 if alive_s > 0 else 0.0


def _at_most(percent: float, cores: int) -> float:
    """``percent`` (of one core) within what the host's cores can give: CPU times count in clock
    ticks, so a short window can round above it."""
    return round(min(max(percent, 0.0), cores * 100.0), 1)


def _descendants(root: int, parents: dict[int, int]) -> set[int]:
    """``root`` and every process below it, from a pid -> parent pid map."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return found


def thin_samples(data: bytes, interval_s: float) -> bytes:
    """Telemetry lines keeping one sample per ``interval_s``: every row of the first sample (the rows taken at one
    time) in each interval. A line that is not a row (cut by a kill) is left out, as every reader leaves it."""
    kept, seen = [], set()
    sample_time, keep = None, False
    for line in data.splitlines(keepends=True):
        try:
            at = float(json.loads(line)["time"])
        except (ValueError, KeyError, TypeError):
            continue
        if at != sample_time:
            sample_time, bucket = at, math.floor(at / interval_s)
            keep = bucket not in seen
            seen.add(bucket)
        if keep:
            kept.append(line if line.endswith(b"\n") else line + b"\n")
    return b"".join(kept)


def write_parquet(run_dir: Path) -> Path | None:
    """Merge every host's telemetry.jsonl into ``telemetry.parquet``; None when there is none."""
    rows = telemetry_rows(run_dir)
    if not rows:
        return None
    out = Path(run_dir) / "telemetry.parquet"
    write_bytes_atomic(out, telemetry_table(rows).to_parquet(index=False))
    return out
