"""The per-host loads as run/host_load.py computed them before issue 62 (hosts as text per row, pandas group-bys by
rank and host): the reference tests/test_host_load.py holds the numbered version to."""

from __future__ import annotations

import pandas as pd

from diagtrain.profiler.analyzer.run.host_load import Contention, HostLoad, _add_telemetry, _host_telemetry
from diagtrain.profiler.analyzer.run.tables import Tables


def host_loads(tables: Tables, steps: pd.DataFrame, whole_run: bool = False) -> dict[str, HostLoad]:
    """run/host_load.host_loads as it was."""
    s = Contention.active()
    hosts = pd.Series({int(r): h for r, h in tables.rank_hosts.items() if h is not None}, dtype=object)
    steps = steps[steps["rank"].isin(hosts.index)]
    if steps.empty:
        return {}
    ranks_of: dict[str, list[int]] = {}
    for rank, host in sorted(hosts.items()):
        ranks_of.setdefault(host, []).append(rank)
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
    if not {"runq_ms", "wall_ms"} <= set(steps.columns) or not steps["runq_ms"].notna().any():
        return pd.DataFrame(columns=["runq_ms", "share"])
    per_rank = steps.dropna(subset=["runq_ms"]).groupby("rank")[["runq_ms", "wall_ms"]].median()
    per_rank = per_rank.assign(share=per_rank["runq_ms"] / per_rank["wall_ms"], host=per_rank.index.map(hosts))
    return per_rank.groupby("host")[["runq_ms", "share"]].median()
