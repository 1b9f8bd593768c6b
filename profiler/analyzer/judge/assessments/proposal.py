"""A candidate's proposal: the severity and impact its own measurements say, by its kind's rule.

A detector decides whether there is a candidate at all (its thresholds); how bad it is, and what removing it would
save, is decided here, one small rule per kind, from the candidate's metrics and facts and its proposer's settings.
``verdict.verdict()`` makes the proposal of every candidate, and it decides where no assessment has a say
(``PROPOSAL`` comes last in ``SEVERITY_FROM`` and ``IMPACT_FROM``). Every kind in judge/kinds.py has a rule
(tests/test_verdict.py).
"""

from __future__ import annotations

from typing import Callable

from diagtrain.profiler.analyzer.judge.assessments.ledger_price import EVERY_STEP, Cost, severity as cost_severity
from diagtrain.profiler.analyzer.judge.detectors.exposed_communication import ExposedCommunication
from diagtrain.profiler.analyzer.judge.detectors.memory_growth import MemoryGrowth
from diagtrain.profiler.analyzer.judge.detectors.straggler import Straggler
from diagtrain.profiler.analyzer.judge.findings import Candidate, Finding
from diagtrain.profiler.analyzer.judge.verdict import PROPOSAL, Assessment

Rule = Callable[[Candidate], Assessment]


def proposed(candidate: Candidate) -> Assessment:
    """The candidate's proposal; a finding judged again (the assessments' tests) proposes what it was decided."""
    if isinstance(candidate, Finding):
        return _says(candidate.severity, candidate.impact_ms)
    case = candidate.facts.get("case")
    return RULES.get(f"{candidate.kind}/{case}", RULES[candidate.kind])(candidate)


def _says(severity: str, impact_ms: float | None = None) -> Assessment:
    return Assessment(PROPOSAL, severity=severity, impact_ms=impact_ms, prices=True)


def _always(severity: str) -> Rule:
    """The rule of a kind always proposed at one severity, with no saving of its own."""
    return lambda _: _says(severity)


def _straggler(c: Candidate) -> Assessment:
    """info for the same work done more slowly, or a rank slow in fewer than ``persistent_share`` of the steps it could
    be seen in (a busy host's pauses); error at ``error_share`` of the step or more; else warning."""
    s, f = Straggler.active(), c.facts
    if f["same_work"] or f["seen_share"] < s.persistent_share:
        severity = "info"
    else:
        severity = "error" if c.metrics["excess_ms"] >= s.error_share * c.metrics["step_time_median_ms"] else "warning"
    return _says(severity, f["lost_ms_per_step"])


def _slow_collective(c: Candidate) -> Assessment:
    """A rank late on its way to its collectives: warning, everyone waiting for it; late from its own work earlier in
    the step (a straggler's doing): info. Transfers slow for their size: warning on GPU; info on CPU (gloo), where
    they follow the host's load."""
    f = c.facts
    if f["case"] == "late_arrival":
        return _says("warning", f["lost_ms_per_step"]) if f["before_calls"] else _says("info")
    return _says("warning" if f["on_gpu"] else "info")


def _ledger(c: Candidate) -> Assessment:
    """A cause the ledger charged that no detector named: the cost rule on the share of the run it held; its saving,
    the ledger's, or less where a crowded host's free CPUs bound it."""
    return _says(cost_severity(c.metrics["share_of_run"], c.metrics["pattern"], Cost.active()),
                 c.metrics.get("cpu_bound_ms", c.metrics["lost_ms_per_step"]))


def _more_work(c: Candidate) -> Assessment:
    """A rank doing more work than its peers on a crowded host: the cost rule on its estimated share of a step with a
    CPU per rank (an estimate: no saving claimed)."""
    return _says(cost_severity(c.facts["share"], EVERY_STEP, Cost.active()))


def _exposed_communication(c: Candidate) -> Assessment:
    # On CPU (gloo) toy runs communication dominates by construction: informative, not a defect, and no saving is
    # claimed (nothing in the job can overlap what the host itself blocks on).
    on_gpu = c.facts["on_gpu"]
    warn = on_gpu and c.metrics["observed_share"] >= ExposedCommunication.active().warn_share_gpu
    return _says("warning" if warn else "info", c.metrics["exposed_ms_per_step"] if on_gpu else None)


def _memory_growth(c: Candidate) -> Assessment:
    """error where a memory that grows would be full within ``error_horizon_min`` at its pace, else warning."""
    minutes = [g["steps_left"] * g["step_ms"] / 60e3 for g in c.facts["growths"]
               if g["steps_left"] is not None and g["step_ms"] > 0]
    return _says("error" if minutes and min(minutes) <= MemoryGrowth.active().error_horizon_min else "warning")


# The rule of each kind (judge/kinds.py's ``severity`` column says it in words), or of a case (``kind/case``) where
# its proposer is not the kind's detector.
RULES: dict[str, Rule] = {
    # Why the run stopped (judge/detectors/hang.py): it stopped the run, except a job that failed only on its way out,
    # and an interruption of the whole run while its ranks made progress (only a fact).
    "hang": _always("critical"),
    "crash": _always("critical"),
    "crash_at_exit": _always("error"),
    "host_lost": _always("critical"),
    "interrupted": lambda c: _says("info" if c.facts["whole_run"] else "critical"),
    "collective_mismatch": _always("critical"),
    "sequence_divergence": _always("critical"),
    "straggler": _straggler,
    "straggler/ledger": _ledger,
    "straggler/more_work": _more_work,
    "dataloader_stall": lambda c: _says("warning", c.facts["lost_ms_per_step"]),
    "dataloader_stall/ledger": _ledger,
    "memory_imbalance": _always("warning"),
    # Too few microbatches or unequal stages: warning, with what fixing it saves; a pipeline balanced as measured: info.
    "pipeline_bubble": lambda c: (_says("info") if c.facts["case"] == "balanced" else
                                  _says("warning", c.facts["lost_ms_per_step"])),
    "slow_collective": _slow_collective,
    "exposed_communication": _exposed_communication,
    "nccl_transport": _always("warning"),
    "gpu_throttling": _always("warning"),
    "low_utilization": _always("warning"),
    "host_contention": lambda c: _says("info", c.metrics["runq_ms_per_step"]),  # the time its ranks waited for a CPU
    "memory_growth": _memory_growth,
    "missing_evidence": _always("info"),
    "input_bound": _always("info"),  # its price, and severity, are the job's ledger's (judge/assessments/job_price.py)
    "periodic_stall": _always("info"),
    "slow_startup": _always("info"),
    # The run against the model of its layout (judge/model_check/expected.py): on CPU (gloo) a shared host stalls
    # ranks by turns and every wait looks like bubble, information there.
    "state_mismatch": _always("warning"),
    "unexpected_communication": _always("warning"),
    "bubble_above_model": lambda c: _says("warning" if c.facts["on_gpu"] else "info"),
    "memory_above_model": _always("warning"),
    "slow_collective_group": _always("warning"),
    "no_progress": _always("warning"),  # live judgement's own (judge/live_judge.py)
}
