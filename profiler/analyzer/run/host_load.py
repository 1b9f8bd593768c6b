"""How loaded each host's CPUs were while the job stepped: other processes (telemetry) and the ranks' waits for a
CPU (run-queue delay in steps.jsonl). The host_contention detector names the hosts; judge/assessments/contention.py
reads a rank's host to tell starvation from its own work.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from diagtrain.profiler.analyzer.run.tables import Tables, unix_seconds
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
    of the run's that count, its steady steps). Each table is grouped by host once: 1,024 ranks are 128 hosts, and
    a pass per host cost a third of a second."""
    s = Contention.active()
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
