"""Telemetry beside the job: NVML per GPU where there is one, psutil per rank process always.

The sampler runs in a thread of the `diagtrain run` wrapper (never in the ranks), appends one
JSON line per row to ``hosts/<host>/telemetry.jsonl`` while the job runs, and the rows of every
host become ``telemetry.parquet`` at the end.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Callable

import psutil

from diagtrain.profiler import nvml
from diagtrain.profiler.rank_files import RankIndex
from diagtrain.profiler.run_dir import JsonlAppender, write_bytes_atomic

DEFAULT_INTERVAL_S = 1.0  # one sample a second: fine enough for step-level joins, cheap on 2 cores


class TelemetrySampler:
    """Samples host, rank processes and GPUs every ``interval`` seconds in a daemon thread."""

    def __init__(self, run_dir: Path, host_dir: Path, host: str, interval: float,
                 say: Callable[[str], None], gpus: Any = None) -> None:
        self.host, self.interval = host, interval
        self.ranks = RankIndex(run_dir)
        self.out = JsonlAppender(host_dir / "telemetry.jsonl")
        self._stop = threading.Event()
        self._processes: dict[int, psutil.Process] = {}
        self._thread = threading.Thread(target=self._loop, name="diagtrain-telemetry", daemon=True)
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
        self._thread.join()
        self.out.close()

    def _loop(self) -> None:
        while True:
            stopping = self._stop.wait(self.interval)
            for row in self.sample():
                self.out.append(row)
            if stopping:
                return

    def sample(self) -> list[dict[str, Any]]:
        """One row for the host, one per live rank process on it, one per GPU."""
        now = time.time()
        ranks = self.ranks.on_host(self.host)
        vm = psutil.virtual_memory()
        rows = [{"kind": "host", "cpu_percent": psutil.cpu_percent(None),
                 "mem_used_bytes": vm.total - vm.available, "mem_total_bytes": vm.total}]
        rows += [row for rank, info in sorted(ranks.items()) if (row := self._process_row(rank, info))]
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
            if proc is None:
                proc = self._processes[pid] = psutil.Process(pid)
                proc.cpu_percent(None)
            with proc.oneshot():
                rss = proc.memory_info().rss
                if rss == 0 or proc.status() == psutil.STATUS_ZOMBIE:
                    return None  # exiting or exited: its counters read as zero
                return {"kind": "process", "rank": rank, "pid": pid, "cpu_percent": proc.cpu_percent(None),
                        "rss_bytes": rss, "threads": proc.num_threads()}
        except psutil.Error:
            return None  # the rank has exited


def write_parquet(run_dir: Path) -> Path | None:
    """Merge every host's telemetry.jsonl into ``telemetry.parquet``; None when there is none."""
    import pandas as pd

    rows = []
    for path in sorted(Path(run_dir).glob("hosts/*/telemetry.jsonl")):
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass  # a line cut by a kill: everything before it is intact
    if not rows:
        return None
    table = pd.DataFrame(rows)
    table["time"] = pd.to_datetime(table["time"], unit="s", utc=True)
    for column in ("rank", "pid", "threads", "device"):
        if column in table:
            table[column] = table[column].astype("Int64")
    out = Path(run_dir) / "telemetry.parquet"
    write_bytes_atomic(out, table.to_parquet(index=False))
    return out
