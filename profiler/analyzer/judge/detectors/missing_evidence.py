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


def _finding(case: str, what: str, ranks: list[int], facts: dict | None = None, **metrics) -> Candidate:
    """One verdict ``what`` the evidence could not reach, and why (``case``, ``facts``: its words are
    report/words/missing_evidence.py's)."""
    return Candidate(kind="missing_evidence", ranks=ranks, facts={"case": case, **(facts or {})},
                     metrics={"check": what, **metrics})


def _too_few_steps(tables: Tables) -> Candidate | None:
    n = int(tables.steps["step"].nunique())
    steady = Steady.active()
    min_steps = steady.warmup_steps + steady.min_steady_steps
    if n >= min_steps:
        return None
    return _finding("too_few_steps", "step-to-step comparison", _ranks(tables),
                    {"steps": n, "min_steady_steps": steady.min_steady_steps, "min_steps": min_steps}, steps=n)


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
    return _finding("no_per_rank_evidence", "stragglers and data stalls", _ranks(tables),
                    {"profiled_steps": profiled, "min_profiled_steps": s.min_profiled_steps}, profiled_steps=profiled)


def _pipeline_without_busy_time(tables: Tables) -> Candidate | None:
    s = tables.structure
    if s.n_stages < 2 or stage_work(tables) is not None:
        return None
    return _finding("pipeline_without_busy_time", "pipeline stage balance", sorted(s.stages),
                    {"stages": s.n_stages, "stage_source": s.stage_source}, stages=s.n_stages)


def _hang_without_dumps(tables: Tables) -> Candidate | None:
    if tables.manifest.get("status") != "hung" or tables.dumps or tables.stacks:
        return None
    return _finding("hang_without_dumps", "where the job hangs", _ranks(tables))


def _ranks(tables: Tables) -> list[int]:
    return sorted(int(r) for r in tables.steps["rank"].unique())
