"""Every kind of finding, in one table: who proposes it, whether it is judged while the job runs, whether it says
why the run stopped, how its severity is decided, the settings it is judged with, and its page.

The lists that judgement and the documentation need are read from here: the detector modules and their order
(judge/judgement.py), the ones not asked while a job runs, the verdicts on why a run stopped (judge/findings.py).
A kind made anywhere in the analyzer that is not in this table fails tests/test_docs.py.
"""

from __future__ import annotations

from dataclasses import dataclass

# Who proposes a kind besides a detector module (detectors/<name>.py).
MODEL_CHECK = "model check"  # judge/model_check/expected.py: the run against the model of its layout (a finished run only)
LIVE = "live"  # judge/live_judge.py: what only a running job shows


@dataclass(frozen=True)
class Kind:
    """One kind of finding."""

    name: str
    detector: str  # the detector module that proposes it, MODEL_CHECK or LIVE
    live: bool  # judged in a running job's window too (else only when the run has ended)
    stop: bool  # a verdict on why the run stopped: read first, whatever its severity
    severity: str  # how its severity is decided, in words (in code: its rule, judge/assessments/proposal.py)
    # The settings sections its page shows (each on one page: the hang detector's other verdicts are judged with
    # the sections of the hang page).
    settings: tuple[str, ...] = ()

    @property
    def page(self) -> str:
        """Its page of the findings reference, from the repository's root."""
        return f"docs/findings/{self.name}.md"


SHARE_RULE = "by the share of the run it cost (cost.*): error, warning or info; info where it came and went"
STOPPED = "critical: it stopped the run"

# In the order detectors run (and findings of equal rank are shown): a detector's first kind places it.
KINDS: tuple[Kind, ...] = (
    Kind("hang", "hang", False, True, STOPPED, ("hang",)),
    Kind("crash", "hang", False, True, STOPPED),
    Kind("crash_at_exit", "hang", False, True, "error: the training finished, the job failed on its way out"),
    Kind("host_lost", "hang", False, True, STOPPED),
    Kind("interrupted", "hang", False, True, "info while the ranks made progress; critical for a multi-host job"),
    Kind("collective_mismatch", "hang", False, True, STOPPED),
    Kind("sequence_divergence", "hang", False, True, STOPPED),
    Kind("straggler", "straggler", True, False, SHARE_RULE + "; info where the excess is not the rank's own work",
         ("straggler", "own_time", "traced_excess", "onset")),
    Kind("dataloader_stall", "dataloader_stall", True, False, SHARE_RULE, ("dataloader_stall",)),
    Kind("memory_imbalance", "memory_imbalance", True, False, "warning", ("memory_imbalance",)),
    Kind("pipeline_bubble", "pipeline_bubble", True, False, "warning; info for a pipeline balanced as measured",
         ("pipeline_bubble",)),
    Kind("slow_collective", "slow_collective", True, False, "warning; info on CPU",
         ("slow_collective", "late_arrival")),
    Kind("exposed_communication", "exposed_communication", True, False, "info on CPU, warning on GPU",
         ("exposed_communication",)),
    Kind("nccl_transport", "nccl_transport", True, False, "warning", ("nccl_transport",)),
    Kind("gpu_throttling", "gpu_throttling", True, False, "warning", ("gpu_throttling",)),
    Kind("low_utilization", "low_utilization", True, False, "warning", ("low_utilization",)),
    Kind("host_contention", "host_contention", True, False, "info", ("contention",)),
    Kind("memory_growth", "memory_growth", True, False, "error where memory runs out within the horizon, else warning",
         ("memory_growth",)),
    Kind("missing_evidence", "missing_evidence", False, False, "info", ("missing_evidence",)),
    Kind("input_bound", "input_bound", True, False, SHARE_RULE, ("input_bound",)),
    Kind("periodic_stall", "periodic_stall", True, False, SHARE_RULE, ("periodic_stall",)),
    Kind("slow_startup", "slow_startup", False, False, "info; warning at the error share of the wall time",
         ("slow_startup",)),
    Kind("state_mismatch", MODEL_CHECK, False, False, "warning"),
    Kind("unexpected_communication", MODEL_CHECK, False, False, "warning"),
    Kind("bubble_above_model", MODEL_CHECK, False, False, "warning; info on CPU"),
    Kind("memory_above_model", MODEL_CHECK, False, False, "warning"),
    Kind("slow_collective_group", MODEL_CHECK, False, False, "warning"),
    Kind("no_progress", LIVE, True, False, "warning", ("live",)),
)
BY_NAME = {k.name: k for k in KINDS}


def detectors() -> tuple[str, ...]:
    """The detector modules (detectors/<name>.py), in the order they run."""
    return tuple(dict.fromkeys(k.detector for k in KINDS if k.detector not in (MODEL_CHECK, LIVE)))


def not_live() -> tuple[str, ...]:
    """The detector modules not asked while a job runs: every kind they propose is judged at the run's end."""
    return tuple(d for d in detectors() if not any(k.live for k in KINDS if k.detector == d))


def stop_kinds() -> tuple[str, ...]:
    """The verdicts on why a run stopped."""
    return tuple(k.name for k in KINDS if k.stop)
