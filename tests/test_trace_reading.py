"""The trace reader decodes a trace a block at a time, cut at event boundaries, and must give exactly
what reading the whole document event by event gives, whatever the layout; what it cannot cut it reads
event by event."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from diagtrain.profiler.analyzer.read import trace_file
from diagtrain.profiler.analyzer.read.trace_file import TraceError, read_trace
from public_fixtures import HTA_TRACES

DIALECTS = Path(__file__).parent / "fixtures" / "dialects"
TRACES = sorted(HTA_TRACES.glob("*.json.gz")) + sorted(DIALECTS.glob("*.json"))
TINY_BLOCK = 4096  # many pieces even in a small trace, and a cut in nearly every event's neighbourhood


def whole(path: Path) -> trace_file.TraceFile:
    """The trace read event by event (the reader's fallback)."""
    header, columns, _ = trace_file._read_whole(path)
    events, notes, ranges, arguments = columns.frame()
    return trace_file.TraceFile(path=path, events=events, rank=None, world_size=None, backend=None, notes=notes,
                                device_ranges=ranges, arguments=arguments)


def assert_same(a: trace_file.TraceFile, b: trace_file.TraceFile) -> None:
    for frame_a, frame_b in ((a.events, b.events), (a.comm_events(), b.comm_events())):
        assert list(frame_a.columns) == list(frame_b.columns)
        for column in frame_a.columns:
            x, y = frame_a[column], frame_b[column]
            if isinstance(x.dtype, pd.CategoricalDtype):
                x, y = x.astype(str), y.astype(str)
            if x.dtype == object:
                assert list(x) == list(y), column
            else:
                assert np.array_equal(x.to_numpy(), y.to_numpy(), equal_nan=x.dtype.kind == "f"), column
    assert a.notes == b.notes and a.device_ranges == b.device_ranges


@pytest.fixture
def no_fallback(monkeypatch):
    """Fail if the reader falls back to decoding a whole document."""
    def refuse(path):
        raise AssertionError(f"{path} was decoded whole")
    monkeypatch.setattr(trace_file, "_read_whole", refuse)


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_reading_in_small_pieces_equals_decoding_the_whole_document(monkeypatch, path):
    expected = whole(path)
    monkeypatch.setattr(trace_file, "BLOCK_BYTES", TINY_BLOCK)
    monkeypatch.setattr(trace_file, "_read_whole", lambda p: pytest.fail(f"{p} was decoded whole"))
    assert_same(read_trace(path), expected)


def event(i: int, name: str = "aten::mm", **args) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": 1000 + 10 * i, "dur": 5, "args": args}


def write(path: Path, text: str) -> Path:
    with gzip.open(path, "wt") as f:
        f.write(text)
    return path


def test_a_layout_with_cut_lookalikes_inside_strings_and_objects(tmp_path, monkeypatch, no_fallback):
    # "}, {" inside a name and inside nested args, "]" inside strings, header keys on both sides.
    tricky = [event(i, name='weird"}, {"ph": "X"] name' if i % 3 == 0 else "aten::add",
                    **{"Input Dims": [[2, 3], []], "nested": {"a": [{"b": "}, {"}, {}]}}) for i in range(300)]
    text = ('{"schemaVersion": 1, "distributedInfo": {"rank": 5, "pg_config": [{"pg_name": "0", "ranks": [0, 1]}]}, '
            f'"traceEvents":\n[ {(chr(10) + ",  ").join(json.dumps(e) for e in tricky)} \n],\n'
            '"deviceProperties": [{"id": 0}, {"id": 1}], "baseTimeNanoseconds": 1700000000000000000}')
    path = write(tmp_path / "rank5.json.gz", text)
    monkeypatch.setattr(trace_file, "BLOCK_BYTES", 512)
    trace = read_trace(path)
    assert trace.rank == 5 and trace.pg_config == [{"pg_name": "0", "ranks": [0, 1]}] and trace.base_time_ns
    assert len(trace.events) == 300 and trace.events["name"].astype(str).iloc[0].startswith('weird"}, {')


def test_a_document_the_fast_decoder_refuses_is_read_event_by_event(tmp_path):
    events = [event(i) for i in range(50)]
    events[7]["ts"] = "1070"  # a string time: that event is left out, the others kept
    events[9]["ph"] = "Q"  # a phase no format defines
    path = write(tmp_path / "rank0.json.gz", json.dumps({"traceEvents": events}))
    trace = read_trace(path)
    assert len(trace.events) == 48 and 1070.0 not in set(trace.events["ts"]) and 1090.0 not in set(trace.events["ts"])
    assert trace.left_out == 1 and "1 ts is a string ($.traceEvents[7])" in trace.notes[0]["message"]


def test_gzip_members_and_padding_are_read_and_a_cut_file_keeps_what_was_written(tmp_path):
    text = json.dumps({"traceEvents": [event(i) for i in range(2000)]}).encode()
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip.compress(text[:10_000]) + gzip.compress(text[10_000:]) + b"\0" * 8)
    assert len(read_trace(path).events) == 2000
    path.write_bytes(gzip.compress(text)[:-30])
    cut = read_trace(path)
    assert cut.cut and "ends early (truncated?)" in cut.cut and 0 < len(cut.events) <= 2000
    path.write_bytes(gzip.compress(text)[:20])
    with pytest.raises(TraceError, match="not a PyTorch Profiler trace|no duration events"):
        read_trace(path)


def test_only_host_collectives_and_matrix_multiplies_keep_their_shapes(tmp_path):
    events = [event(0, "aten::mm", **{"Input Dims": [[4, 4], [4, 2]], "Input type": ["float", "float"]}),
              event(1, "gloo:all_reduce", **{"Input Dims": [[8]], "Input type": ["float"]}),
              {**event(2, "ncclDevKernel_AllReduce_Sum_f32_RING_LL"), "cat": "kernel",
               "args": {"stream": 7, "Collective name": "allreduce", "In msg nelems": 1024, "dtype": "Float",
                        "Process Group Name": 0, "Group size": 2}}]
    path = write(tmp_path / "rank0.json.gz", json.dumps({"traceEvents": events}))
    trace = read_trace(path)
    assert "input_dims" not in trace.events  # the events table holds no per-event arguments
    comm = trace.comm_events().set_index(trace.comm_events()["name"].astype(str))
    assert list(comm.index) == ["gloo:all_reduce", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"]
    assert comm.loc["gloo:all_reduce", "input_dims"] == [[8]] and comm.loc["gloo:all_reduce", "pg_name"] is None
    kernel = comm.loc["ncclDevKernel_AllReduce_Sum_f32_RING_LL"]
    assert (kernel["collective"], kernel["dtype"], kernel["pg_name"], kernel["in_nelems"], kernel["group_size"]) == \
        ("allreduce", "Float", "0", 1024.0, 2.0)
    assert kernel["input_dims"] is None
    # The matrix multiply's shapes are kept for its FLOPs, beside the collective's; an add's are not.
    shaped = trace.shaped_events()
    assert list(shaped["name"].astype(str)) == ["aten::mm", "gloo:all_reduce"]
    assert shaped["input_dims"].iloc[0] == [[4, 4], [4, 2]]


def test_every_event_keeps_its_thread_and_point_to_point_calls_their_peer(tmp_path):
    events = [{**event(0, "c10d::send", **{"Concrete Inputs": ["", "", "1", "0"]}), "tid": 7},
              {**event(1, "c10d::recv_", **{"Concrete Inputs": ["", "", "3", "0"]}), "tid": 8},
              event(2, "aten::add", **{"Concrete Inputs": ["", "", "5"]}),  # not a point-to-point call: not read
              event(3, "c10d::send", **{"Concrete Inputs": ["", ""]}),  # a tracer that wrote no peer
              {**event(4, "aten::mul"), "tid": "a thread name"}]
    path = write(tmp_path / "rank0.json.gz", json.dumps({"traceEvents": events}))
    trace = read_trace(path)
    assert list(trace.events["tid"]) == [7, 8, 1, 1, -1]
    assert "peer" not in trace.events
    comm = trace.comm_events()
    assert list(comm["name"].astype(str)) == ["c10d::send", "c10d::recv_", "c10d::send"]
    assert np.array_equal(comm["peer"].to_numpy(), [1.0, 3.0, np.nan], equal_nan=True)
    assert trace.arguments is not None and len(trace.arguments.rows) == 2  # the two calls with a peer, no more
