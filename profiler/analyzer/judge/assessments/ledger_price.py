"""What each cause cost the job, from the ledger of time (run/ledger.py): findings priced, ranked and judged by it.

A cause is a rank and the part of its step (a phase, or work outside the phases) in which the others
waited for it. Its cost is the job's wall time that removing it would have saved, step by step over
the whole run (not only the profiled steps), so a cause present in every step, one that recurs every
k steps (a checkpoint, an evaluation) and one that happened twice are told apart and priced alike.
A step is charged to a cause only above the noise measured on the run itself. Severity follows one
rule for every kind (:func:`severity`): the share of the run's time lost, and whether the cause is a
pattern (every step, or periodic) or came and went.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.judge.detectors.base import Onset, Steady, onset, profiled_steps, steady
from diagtrain.profiler.analyzer.judge.findings import SEVERITIES, UPPER_BOUND, Candidate, Finding
from diagtrain.profiler.analyzer.judge.own_time import SOURCE as COUNTERS
from diagtrain.profiler.analyzer.judge.quantities import CAUSE_OF, Measure, Quantity, SlowCause
from diagtrain.profiler.analyzer.judge.verdict import LEDGER, Assessed, Assessment
from diagtrain.profiler.analyzer.run.ledger import (DEVICE_BUSY, DEVICE_IDLE, OUTSIDE, crowded_hosts,
                                                    work_column)
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.util.settings import section, setting, values
from diagtrain.profiler.util.groups import Groups, distinct, ranked
from diagtrain.profiler.util.stats import MAD_TO_SIGMA
from diagtrain.profiler.util.text import ranges

EVERY_STEP, INTERMITTENT = "every step", "intermittent"
RECORDS = ("phases", COUNTERS, "device")  # the kinds of evidence (a finding's ``source``) read from every step's records


@section("cost")
class Cost:
    """When a step is charged to a cause, how a cause's pattern is named, and how much lost time matters."""

    noise_sigmas: float = setting(3.0, "a step is charged to a cause only when its saving exceeds this many robust "
                                  "standard deviations of the ranks' own step-to-step variation in this run")
    min_saving_ms: float = setting(2.0, "... and at least this many ms: timer resolution and scheduling jitter")
    min_steps: int = setting(2, "a cause charged in a single step is an accident, not a pattern")
    every_step_share: float = setting(0.6, "charged in this share of the steady steps or more: present in every step")
    min_periods: int = setting(3, "a period is named only when the cause recurs at a fixed interval this many times")
    warning_share: float = setting(0.05, "a pattern that cost the job this share of its steady time is worth a warning")
    error_share: float = setting(0.25, "... and this share, an error: a quarter of the run lost to one cause")
    validated_kinds: str = setting("straggler,dataloader_stall,slow_collective,input_bound,periodic_stall",
                                   "kinds whose price benchmarks/impact.py holds within 30% of the saving measured "
                                   "against a clean twin; others claim a bound ('up to')")
    min_replay_coverage: float = setting(0.6, "the critical path's what-if is a check of the ledger's price only where "
                                         "its graph models this share of the ranks' blocked time as waits (3D jobs "
                                         "on 2 shared cores: under half, the waits sit inside operators)")
    cpu_floor_slack: float = setting(1.1, "a step's CPU floor (run/ledger.py) up to this times the step means a full "
                                     "host (CPU and wall time are read at slightly different instants); above it the "
                                     "counters disagree and the host's CPUs bound nothing")
    charged_steps_listed: int = setting(1000, "charged steps a finding's metrics list (the first ones): a report of a "
                                        "100,000-step run stays small, and later passes judge them as a sample")
    disagree_share: float = setting(0.3, "the critical path's what-if and the ledger disagree when they differ by more "
                                    "than this share of the larger (and by more than the noise)")


@dataclass
class Cause:
    """One rank's part of the step that the others waited for, and what it cost the job."""

    rank: int
    part: str  # a phase, or OUTSIDE
    steps: list[int]  # the steady steps charged to it
    lost_ms: float  # job wall time it cost, summed over those steps
    per_step_ms: float  # ... averaged over every steady step of the run
    share: float  # ... as a share of the run's steady time
    pattern: str  # EVERY_STEP, "every k steps", or INTERMITTENT
    period: int | None
    own_ms: float  # the rank's median work in that part, in the charged steps
    peer_ms: float  # its peers' median there
    cpu_bounded_ms: float  # at most what removing it saves, given the CPUs its host had free (= lost_ms if unbounded)
    onset: int | None = None  # the step it began at, where it came far more often from there on (base.onset)
    blips: list[int] = field(default_factory=list)  # steps charged before its onset: another cause's, told apart

    def to_json(self) -> dict[str, Any]:
        """The report's record of this cause."""
        return {"rank": self.rank, "part": self.part, "steps": self.steps, "lost_s": round(self.lost_ms / 1e3, 4),
                "per_step_ms": round(self.per_step_ms, 3), "share": round(self.share, 4), "pattern": self.pattern,
                "period_steps": self.period, "own_ms": round(self.own_ms, 3), "peer_ms": round(self.peer_ms, 3),
                "cpu_bounded_s": round(self.cpu_bounded_ms / 1e3, 4), "onset": self.onset,
                "blips_before_onset": len(self.blips)}


@dataclass(frozen=True)
class LedgerPrice:
    """The ledger's price of a finding (its causes'): the record the assessments after it read, and the metrics the
    finding carries."""

    lost_ms: float  # job wall time its causes cost, over the steady steps
    per_step_ms: float  # ... per steady step
    share: float  # ... as a share of the run's steady time
    pattern: str  # EVERY_STEP, "every k steps", or INTERMITTENT: its costliest cause's
    period: int | None
    # The steps the price is about (the first ones of a long run: later passes judge them as a sample).
    charged_steps: list[int]
    charged_ms_per_step: float  # the costliest cause's saving in each of its charged steps
    noise_ms: float  # the run's noise the charges stood above
    profiled_ms: float | None  # its mean saving over the profiled steps: what the critical path replays

    def to_metrics(self) -> dict[str, Any]:
        """The finding's metrics of it."""
        return {"lost_s": round(self.lost_ms / 1e3, 4), "lost_ms_per_step": self.per_step_ms,
                "share_of_run": self.share, "pattern": self.pattern, "period_steps": self.period,
                "charged_steps": self.charged_steps, "charged_ms_per_step": self.charged_ms_per_step,
                "ledger_noise_ms": self.noise_ms, "ledger_profiled_ms": self.profiled_ms, "impact_source": "ledger"}


SETTINGS = (Cost, Steady)


def noise_ms(ledger: pd.DataFrame) -> float:
    """The ranks' own step-to-step variation (robust standard deviation of running time, median over ranks)."""
    # All ranks at once (a function per rank was a fifth of a live judgement of 64 ranks), np.median's numbers.
    # Each rank's rows gathered once for both medians, its spread one number, not one per row (7 ms of 10 at 8,192
    # ranks x 20 steps went to a second gathering and a sort of the ranks for a row of each).
    running = ledger["running_ms"].to_numpy(dtype=float)
    block = _by_rank(ledger["rank"].to_numpy(), running)
    if block is not None:  # a (ranks, steps) array: numpy's medians of its rows, 4 ms less than the groups' here
        spread = MAD_TO_SIGMA * np.median(np.abs(block - np.median(block, axis=1)[:, None]), axis=1)
    else:
        ranks, codes = ranked(ledger["rank"].to_numpy())
        by = Groups(codes, len(ranks))
        spread = MAD_TO_SIGMA * by.median(np.abs(running - by.median(running)[codes]))
    # The median of the ranks' spreads: the same, in whatever order the ranks come
    return float(pd.Series(spread).median()) if len(spread) else 0.0


def _by_rank(ranks: np.ndarray, values: np.ndarray) -> np.ndarray | None:
    """``values`` as a (ranks, rows) array, where the rows are by rank, each rank's together and as many as every
    other's (a live window's ledger: by rank, then step); else None."""
    if not len(ranks) or ranks.dtype.kind not in "iu":
        return None
    size = int(np.argmax(ranks != ranks[0])) or len(ranks)  # the first rank's rows
    if len(ranks) % size:
        return None
    by_rank = ranks.reshape(-1, size)
    if not ((by_rank == by_rank[:, :1]).all() and (by_rank[1:, 0] > by_rank[:-1, 0]).all()):
        return None  # not one block per rank (a rank's rows apart, or ranks of fewer rows)
    return values.reshape(-1, size)


def causes(t: Tables, c: Cost | None = None) -> tuple[list[Cause], dict[str, Any]]:
    """Every cause charged in the run's steady steps, costliest first; and the run's totals. Made once per
    ledger and settings: the pricing assessment and the report's ledger section both read them (each pass
    over a long run's ledger took a second at 2 x 500,000 steps)."""
    c = c or Cost.active()
    settings = tuple(tuple(values(s).items()) for s in (c, Steady.active(), Onset.active()))
    held = t.memo.get("causes")
    if held is None or held[0] is not t.ledger or held[1] != settings:
        held = t.memo["causes"] = (t.ledger, settings, _causes(t, c))
    found, totals = held[2]
    return list(found), dict(totals)


def _causes(t: Tables, c: Cost) -> tuple[list[Cause], dict[str, Any]]:
    read = CAUSE_COLUMNS + tuple(c for c in t.ledger.columns if str(c).startswith("work_"))
    # Arrays of steps, not lists: a long run's cause is charged in hundreds of thousands of them.
    ledger, steps = _steady_ledger(t, read)
    if ledger.empty:
        return [], {}
    noise = noise_ms(ledger)
    bar = max(c.min_saving_ms, c.noise_sigmas * noise)
    # The charged rows alone, and of them the columns read: a cause's rows are a few of the window's.
    charged = ledger.loc[ledger["lost_ms"].to_numpy() > bar,
                         [name for name in ledger.columns
                          if name in read and name not in ("wait_ms", "starved_ms", "running_ms", "time_source")]]
    bound = _cpu_bound(charged, c)
    job_ms = _job_ms(ledger, steps)
    found = []
    for (rank, part), rows in charged.groupby(["rank", "cause_phase"]):
        if len(rows) < c.min_steps:
            continue
        charged_steps = np.sort(rows["step"].to_numpy())
        began = onset(charged_steps, steps)
        blips = charged_steps[:int((charged_steps < began).sum())] if began is not None else charged_steps[:0]
        if len(blips):  # before it began: a busy host's blips, not this cause
            rows, charged_steps = rows[rows["step"] >= began], charged_steps[len(blips):]
        pattern, period = _pattern(charged_steps, steps[steps >= began] if began is not None else steps, c)
        lost = float(rows["lost_ms"].sum())
        # The peers' work in that part alone, not every column of their rows (nearly the whole window's).
        others = ledger["step"].isin(charged_steps).to_numpy() & (ledger["rank"].to_numpy() != rank)
        peers = ledger[work_column(part)][others]
        found.append(Cause(int(rank), str(part), charged_steps.tolist(), lost, lost / len(steps),
                           lost / job_ms if job_ms else 0.0, pattern, period, float(rows[work_column(part)].median()),
                           float(peers.median()) if len(peers) else float("nan"),
                           float(np.minimum(rows["lost_ms"], bound[rows.index]).sum()), began, blips.tolist()))
    found.sort(key=lambda x: -x.lost_ms)
    totals = {"steady_steps": len(steps), "job_s": round(job_ms / 1e3, 4), "noise_ms": round(noise, 3),
              "charged_above_ms": round(bar, 3),
              "waiting_s": round(float(ledger["wait_ms"].sum()) / 1e3, 4),
              "starved_s": round(float(ledger["starved_ms"].sum()) / 1e3, 4) if ledger["starved_ms"].notna().any() else None}
    if "time_source" in ledger:  # a GPU run's steps weighed on the device (run/ledger.py device_view)
        totals["device_steps"] = int(ledger.loc[ledger["time_source"] == "device", "step"].nunique())
    return found, totals


def _job_ms(ledger: pd.DataFrame, steps: np.ndarray) -> float:
    """The job's time over the ledger's ``steps`` (its distinct ones): each step's first job time, summed as
    ``ledger.groupby("step")["job_ms"].first().sum()`` sums them. Read off the first rows where they hold every step
    (a ledger by rank, then step: the first rank's), not by a group-by of every row (3 ms at 8,192 ranks x 20 steps)."""
    step, job = ledger["step"], ledger["job_ms"]
    # numpy's integers and floats: no missing step, nor a number the Series below would change
    if isinstance(step.dtype, np.dtype) and step.dtype.kind in "iu" and job.dtype == np.float64:
        first: dict[int, float] = {}
        for at, ms in zip(step.to_numpy()[:2 * len(steps)].tolist(), job.to_numpy()[:2 * len(steps)].tolist()):
            if ms == ms:  # the group-by's first skips NaN
                first.setdefault(at, ms)
        if len(first) == len(steps):
            return float(pd.Series([first[at] for at in sorted(first)], dtype=np.float64).sum())
    return float(ledger.groupby("step")["job_ms"].first().sum())


def _cpu_bound(ledger: pd.DataFrame, c: Cost) -> pd.Series:
    """Per row, the most its step could lose to the ranks' excess on its hosts' free CPUs: the step less
    its CPU floor (infinite where the floor is unknown or contradicts the step)."""
    floor = ledger["cpu_floor_ms"] if "cpu_floor_ms" in ledger else pd.Series(np.nan, index=ledger.index)
    plausible = floor <= c.cpu_floor_slack * ledger["job_ms"]
    return (ledger["job_ms"] - floor).clip(lower=0.0).where(plausible, np.inf)


def severity(share: float, pattern: str, c: Cost) -> str:
    """One rule for every kind: a pattern (every step, periodic) by the share of the run it cost; a cause
    that came and went is information (a busy host gives any rank some pauses), unless it cost the job
    the error share: two checkpoints of a short run can cost half of it, no pause of a busy host does."""
    if pattern == INTERMITTENT:
        return "warning" if share >= c.error_share else "info"
    return "error" if share >= c.error_share else "warning" if share >= c.warning_share else "info"


def priced(findings: list[Finding], t: Tables) -> Assessed:
    """Stragglers, data stalls and late ranks priced by the ledger (impact: the job time they cost, per step
    over the whole run), with their pattern and the uniform severity; causes no detector named are new candidates."""
    c = Cost.active()
    found, totals = causes(t, c)
    out = Assessed()
    if not totals:
        return out
    covered: set[tuple[int, str]] = set()
    for i, f in enumerate(findings):
        mine = _causes_of(f, found)
        if mine:
            out.add(i, _price(f, mine, totals, c, t))
            covered |= {(x.rank, x.part) for x in mine}
        elif _charged_nothing(f, found, t):
            out.add(i, Assessment(LEDGER, severity="info", metrics={"ledger_charged_nothing": True},
                                  says={"says": "ledger_charged_nothing", "rank": f.ranks[0],
                                        "charged_above_ms": totals["charged_above_ms"]}))
    for cause in found:
        if (cause.rank, cause.part) not in covered and severity(cause.share, cause.pattern, c) != "info":
            out.add_new(_finding(cause, totals, c, t), _ledger_price([cause], totals, t))
    return out


# What the causes read of the ledger, besides its work_<part>_ms columns: a long run's whole ledger is not copied.
CAUSE_COLUMNS = ("rank", "step", "lost_ms", "cause_phase", "job_ms", "running_ms", "cpu_floor_ms", "wait_ms",
                 "starved_ms", "time_source")


def _steady_ledger(t: Tables, columns: tuple[str, ...] | None = None) -> tuple[pd.DataFrame, np.ndarray]:
    """The ledger's rows of steady steps, and their distinct steps. Every step steady (a live window): the ledger as it
    is (read only here), not a copy (2 ms at 8,192 ranks x 20 steps); else ``columns`` of those rows (those it has,
    where given): a long run's whole ledger is not copied."""
    ledger = getattr(t, "ledger", None)
    if ledger is None or ledger.empty:
        return pd.DataFrame(), np.array([])
    steps = distinct(ledger["step"])
    kept = steady(pd.DataFrame({"step": steps}))  # its distinct steps: steady counts only them
    if len(kept) == len(steps):
        return ledger, steps
    if columns is not None:
        ledger = ledger[[c for c in ledger.columns if c in columns]]
    ledger = ledger[ledger["step"].isin(kept["step"])]
    return ledger, distinct(ledger["step"])


def _pattern(charged: list[int] | np.ndarray, steps: list[int] | np.ndarray, c: Cost) -> tuple[str, int | None]:
    """How a cause charged in ``charged`` (sorted) of ``steps`` came: in every step, every k steps, or now and then."""
    if len(charged) >= c.every_step_share * len(steps):
        return EVERY_STEP, 1
    gaps = distinct(np.diff(np.asarray(charged, dtype=np.int64)))
    if len(gaps) == 1 and len(charged) >= c.min_periods and (period := int(gaps[0])) > 1:
        return f"every {period} steps", period
    return INTERMITTENT, None


def _causes_of(f: Finding, found: list[Cause]) -> list[Cause]:
    """The ledger's causes a finding names: a data stall its rank's data part; a straggler, or a rank late
    at its collectives because it pauses before its calls, its rank's other parts (a straggler's own
    phase, when it names one the ledger has). A rank late because its work earlier in the step is slower
    names none: that is a straggler, which the ledger names where no detector did."""
    late = (f.kind == "slow_collective" and f.metrics.get("cause") == SlowCause.LATE_ARRIVAL
            and f.metrics.get("before_calls") is True)
    if len(f.ranks) != 1 or not (late or f.kind in ("straggler", "dataloader_stall")):
        return []
    mine = [x for x in found if x.rank == f.ranks[0]]
    if f.kind == "dataloader_stall":  # on a device, the idle time its host's wait for data left there
        return [x for x in mine if x.part == "data"] or [x for x in mine if x.part == DEVICE_IDLE]
    mine = [x for x in mine if x.part != "data"]
    key = f.metrics.get("quantity")
    part = _part(Quantity.from_key(key)) if key else None
    if part is not None:
        return [x for x in mine if x.part == part] or mine
    return mine


# The ledger's part of the step a quantity measures, where it has one; and back.
DEVICE_PARTS = {Measure.DEVICE_BUSY: DEVICE_BUSY, Measure.DEVICE_IDLE: DEVICE_IDLE}


def _part(quantity: Quantity) -> str | None:
    return quantity.phase if quantity.measure is Measure.PHASE else DEVICE_PARTS.get(quantity.measure)


def _quantity(part: str) -> Quantity:
    device = {p: m for m, p in DEVICE_PARTS.items()}
    return (Quantity(device[part]) if part in device else Quantity(Measure.OWN_TIME) if part == OUTSIDE
            else Quantity(Measure.PHASE, part))


def _price(f: Finding, mine: list[Cause], totals: dict[str, Any], c: Cost, t: Tables) -> Assessment:
    lost = sum(x.lost_ms for x in mine)
    share = sum(x.share for x in mine)
    costliest = max(mine, key=lambda x: x.lost_ms)
    main = replace(costliest, **_seen_pattern(f, costliest, mine, t, c))
    price = _ledger_price(mine, totals, t, main)
    # The detector's own reading of a period (from every step it saw) stands where it made one.
    metrics = {k: v for k, v in price.to_metrics().items() if not (k == "period_steps" and f.metrics.get(k) is not None)}
    if f.kind not in c.validated_kinds.split(","):
        metrics[UPPER_BOUND] = True  # a price not yet held against a clean twin: claimed as a bound
    metrics["detector_impact_ms"] = f.impact_ms
    impact, bound = _bounded(mine, totals, c)
    metrics.update(bound)
    ruled = None
    if f.severity != "critical":
        ruled = severity(share, main.pattern, c)
        # A detector that compared every step's records with the rank's peers judged how often with thresholds
        # of its own (a data phase 3x the typical one): that stands beside the rule, which needs three
        # occurrences to name a period (two stalls in a short run). One that saw a profiled window alone
        # cannot say how often: auto profiling's first window is where a rank slow then looks slow always.
        ruled = max(f.severity, ruled, key=SEVERITIES.index) \
            if main.pattern == INTERMITTENT and not _window_only(f, t) else ruled
    if any(x.part in (DEVICE_BUSY, DEVICE_IDLE) for x in mine):
        metrics["impact_time_source"] = "device"  # the others' waits measured on their devices, not their hosts
    metrics.update(_crowded(f.ranks, t))
    return Assessment(LEDGER, metrics=metrics, severity=ruled, impact_ms=impact, prices=True, settings=values(c),
                      says=_price_remark(main, lost, share, totals, metrics), result=price)


def _crowded(ranks: list[int], t: Tables) -> dict[str, Any]:
    """On a host with more ranks than CPUs the ledger's price is a bound: the metrics that mark it (none elsewhere)."""
    crowded = crowded_hosts(t)
    host = next((t.rank_hosts[r] for r in ranks if t.rank_hosts.get(r) in crowded), None)
    if host is None:
        return {}
    # A rank held up there frees a CPU its peers then use; without the cause it takes one back. What that
    # saves depends on the scheduler: 8 ranks on 2 CPUs (benchmarks/impact.py's 3D case) saved 68 ms and
    # then ~0 against a price of 126-164 ms, with a CPU for every rank the price holds.
    ranks_there, cpus = crowded[host]
    return {UPPER_BOUND: True, "host_ranks": ranks_there, "host_cpus": cpus}


def _charged_nothing(f: Finding, found: list[Cause], t: Tables) -> bool:
    """A straggler seen in the traces of profiled steps alone whose rank the ledger, which read every step's
    counters (the profiled ones too), charged with nothing: its excess there is within the run's noise."""
    return (f.kind == "straggler" and len(f.ranks) == 1 and f.severity in ("warning", "error")
            and not any(x.rank == f.ranks[0] for x in found) and _window_only(f, t))


def _window_only(f: Finding, t: Tables) -> bool:
    """Whether the detector saw the cause in the traces of profiled steps alone, in a run with others (step
    records, its phases and counters, cover every step)."""
    if f.metrics.get("source") in RECORDS or not f.steps:
        return False
    profiled = set(profiled_steps(t.steps))
    return bool(profiled) and set(f.steps) <= profiled and len(profiled) < t.steps["step"].nunique()


def _seen_pattern(f: Finding, main: Cause, mine: list[Cause], t: Tables, c: Cost) -> dict[str, Any]:
    """How often the cause came: the ledger's pattern where it names one; where the ledger saw it come and
    go, the pattern of its steps with those in which the detector saw the rank stand out from its peers.

    The ledger charges a step only above 3 standard deviations of one step's noise: on a busy host a
    60 ms pause in every step sits under that bar in some steps, which the detector still sees. The
    detector alone does not say it either: one that read a window of three profiled steps (auto
    profiling's first window) saw the rank slow in all of them even where that was the only time it was."""
    if main.pattern != INTERMITTENT:
        return {}
    steps = _steady_ledger(t)[1]
    if main.onset is not None:  # since it began
        steps = steps[steps >= main.onset]
    seen = sorted(set().union(*(x.steps for x in mine)) | set(np.intersect1d(f.steps, steps).tolist()))
    pattern, period = _pattern(seen, steps, c)
    return {"steps": seen, "pattern": pattern, "period": period} if pattern != INTERMITTENT else {}


def _bounded(mine: list[Cause], totals: dict[str, Any], c: Cost) -> tuple[float, dict[str, float]]:
    """The finding's impact per step: the ledger's price, or less where the host's free CPUs bound what
    removing the cause saves (its severity stays the ledger's: the share of the run its excess held); and
    the metrics that say so."""
    lost, bounded = sum(x.lost_ms for x in mine), sum(x.cpu_bounded_ms for x in mine)
    steps = totals["steady_steps"]
    if bounded >= (1 - c.disagree_share) * lost:
        return lost / steps, {}
    return bounded / steps, {"ledger_impact_ms": lost / steps, "cpu_bound_ms": bounded / steps}


def _price_remark(main: Cause, lost_ms: float, share: float, totals: dict[str, Any], metrics: dict[str, Any]) -> dict:
    """The ledger's price as a remark (report/wording.py): what it cost, when, and what bounds the saving."""
    return {"says": "ledger_price", "lost_ms": lost_ms, "share": share, "job_s": totals["job_s"],
            "steady_steps": totals["steady_steps"], "pattern": main.pattern, "periodic": bool(main.period),
            "step_ranges": ranges(main.steps), "onset": main.onset, "blips": len(main.blips),
            **{k: metrics[k] for k in ("cpu_bound_ms", "ledger_impact_ms", "host_ranks", "host_cpus") if k in metrics}}


def _finding(cause: Cause, totals: dict[str, Any], c: Cost, t: Tables) -> Candidate:
    """A candidate for a cause that no detector named (its words: report/words/ledger_price.py)."""
    others = _others(t.steps["rank"].unique(), cause.rank)
    quantity = _quantity(cause.part)
    device_cause = CAUSE_OF.get(quantity.measure)
    data = cause.part == "data"
    f = Candidate(
        kind="dataloader_stall" if data else "straggler", ranks=[cause.rank], steps=cause.steps,
        facts={"case": "ledger", "part": cause.part, "own_ms": cause.own_ms, "peer_ms": cause.peer_ms, "others": others,
               "pattern": cause.pattern, "onset": cause.onset, "on_device": device_cause is not None},
        metrics={"observed_ms": cause.own_ms, "expected_ms": cause.peer_ms, "excess_ms": cause.own_ms - cause.peer_ms,
                 "source": "ledger", "quantity": quantity.key, "time_source": "device" if device_cause else "host",
                 **({"cause": device_cause.value} if device_cause else {}),
                 **_cost_metrics([cause], totals, t)},
        evidence=[{"type": "ledger", "rank": cause.rank, "step": s, "part": cause.part} for s in cause.steps[:20]],
        settings=values(c),
    )
    _, bound = _bounded([cause], totals, c)  # the saving: its proposal (judge/assessments/proposal.py)
    f.metrics.update({**bound, **_crowded(f.ranks, t)})
    f.remarks.append(_price_remark(cause, cause.lost_ms, cause.share, totals, f.metrics))
    return f


def _others(ranks: np.ndarray, rank: int) -> list[int]:
    """The ``ranks`` (distinct) but ``rank``, in order, as ints: by numpy where they are integers (8,192 ranks
    compared one by one took 3 ms)."""
    if isinstance(ranks, np.ndarray) and ranks.dtype.kind in "iu":
        return np.sort(ranks[ranks != rank]).tolist()
    return sorted(int(r) for r in ranks if r != rank)


def _cost_metrics(mine: list[Cause], totals: dict[str, Any], t: Tables) -> dict[str, Any]:
    """The ledger's price of ``mine`` for a finding's metrics."""
    return _ledger_price(mine, totals, t).to_metrics()


def _ledger_price(mine: list[Cause], totals: dict[str, Any], t: Tables, main: Cause | None = None) -> LedgerPrice:
    """The ledger's price of ``mine``; its pattern ``main``'s (the costliest cause's, where not given)."""
    main = main or max(mine, key=lambda x: x.lost_ms)
    lost = sum(x.lost_ms for x in mine)
    return LedgerPrice(lost, lost / totals["steady_steps"], sum(x.share for x in mine), main.pattern, main.period,
                       main.steps[:Cost.active().charged_steps_listed], main.lost_ms / len(main.steps),
                       totals["noise_ms"], _profiled_saving(t, main.rank, [x.part for x in mine]))


def _profiled_saving(t: Tables, rank: int, parts: list[str]) -> float | None:
    """The ledger's mean saving over the profiled steps, for this rank's parts: what the critical path
    prices from the traces of the same steps."""
    profiled = set(profiled_steps(t.steps))
    if not profiled:
        return None
    rows = t.ledger[t.ledger["step"].isin(profiled)]
    if rows.empty:
        return None
    mine = rows[(rows["rank"] == rank) & rows["cause_phase"].isin(parts)]
    return float(mine["lost_ms"].sum()) / rows["step"].nunique()


def ledger_section(t: Tables) -> dict[str, Any] | None:
    """The report's ledger section: the run's totals and every cause with its cost (None without a ledger)."""
    found, totals = causes(t)
    if not totals:
        return None
    return {**totals, "causes": [x.to_json() for x in found]}
