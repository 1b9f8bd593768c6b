"""host_contention: other processes on a host competed with the ranks for its CPUs.

Measured by run/host_load.py: the host's CPUs saturated while processes that are not the job's used
a good part of them (telemetry), or the ranks' main threads waiting for a CPU for a good share of
their steps (run-queue delay in steps.jsonl). Info: it is about the host, not the job, but it
explains noise in step times, and why a rank that looks slow is not reported as a straggler.
"""

from __future__ import annotations

from diagtrain.profiler.analyzer.judge.detectors.base import Steady, steady, steady_host_loads
from diagtrain.profiler.util.groups import distinct
from diagtrain.profiler.util.text import ranges
from diagtrain.profiler.analyzer.judge.findings import Candidate
from diagtrain.profiler.analyzer.run.host_load import Contention
from diagtrain.profiler.analyzer.run.tables import Tables

# Its thresholds are the host loads' (run/host_load.py), with which judge/assessments/contention.py also lowers
# the stragglers and late ranks it explains.
SETTINGS = (Contention, Steady)


def detect(tables: Tables) -> list[Candidate]:
    """One info finding per host whose CPUs other processes contended, or whose ranks waited for a CPU."""
    s = Contention.active()
    steps = steady(tables.steps[["rank", "step"]])  # what it reads: not a copy of a long run's whole table
    findings = []
    for host, load in sorted(steady_host_loads(tables).items()):
        if not load.is_contended:
            continue
        stepped = distinct(steps.loc[steps["rank"].isin(load.ranks), "step"]).tolist()
        said = []
        if load.contended:
            said.append(f"Other processes on host {host} used {load.others_percent / 100:.1f} CPU cores while the job "
                        f"ran (host CPUs {load.host_percent:.0f}% busy in {load.contended} of {load.samples} samples)"
                        + (f": {load.named()}." if load.processes else "."))
        if load.runq_ms is not None and load.runq_share is not None:
            said.append(f"Ranks {ranges(load.ranks)} waited {load.runq_ms:.1f} ms per step ({load.runq_share:.0%}) "
                        "for a CPU.")
        findings.append(Candidate(
            kind="host_contention", severity="info", ranks=load.ranks, steps=stepped, time_range=load.time_range,
            explanation=" ".join(said) + " Step times and differences between ranks on this host reflect the host's "
                        "load as much as the job; a rank slowed by it is not reported as a straggler.",
            suggestion="Run on a host of its own, or keep other work off the ranks' cores (taskset, cgroups); "
                       "compare runs only from similarly loaded hosts.",
            metrics={"observed_others_cpu_percent": load.others_percent,
                     "threshold_others_cpu_percent": s.others_min_percent,
                     "host_cpu_percent": load.host_percent, "threshold_host_cpu_percent": s.saturated_percent,
                     "contended_samples": load.contended, "samples": load.samples,
                     "runq_ms_per_step": load.runq_ms, "runq_share": load.runq_share,
                     "threshold_runq_share": s.runq_min_share, "host": host},
            evidence=[{"type": "process", "host": host, **p} for p in load.processes],
            impact_ms=load.runq_ms,
        ))
    return findings
