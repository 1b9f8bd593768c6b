"""A trace analyzed a piece at a time (bounded worker memory, issue 18) gives exactly what it gives whole."""

from __future__ import annotations


import numpy as np
import pandas as pd
import pytest

from diagtrain.profiler.analyzer.per_rank import breakdown as bd
from diagtrain.profiler.analyzer.read import dialects
from diagtrain.profiler.util import intervals as iv
from diagtrain.profiler.analyzer.per_rank import pipeline, timeline
from diagtrain.profiler.analyzer.per_rank.steps import step_breakdown
from diagtrain.profiler.analyzer.read.trace_file import read_trace
from diagtrain.profiler.analyzer.per_rank.work_segments import rank_segments
from public_fixtures import HTA_TRACES as TRACES

PIECES = 50  # a trace cut in this many: pieces end inside nested ops and long kernels


def _random_intervals(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Intervals sorted by start, with ties, nesting, zero lengths and gaps of every size."""
    starts = np.sort(rng.integers(0, 40 * n, n)).astype(float)
    lengths = rng.choice([0.0, 1.0, 3.0, 40.0, 400.0], n, p=[0.1, 0.4, 0.3, 0.15, 0.05])
    return starts, starts + lengths


@pytest.mark.parametrize("gap", [0.0, 5.0])
def test_running_union_in_pieces_joins_to_the_whole_merge(gap):
    rng = np.random.default_rng(7)
    starts, ends = _random_intervals(rng, 3000)
    ids = np.arange(len(starts))
    (whole_s, whole_e), whole_first = iv.merge_with_first(starts, ends, gap)
    cuts = np.unique(np.concatenate([[0, len(starts)], rng.integers(0, len(starts), 60)]))
    union, got = iv.RunningUnion(gap), []
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        got.append(union.add(starts[lo:hi], ends[lo:hi], ids[lo:hi]))
    got.append(union.close())
    np.testing.assert_array_equal(np.concatenate([g[0][0] for g in got]), whole_s)
    np.testing.assert_array_equal(np.concatenate([g[0][1] for g in got]), whole_e)
    np.testing.assert_array_equal(np.concatenate([g[1] for g in got]), whole_first)
    assert len(whole_s) > 100  # the data has many separate intervals, not one


@pytest.mark.parametrize("shuffled", [False, True])
def test_pieces_follow_start_order_and_never_split_events_that_start_together(shuffled):
    rng = np.random.default_rng(3)
    ts = np.sort(rng.integers(0, 300, 2000)).astype(float)  # many ties
    if shuffled:  # several windows joined out of time order
        ts = np.concatenate([ts[1000:], ts[:1000]])
    selected = rng.random(len(ts)) < 0.7
    got = list(iv.pieces(ts, selected, size=37))
    expected = np.argsort(ts, kind="stable")
    np.testing.assert_array_equal(np.concatenate(got), expected[selected[expected]])
    for before, after in zip(got[:-1], got[1:]):
        if len(before) and len(after):
            assert ts[before].max() < ts[after].min()
    assert len(got) > 20


@pytest.mark.jobs
@pytest.mark.parametrize("name, on_gpu", [("nccl_2rank_rank0", True), ("sampled_128rank_rank1", True),
                                          ("user_run", False)])
def test_every_stage_gives_the_same_in_small_pieces_as_whole(request, monkeypatch, name, on_gpu):
    """Real GPU traces, and a gloo rank of a plain torchrun script (host ops nested deep)."""
    path = request.getfixturevalue(name).traces(0)[0] if name == "user_run" else TRACES / f"{name}.json.gz"
    events = read_trace(path).events
    assert len(events) > 5 * PIECES

    def stages() -> dict:
        steps = step_breakdown(events, 0, on_gpu)
        return {
            "whole": bd.gpu_breakdown(events) if on_gpu else bd.cpu_breakdown(events, (events["ts"].min(),
                                                                                       events["end"].max())),
            "steps": steps, "overlapping": pipeline._overlapping_kernels(events),
            "segments": rank_segments(events, 0, on_gpu),
            "spans": timeline.spans(events, on_gpu).sort_values(["kind", "start_us"], kind="stable",
                                                                 ignore_index=True),
        }

    monkeypatch.setattr(iv, "PIECE_EVENTS", 10 * len(events))
    whole = stages()
    monkeypatch.setattr(iv, "PIECE_EVENTS", len(events) // PIECES)
    pieces = stages()
    assert pieces["whole"].total_us > 0 and pieces["whole"].compute_us > 0
    for field in ("total_us", "idle_us", "compute_us", "comm_us", "exposed_comm_us"):
        assert getattr(pieces["whole"], field) == pytest.approx(getattr(whole["whole"], field), rel=1e-12, abs=1e-6)
    assert pieces["overlapping"] == whole["overlapping"]
    assert len(whole["steps"]) and len(whole["segments"]) > 5 and len(whole["spans"]) > 100
    for table in ("steps", "segments", "spans"):
        pd.testing.assert_frame_equal(pieces[table], whole[table], check_exact=False, rtol=1e-12, atol=1e-6)


def test_kernels_overlapping_across_pieces_are_counted(monkeypatch):
    # Two streams, kernels interleaved in start order: three start 5 µs before the kernel before them on
    # their stream ends, which lies in the piece before theirs when pieces are 2 events.
    ts = np.array([0.0, 10.0, 15.0, 25.0, 30.0, 80.0])
    end = np.array([20.0, 30.0, 35.0, 60.0, 70.0, 90.0])
    stream = np.array([7, 8, 7, 8, 7, 8], dtype=np.int32)
    events = pd.DataFrame({"ts": ts, "end": end, "stream": stream,
                           "kind": pd.Categorical(["compute"] * 6, categories=dialects.KINDS)})
    monkeypatch.setattr(iv, "PIECE_EVENTS", 2)
    assert pipeline._overlapping_kernels(events) == 3
    monkeypatch.setattr(iv, "PIECE_EVENTS", 100)
    assert pipeline._overlapping_kernels(events) == 3


def test_gpu_segments_of_windows_with_different_names(monkeypatch):
    # Two profiled windows of a rank with different kernel names: joined, the names are no longer one
    # categorical; the segments still name the kernel each opens with.
    traces = [read_trace(TRACES / f"{name}.json.gz") for name in ("nccl_2rank_rank0", "sampled_128rank_rank1")]
    events, _ = pipeline._rank_events(traces)
    monkeypatch.setattr(iv, "PIECE_EVENTS", len(events) // PIECES)
    segments = rank_segments(events, 0, on_gpu=True)
    alone = [rank_segments(t.events, 0, on_gpu=True) for t in traces]
    assert len(segments) == sum(len(a) for a in alone) > 10
    assert sorted(segments["op"]) == sorted(op for a in alone for op in a["op"])
    assert (segments["op"] != "").mean() > 0.9
