"""What detectors share: steady-state steps, late arrivals at collectives, and step ranges in words."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.run import job_time
from diagtrain.profiler.analyzer.run.job_time import JobTime
from diagtrain.profiler.analyzer.run.host_load import LOAD_COLUMNS, Contention, HostLoad, host_loads
from diagtrain.profiler.util.groups import distinct
from diagtrain.profiler.util.settings import section, setting, values
from diagtrain.profiler.util.stats import rate_change

if TYPE_CHECKING:
    from diagtrain.profiler.analyzer.run.tables import Tables


@section("steady")
class Steady:
    """Which steps every detector's statistics leave out as warm-up."""

    warmup_steps: int = setting(1, "the first steps carry start-up (process-group init, allocator growth, "
                                "first-call compilation) and are left out of every statistic ...")
    min_steady_steps: int = setting(3, "... as long as this many steps remain after them")


@section("late_arrival")
class LateArrival:
    """When a rank's arrivals at collectives make it persistently late, and when a pause before its calls
    explains that."""

    late_ms: float = setting(1.0, "arriving this much after the first rank of the group counts as late")
    persistent_share: float = setting(0.6, "late at this share of its collectives: the delay is on its comm path")
    min_lateness_ms: float = setting(5.0, "... and by this much on average: ranks sharing a busy host arrive a few ms "
                                     "apart by turns")
    # A clean 4-rank run here: 9 ms against the others' 3 ms.
    lateness_ratio: float = setting(4.0, "... and this many times later than the other ranks usually are: on a busy "
                                    "host every rank is late by turns")
    # With 4 ranks and 4 collectives, chance alone makes some rank last 3 times of 4 in one run of five. Weighed
    # by how late, not only who came last: a 3-step window holds 6 collectives of 2 ranks, and a count of who came
    # last lost its significance (5 of 6: p = 0.11) whenever a busy host held the peer up once a little longer.
    alpha: float = setting(0.05, "... and later, summed over its collectives, than chance would make it (each "
                           "collective's arrivals shuffled between its ranks), at this significance")
    chance_grid_ms: float = setting(0.5, "lateness is weighed against chance in steps of this: finer than late_ms, "
                                    "and coarse enough for the exact count of a short window's shuffles")
    exact_chance_bins: int = setting(1 << 12, "chance's distribution of a rank's summed lateness is counted exactly up "
                                     "to this many grid steps ...")
    exact_chance_collectives: int = setting(64, "... and this many collectives of a group (a short profiled window); "
                                            "beyond, its normal approximation, close with that many")
    # Counting such a collective would dilute a rank late wherever arrivals do differ (a comm hook
    # delays the gradient buckets, not the loss all-reduce beside them).
    arrived_together_ms: float = setting(5.0, "a collective its ranks reached within this of each other (by default "
                                         "min_lateness_ms) has no late rank: who came last there is a coin toss")
    # Less, and its lateness comes from its own work earlier in the step (a straggler). A third: what
    # else a late rank carries into the collective (contended compute since the last one) can be twice
    # the pause itself on a shared host.
    gap_explains_share: float = setting(1 / 3, "a late rank that pauses right before its calls this much longer than "
                                        "its peers, as a share of its lateness (and by min_lateness_ms), was held up "
                                        "on its way to the collective (a comm hook, a delay before each call)")


@section("onset")
class Onset:
    """When a cause's first step is where it began, not the first blip the same evidence showed before it."""

    min_llr: float = setting(10.0, "how often the cause came changed at one step this surely (twice the log-likelihood "
                             "ratio of a rate before and one after, against one rate: 10 is p < 0.002)...")
    min_rise: float = setting(3.0, "... and it came at least this many times as often after that step as before: a "
                              "busy host's blips before a fault begins are told apart from it")
    min_after: int = setting(3, "... with at least this many of its steps after it")


def onset(flagged: list[int] | np.ndarray, steps: list[int] | np.ndarray) -> int | None:
    """The step a cause flagged in ``flagged`` (of ``steps``, in order) began at, where it came far more often from
    a step on than before it (Onset); None where it came at one rate (its first step is then its start)."""
    s = Onset.active()
    steps = np.sort(np.asarray(steps))
    marked = np.isin(steps, np.asarray(flagged))  # arrays: a cause of a long run is flagged in many steps
    at, llr = rate_change(marked)
    if llr < s.min_llr or at == 0:
        return None
    after = steps[at:][marked[at:]]
    rate_before, rate_after = marked[:at].sum() / at, len(after) / (len(steps) - at)
    if len(after) < s.min_after or rate_after < s.min_rise * rate_before:
        return None
    return int(after[0])


# Phases that alone say too little of a rank's own work to compare ranks by: the optimizer step
# that `diagtrain run`'s optimizer hooks time in a plain script (a few ms that a busy host doubles).
UNINFORMATIVE_PHASES = frozenset({"optimizer"})


def informative_phases(phases: list[str]) -> list[str]:
    """The recorded phases, unless they are only the uninformative ones (then none)."""
    return [] if set(phases) <= UNINFORMATIVE_PHASES else list(phases)


def profiled_steps(steps: pd.DataFrame) -> list[int]:
    """The steps with traces, in order (none where the step table does not say)."""
    if "profiled" not in steps:
        return []
    return sorted(int(s) for s in steps.loc[steps["profiled"].astype(bool), "step"].unique())


def steady(steps: pd.DataFrame, at_least: int | None = None) -> pd.DataFrame:
    """The steps after warm-up; all of them if fewer than ``at_least`` (default ``steady.min_steady_steps``,
    what comparing ranks needs) would be left. The run's model takes one steady step (judge/model_check/measured.py)."""
    if steps.empty:
        return steps
    s = Steady.active()
    later = steps[steps["step"] > s.warmup_steps]
    return later if later["step"].nunique() >= (s.min_steady_steps if at_least is None else at_least) else steps


def steady_columns(steps: pd.DataFrame, columns: tuple[str, ...], at_least: int | None = None) -> pd.DataFrame:
    """:func:`steady` of ``columns`` of ``steps`` (those it has): a long run's whole table is not copied for a few."""
    return steady(steps[[c for c in dict.fromkeys(columns) if c in steps]], at_least)


def time_range(steps: pd.DataFrame) -> tuple[float, float] | None:
    """Unix-time span of these step rows."""
    if steps.empty or "start" not in steps:
        return None
    return float(steps["start"].min()), float(steps["end"].max())


LATE_COLUMNS = ["rank", "group", "collectives", "late", "late_share", "lateness_ms", "chance", "p_value", "extra_gap_ms",
                "lateness_sum", "null_mean", "null_var", "null_pmf"]


def late_arrivals(collectives: pd.DataFrame) -> pd.DataFrame:
    """Per rank and process group: collectives judged (those not reached together), share of them at
    which it arrived last and late, mean lateness (ms), and how much longer than its peers it paused
    right before its calls."""
    if collectives.empty or "group" not in collectives:
        return pd.DataFrame(columns=LATE_COLUMNS)
    shared = collectives["ranks_seen"] > 1
    if "is_p2p" in collectives:
        shared &= ~collectives["is_p2p"].fillna(False).astype(bool)
    table = collectives[shared].copy()
    if table.empty:
        return pd.DataFrame(columns=LATE_COLUMNS)
    s = LateArrival.active()
    key = ["group", "op", "seq"]
    arrived = table["arrived_ts"] if "arrived_ts" in table else table["ts"]
    table["lateness_ms"] = (arrived - arrived.groupby([table[k] for k in key]).transform("min")) / 1e3
    spread = table["lateness_ms"].groupby([table[k] for k in key]).transform("max")
    table["judged"] = spread >= s.arrived_together_ms
    table["late"] = (table["last_rank"] == table["rank"]) & (table["lateness_ms"] >= s.late_ms) & table["judged"]
    table["chance"] = (1.0 / table["ranks_seen"]).where(table["judged"])
    gap = table["issue_gap_us"] if "issue_gap_us" in table else pd.Series(np.nan, index=table.index)
    by = gap.groupby([table[k] for k in key])
    others = (by.transform("sum") - gap) / (by.transform("count") - 1)  # the other ranks' mean gap
    table["extra_gap_ms"] = ((gap - others) / 1e3).where(table["late"])
    # Chance's share of a rank's lateness: in each judged collective, what a rank drawn at random from its
    # arrivals would be late by (its mean and variance), on the grid the exact count uses.
    table["steps"] = np.rint(table["lateness_ms"] / s.chance_grid_ms).where(table["judged"], 0.0)
    by_collective = table["steps"].groupby([table[k] for k in key])
    mean = by_collective.transform("mean")
    table["null_mean"] = mean.where(table["judged"], 0.0)
    table["null_var"] = ((table["steps"] ** 2).groupby([table[k] for k in key]).transform("mean") - mean ** 2) \
        .clip(lower=0.0).where(table["judged"], 0.0)
    out = table.groupby(["rank", "group"]).agg(
        collectives=("judged", "sum"), late=("late", "sum"),
        lateness_ms=("lateness_ms", "mean"), chance=("chance", "mean"), extra_gap_ms=("extra_gap_ms", "median"),
        lateness_sum=("steps", "sum"), null_mean=("null_mean", "sum"), null_var=("null_var", "sum"),
    ).reset_index()
    out["late_share"] = (out["late"] / out["collectives"]).where(out["collectives"] > 0, 0.0)
    pmfs, judged_in = _null_pmfs(table[table["judged"]], key, s)
    # A rank seen in fewer of its group's judged collectives than the group holds has another null: approximated.
    out["null_pmf"] = [pmfs.get(g) if n == judged_in.get(g) else None for g, n in zip(out["group"], out["collectives"])]
    out["p_value"] = [_tail(x, [pmf], m, v) for x, pmf, m, v in
                      zip(out["lateness_sum"], out["null_pmf"], out["null_mean"], out["null_var"])]
    return out[LATE_COLUMNS]


def _null_pmfs(judged: pd.DataFrame, key: list[str], s: LateArrival) -> tuple[dict, dict]:
    """Per group: the exact distribution (over grid steps) of the lateness summed over its judged collectives of a
    rank drawn at random from each one's arrivals (None where it would hold more than ``exact_chance_bins`` steps),
    and how many judged collectives it holds. Every rank of a group meets at the same collectives: one per group."""
    pmfs, counts = {}, {}
    for group, rows in judged.groupby("group", sort=False):
        pmf: np.ndarray | None = np.ones(1)
        collectives = rows.groupby(key[1:], sort=False)["steps"]
        counts[group] = collectives.ngroups
        if collectives.ngroups > s.exact_chance_collectives:
            pmfs[group] = None
            continue
        for _, steps in collectives:
            one = np.bincount(steps.to_numpy(dtype=np.int64)) / len(steps)
            if len(pmf) + len(one) > s.exact_chance_bins:
                pmf = None
                break
            pmf = np.convolve(pmf, one)
        pmfs[group] = pmf
    return pmfs, counts


def chance_of_lateness(rows: pd.DataFrame) -> float:
    """How often chance alone makes a rank at least as late, summed over the judged collectives of ``rows`` (rows of
    :func:`late_arrivals` of one rank: its groups pooled), with each collective's arrivals shuffled between its
    ranks: exactly from the groups' distributions where known, else by their normal approximation."""
    return _tail(float(rows["lateness_sum"].sum()), list(rows["null_pmf"]), float(rows["null_mean"].sum()),
                 float(rows["null_var"].sum()))


def _tail(observed: float, pmfs: list[np.ndarray | None], mean: float, var: float) -> float:
    """P(chance's summed lateness >= ``observed``), in grid steps: from the groups' exact distributions ``pmfs`` where
    all are known, else from the normal distribution of ``mean`` and ``var``."""
    if observed <= 0.0:
        return 1.0
    if all(p is not None for p in pmfs) and sum(len(p) for p in pmfs) <= LateArrival.active().exact_chance_bins:
        pmf = np.ones(1)
        for p in pmfs:
            pmf = np.convolve(pmf, p)
        return float(min(1.0, pmf[int(round(observed)):].sum()))
    if var <= 0.0:
        return 0.0 if observed > mean else 1.0
    return float(0.5 * math.erfc((observed - mean) / math.sqrt(2.0 * var)))


def is_persistently_late(late: pd.DataFrame) -> pd.Series:
    """Rows of ``late_arrivals`` whose rank is late at most collectives of that group, by more than
    noise: later than the group's other ranks usually are, and later than chance would make it (its
    lateness summed against each collective's arrivals shuffled: one collective at which a busy host
    held a peer up a little longer weighs by how much, not as a whole collective lost). The chance
    test pools the groups in which the rank is late this way (a rank held up before every call is
    late in each of its groups, each with few collectives in a short profiled window)."""
    s = LateArrival.active()
    others = late.groupby("group")["lateness_ms"].transform(_median_of_the_others).fillna(0.0)
    candidate = ((late["late_share"] >= s.persistent_share) & (late["lateness_ms"] >= s.min_lateness_ms)
                 & (late["lateness_ms"] >= s.lateness_ratio * others))
    p_value = {int(r): chance_of_lateness(rows) for r, rows in late[candidate].groupby("rank")}
    return candidate & (late["rank"].map(p_value).fillna(1.0) < s.alpha)


def _median_of_the_others(values: pd.Series) -> pd.Series:
    v = values.to_numpy(dtype=float)
    if len(v) < 2:
        return pd.Series(np.nan, index=values.index)
    return pd.Series([float(np.median(np.delete(v, i))) for i in range(len(v))], index=values.index)


def held_before_calls(late: pd.DataFrame) -> pd.Series:
    """Per row of ``late_arrivals``: 1.0 when its lateness is a pause right before the rank's
    calls, 0.0 when it comes from the rank's earlier work, NaN when unknown (no call gaps: GPU)."""
    s = LateArrival.active()
    explained = ((late["extra_gap_ms"] >= s.gap_explains_share * late["lateness_ms"])
                 & (late["extra_gap_ms"] >= s.min_lateness_ms)).astype(float)
    return explained.where(late["extra_gap_ms"].notna())


def persistently_late(collectives: pd.DataFrame) -> set[int]:
    """Ranks that arrive last at most collectives of some group."""
    late = late_arrivals(collectives)
    return set(int(r) for r in late.loc[is_persistently_late(late), "rank"])


def late_on_their_path(collectives: pd.DataFrame) -> tuple[set[int], set[int]]:
    """Persistently late ranks whose delay sits right before their calls: (known from the gaps
    before their calls, assumed where those gaps are unknown)."""
    late = late_arrivals(collectives)
    if late.empty:  # no collectives traced (every live judgement): nothing to test, and the test costs
        return set(), set()
    late = late[is_persistently_late(late)]
    held = held_before_calls(late)
    known = set(int(r) for r in late.loc[held == 1.0, "rank"])
    assumed = set(int(r) for r in late.loc[held.isna(), "rank"]) - known
    return known, assumed


def job_totals(tables: Tables) -> JobTime | None:
    """The run's wall time by category (run/job_time.py), judged on its steady steps; a running job's
    (status "running") has no teardown yet."""
    steps = tables.job_steps
    if steps.empty:
        return None
    kept = distinct(steady(steps[["step"]])["step"]).tolist()
    return job_time.totals(tables, kept, finished=tables.manifest.get("status") != "running")


def steady_job_steps(tables: Tables) -> pd.DataFrame:
    """The job's steps (run/job_time.py) after warm-up."""
    return steady(tables.job_steps) if not tables.job_steps.empty else tables.job_steps


def steady_host_loads(tables: Tables) -> dict[str, HostLoad]:
    """Each host's CPU load over the run's steady steps (run/host_load.py). Made once per steps table, telemetry and
    settings: the host_contention detector and the contention assessment (once per straggler) both read them."""
    settings = tuple(tuple(values(s).items()) for s in (Contention.active(), Steady.active()))
    held = tables.memo.get("steady_host_loads")
    if held is None or held[0] is not tables.steps or held[1] is not tables.telemetry or held[2] != settings:
        loads = host_loads(tables, steady_columns(tables.steps, LOAD_COLUMNS), whole_run=True)
        held = tables.memo["steady_host_loads"] = (tables.steps, tables.telemetry, settings, loads)
    return held[3]
