"""host_contention: other processes on a host competed with the ranks for its CPUs.

Measured by run/host_load.py: the host's CPUs saturated while processes that are not the job's used
a good part of them (telemetry), or the ranks' main threads waiting for a CPU for a good share of
their steps (run-queue delay in steps.jsonl). Info: it is about the host, not the job, but it
explains noise in step times, and why a rank that looks slow is not reported as a straggler.
"""

from __future__ import annotations

from diagtrain.profiler.analyzer.judge.detectors.base import Steady, steady, steady_host_loads
from diagtrain.profiler.util.groups import distinct
from diagtrain.profiler.analyzer.judge.findings import Candidate
from diagtrain.profiler.analyzer.run.host_load import Contention
from diagtrain.profiler.analyzer.run.tables import Tables

# Its thresholds are the host loads' (run/host_load.py), with which judge/assessments/contention.py also lowers
# the stragglers and late ranks it explains.
SETTINGS = (Contention, Steady)


def detect(tables: Tables) -> list[Candidate]:
    """One info finding per host whose CPUs other processes contended, or whose ranks waited for a CPU."""
    s = Contention.active()
    contended = [(host, load) for host, load in sorted(steady_host_loads(tables).items()) if load.is_contended]
    # What it reads (not a copy of a long run's whole table), for the hosts found only (most are quiet)
    steps = steady(tables.steps[["rank", "step"]]) if contended else None
    findings = []
    for host, load in contended:
        stepped = distinct(steps.loc[steps["rank"].isin(load.ranks), "step"]).tolist()
        findings.append(Candidate(
            kind="host_contention", ranks=load.ranks, steps=stepped, time_range=load.time_range,
            facts={"host": host, "others_cpu_percent": load.others_percent, "host_cpu_percent": load.host_percent,
                   "contended_samples": load.contended, "samples": load.samples, "processes": load.processes,
                   "runq_ms": load.runq_ms, "runq_share": load.runq_share},
            metrics={"observed_others_cpu_percent": load.others_percent,
                     "threshold_others_cpu_percent": s.others_min_percent,
                     "host_cpu_percent": load.host_percent, "threshold_host_cpu_percent": s.saturated_percent,
                     "contended_samples": load.contended, "samples": load.samples,
                     "runq_ms_per_step": load.runq_ms, "runq_share": load.runq_share,
                     "threshold_runq_share": s.runq_min_share, "host": host},
            evidence=[{"type": "process", "host": host, **p} for p in load.processes],
        ))
    return findings
