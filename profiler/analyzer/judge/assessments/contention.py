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

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.judge.assessments.ledger_price import EVERY_STEP, INTERMITTENT, Cost, severity as cost_severity
from diagtrain.profiler.analyzer.judge.detectors.base import Steady, profiled_steps, steady
from diagtrain.profiler.analyzer.judge.findings import SEVERITIES, UPPER_BOUND, Candidate, Finding
from diagtrain.profiler.analyzer.judge.quantities import SlowCause
from diagtrain.profiler.analyzer.judge.verdict import HOST, LEAK_TIME, MORE_WORK, Assessed, Assessment
from diagtrain.profiler.analyzer.run.ledger import cpu_wait, crowded_hosts
from diagtrain.profiler.analyzer.run.tables import Tables, unix_seconds
from diagtrain.profiler.util.groups import distinct
from diagtrain.profiler.util.settings import section, setting, values

@section("contention")
class Contention:
    """When other processes on a host, or a rank's memory allocator, and not the rank's own work explain its excess."""

    saturated_percent: float = setting(85.0, "the host's CPUs this busy (all cores): a runnable thread may wait "
                                       "for one")
    others_min_percent: float = setting(50.0, "other processes using at least half a core then ...")
    contended_share: float = setting(0.25, "... in this share of the samples taken while the job stepped: contention")
    runq_min_share: float = setting(0.1, "ranks waiting this share of their steps for a CPU are contended, "
                                    "telemetry or not")
    starved_share: float = setting(0.5, "a rank's excess at least half run-queue wait (beyond its peers') was "
                                   "starvation ...")
    work_share: float = setting(0.5, "... unless at least half of it is extra CPU time of its own: it did more work")
    # Sharing the cores with other busy processes stretched work 2-4x here (two CPU hogs on 2 cores);
    # a data wait of 205 ms against 0.7 ms was a slow dataset, not a wait for a CPU.
    starved_max_stretch: float = setting(10.0, "without run-queue counters, a saturated host excuses a rank only this "
                                         "many times slower than its peers at most")
    named_processes: int = setting(5, "the busiest other processes named in a finding")
    default_interval_s: float = setting(1.0, "telemetry's sampling interval where fewer than two samples tell it "
                                        "(run --telemetry-interval)")
    # Fewer than 1 MiB of 4 KiB pages cost well under a millisecond.
    churn_min_faults: int = setting(256, "memory churn: at least this many more page faults per step than the "
                                    "peers ...")
    churn_ratio: float = setting(2.0, "... and at least this many times the peers': its allocator, not the job's shape")
    # A leak of 16 MiB a step here faulted in 29 MiB a step (its temporaries fault too); churn keeps nothing.
    kept_share: float = setting(0.3, "resident memory growing by this share of the extra pages faulted in: memory "
                                "kept, a leak's cost in time, not churn")
    more_samples_ratio: float = setting(1.05, "a rank loading this share more samples per step than its peers does "
                                        "more work")
    # Clean ranks of one job on 2 shared cores burnt within ~15% of each other's CPU time per step; a rank given
    # 3x the batch burnt 1.5x.
    more_work_ratio: float = setting(1.3, "on a host with more ranks than CPUs, a rank burning this many times its "
                                     "peers' CPU time per step does more work, whatever its step time shows (where "
                                     "the steps count samples or tokens, more of them and more CPU time say it)")
    # A busy host's pauses made clean ranks slow in 2 of 3 and 5 of 9 steps; a rank sleeping every
    # step was missed in 1 of 9.
    steadily_slow_share: float = setting(0.8, "a rank slow in this share of the steps it was seen in is steadily "
                                         "slow, busy host or not")
    own_blocking_share: float = setting(0.5, "... and one whose excess in its slow steps was at least this share off a "
                                        "CPU without waiting for one or for a peer blocked itself (a checkpoint's "
                                        "fsync, a file read): a busy host takes CPU time, it does not block a rank")


@dataclass
class HostLoad:
    """How contended one host's CPUs were while the job stepped."""

    host: str
    ranks: list[int]
    samples: int  # host samples taken while the job stepped
    contended: int  # ... of them saturated with other processes using at least contention.others_min_percent
    others_percent: float | None  # median CPU of other processes (% of one core) in contended samples
    host_percent: float | None  # median host CPU (% of all cores) in contended samples
    runq_share: float | None  # median share of a step its ranks' main threads waited for a CPU
    runq_ms: float | None  # ... in ms per step
    processes: list[dict] = field(default_factory=list)  # name, pid, cpu_percent (median), samples
    time_range: tuple[float, float] | None = None

    @property
    def busy_with_others(self) -> bool:
        """Other processes kept the host's CPUs saturated (telemetry), not the job's own ranks."""
        return self.samples > 0 and self.contended / self.samples >= Contention.active().contended_share

    @property
    def is_contended(self) -> bool:
        """Busy with other processes, or its ranks waited a good share of their steps for a CPU."""
        return self.busy_with_others or (self.runq_share or 0.0) >= Contention.active().runq_min_share

    def named(self) -> str:
        """``python (pid 4242) 97%, ...``: the busiest other processes, in words."""
        return ", ".join(f"{p['name']} (pid {p['pid']}) {p['cpu_percent']:.0f}%" for p in self.processes)


LOAD_COLUMNS = ("rank", "step", "start", "end", "runq_ms", "wall_ms")  # what host_loads reads of the steps


def host_loads(tables: Tables, steps: pd.DataFrame | None = None) -> dict[str, HostLoad]:
    """Per host of the run, its CPU load while its ranks ran ``steps`` (default: the steady ones). Each
    table is grouped by host once: 1,024 ranks are 128 hosts, and a pass per host cost a third of a second."""
    s = Contention.active()
    whole_run = steps is None
    # Only the columns read here: a long run's whole step table copied twice cost half a second.
    steps = steady(tables.steps[[c for c in LOAD_COLUMNS if c in tables.steps]]) if steps is None else steps
    hosts = pd.Series({int(r): h for r, h in tables.rank_hosts.items() if h is not None}, dtype=object)
    steps = steps[steps["rank"].isin(hosts.index)]
    if steps.empty:
        return {}
    ranks_of: dict[str, list[int]] = {}
    for rank, host in sorted(hosts.items()):
        ranks_of.setdefault(host, []).append(rank)
    # Each rank's span, then its host's: the earliest start and latest end of its ranks' (a host per row was a
    # lookup per step).
    per_rank = steps.groupby("rank").agg(start=("start", "min"), end=("end", "max"))
    spans = per_rank.groupby(per_rank.index.map(hosts).rename("host")).agg(start=("start", "min"), end=("end", "max"))
    runq = _runq_by_host(steps, hosts).to_dict("index")
    telemetry = _host_telemetry(tables.telemetry)
    loads = {}
    for host, start, end in zip(spans.index, spans["start"].tolist(), spans["end"].tolist()):
        load = HostLoad(str(host), ranks_of[host], 0, 0, None, None, None, None, time_range=(float(start), float(end)))
        if host in runq:
            load.runq_ms, load.runq_share = float(runq[host]["runq_ms"]), float(runq[host]["share"])
        if host in telemetry:
            _add_telemetry(load, telemetry[host], whole_run, s)
        loads[str(host)] = load
    return loads


def _runq_by_host(steps: pd.DataFrame, hosts: pd.Series) -> pd.DataFrame:
    """Per host: the median over its ranks of each rank's median wait for a CPU (ms per step), and of that
    wait's share of the rank's median step."""
    if not {"runq_ms", "wall_ms"} <= set(steps.columns) or not steps["runq_ms"].notna().any():
        return pd.DataFrame(columns=["runq_ms", "share"])
    per_rank = steps.dropna(subset=["runq_ms"]).groupby("rank")[["runq_ms", "wall_ms"]].median()
    per_rank = per_rank.assign(share=per_rank["runq_ms"] / per_rank["wall_ms"], host=per_rank.index.map(hosts))
    return per_rank.groupby("host")[["runq_ms", "share"]].median()


def _host_telemetry(t: pd.DataFrame | None) -> dict[str, pd.DataFrame]:
    """The telemetry samples of each host (none without the other processes' CPU, an older run's)."""
    if t is None or t.empty or "others_cpu_percent" not in t or "host" not in t:
        return {}
    return {str(host): rows for host, rows in t.groupby("host")}


def _add_telemetry(load: HostLoad, t: pd.DataFrame, whole_run: bool, s: Contention) -> None:
    """What the host's samples while its ranks stepped say: how often other processes saturated its CPUs, and
    which."""
    times = unix_seconds(t["time"])
    # A sample describes the interval before it. Some steps are judged by the samples inside them; the
    # whole run also by the one just after its last step (a run of a few hundred milliseconds of steps
    # has no sample inside them at 1 Hz).
    interval = float(times[t["kind"] == "host"].drop_duplicates().sort_values().diff().median())
    after = (interval if interval > 0 else s.default_interval_s) if whole_run else 0.0
    span = load.time_range
    t = t[times.between(span[0], span[1] + after)]
    samples = t[(t["kind"] == "host") & t["others_cpu_percent"].notna()]
    contended = samples[(samples["cpu_percent"] >= s.saturated_percent)
                        & (samples["others_cpu_percent"] >= s.others_min_percent)]
    load.samples, load.contended = len(samples), len(contended)
    if len(contended):
        load.others_percent = float(contended["others_cpu_percent"].median())
        load.host_percent = float(contended["cpu_percent"].median())
    others = t[t["kind"] == "other"]
    if len(others):
        busiest = others.groupby(["pid", "name"])["cpu_percent"].agg(["median", "size", "sum"]).sort_values("sum", ascending=False)
        load.processes = [{"pid": int(pid), "name": str(name), "cpu_percent": float(row["median"]), "samples": int(row["size"])}
                          for (pid, name), row in busiest.head(s.named_processes).iterrows()]


def starvation(tables: Tables, rank: int, steps: list[int], excess_ms: float,
               stretch: float | None = None) -> str | None:
    """Why ``rank``'s excess of ``excess_ms`` per step in ``steps`` (``stretch`` times its peers' time,
    where known) is host contention, in words, or None when it is its own (more CPU time than its
    peers, or no sign of starvation)."""
    s = Contention.active()
    rows = tables.steps[tables.steps["step"].isin(steps)]
    extra_cpu = _beyond_peers(rows, rank, "cpu_ms")
    if extra_cpu is not None and extra_cpu >= s.work_share * excess_ms:
        return None  # it burnt the time itself: more work
    extra_runq = _beyond_peers(rows.assign(cpu_wait_ms=cpu_wait(rows)), rank, "cpu_wait_ms")
    if extra_runq is not None:
        if extra_runq < s.starved_share * excess_ms:
            return None
        return f"it waited {extra_runq:.1f} ms per step longer than its peers for a CPU"
    if stretch is not None and stretch >= s.starved_max_stretch:
        return None  # far slower than a wait for a CPU makes it
    host = tables.rank_hosts.get(rank)
    load = host_loads(tables, rows).get(host) if host is not None else None
    if load is None or not load.is_contended:
        return None
    named = f" ({load.named()})" if load.processes else ""
    return f"its host's CPUs were saturated by other processes then{named} and its own CPU time was not higher"


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


def churn(f: Faulting) -> str | None:
    """Why page faults ``f`` are memory churn (the same work done more slowly, the memory given back), in
    words; None when the rank kept the memory (a leak's cost, see :func:`leak_cost`)."""
    if f.kept_bytes >= Contention.active().kept_share * f.extra_mib * 2**20:
        return None
    return (f"its extra time was CPU time of its own, for the same samples as its peers, with {f.mine - f.theirs:,.0f} "
            f"more page faults per step than they took ({f.mine:,.0f} vs {f.theirs:,.0f}, "
            f"{f.extra_mib:,.0f} MiB); its memory allocator gives memory back to the kernel and "
            "faults it in again every step")


def leak_cost(f: Faulting) -> str | None:
    """Why page faults ``f`` are the time a memory growth costs (pages faulted in and kept), in words."""
    if f.kept_bytes < Contention.active().kept_share * f.extra_mib * 2**20:
        return None
    return (f"its extra time was CPU time of its own, for the same samples as its peers, faulting in "
            f"{f.extra_mib:,.0f} MiB a step more than they did while its resident memory grew "
            f"{f.kept_bytes / 2**20:,.1f} MiB a step")


def own_work_only(findings: list[Finding], tables: Tables) -> Assessed:
    """Stragglers, late ranks and data stalls whose excess was not the rank's own work (starvation for a CPU,
    memory churn) or is the cost of a leak found beside them: information, and said so; such a leak charged
    the time."""
    s = Contention.active()
    growing = {r: i for i, f in enumerate(findings) if f.kind == "memory_growth" and f.severity != "info" for r in f.ranks}
    out = Assessed()
    charged: dict[int, float] = {}  # a leak's position -> the time charged to it so far
    for i, f in enumerate(findings):
        why = _not_own_work(f, tables, s, set(growing))
        if why is None:
            continue
        reason, marker = why
        out.add(i, Assessment(HOST, severity="info", metrics={marker: True},
                              says={"says": "not_own_work", "cause": marker, "rank": f.ranks[0], "reason": reason}))
        if marker == "leak_cost" and f.impact_ms:
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
            out.add(first, Assessment(MORE_WORK, severity=raised, metrics=metrics, says=remark,
                                      extra_impact_ms=sum(findings[i].impact_ms or 0.0 for i in rest)))
            for i in rest:
                out.add(i, Assessment(MORE_WORK, drop=True))
        elif severity != "info":
            out.new.append(_more_work_finding(extra, metrics, remark, tables))
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


def _not_own_work(finding: Finding, tables: Tables, s: Contention, growing: set[int]) -> tuple[str, str] | None:
    """(the reason in words, the metric that marks what that is: report/wording.py says what it means), or None for
    the rank's own work (``growing``: the ranks a memory_growth finding names)."""
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
    if not _ledger_pattern(finding) and (reason := starvation(tables, rank, steps, excess, _stretch(finding))):
        return reason, "starved"
    faults = faulting(tables, rank, *_priced_steps(finding, steps, excess)) if finding.kind == "straggler" else None
    if faults is not None and (reason := churn(faults)):
        return reason, "memory_churn"
    if faults is not None and rank in growing and (reason := leak_cost(faults)):
        return reason, "leak_cost"
    if finding.kind == "straggler" and (reason := _intermittent_on_busy_host(tables, finding, s)):
        return reason, "busy_host"
    return None


def _stretch(finding: Finding) -> float | None:
    """How many times its peers' time the rank took (observed over expected), where the finding says."""
    observed, expected = finding.metrics.get("observed_ms"), finding.metrics.get("expected_ms")
    return observed / expected if observed and expected and expected > 0 else None


def _intermittent_on_busy_host(tables: Tables, finding: Finding, s: Contention) -> str | None:
    """Why a straggler seen in only some of its steps, on a host other processes kept busy, is
    contention, in words; None where it was slow in nearly every step seen or its host was quiet.
    Run-queue wait alone is not enough: more ranks than cores make it too, and one of them can still
    straggle."""
    seen = finding.metrics.get("steps_seen")
    if not seen or len(finding.steps) >= s.steadily_slow_share * seen:
        return None  # slow in (nearly) every step it could be seen in: a straggler, busy host or not
    if _ledger_pattern(finding) or _blocked_itself(tables, finding, s):
        return None
    host = tables.rank_hosts.get(finding.ranks[0])
    load = host_loads(tables).get(host) if host is not None else None
    if load is None or not load.busy_with_others:
        return None
    named = f" ({load.named()})" if load.processes else ""
    return (f"it was slow in only {len(finding.steps)} of the {seen} steps it was seen in, on a host whose CPUs "
            f"other processes kept busy{named}")


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


def _priced_steps(finding: Finding, steps: list[int], excess_ms: float) -> tuple[list[int], float]:
    """The steps whose time the finding's price is about, and its excess per step there: the ledger's
    charged steps where it priced the finding (a detector's steps can be other ones: a rank that churned
    in early steps and writes a checkpoint every 4th), else the detector's own."""
    charged = finding.metrics.get("charged_steps")
    if finding.metrics.get("impact_source") != "ledger" or not charged:
        return steps, excess_ms
    return charged, finding.metrics["charged_ms_per_step"]


def _ledger_pattern(finding: Finding) -> bool:
    """Whether the ledger priced the finding as a pattern (every step, or periodic) of running time,
    the time the rank ran on a CPU: a wait for a CPU, or a busy host's pauses, were taken out first."""
    return finding.metrics.get("impact_source") == "ledger" and finding.metrics.get("pattern") not in (None, INTERMITTENT)


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
