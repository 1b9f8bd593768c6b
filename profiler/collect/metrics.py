"""`diagtrain run --metrics-port PORT`: the live verdict as Prometheus metrics at ``/metrics``.

prometheus-client's own HTTP server, in a daemon thread of the wrapper, answers each scrape from
the last live judgement (a snapshot swapped in whole, under a lock): a scrape reads no file and
never waits for a judgement, and nothing it does can stop or slow the job.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

# Per-rank gauges: (name, help, the step record's column, factor to the metric's unit).
RANK_GAUGES = (
    ("diagtrain_step_seconds", "duration of the rank's latest finished step", "wall_ms", 1e-3),
    ("diagtrain_collective_wait_seconds", "time the rank was blocked in collectives and point-to-point calls in its "
     "latest step", "comm_wait_ms", 1e-3),
    ("diagtrain_data_wait_seconds", "time the rank waited for its batch in its latest step", "data_ms", 1e-3),
    ("diagtrain_cpu_runqueue_wait_seconds", "time the rank's main thread waited for a CPU in its latest step",
     "runq_ms", 1e-3),
    ("diagtrain_last_step", "the latest step the rank finished", "step", 1),
    # On a GPU (CUDA events, NCCL's collective timing) the device's view of the latest step it has timed, a
    # step or two behind diagtrain_last_step: NCCL's waits return on the host once queued, these do not.
    ("diagtrain_device_step_seconds", "the device's time in the rank's latest step timed on the device",
     "device_step_ms", 1e-3),
    ("diagtrain_device_collective_wait_seconds", "time the rank's device waited in collectives for the last peer "
     "to arrive, in its latest step timed on the device", "device_comm_wait_ms", 1e-3),
    ("diagtrain_device_idle_seconds", "time the rank's device idled waiting for its host before its latest step "
     "timed on the device", "device_idle_ms", 1e-3),
    ("diagtrain_device_last_step", "the latest step the rank's device has timed", "device_step", 1),
)
# Memory at the end of the rank's latest step, by kind (the step record's column).
MEMORY = {"rss": "rss_bytes", "gpu_allocated": "gpu_allocated_bytes", "gpu_reserved": "gpu_reserved_bytes",
          "peak": "peak_mem_bytes"}


class LiveMetrics:
    """The metrics of the last judgement, served by prometheus-client (see :func:`serve`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: dict[int, dict[str, Any]] = {}
        self._active: list[dict[str, Any]] = []
        self._job: dict[str, float] = {}
        self._server = None

    def update(self, latest: dict[int, dict[str, Any]], active: list[dict[str, Any]],
               job_seconds: dict[str, float] | None = None) -> None:
        """Swap in each rank's latest step record, the live findings standing now and the job's time so far by
        category (seconds, only growing)."""
        with self._lock:
            self._latest, self._active = dict(latest), list(active)
            self._job = dict(job_seconds or self._job)

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """What a scrape reads (prometheus-client's collector protocol)."""
        with self._lock:
            latest, active, job = self._latest, self._active, self._job
        for name, help_text, column, factor in RANK_GAUGES:
            gauge = GaugeMetricFamily(name, help_text, labels=["rank"])
            for rank, row in sorted(latest.items()):
                if _number(row.get(column)):
                    gauge.add_metric([str(rank)], float(row[column]) * factor)
            yield gauge
        memory = GaugeMetricFamily("diagtrain_memory_bytes", "the rank's memory at the end of its latest step, by kind",
                                   labels=["rank", "kind"])
        for rank, row in sorted(latest.items()):
            for kind, column in MEMORY.items():
                if _number(row.get(column)):
                    memory.add_metric([str(rank), kind], float(row[column]))
        yield memory
        findings = GaugeMetricFamily("diagtrain_live_findings", "live findings standing now, by kind and severity",
                                     labels=["kind", "severity"])
        for (kind, severity), n in sorted(Counter((f["kind"], f["severity"]) for f in active).items()):
            findings.add_metric([kind, severity], n)
        yield findings
        yield from _job_metrics(job)

    def close(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def serve(host: str, port: int) -> LiveMetrics:
    """Serve ``/metrics`` on ``host:port`` from now on; OSError when the port cannot be bound (in use)."""
    metrics = LiveMetrics()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    metrics._server = server
    return metrics


def _job_metrics(job: dict[str, float]) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """The job's time so far by category (a counter: its rate per category is where the time goes now), and its
    goodput (the share of it spent computing)."""
    seconds = CounterMetricFamily("diagtrain_job_seconds", "the job's wall time so far, by where it went (compute, "
                                  "data, communication, imbalance, other, between, profiler, startup)",
                                  labels=["category"])
    for category, value in job.items():
        seconds.add_metric([category], value)
    yield seconds
    goodput = GaugeMetricFamily("diagtrain_goodput", "the share of the job's wall time so far spent computing")
    total = sum(job.values())
    if total > 0:
        goodput.add_metric([], job.get("compute", 0.0) / total)
    yield goodput


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
