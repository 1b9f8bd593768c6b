"""Judgement, in the order it happens: the detectors propose candidates, the assessments weigh them, and
judge/verdict.py decides each finding once. The final analysis and live judgement both call :func:`judge`.

Adding a detector: its module in ``detectors/`` (a ``detect(tables) -> list[Candidate]`` and, for its
thresholds, a settings class registered with ``settings.section``), its kinds in judge/kinds.py, each kind's
severity rule in assessments/proposal.py and its words in report/words/.
Adding an assessment: a :class:`Step` in ``ASSESSMENTS`` (a function ``(findings, results so far, context) ->
Assessed``, the typed records it leaves and those of earlier steps it reads), with its name in judge/verdict.py
(where its say on severity and impact, if it has one, is ranked against the others').
Every finding records the settings its detector and its assessments ran with (``Finding.settings``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

import pandas as pd

from diagtrain.profiler.util import settings
from diagtrain.profiler.util.heap import release_freed_memory
from diagtrain.profiler.analyzer.judge import kinds
from diagtrain.profiler.analyzer.judge.assessments import (contention, critical_path, job_price, ledger_price, price_check,
                                                           traced_excess)
from diagtrain.profiler.analyzer.judge.assessments.contention import MoreWork, NotOwnWork
from diagtrain.profiler.analyzer.judge.assessments.critical_path import ReplayCheck
from diagtrain.profiler.analyzer.judge.assessments.ledger_price import LedgerPrice
from diagtrain.profiler.analyzer.judge.assessments.traced_excess import TracedExcess
from diagtrain.profiler.analyzer.judge.model_check import expected
from diagtrain.profiler.analyzer.judge.detectors.base import job_totals
from diagtrain.profiler.analyzer.judge.assessments.explained import explained
from diagtrain.profiler.analyzer.judge.findings import Candidate, Finding, order
from diagtrain.profiler.analyzer.judge.verdict import Assessed, Judged, Results, verdict
from diagtrain.profiler.analyzer.run import replay
from diagtrain.profiler.analyzer.run.replay import RunPaths, StepPath
from diagtrain.profiler.analyzer.run.tables import Tables

# The detector modules, in the order they run, and those not asked while a job runs (what a stopped or finished
# job leaves: dumps and exit records, what a finished run lacks, its whole wall time): from the kinds table.
DETECTORS = kinds.detectors()
NOT_LIVE = kinds.not_live()


@dataclass
class Context:
    """What assessments read besides the findings: the tables, each rank's traced spans, the critical paths."""

    tables: Tables
    spans_of: Callable[[int], pd.DataFrame | None]
    paths: RunPaths | None = None


@dataclass(frozen=True)
class Step:
    """One assessment step: its name, the assessment, and the typed records it leaves on the findings (``makes``)
    and reads of the steps before it (``reads``: each made by a step listed earlier, tests/test_verdict.py)."""

    name: str
    assess: Callable[[list[Finding], list[Results], Context], Assessed]
    makes: tuple[type, ...] = ()
    reads: tuple[type, ...] = ()


# The assessments, in order: each sees the findings as the ones before decided them (judge/verdict.py), with the
# records those left (``Results``).
ASSESSMENTS: tuple[Step, ...] = (
    # Stragglers and data stalls priced by what they cost the job over the whole run (the ledger), with
    # one severity rule; a cause in the ledger that no detector named becomes a candidate.
    Step("cost", lambda found, prior, c: ledger_price.priced(found, c.tables), makes=(LedgerPrice,)),
    # What every rank lost together (input, periodic stalls, start-up) priced by the job's own ledger, by the
    # same severity rule.
    Step("job cost", lambda found, prior, c: job_price.priced(found, c.tables)),
    # A rank slowed by other processes on its host, or by its allocator's memory churn, is information and
    # said so: it is not a straggler or a late rank. What the ledger priced as a pattern is the rank's own.
    Step("host contention", lambda found, prior, c: contention.own_work_only(found, prior, c.tables),
         makes=(NotOwnWork,), reads=(LedgerPrice,)),
    # A rank doing more work than its peers on a host with fewer CPUs than ranks, which the step times hide:
    # named with the severity its cost with a CPU per rank deserves, as an estimate.
    Step("more work", lambda found, prior, c: contention.hidden_work(found, c.tables), makes=(MoreWork,)),
    # A late arrival that a straggler explains says nothing new.
    Step("explained", lambda found, prior, c: explained(found)),
    # Where a priced rank's excess went in its traced steps; where a periodic stall's went in its traced stalls.
    Step("traced excess", lambda found, prior, c: traced_excess.refine(found, prior, c.tables, c.spans_of),
         makes=(TracedExcess,), reads=(LedgerPrice,)),
    Step("traced stall", lambda found, prior, c: traced_excess.stall_operators(found, c.tables, c.spans_of),
         makes=(TracedExcess,)),
    # The what-if of the profiled steps: a straggler's price where the ledger has none, its check where it has.
    Step("critical path", lambda found, prior, c: critical_path.with_impacts(found, prior, c.paths, c.tables.ledger)
         if c.paths is not None else Assessed(), makes=(ReplayCheck,), reads=(LedgerPrice,)),
    # The two prices against each other.
    Step("price check", lambda found, prior, c: price_check.disputed(found, prior), reads=(LedgerPrice, ReplayCheck)),
)


def misordered(steps: tuple[Step, ...] = ASSESSMENTS) -> list[str]:
    """Each step listed before one that makes a record it reads, or reading a record no step makes (none: in order)."""
    made: set[type] = set()
    found = []
    for step in steps:
        found += [f"{step.name} reads {kind.__name__}, which no step before it makes" for kind in step.reads
                  if kind not in made]
        made.update(step.makes)
    return found


def detector_modules() -> dict[str, ModuleType]:
    """name -> detector module, in registration order."""
    return {name: importlib.import_module(f"{__package__}.detectors.{name}") for name in DETECTORS}


@dataclass
class Judgement:
    """What judgement gives the report: the findings, ranked, and the sections they rest on (each profiled step's
    critical path, or the error that stopped their tracing: report/critical_path_section.py makes their section)."""

    findings: list[Finding]
    paths: list[StepPath] | None
    paths_failure: str | None
    expected: dict[str, Any] | None
    ledger: dict[str, Any] | None
    job_time: dict[str, Any] | None = None


def judge(t: Tables, spans_of: Callable[[int], pd.DataFrame | None], progress: Callable[[str], None],
          notes: list[dict] | None = None, live: bool = False) -> Judgement:
    """Detectors, assessments, verdicts; the critical path and expected vs measured. ``live``: a running job's
    window (no stop or end-of-run detectors, no report sections, no progress lines: only failures go to
    ``progress``). A failing step is reported, never fatal."""
    status = (lambda _: None) if live else progress
    status("running the detectors")
    # A finished run's memory: what each stage freed handed back before the next (a long run's peak is one stage's);
    # a live window is small, and judged every few seconds.
    trim = (lambda: None) if live else release_freed_memory
    trim()
    judged = Judged(run_detectors(t, progress, notes, only=[d for d in DETECTORS if d not in NOT_LIVE] if live else None,
                                  trim=trim))
    status("tracing the critical path")  # from the tables alone: its replay assesses the findings below
    paths, paths_failure = trace_critical_path(t, progress)
    context = Context(t, spans_of, paths)
    for step in ASSESSMENTS:
        try:
            judged.take(step.assess(judged.findings(), judged.results(), context))
        except Exception as e:  # noqa: BLE001 - the findings stand as they were
            progress(f"{step.name} check failed: {type(e).__name__}: {e}")
        trim()
    findings = judged.findings()
    if live:
        return Judgement(findings, _steps_of(paths), paths_failure, None, None)
    model_section, model_findings = check_expected(t, spans_of, progress)
    return Judgement(order(findings + model_findings), _steps_of(paths), paths_failure, model_section, ledger_section(t, progress),
                     job_time_section(t, progress))


def job_time_section(t: Tables, progress: Callable[[str], None]) -> dict[str, Any] | None:
    """The report's "where the job's time went" (run/job_time.py); None without steps; a failure is reported."""
    try:
        totals = job_totals(t)
        return totals.to_json() if totals is not None else None
    except Exception as e:  # noqa: BLE001 - the findings stand without it
        progress(f"job time failed: {type(e).__name__}: {e}")
        return {"available": False, "reason": f"{type(e).__name__}: {e}"}


def ledger_section(t: Tables, progress: Callable[[str], None]) -> dict[str, Any] | None:
    """The report's "where the time went"; a failure is reported, never fatal."""
    try:
        return ledger_price.ledger_section(t)
    except Exception as e:  # noqa: BLE001 - the findings stand without it
        progress(f"ledger failed: {type(e).__name__}: {e}")
        return {"available": False, "reason": f"{type(e).__name__}: {e}"}


def run_detectors(t: Tables, progress: Callable[[str], None], notes: list[dict] | None = None,
                  only: list[str] | None = None, trim: Callable[[], None] = lambda: None) -> list[Candidate]:
    """Every registered detector's candidates (those named in ``only``, when given), each stamped with the
    settings it ran with."""
    found = []
    for name, module in detector_modules().items():
        if only is not None and name not in only:
            continue
        try:
            made = module.detect(t)
        except Exception as e:  # noqa: BLE001 - one broken detector must not hide the others
            progress(f"detector {name} failed: {type(e).__name__}: {e}")
            if notes is not None:
                notes.append({"check": "detector", "severity": "warning",
                              "message": f"the {name} detector failed ({type(e).__name__}: {e}); its findings are "
                                         "missing from this report"})
            continue
        used = _settings_of(module)
        for f in made:
            f.settings = {**used, **f.settings}
        found += made
        trim()  # a detector's temporaries (a long run's copies of its steps), before the next's
    return found


def trace_critical_path(t: Tables, progress: Callable[[str], None]) -> tuple[RunPaths | None, str | None]:
    """The critical paths, or None and why; a failure is reported, never fatal."""
    try:
        return replay.analyze(t), None
    except Exception as e:  # noqa: BLE001 - the findings stand without it
        progress(f"critical path failed: {type(e).__name__}: {e}")
        return None, f"{type(e).__name__}: {e}"


def _steps_of(paths: RunPaths | None) -> list[StepPath] | None:
    """The paths the report shows, without the graphs the what-ifs replayed (a long run's are large)."""
    return paths.paths if paths is not None else None


def check_expected(t: Tables, spans_of: Callable[[int], pd.DataFrame | None],
                   progress: Callable[[str], None]) -> tuple[dict | None, list[Finding]]:
    """The expected-vs-measured section and its findings; a failure is reported, never fatal."""
    try:
        section, found = expected.check(t, spans_of)
    except Exception as e:  # noqa: BLE001 - the model's check must not take the analysis down
        progress(f"expected vs measured failed: {type(e).__name__}: {e}")
        return {"available": False, "reason": f"{type(e).__name__}: {e}"}, []
    used = _settings_of(expected)
    for f in found:
        f.settings = {**used, **f.settings}
    return section, [verdict(c, []) for c in found]  # the model's own judgement: no assessment weighs it


def _settings_of(module: ModuleType) -> dict[str, Any]:
    """``{"section.name": value}`` of the settings classes a module declares it judges with."""
    out: dict[str, Any] = {}
    for cls in getattr(module, "SETTINGS", ()):
        out.update(settings.values(cls.active()))
    return out


def all_sections() -> dict[str, type]:
    """Every settings section of the analyzer (importing every judging module registers them)."""
    detector_modules()
    importlib.import_module(f"{__package__}.live_judge")  # live judgement's own: how often, over which steps
    importlib.import_module("diagtrain.profiler.analyzer.run.clocks")  # when ranks' clocks disagree
    importlib.import_module("diagtrain.profiler.analyzer.per_rank.reading")  # how a rank's trace is read
    return dict(settings.SECTIONS)
