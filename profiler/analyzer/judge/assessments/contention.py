"""Busy host or slow rank: did a rank do more work, or wait for a CPU other processes held?

Three kinds of evidence, from what diagtrain records anyway:

- per rank and step (steps.jsonl): ``cpu_ms``, the process's CPU time, and ``runq_ms``, the time its
  main thread was runnable but waiting for a CPU (Linux scheduler statistics). A rank that did
  more work burnt more CPU; a starved one waited in the run queue instead.
- per host (telemetry): how busy its CPUs were, how much of that was not the job
  (``others_cpu_percent``) and which processes (rows of kind ``other``).
- per rank and step: ``page_faults`` and ``samples``. A rank that burnt more CPU for the same
  samples, with many more page faults than its peers, did the same work more slowly: its memory
  allocator hands memory back to the kernel and faults it in again every step (glibc's malloc
  does so for buffers above its mmap threshold, a threshold that moves with the process's history,
  so one rank of a clean job can fall into it and its twin not).

A straggler, a late rank or a data stall whose excess is mostly run-queue wait is host contention,
not its own work: reported as info, beside a ``host_contention`` finding that names the other
processes. One whose excess is memory churn is reported as info and says so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.judge.assessments.ledger_price import (EVERY_STEP, INTERMITTENT, Cost, LedgerPrice,
                                                                  severity as cost_severity)
from diagtrain.profiler.analyzer.judge.detectors.base import Steady, profiled_steps, steady, steady_host_loads
from diagtrain.profiler.analyzer.judge.findings import SEVERITIES, UPPER_BOUND, Candidate, Finding
from diagtrain.profiler.analyzer.judge.quantities import SlowCause
from diagtrain.profiler.analyzer.judge.verdict import HOST, LEAK_TIME, MORE_WORK, Assessed, Assessment, Results
from diagtrain.profiler.analyzer.run.ledger import cpu_wait, crowded_hosts
from diagtrain.profiler.analyzer.run.host_load import Contention, host_loads
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.util.groups import distinct
from diagtrain.profiler.util.settings import values


@dataclass(frozen=True)
class NotOwnWork:
    """Why a rank's excess was not its own work, as data (report/wording.py words it): what that time is (``cause``,
    the metric that marks the finding) and what showed it (``evidence``, with its ``values``)."""

    cause: str  # starved | memory_churn | leak_cost | busy_host
    evidence: str  # cpu_wait | saturated_host | churn | leak | intermittent
    values: dict[str, Any] = field(default_factory=dict)

    def remark(self, rank: int) -> dict[str, Any]:
        """The finding's remark of it."""
        return {"says": "not_own_work", "cause": self.cause, "rank": rank, "evidence": self.evidence, **self.values}


def starvation(tables: Tables, rank: int, steps: list[int], excess_ms: float,
               stretch: float | None = None) -> NotOwnWork | None:
    """Why ``rank``'s excess of ``excess_ms`` per step in ``steps`` (``stretch`` times its peers' time,
    where known) is host contention, or None when it is its own (more CPU time than its peers, or no sign
    of starvation)."""
    s = Contention.active()
    rows = tables.steps[tables.steps["step"].isin(steps)]
    extra_cpu = _beyond_peers(rows, rank, "cpu_ms")
    if extra_cpu is not None and extra_cpu >= s.work_share * excess_ms:
        return None  # it burnt the time itself: more work
    extra_runq = _beyond_peers(rows.assign(cpu_wait_ms=cpu_wait(rows)), rank, "cpu_wait_ms")
    if extra_runq is not None:
        if extra_runq < s.starved_share * excess_ms:
            return None
        return NotOwnWork("starved", "cpu_wait", {"extra_ms": extra_runq})
    if stretch is not None and stretch >= s.starved_max_stretch:
        return None  # far slower than a wait for a CPU makes it
    host = tables.rank_hosts.get(rank)
    load = host_loads(tables, rows).get(host) if host is not None else None
    if load is None or not load.is_contended:
        return None
    return NotOwnWork("starved", "saturated_host", {"processes": load.processes})


@dataclass
class Faulting:
    """A rank that burnt its excess itself faulting pages in, for the same samples as its peers."""

    mine: float  # its page faults per step (median)
    theirs: float  # its peers'
    kept_bytes: float  # how much its resident memory grew per step there (median step to step)

    @property
    def extra_mib(self) -> float:
        """The extra pages it faulted in per step, in MiB (a minor fault maps one 4 KiB page: x86-64, arm64)."""
        return (self.mine - self.theirs) * 4 / 1024


def faulting(tables: Tables, rank: int, steps: list[int], excess_ms: float) -> Faulting | None:
    """Whether ``rank``'s excess of ``excess_ms`` per step in ``steps`` was page faults of its own (the same
    samples as its peers, its own CPU time, many more faults), and how much of that memory it kept."""
    s = Contention.active()
    rows = tables.steps[tables.steps["step"].isin(steps)]
    more_samples = _ratio_to_peers(rows, rank, "samples")
    if more_samples is None or more_samples > s.more_samples_ratio:
        return None  # more work, or no way to tell the work was the same
    extra_cpu = _beyond_peers(rows, rank, "cpu_ms")
    if extra_cpu is None or extra_cpu < s.work_share * excess_ms:
        return None  # not time it burnt itself (waiting, sleeping, starved)
    faults = _medians(rows, rank, "page_faults")
    if faults is None:
        return None
    mine, theirs = faults
    if mine - theirs < s.churn_min_faults or mine < s.churn_ratio * theirs:
        return None
    return Faulting(mine, theirs, _growth_per_step(tables.steps, rank, steps))


def _growth_per_step(steps: pd.DataFrame, rank: int, chosen: list[int]) -> float:
    """The median growth of ``rank``'s resident memory from one step to the next, over ``chosen`` (0 unknown)."""
    if "rss_bytes" not in steps:
        return 0.0
    mine = steps[steps["rank"] == rank].dropna(subset=["rss_bytes"]).sort_values("step")
    step, rss = mine["step"].to_numpy(), mine["rss_bytes"].to_numpy(dtype=float)
    growth = np.diff(rss) / np.diff(step)
    growth = growth[np.isin(step[1:], chosen)]
    return float(np.median(growth)) if len(growth) else 0.0


def churn(f: Faulting) -> NotOwnWork | None:
    """Page faults ``f`` as memory churn (the same work done more slowly, the memory given back); None when the
    rank kept the memory (a leak's cost, see :func:`leak_cost`)."""
    if f.kept_bytes >= Contention.active().kept_share * f.extra_mib * 2**20:
        return None
    return NotOwnWork("memory_churn", "churn", {"faults": f.mine, "peer_faults": f.theirs, "extra_mib": f.extra_mib})


def leak_cost(f: Faulting) -> NotOwnWork | None:
    """Page faults ``f`` as the time a memory growth costs (pages faulted in and kept); None when not kept."""
    if f.kept_bytes < Contention.active().kept_share * f.extra_mib * 2**20:
        return None
    return NotOwnWork("leak_cost", "leak", {"extra_mib": f.extra_mib, "kept_bytes": f.kept_bytes})


def own_work_only(findings: list[Finding], prior: list[Results], tables: Tables) -> Assessed:
    """Stragglers, late ranks and data stalls whose excess was not the rank's own work (starvation for a CPU,
    memory churn) or is the cost of a leak found beside them: information, and said so; such a leak charged
    the time."""
    s = Contention.active()
    growing = {r: i for i, f in enumerate(findings) if f.kind == "memory_growth" and f.severity != "info" for r in f.ranks}
    out = Assessed()
    charged: dict[int, float] = {}  # a leak's position -> the time charged to it so far
    for i, f in enumerate(findings):
        why = _not_own_work(f, prior[i].of(LedgerPrice), tables, s, set(growing))
        if why is None:
            continue
        out.add(i, Assessment(HOST, severity="info", metrics={why.cause: True}, says=why.remark(f.ranks[0]), result=why))
        if why.cause == "leak_cost" and f.impact_ms:
            leak = growing[f.ranks[0]]
            charged[leak] = charged.get(leak, findings[leak].impact_ms or 0.0) + f.impact_ms
            out.add(leak, _leak_time(f, charged[leak]))
    return out


@dataclass
class MoreWork:
    """A rank on a crowded host that does more work than its peers, and what that would cost with a CPU per rank."""

    rank: int
    cpu_ms: float  # its CPU time per step (median over the steady steps)
    peer_cpu_ms: float  # its peers' (the median of theirs)
    load: tuple[str, float, float] | None  # (samples or tokens, its per step, its peers') where recorded
    host_ranks: int
    host_cpus: int

    @property
    def estimate_ms(self) -> float:
        """The step time it would cost with a CPU per rank: there a rank's step lasts at least its CPU time."""
        return self.cpu_ms - self.peer_cpu_ms

    @property
    def share(self) -> float:
        """... as a share of such a host's step (its own CPU time)."""
        return self.estimate_ms / self.cpu_ms if self.cpu_ms > 0 else 0.0


def more_work(tables: Tables) -> list[MoreWork]:
    """The ranks on hosts with more ranks than CPUs that burn ``more_work_ratio`` times their peers' CPU time per
    step, for more samples or tokens where the steps count them: their peers wait for a CPU as long as for them, so
    the step times hide what they cost (the same work done more slowly is churn's, not theirs)."""
    s, crowded, warm = Contention.active(), crowded_hosts(tables), Steady.active()
    # Past warm-up only, and enough of it: a short run's first steps burn start-up CPU unevenly between ranks.
    steps = tables.steps[tables.steps["step"] > warm.warmup_steps]
    if not crowded or "cpu_ms" not in steps or steps["cpu_ms"].isna().all() \
            or steps["step"].nunique() < warm.min_steady_steps:
        return []
    per_rank = steps.groupby("rank")[[c for c in ("cpu_ms", "samples", "tokens") if c in steps]].median()
    found = []
    for group in tables.structure.peer_groups(sorted(int(r) for r in per_rank.index)):
        for rank in group:
            host = tables.rank_hosts.get(rank)
            peers = per_rank.loc[[r for r in group if r != rank]]
            if host not in crowded or peers.empty or not peers["cpu_ms"].median() > 0:
                continue
            mine, theirs = float(per_rank.loc[rank, "cpu_ms"]), float(peers["cpu_ms"].median())
            load = _load(per_rank, rank, peers)
            # Counted work decides where the steps count it (ranks waiting in gloo burn CPU too, which narrows the
            # ratio of CPU times); else only a CPU time far above the peers' own spread.
            more = mine > theirs and load[1] >= s.more_samples_ratio * load[2] if load else mine >= s.more_work_ratio * theirs
            if not more or mine - theirs < Cost.active().min_saving_ms:  # jitter, not work
                continue
            found.append(MoreWork(rank, mine, theirs, load, *crowded[host]))
    return found


def _load(per_rank: pd.DataFrame, rank: int, peers: pd.DataFrame) -> tuple[str, float, float] | None:
    """(what the steps count, the rank's per step, its peers') for tokens, else samples; None where not counted."""
    for column in ("tokens", "samples"):
        if column in per_rank and pd.notna(per_rank.loc[rank, column]) and peers[column].notna().any():
            return column, float(per_rank.loc[rank, column]), float(peers[column].median())
    return None


def hidden_work(findings: list[Finding], tables: Tables) -> Assessed:
    """A rank doing more work on a crowded host, named with that evidence and the severity its cost with a CPU per
    rank deserves (said as an estimate for such a host): its straggler finding assessed, or a new one. More work is
    one cause for the whole rank: where the rank is a straggler in several parts of its step (a detector's phase,
    and another the ledger charged), the first finding takes the others' time and they are gone."""
    out = Assessed()
    for extra in more_work(tables):
        remark = {"says": "more_work", **asdict(extra), "estimate_ms": extra.estimate_ms, "share": extra.share}
        severity = cost_severity(extra.share, EVERY_STEP, Cost.active())
        metrics = {"cpu_ms_per_step": round(extra.cpu_ms, 3), "peer_cpu_ms_per_step": round(extra.peer_cpu_ms, 3),
                   "estimate_ms_per_step_with_a_cpu_per_rank": round(extra.estimate_ms, 3),
                   "estimate_share_with_a_cpu_per_rank": round(extra.share, 4),
                   "host_ranks": extra.host_ranks, "host_cpus": extra.host_cpus,
                   **({f"{extra.load[0]}_per_step": extra.load[1], f"peer_{extra.load[0]}_per_step": extra.load[2]}
                      if extra.load else {})}
        mine = [i for i, f in enumerate(findings) if f.kind == "straggler" and f.ranks == [extra.rank]]
        if mine:  # it can only raise the finding: what the step times measured stands
            first, rest = mine[0], mine[1:]
            raised = max([findings[i].severity for i in mine] + [severity], key=SEVERITIES.index)
            out.add(first, Assessment(MORE_WORK, severity=raised, metrics=metrics, says=remark, result=extra,
                                      extra_impact_ms=sum(findings[i].impact_ms or 0.0 for i in rest)))
            for i in rest:
                out.add(i, Assessment(MORE_WORK, drop=True))
        elif severity != "info":
            out.add_new(_more_work_finding(extra, metrics, remark, tables), extra)
    return out


def _more_work_finding(extra: MoreWork, metrics: dict, remark: dict, tables: Tables) -> Candidate:
    """A straggler candidate for a rank doing more work on a crowded host: its remark says it all (its suggestion:
    report/words/contention.py)."""
    others = sorted(r for r in tables.rank_hosts if r != extra.rank)
    return Candidate(
        kind="straggler", ranks=[extra.rank], remarks=[remark], facts={"case": "more_work", "share": extra.share},
        metrics={**metrics, "source": "counters", "observed_ms": extra.cpu_ms, "expected_ms": extra.peer_cpu_ms,
                 "excess_ms": extra.estimate_ms, "others": others},
        steps=distinct(steady(tables.steps[["step"]])["step"]).tolist(), settings=values(Contention.active()))


def _leak_time(straggler: Finding, total_ms: float) -> Assessment:
    """The memory_growth finding carries the time its page faults cost (the straggler's price): fixing the
    leak saves it, and the finding is ordered and priced by it."""
    return Assessment(LEAK_TIME, extra_impact_ms=straggler.impact_ms,
                      metrics={"time_cost_ms_per_step": total_ms,
                               **({UPPER_BOUND: True} if straggler.metrics.get(UPPER_BOUND) else {})},
                      says={"says": "leak_time", "impact_ms": straggler.impact_ms, "rank": straggler.ranks[0],
                            "phase": straggler.metrics.get("phase", "step")})


def _not_own_work(finding: Finding, price: LedgerPrice | None, tables: Tables, s: Contention,
                  growing: set[int]) -> NotOwnWork | None:
    """Why the finding's excess was not the rank's own work, or None for its own (``price``: the ledger's of it;
    ``growing``: the ranks a memory_growth finding names)."""
    if finding.severity == "info" or len(finding.ranks) != 1:
        return None
    if finding.kind == "straggler":
        excess = finding.metrics.get("excess_ms")
    elif finding.kind == "slow_collective" and finding.metrics.get("cause") == SlowCause.LATE_ARRIVAL:
        excess = finding.impact_ms  # everyone waits this long per step at the rank's collectives
    elif finding.kind == "dataloader_stall":
        excess = finding.metrics["observed_ms"] - finding.metrics["expected_ms"]
    else:
        return None
    steps = finding.steps or profiled_steps(tables.steps)
    if not (excess and steps):
        return None
    rank = finding.ranks[0]
    # The ledger compares running time, CPU starvation taken out: a pattern it priced is the rank's own.
    if not _ledger_pattern(price) and (why := starvation(tables, rank, steps, excess, _stretch(finding))):
        return why
    faults = faulting(tables, rank, *_priced_steps(price, steps, excess)) if finding.kind == "straggler" else None
    if faults is not None and (why := churn(faults)):
        return why
    if faults is not None and rank in growing and (why := leak_cost(faults)):
        return why
    if finding.kind == "straggler":
        return _intermittent_on_busy_host(tables, finding, price, s)
    return None


def _stretch(finding: Finding) -> float | None:
    """How many times its peers' time the rank took (observed over expected), where the finding says."""
    observed, expected = finding.metrics.get("observed_ms"), finding.metrics.get("expected_ms")
    return observed / expected if observed and expected and expected > 0 else None


def _intermittent_on_busy_host(tables: Tables, finding: Finding, price: LedgerPrice | None,
                               s: Contention) -> NotOwnWork | None:
    """Why a straggler seen in only some of its steps, on a host other processes kept busy, is
    contention; None where it was slow in nearly every step seen or its host was quiet.
    Run-queue wait alone is not enough: more ranks than cores make it too, and one of them can still
    straggle."""
    seen = finding.metrics.get("steps_seen")
    if not seen or len(finding.steps) >= s.steadily_slow_share * seen:
        return None  # slow in (nearly) every step it could be seen in: a straggler, busy host or not
    if _ledger_pattern(price) or _blocked_itself(tables, finding, s):
        return None
    host = tables.rank_hosts.get(finding.ranks[0])
    load = steady_host_loads(tables).get(host) if host is not None else None
    if load is None or not load.busy_with_others:
        return None
    return NotOwnWork("busy_host", "intermittent",
                      {"slow_steps": len(finding.steps), "steps_seen": seen, "processes": load.processes})


def _blocked_itself(tables: Tables, finding: Finding, s: Contention) -> bool:
    """Whether the straggler's excess in its slow steps was mostly time off a CPU while not waiting for one
    (run queue) or for a peer (collectives), beyond its peers': I/O or a sleep of its own."""
    excess = finding.metrics.get("excess_ms")
    needed = ("wall_ms", "cpu_ms", "runq_ms", "comm_wait_ms")
    if not excess or not all(c in tables.steps for c in needed):
        return False
    rows = tables.steps[tables.steps["step"].isin(finding.steps)]
    off_cpu = rows.assign(off_cpu_ms=rows["wall_ms"] - rows["cpu_ms"] - cpu_wait(rows) - rows["comm_wait_ms"])
    blocked = _beyond_peers(off_cpu, finding.ranks[0], "off_cpu_ms")
    return blocked is not None and blocked >= s.own_blocking_share * excess


def _priced_steps(price: LedgerPrice | None, steps: list[int], excess_ms: float) -> tuple[list[int], float]:
    """The steps whose time the finding's price is about, and its excess per step there: the ledger's
    charged steps where it priced the finding (a detector's steps can be other ones: a rank that churned
    in early steps and writes a checkpoint every 4th), else the detector's own."""
    if price is None or not price.charged_steps:
        return steps, excess_ms
    return price.charged_steps, price.charged_ms_per_step


def _ledger_pattern(price: LedgerPrice | None) -> bool:
    """Whether the ledger priced the finding as a pattern (every step, or periodic) of running time,
    the time the rank ran on a CPU: a wait for a CPU, or a busy host's pauses, were taken out first."""
    return price is not None and price.pattern != INTERMITTENT


def _beyond_peers(rows: pd.DataFrame, rank: int, column: str) -> float | None:
    """Median over steps of ``rank``'s ``column`` minus its peers' median in the same step."""
    if column not in rows or rows[column].isna().all():
        return None
    table = rows.dropna(subset=[column])
    mine = table[table["rank"] == rank].set_index("step")[column]
    peers = table[table["rank"] != rank].groupby("step")[column].median()
    both = mine.index.intersection(peers.index)
    return float((mine[both] - peers[both]).median()) if len(both) else None


def _medians(rows: pd.DataFrame, rank: int, column: str) -> tuple[float, float] | None:
    """The median of ``column`` over ``rank``'s rows and over its peers' (None where either is unknown)."""
    if column not in rows:
        return None
    known = rows.dropna(subset=[column])
    mine, theirs = known.loc[known["rank"] == rank, column], known.loc[known["rank"] != rank, column]
    return (float(mine.median()), float(theirs.median())) if len(mine) and len(theirs) else None


def _ratio_to_peers(rows: pd.DataFrame, rank: int, column: str) -> float | None:
    """``rank``'s median ``column`` over its peers' (None where unknown or zero)."""
    medians = _medians(rows, rank, column)
    return medians[0] / medians[1] if medians and medians[1] else None
