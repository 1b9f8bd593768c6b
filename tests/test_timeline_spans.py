"""Timeline spans (what the dashboard draws) add up to the time breakdown, on real traces."""

from __future__ import annotations


import numpy as np
import pytest

from diagtrain.profiler.analyzer.per_rank.breakdown import cpu_breakdown, gpu_breakdown_in
from diagtrain.profiler.analyzer.read.flight_records import Entry, cross_rank, mismatches
from diagtrain.profiler.analyzer.per_rank.timeline import spans
from diagtrain.profiler.analyzer.read.trace_file import STEP_ANNOTATION, name_matches, read_trace
from public_fixtures import HTA_TRACES as TRACES



def lengths(table) -> dict[str, float]:
    return {kind: float((rows["end_us"] - rows["start_us"]).sum()) for kind, rows in table.groupby("kind", observed=True)}


def disjoint_and_sorted(table) -> bool:
    for _, rows in table.groupby("kind", observed=True):
        s, e = rows["start_us"].to_numpy(), rows["end_us"].to_numpy()
        if not (np.all(np.diff(s) >= 0) and np.all(s[1:] >= e[:-1]) and np.all(e >= s)):
            return False
    return True


@pytest.mark.parametrize("name", ["nccl_2rank_rank0", "rocm_mi250_minitoy"])
def test_gpu_spans_add_up_to_the_breakdown(name):
    events = read_trace(TRACES / f"{name}.json.gz").events
    table = spans(events, on_gpu=True)
    kernels = events[events["stream"] >= 0]
    b = gpu_breakdown_in(events, (kernels["ts"].min(), kernels["end"].max()))
    total = lengths(table)
    assert total["compute"] == pytest.approx(b.compute_us) and total["idle"] == pytest.approx(b.idle_us)
    assert total.get("comm", 0.0) == pytest.approx(b.comm_us)
    assert disjoint_and_sorted(table)
    # Each span is named after a kernel of its kind that opens it.
    compute = table[table["kind"] == "compute"]
    assert not compute["name"].astype(str).str.startswith("nccl").any()


def test_cpu_spans_take_the_outermost_op_name():
    events = read_trace(TRACES / "cpu_only_gloo_rank34.json.gz").events
    table = spans(events, on_gpu=False)
    window = (events["ts"].min(), events["end"].max())
    b = cpu_breakdown(events, window)
    total = lengths(table)
    assert total["compute"] == pytest.approx(b.compute_us) and total["comm"] == pytest.approx(b.comm_us)
    assert disjoint_and_sorted(table)
    ops = events[(events["cat"] == "cpu_op") & (events["kind"] == "cpu")]
    first = table[table["kind"] == "compute"].iloc[0]
    opening = ops[ops["ts"] == first["start_us"]]
    assert first["name"] == opening.loc[opening["dur"].idxmax(), "name"]  # the outer op, not a nested one


def test_cpu_idle_is_the_gaps_inside_each_profiled_step():
    events = read_trace(TRACES / "cpu_only_gloo_rank34.json.gz").events
    idle = spans(events, on_gpu=False).query("kind == 'idle'")
    steps = events[(events["stream"] < 0).to_numpy() & name_matches(events["name"], STEP_ANNOTATION)]
    assert len(steps) >= 1
    expected = sum(cpu_breakdown(events[(events["ts"] < hi) & (events["end"] > lo)], (lo, hi)).idle_us
                   for lo, hi in zip(steps["ts"], steps["end"]))
    assert float((idle["end_us"] - idle["start_us"]).sum()) == pytest.approx(expected) and expected > 0
    assert idle["start_us"].min() >= steps["ts"].min() and idle["end_us"].max() <= steps["end"].max()


def entry(rank: int, seq: int, op: str, sizes) -> Entry:
    return Entry(rank=rank, pg="0:0,1", pg_desc="default_pg", seq=seq, op=op, sizes=sizes, dtypes=["Float"],
                 created_ns=seq * 1000 + rank, state="scheduled")


def test_scatter_inputs_on_the_root_only_are_not_a_mismatch():
    scatter = [entry(0, 1, "gloo:scatter", [[2, 32]]), entry(1, 1, "gloo:scatter", [])]
    assert mismatches(scatter) == []
    different = [entry(0, 2, "gloo:all_reduce", [[8]]), entry(1, 2, "gloo:all_reduce", [[4]])]
    [m] = mismatches(scatter + different)
    assert m.seq == 2 and set(m.versions) == {0, 1}


def test_cross_rank_table_lists_who_never_entered():
    entries = [entry(0, 1, "gloo:all_reduce", [[8]]), entry(1, 1, "gloo:all_reduce", [[8]]),
               entry(0, 2, "gloo:all_reduce", [[8]])]
    rows = cross_rank(entries, tail=10)
    assert [(r["seq"], r["entered"], r["missing"]) for r in rows] == [(1, [0, 1], []), (2, [0], [1])]
    assert cross_rank(entries, tail=1)[0]["seq"] == 2
