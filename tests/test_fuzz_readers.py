"""Property-based fuzzing of the readers of run-directory files: traces, steps, manifest, flight recorder.

Each reader gets generated documents shaped like the real thing (the right keys with values of any
JSON type, numbers from 0 to 1e18, NaN and infinities, strings where numbers belong) and plain
garbage. The property: it returns data in the types the analysis relies on, or raises the one
error that says which file is bad and why; nothing else, and never code run from a pickle.
Examples are bounded and derandomized so that the suite stays fast and repeatable.
"""

from __future__ import annotations

import gzip
import io
import itertools
import json
import math

import pandas as pd
import os
import pickle
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diagtrain.profiler.analyzer.read import flight_records as fr
from diagtrain.profiler.analyzer.per_rank.pipeline import MAX_EVENT_US, UnreadableRank, load_rank
from diagtrain.profiler.analyzer.read.discover import RankInput
from diagtrain.profiler.analyzer.read.run_files import MANIFEST_FIELDS, MAX_STEP_MS, read_manifest
from diagtrain.profiler.analyzer.read.step_cache import read_steps
from diagtrain.profiler.analyzer.read.trace_file import TraceError, read_trace
from diagtrain.profiler.util.bounded_read import InputError

# Few examples in the suite (fast, the same ones every time); benchmarks/robustness.py asks for more.
EXAMPLES = int(os.environ.get("DIAGTRAIN_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 60, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SLOW_FUZZ = settings(FUZZ, max_examples=max(1, EXAMPLES // 2))  # each example runs a rank's whole load (pandas)

numbers = st.one_of(st.integers(-10**20, 10**20), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0, 1, -1, 1e18, -1e18, 2**63, 1.5]))
scalars = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                                  max_size=3), max_leaves=8)
maybe = lambda s: st.one_of(s, json_values)  # noqa: E731 - the right kind of value, or anything
mostly = lambda s: st.one_of(s, s, s, s, json_values)  # noqa: E731 - usually the right kind: the reader gets deep
times = st.one_of(*[st.floats(0, 1e6)] * 4, numbers)  # µs, mostly plausible


_ROOT = tempfile.TemporaryDirectory(prefix="diagtrain-fuzz-")  # removed when the test process ends
_made = itertools.count()


def _file(data: bytes, suffix: str = "") -> Path:
    """A new file holding ``data``, in a folder of its own."""
    folder = Path(_ROOT.name) / str(next(_made))
    folder.mkdir()
    path = folder / f"input{suffix}"
    path.write_bytes(data)
    return path


def _dumps(doc) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()


# -- traces --------------------------------------------------------------------------------------

NAMES = ["ProfilerStep#1", "ProfilerStep#2", "gloo:all_reduce", "c10d::allreduce_", "aten::mm", "record_param_comms",
         "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "Memcpy HtoD", "diagtrain.phase.forward"]
args = st.fixed_dictionaries({}, optional={
    "stream": maybe(st.integers(-1, 20)), "correlation": maybe(st.integers(0, 10**6)),
    "Collective name": maybe(st.sampled_from(["allreduce", "all_gather", "_allgather_base", "broadcast"])),
    "In msg nelems": maybe(st.integers(0, 10**12)), "Group size": maybe(st.integers(0, 64)),
    "dtype": maybe(st.sampled_from(["Float", "c10::BFloat16", "Long"])),
    "Process Group Name": maybe(st.sampled_from(["0", "1", 5])), "Process Group Description": json_values,
    "Input Dims": maybe(st.lists(st.lists(st.integers(-3, 10**6), max_size=3), max_size=3)),
    "Input type": maybe(st.lists(st.sampled_from(["float", "long int", ""]), max_size=3)),
})
events = st.fixed_dictionaries({"ph": mostly(st.sampled_from(["X", "X", "X", "i", "M"])),
                                "name": mostly(st.sampled_from(NAMES)), "ts": mostly(times), "dur": mostly(times)},
                               optional={"cat": maybe(st.sampled_from(["cpu_op", "kernel", "user_annotation",
                                                                       "gpu_memcpy"])),
                                         "pid": mostly(st.integers(0, 99)), "tid": mostly(st.integers(0, 99)),
                                         "args": mostly(args)})
dist_info = st.fixed_dictionaries({}, optional={
    "rank": maybe(st.integers(-2, 10**9)), "world_size": maybe(st.integers(-1, 10**12)),
    "backend": json_values,
    "pg_config": maybe(st.lists(maybe(st.fixed_dictionaries({"pg_name": maybe(st.sampled_from(["0", "1"])),
                                                             "ranks": maybe(st.lists(st.integers(0, 3)))})), max_size=3)),
})
traces = st.fixed_dictionaries({"traceEvents": mostly(st.lists(events, max_size=25))},
                               optional={"distributedInfo": mostly(dist_info),
                                         "baseTimeNanoseconds": mostly(st.integers(0, 2**63)),
                                         "record_shapes": mostly(st.booleans()), "host_name": mostly(st.text())})


@FUZZ
@given(doc=traces, packed=st.booleans())
def test_trace_reader(doc, packed):
    data = _dumps(doc)
    path = _file(gzip.compress(data) if packed else data, ".json.gz" if packed else ".json")
    try:
        trace = read_trace(path)
    except TraceError as e:
        assert str(path) in str(e)
        return
    assert len(trace.events) > 0 and trace.events["ts"].dtype.kind == "f"


@FUZZ
@given(data=st.binary(max_size=2048))
def test_trace_reader_on_garbage(data):
    with pytest.raises(TraceError):
        read_trace(_file(data, ".json.gz"))


# Well-typed traces with values from anywhere (negative, huge, NaN, overlapping): they get past the
# decoder, so the whole load of a rank runs on them.
typed_events = st.fixed_dictionaries(
    {"ph": st.just("X"), "name": st.sampled_from(NAMES), "ts": st.one_of(times, st.floats(0, 1e6)),
     "dur": st.one_of(times, st.floats(0, 1e5)), "pid": st.integers(0, 3), "tid": st.integers(0, 3)},
    optional={"cat": st.sampled_from(["cpu_op", "kernel", "user_annotation", "gpu_memcpy"]),
              "args": st.fixed_dictionaries({}, optional={
                  "stream": st.integers(-1, 20), "Collective name": st.sampled_from(["allreduce", "all_gather"]),
                  "In msg nelems": st.integers(0, 10**12), "Group size": st.integers(0, 64),
                  "dtype": st.sampled_from(["Float", "Long"]), "Process Group Name": st.sampled_from(["0", "1"]),
                  "Input Dims": st.lists(st.lists(st.integers(-3, 10**6), max_size=3), max_size=3)})})
typed_traces = st.fixed_dictionaries({"traceEvents": st.lists(typed_events, min_size=1, max_size=30)},
                                     optional={"distributedInfo": dist_info,
                                               "baseTimeNanoseconds": st.integers(0, 2**62)})


@SLOW_FUZZ
@given(doc=typed_traces)
def test_a_ranks_whole_load(doc):
    """From the trace to the rank's steps, breakdown, collectives and spans: the guard's only errors."""
    path = _file(_dumps(doc), ".json")
    try:
        result = load_rank(RankInput("rank-0", [path], 0), path.parent / "cache")
    except (TraceError, UnreadableRank):
        return
    assert result.rank >= 0 and all(0 <= v <= MAX_EVENT_US for v in result.steps["wall_us"])
    assert all(math.isfinite(v) for v in result.breakdown.values() if isinstance(v, float) and not math.isnan(v))


# -- steps.jsonl ---------------------------------------------------------------------------------

records = st.fixed_dictionaries({"rank": maybe(st.just(0)), "step": maybe(st.integers(-1, 2**60)),
                                 "start": maybe(numbers), "end": maybe(numbers), "duration_ms": maybe(numbers)},
                                optional={"phases_ms": maybe(st.dictionaries(st.sampled_from(["forward", "backward"]),
                                                                             maybe(numbers), max_size=2)),
                                          "peak_mem_bytes": maybe(numbers), "samples": maybe(numbers)})
lines = st.lists(st.one_of(records.map(lambda r: json.dumps(r, allow_nan=True)), st.text(max_size=40)), max_size=12)


@FUZZ
@given(lines=lines, cut=st.booleans())
def test_steps_reader(lines, cut):
    text = "\n".join(lines) + ("" if cut else "\n")
    found = read_steps(_file(text.encode(errors="surrogatepass")), 0)
    physical = len(io.StringIO(text, newline=None).readlines())  # a generated "line" may hold line breaks
    rows = found.table.to_dict("records")
    assert len(rows) + len(found.bad_lines) + len(found.impossible) + found.repeated <= physical
    for row in rows:
        assert row["rank"] == 0 and isinstance(row["step"], int)
        assert 0 <= row["wall_ms"] <= MAX_STEP_MS and math.isfinite(row["start"]) and row["end"] >= row["start"]
        assert pd.isna(row["peak_mem_bytes"]) or 0 <= row["peak_mem_bytes"] <= 2**50
        assert all(pd.isna(row[f"{p}_ms"]) or 0 <= row[f"{p}_ms"] <= MAX_STEP_MS for p in found.phases)
    assert len({r["step"] for r in rows}) == len(rows)


# -- manifest.json -------------------------------------------------------------------------------

manifests = st.fixed_dictionaries({}, optional={
    "status": maybe(st.sampled_from(["ok", "failed", "running"])), "world_size": maybe(st.integers(-1, 10**30)),
    "hosts": maybe(st.lists(maybe(st.fixed_dictionaries({"name": maybe(st.text(max_size=5))})), max_size=3)),
    "command": json_values, "strategy": json_values, "mesh": maybe(st.dictionaries(st.text(max_size=3), json_values)),
    "injected": json_values, "exit_codes": json_values, "started_at": maybe(numbers), "ended_at": maybe(numbers),
})


@FUZZ
@given(doc=st.one_of(manifests, json_values))
def test_manifest_reader(doc):
    try:
        manifest, problems = read_manifest(_file(_dumps(doc)))
    except InputError as e:
        assert not isinstance(doc, dict) and "manifest" not in e.reason
        return
    for name, kind in MANIFEST_FIELDS.items():
        if name in manifest:
            assert isinstance(manifest[name], kind), (name, manifest[name])
    assert all(isinstance(h, dict) and isinstance(h["name"], str) for h in manifest.get("hosts", []))
    assert all(isinstance(v, int) and v > 0 for v in manifest.get("mesh", {}).values())
    assert 0 < manifest.get("world_size", 1) <= 1 << 20
    assert all(isinstance(p, str) for p in problems)


# -- flight-recorder dumps -----------------------------------------------------------------------

entries = st.fixed_dictionaries({}, optional={
    "process_group": maybe(st.tuples(st.sampled_from(["0", "1"]), st.sampled_from(["default_pg", "metrics"]))),
    "pg_id": json_values, "collective_seq_id": maybe(st.integers(0, 50)), "profiling_name":
        maybe(st.sampled_from(["gloo:all_reduce", "nccl:all_gather", "nccl:send 0->1"])),
    "time_created_ns": maybe(numbers), "input_sizes": json_values, "input_dtypes": json_values,
    "state": maybe(st.sampled_from(["scheduled", "completed"])), "is_p2p": json_values,
    "frames": maybe(st.lists(maybe(st.fixed_dictionaries({"name": st.text(max_size=5), "line": st.integers()})))),
})
dumps = st.fixed_dictionaries({"entries": maybe(st.lists(maybe(entries), max_size=8))},
                              optional={"pg_config": json_values, "rank": json_values, "version": json_values})
plain_data = st.recursive(st.one_of(scalars, st.binary(max_size=8)),
                          lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner)
                          | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=10)


def _use(dump: dict) -> None:
    """Everything the analysis does with a dump once read."""
    found = fr.entries(0, dump) + fr.entries(1, dump)
    fr.blocked(found, fr.members({}, found), {0, 1})
    fr.mismatches(found)
    json.dumps(fr.cross_rank(found, 4), default=str)


@FUZZ
@given(doc=dumps, as_pickle=st.booleans())
def test_flight_recorder_reader(doc, as_pickle):
    path = _file(pickle.dumps(doc) if as_pickle else _dumps(doc))
    try:
        dump = fr.read_dump(path)
    except InputError as e:
        assert "entries" in e.reason and not isinstance(doc["entries"], list)
        return
    assert all(isinstance(e["collective_seq_id"], int) for e in dump["entries"])
    _use(dump)


def _has_bytes(value) -> bool:
    if isinstance(value, bytes):
        return True
    items = value.items() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return any(_has_bytes(v) for item in items for v in (item if isinstance(value, dict) else (item,)))


@FUZZ
@given(value=plain_data, protocol=st.integers(0, pickle.HIGHEST_PROTOCOL))
def test_any_plain_pickle_reads(value, protocol):
    path = _file(pickle.dumps(value, protocol=protocol))
    try:
        dump = fr.read_dump(path)
    except InputError as e:
        if protocol < 3 and _has_bytes(value):  # before protocol 3, bytes are pickled as a call
            assert "unsafe pickle: it refers to" in e.reason, e.reason  # _codecs.encode, or bytes() for b""
        else:
            assert not isinstance(value, dict) or "entries" in e.reason, e.reason
        return
    _use(dump)


@FUZZ
@given(obj=st.sampled_from([set(), frozenset(), bytearray(b"x"), complex(1, 2), range(3), Path("/"), slice(1),
                            Exception("x"), print]), wrap=st.booleans())
def test_a_pickle_of_anything_but_plain_data_is_refused(obj, wrap):
    path = _file(pickle.dumps({"entries": [{"frames": [obj]}]} if wrap else obj))
    with pytest.raises(InputError, match="pickle"):
        fr.read_dump(path)


@FUZZ
@given(data=st.binary(max_size=2048))
def test_flight_recorder_reader_on_garbage(data):
    path = _file(data)
    try:
        dump = fr.read_dump(path)
    except InputError as e:  # refused: the message names this file (not "<pickle>") and says why
        assert str(e).startswith(f"{path}: ") and e.reason, str(e)
        return
    assert all(isinstance(e["collective_seq_id"], int) for e in dump["entries"])
    _use(dump)
