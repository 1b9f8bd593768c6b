"""missing_evidence: what the run did not record that a verdict needs, and how to get it.

A detector that finds nothing because it had nothing to look at must not read as "all is well".
In a synchronous job every rank's step takes as long as the slowest's, so step times alone cannot
say which rank is slow; a pipeline's stages cannot be compared without their busy time; a hang
cannot be located without the flight recorder or the ranks' stacks. Each finding here says which
verdict could not be reached and the command that would reach it.
"""

from __future__ import annotations

from diagtrain.profiler.analyzer.judge.detectors.base import Steady, informative_phases
from diagtrain.profiler.analyzer.judge.detectors.pipeline_bubble import stage_work
from diagtrain.profiler.analyzer.judge.findings import Candidate
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.util.settings import section, setting


@section("missing_evidence")
class MissingEvidence:
    """How much evidence a run must hold before its ranks can be compared step to step."""

    min_profiled_steps: int = setting(3, "fewer profiled steps cannot show how much a rank varies from step to step")


PROFILE_HINT = "diagtrain run --profile-steps 4-6 -- <your command>"
SETTINGS = (MissingEvidence, Steady)


def detect(tables: Tables) -> list[Candidate]:
    """One info finding per verdict the run's evidence could not reach, with how to reach it."""
    s = MissingEvidence.active()
    steps = tables.steps
    if steps.empty:
        return []
    found = [_too_few_steps(tables), _no_per_rank_evidence(tables, s), _pipeline_without_busy_time(tables),
             _hang_without_dumps(tables)]
    return [f for f in found if f is not None]


def _finding(what: str, missing: str, how: str, ranks: list[int], **metrics) -> Candidate:
    return Candidate(kind="missing_evidence", severity="info", ranks=ranks,
                   explanation=f"{what} could not be checked: {missing}.", suggestion=how,
                   metrics={"check": what, **metrics})


def _too_few_steps(tables: Tables) -> Candidate | None:
    n = int(tables.steps["step"].nunique())
    steady = Steady.active()
    min_steps = steady.warmup_steps + steady.min_steady_steps
    if n >= min_steps:
        return None
    return _finding("step-to-step comparison", f"only {n} step{'s' if n != 1 else ''} recorded; the first carries "
                    f"start-up and {steady.min_steady_steps} more are needed to compare ranks",
                    f"Run at least {min_steps + 2} steps.", _ranks(tables), steps=n)


def _no_per_rank_evidence(tables: Tables, s: MissingEvidence) -> Candidate | None:
    """Peers exist but nothing separates a rank's own work from its waiting for the others."""
    steps = tables.steps
    if not any(len(peers) > 1 for peers in tables.structure.peer_groups(_ranks(tables))):
        return None
    profiled = int(steps.loc[steps["profiled"], "step"].nunique()) if "profiled" in steps else 0
    phases = [p for p in informative_phases(tables.phases) if f"{p}_ms" in steps]
    counted = "comm_wait_ms" in steps and steps["comm_wait_ms"].notna().any()
    if phases or counted or profiled >= s.min_profiled_steps:
        return None
    if profiled:
        missing = (f"only {profiled} profiled step{'s' if profiled != 1 else ''}: a rank's step-to-step variation "
                   "is unknown, so only a very large excess would count")
    else:
        missing = ("no profiled steps and no per-step times of each rank's own work (data wait, compute, time in "
                   "collectives): in a synchronous job every rank's step lasts as long as the slowest's, so step "
                   "times cannot say which rank is slow or waits for data")
    return _finding("stragglers and data stalls", missing,
                    f"Profile {s.min_profiled_steps} or more steps after warm-up: `{PROFILE_HINT}` (or time phases "
                    "with diagtrain.profiler.instrument.StepRecorder).", _ranks(tables), profiled_steps=profiled)


def _pipeline_without_busy_time(tables: Tables) -> Candidate | None:
    s = tables.structure
    if s.n_stages < 2 or stage_work(tables) is not None:
        return None
    return _finding("pipeline stage balance",
                    f"a pipeline of {s.n_stages} stages was found (from {s.stage_source}) but no stage's busy time "
                    "per step was recorded", f"Profile a few steps: `{PROFILE_HINT}`.", sorted(s.stages),
                    stages=s.n_stages)


def _hang_without_dumps(tables: Tables) -> Candidate | None:
    if tables.manifest.get("status") != "hung" or tables.dumps or tables.stacks:
        return None
    return _finding("where the job hangs", "no rank left a flight-recorder dump or its stacks",
                    "Run the job under `diagtrain run` (it dumps every rank's state when steps stop), or pass the "
                    "dumps NCCL wrote on its timeout: `diagtrain analyze RUN --flight-recorder DIR`.", _ranks(tables))


def _ranks(tables: Tables) -> list[int]:
    return sorted(int(r) for r in tables.steps["rank"].unique())
