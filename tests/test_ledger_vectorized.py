"""The ledger's peer baselines and savings, and the straggler detector's candidates, computed for all
steps at once (issue 39: they cost most of a live judgement), give what a straightforward loop over
steps and peer groups gives, to the bit: ties, NaN counters, ranks alone in a step and ranks of no
peer group included."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
from hypothesis import given, settings, strategies as st

from diagtrain.profiler.analyzer.judge.detectors.straggler import Straggler, _Candidates
from diagtrain.profiler.analyzer.run import ledger as lg
from diagtrain.profiler.util.groups import Groups, median_by, median_of_others, positions_by
from straggler_reference import over_peers

PARTS = ["forward", "backward", lg.OUTSIDE]
# Few distinct values: ties between ranks (which one is the top, which median) are the hard cases.
VALUE = st.sampled_from([0.0, 0.5, 1.0, 2.0, 2.5, 7.0, 40.0, 41.5, 300.0])


def reference_median_of_others(values: np.ndarray) -> np.ndarray:
    return np.array([np.median(np.delete(values, i)) for i in range(len(values))])


def reference_baselines(ledger: pd.DataFrame, groups: list[list[int]], parts: list[str]) -> None:
    """Per (step, peer group): each rank's excess over the median of the others."""
    ledger["peer_running_ms"] = np.nan
    ledger["cpu_excess_ms"] = 0.0
    for part in parts:
        ledger[lg.excess_column(part)] = 0.0
    group_of = {r: i for i, g in enumerate(groups) for r in g}
    cells = ledger.groupby([ledger["step"], ledger["rank"].map(group_of).fillna(-1).astype(int)])
    for _, rows in cells:
        if len(rows) < 2:
            continue
        ledger.loc[rows.index, "peer_running_ms"] = reference_median_of_others(rows["running_ms"].to_numpy())
        for column, target in [("cpu_ms", "cpu_excess_ms")] + [(lg.work_column(p), lg.excess_column(p)) for p in parts]:
            values = rows[column].to_numpy()
            ledger.loc[rows.index, target] = np.clip(values - reference_median_of_others(values), 0.0, None)
    ledger["excess_ms"] = (ledger["running_ms"] - ledger["peer_running_ms"]).clip(lower=0.0).fillna(0.0)


def reference_savings(ledger: pd.DataFrame, parts: list[str]) -> None:
    """Per step: the Shapley shares, the top rank's saving and whom the others waited for."""
    ledger["saving_ms"], ledger["lost_ms"], ledger["cause_phase"] = 0.0, 0.0, None
    ledger["waited_for"], ledger["waited_for_phase"] = -1, None
    excess = ledger[[lg.excess_column(p) for p in parts]].to_numpy()
    for _, rows in ledger.groupby("step"):
        running = rows["running_ms"].to_numpy()
        if len(running) < 2:
            continue
        shares = lg.shapley_of_max(running, rows["excess_ms"].to_numpy())
        for i in np.flatnonzero(shares > 0):
            ledger.at[rows.index[i], "lost_ms"] = float(shares[i])
            ledger.at[rows.index[i], "cause_phase"] = parts[int(np.argmax(excess[rows.index[i]]))]
        order = np.argsort(running)
        top = rows.index[order[-1]]
        saving = min(float(ledger.at[top, "excess_ms"]), float(running[order[-1]]) - float(running[order[-2]]))
        if saving > 0:
            ledger.at[top, "saving_ms"] = saving
            others = rows.index[rows.index != top]
            ledger.loc[others, "waited_for"] = int(ledger.at[top, "rank"])
            ledger.loc[others, "waited_for_phase"] = ledger.at[top, "cause_phase"]


@st.composite
def ledgers(draw) -> tuple[pd.DataFrame, list[list[int]]]:
    """A ledger's inputs: some (rank, step) rows missing, counters possibly NaN, ranks in peer groups or none."""
    ranks = draw(st.integers(1, 7))
    steps = draw(st.integers(1, 4))
    cells = [(r, s) for s in range(1, steps + 1) for r in range(ranks)]
    kept = [c for c in cells if draw(st.booleans()) or draw(st.booleans())]  # about 3 in 4 kept
    column = st.lists(VALUE, min_size=len(kept), max_size=len(kept))
    cpu = draw(st.lists(st.one_of(VALUE, st.just(np.nan)), min_size=len(kept), max_size=len(kept)))
    table = pd.DataFrame({"rank": [r for r, _ in kept], "step": [s for _, s in kept],
                          "running_ms": draw(column), "cpu_ms": cpu}, dtype=float)
    table[["rank", "step"]] = table[["rank", "step"]].astype(int)
    for part in PARTS:
        table[lg.work_column(part)] = draw(column)
    group = draw(st.lists(st.integers(-1, 2), min_size=ranks, max_size=ranks))  # -1: in no group
    groups = [[r for r in range(ranks) if group[r] == g] for g in range(3)]
    return table.reset_index(drop=True), [g for g in groups if g]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.one_of(VALUE, st.just(np.nan), st.just(np.inf))), max_size=30))
def test_median_of_others_is_numpys_median_without_the_element(cells):
    groups = np.array([g for g, _ in cells], dtype=int)
    values = np.array([v for _, v in cells], dtype=float)
    expected = np.full(len(values), np.nan)
    for g in set(groups.tolist()):
        mine = np.flatnonzero(groups == g)
        if len(mine) >= 2:
            expected[mine] = reference_median_of_others(values[mine])
    np.testing.assert_array_equal(median_of_others(values, groups), expected)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.one_of(VALUE, st.just(np.nan), st.just(np.inf))), max_size=30))
def test_median_by_group_and_positions_by_are_groupbys(cells):
    groups = np.array([g for g, _ in cells], dtype=int)
    values = np.array([v for _, v in cells], dtype=float)
    expected = np.array([np.median(values[groups == g]) for g in groups])
    np.testing.assert_array_equal(median_by(values, groups), expected)
    by_pandas = [(key, rows.to_numpy()) for key, rows in pd.Series(np.arange(len(groups))).groupby(groups)]
    found = positions_by(groups)
    assert [k for k, _ in found] == [k for k, _ in by_pandas]
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(found, by_pandas))


@settings(max_examples=300, deadline=None)
@given(ledgers())
def test_baselines_and_savings_match_the_loop_over_steps(case):
    table, groups = case
    fast, slow = table.copy(), table.copy()
    lg._peer_baselines(fast, groups, PARTS)
    lg._savings(fast, PARTS)
    reference_baselines(slow, groups, PARTS)
    reference_savings(slow, PARTS)
    pd.testing.assert_frame_equal(fast, slow[fast.columns], check_exact=True)
    assert list(fast.columns) == list(slow.columns)


def test_a_straggler_is_charged_and_waited_for():
    """A worked case, so that both implementations being wrong alike would show: rank 2 runs 30 ms
    above its peers' 10 in step 1; ranks 0 and 1 wait for it in its forward."""
    table = pd.DataFrame({"rank": [0, 1, 2, 0, 1, 2], "step": [1, 1, 1, 2, 2, 2],
                          "running_ms": [10.0, 10.0, 40.0, 10.0, 11.0, 10.0], "cpu_ms": [10.0] * 6,
                          "work_forward_ms": [5.0, 5.0, 35.0, 5.0, 6.0, 5.0], "work_backward_ms": [5.0] * 6,
                          "work_outside_phases_ms": [0.0] * 6})
    lg._peer_baselines(table, [[0, 1, 2]], PARTS)
    lg._savings(table, PARTS)
    assert table["excess_ms"].tolist() == [0.0, 0.0, 30.0, 0.0, 1.0, 0.0]
    assert table["saving_ms"].tolist() == [0.0, 0.0, 30.0, 0.0, 1.0, 0.0]
    assert table["lost_ms"].tolist() == [0.0, 0.0, 30.0, 0.0, 1.0, 0.0]
    assert table["waited_for"].tolist() == [2, 2, -1, 1, -1, 1]
    assert table["waited_for_phase"].tolist() == ["forward", "forward", None, "forward", None, "forward"]


@st.composite
def step_values(draw) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One part's values of some ranks in some steps (rows missing, NaN, ties), and each row's usual
    value and noise (NaN where unknown), in the straggler detector's row order: by rank, then step."""
    ranks, steps = draw(st.integers(1, 6)), draw(st.integers(1, 5))
    kept = [(r, s) for r in range(ranks) for s in range(1, steps + 1) if draw(st.booleans()) or draw(st.booleans())]
    maybe_nan = st.one_of(VALUE, VALUE, VALUE, st.just(np.nan))
    per_rank = {r: (draw(maybe_nan), draw(maybe_nan)) for r in range(ranks)}
    values = np.array(draw(st.lists(maybe_nan, min_size=len(kept), max_size=len(kept))), dtype=float)
    rank = np.array([r for r, _ in kept], dtype=int)
    return (rank, np.array([s for _, s in kept], dtype=int), values,
            np.array([per_rank[r][0] for r in rank], dtype=float), np.array([per_rank[r][1] / 10 for r in rank], dtype=float))


@settings(max_examples=200, deadline=None)
@given(step_values(), st.sampled_from([0.0, 1.0, 5.0]))
def test_the_straggler_candidates_of_all_steps_are_each_steps(case, threshold):
    # The detector's candidates computed for every step at once give what its per-step function gives.
    rank, step, values, usual, noise = case
    s = Straggler()
    by_step = positions_by(step)
    numbers, at = np.unique(step, return_inverse=True)
    candidates = _Candidates(Groups(at, len(numbers)), values, usual, noise, threshold, 40.0, s)
    for k, (number, rows) in enumerate(by_step):
        expected = over_peers(number, rank[rows], values[rows], "forward", usual[rows], noise[rows], "phases",
                              threshold, 40.0, s)
        found = [] if not candidates.ok[k] else [{
            "rank": int(rank[candidates.top[k]]), "step": int(number), "phase": "forward",
            "excess_ms": candidates.excess[k], "value_ms": float(candidates.value[k]),
            "peer_ms": float(candidates.peer[k]), "source": "phases", "threshold_ms": float(candidates.limit[k])}]
        assert found == expected, (k, rows)


def reference_cpu_floor(ledger: pd.DataFrame, t) -> pd.Series:
    """The CPU floor as first written: each row's host looked up by a map over the rows."""
    free = lg.free_cpus(t)
    host = ledger["rank"].map(t.rank_hosts)
    cores = host.map(free).astype(float)
    if cores.isna().any() or ledger["cpu_ms"].isna().any():
        return pd.Series(np.nan, index=ledger.index)
    work = ledger["cpu_ms"] - ledger["cpu_excess_ms"].where(ledger["lost_ms"] > 0, 0.0)
    return (work / cores).groupby([ledger["step"], host]).transform("sum").groupby(ledger["step"]).transform("max")


@settings(max_examples=150, deadline=None)
@given(ledgers(), st.lists(st.sampled_from(["a", "b", "c", "a", "b", None]), min_size=7, max_size=7),
       st.lists(st.sampled_from([0, 1, 2, 3, 2, 3]), min_size=3, max_size=3), st.lists(VALUE, min_size=1), st.booleans())
def test_the_cpu_floor_of_all_rows_at_once_is_the_map_over_rows(case, host_of, cpus, more, measured):
    table, _ = case
    if measured:  # every rank's CPU time known: a floor (NaN makes it none)
        table["cpu_ms"] = table["cpu_ms"].fillna(1.5)
    table["cpu_excess_ms"] = [more[i % len(more)] for i in range(len(table))]
    table["lost_ms"] = [more[(i + 1) % len(more)] - 2.0 for i in range(len(table))]
    hosts = [{"name": name, "cpus": n} for name, n in zip("abc", cpus)]  # 0 CPUs: unknown
    t = SimpleNamespace(telemetry=None, hosts=hosts, rank_hosts={r: h for r, h in enumerate(host_of) if h})
    found = lg._cpu_floor({c: table[c].to_numpy() for c in table.columns}, t)
    # Summed in another order than the map's: equal to the last bits (3.0000000000000004 against 3.0), no further.
    np.testing.assert_allclose(found, reference_cpu_floor(table, t).to_numpy(), rtol=1e-12, atol=1e-12)
