"""How loaded each host's CPUs were while the job stepped: other processes (telemetry) and the ranks' waits for a
CPU (run-queue delay in steps.jsonl). The host_contention detector names the hosts; judge/assessments/contention.py
reads a rank's host to tell starvation from its own work.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.run.tables import Tables, unix_seconds
from diagtrain.profiler.util.groups import Groups, ranked
from diagtrain.profiler.util.settings import section, setting


# One section for the measurement here and the judgement that reads it (``--set contention.*``).
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


def host_loads(tables: Tables, steps: pd.DataFrame, whole_run: bool = False) -> dict[str, HostLoad]:
    """Per host of the run, its CPU load while its ranks ran ``steps`` (rows of the step table; ``whole_run``: all
    of the run's that count, its steady steps). The rows are grouped by a number per host, once: 8,192 ranks are
    1,024 hosts, and hosts as text per row (a lookup per rank, a group-by of text) cost 40 ms a live judgement."""
    s = Contention.active()
    hosts = _Hosts.of_ranks(tables.rank_hosts)
    host = hosts.of(steps["rank"].to_numpy())
    if not (host >= 0).any():
        return {}
    # Python floats once per array, not a numpy scalar per host and number (1,024 hosts: 2 ms a live judgement)
    start, end = (a.tolist() for a in _span_by_host(steps, host, len(hosts.names)))
    runq, share = (a.tolist() for a in _runq_by_host(steps, host, hosts))
    telemetry = _host_telemetry(tables.telemetry)
    loads = {}
    for h in np.flatnonzero(np.bincount(host[host >= 0], minlength=len(hosts.names))).tolist():
        name = hosts.names[h]
        # Its own list of ranks: a finding may take it, and the hosts' are kept for the next call
        load = HostLoad(name, list(hosts.ranks[h]), 0, 0, None, None, None, None, time_range=(start[h], end[h]))
        if not math.isnan(runq[h]):
            load.runq_ms, load.runq_share = runq[h], share[h]
        if name in telemetry:
            _add_telemetry(load, telemetry[name], whole_run, s)
        loads[name] = load
    return loads


class _Hosts:
    """The run's hosts numbered in the order of their names, each with its ranks in order."""

    # The last ones made, with the ranks and hosts they were made of (held: compared by identity). Live judgement
    # makes them of the same ranks' records every few seconds (6 ms at 8,192 ranks); any other key or host object,
    # or another order, makes them again.
    _last: tuple[list, list, _Hosts] | None = None

    @classmethod
    def of_ranks(cls, rank_hosts: dict[int, str | None]) -> _Hosts:
        """The hosts of ``rank_hosts``: the last ones made where it holds the very same keys and hosts, in order."""
        last = cls._last  # read once: another thread may replace it
        if last is not None and len(last[0]) == len(rank_hosts) and all(map(operator.is_, last[0], rank_hosts)) \
                and all(map(operator.is_, last[1], rank_hosts.values())):
            return last[2]
        hosts = cls(rank_hosts)
        cls._last = (list(rank_hosts), list(rank_hosts.values()), hosts)
        return hosts

    def __init__(self, rank_hosts: dict[int, str | None]) -> None:
        known = [(r, h) for r, h in rank_hosts.items() if h is not None]
        ranks = np.fromiter((int(r) for r, _ in known), dtype=np.int64, count=len(known))
        # Numbered in C, in the order of their names (8,192 ranks' tuples sorted in Python were 6 ms a live judgement)
        numbers, names = pd.factorize(np.array([str(h) for _, h in known], dtype=object), sort=True)
        self.names: list[str] = [str(n) for n in names]
        order = np.lexsort((ranks, numbers))  # by host, then rank
        bounds = np.searchsorted(numbers[order], np.arange(len(self.names) + 1))
        ordered = ranks[order].tolist()
        self.ranks: list[list[int]] = [ordered[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        # rank -> its host's number, by position (ranks are 0 .. world size - 1): a gather, not a search per row
        self._number = np.full(max(int(ranks.max()) + 1, 0) if len(ranks) else 0, -1, dtype=np.int64)
        mine = ranks >= 0
        self._number[ranks[mine]] = numbers[mine]

    def of(self, ranks: np.ndarray) -> np.ndarray:
        """Each rank's host number; -1 for a rank of no known host."""
        ranks = np.asarray(ranks, dtype=np.int64)
        known = (ranks >= 0) & (ranks < len(self._number))
        return np.where(known, self._number[np.where(known, ranks, 0)], -1) if len(self._number) else \
            np.full(len(ranks), -1, dtype=np.int64)


def _span_by_host(steps: pd.DataFrame, host: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per host: the earliest start and the latest end of its ranks' rows (NaN skipped, as pandas' min and max)."""
    known = host >= 0
    start, end = np.full(n, np.nan), np.full(n, np.nan)
    np.fmin.at(start, host[known], steps["start"].to_numpy(dtype=float)[known])
    np.fmax.at(end, host[known], steps["end"].to_numpy(dtype=float)[known])
    return start, end


def _runq_by_host(steps: pd.DataFrame, host: np.ndarray, hosts: _Hosts) -> tuple[np.ndarray, np.ndarray]:
    """Per host (NaN for none): the median over its ranks of each rank's median wait for a CPU (ms per step), and
    of that wait's share of the rank's median step."""
    runq_ms, share = np.full(len(hosts.names), np.nan), np.full(len(hosts.names), np.nan)
    if not {"runq_ms", "wall_ms"} <= set(steps.columns):
        return runq_ms, share
    waited = steps["runq_ms"].to_numpy(dtype=float)
    chosen = (host >= 0) & ~np.isnan(waited)
    if not chosen.any():
        return runq_ms, share
    # Groups of rows by rank, then of ranks by host: medians as pandas' group-by gives them (NaN left out), without
    # its frames (8 ms at 8,192 ranks x 20 steps).
    ranks, at = ranked(steps["rank"].to_numpy())
    by_rank = Groups(at, len(ranks)).within(chosen)
    rank_runq = by_rank.median(waited, skip_nan=True)
    with np.errstate(divide="ignore", invalid="ignore"):  # a step of no time: inf or NaN, as pandas divides
        rank_share = rank_runq / by_rank.median(steps["wall_ms"].to_numpy(dtype=float), skip_nan=True)
    held = by_rank.sizes > 0
    by_host = Groups(hosts.of(ranks[held]), len(hosts.names))
    return by_host.median(rank_runq[held], skip_nan=True), by_host.median(rank_share[held], skip_nan=True)


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
