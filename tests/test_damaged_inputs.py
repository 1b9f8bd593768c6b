"""A bad event costs that event: real traces and dumps, damaged event by event or cut short.

Each kind of damage (a null name, a wrong-typed field, a NaN time, a negative duration, a missing key,
an event that is not JSON, a gzip stream or JSON document cut short) is made to real files of the
shared corpus; what the undamaged part gives must equal what the clean file gives with the damaged
events removed, and the health notes must name the damage. Hypothesis then mixes the damage at random
(bounded examples): no crash, no hang, no rank thrown away while usable events remain.
"""

from __future__ import annotations

import gzip
import json
import math
import pickle
import signal
import zlib
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diagtrain.profiler.analyzer.per_rank.pipeline import _clip_to_complete, load_rank
from diagtrain.profiler.analyzer.read import flight_records as fr
from diagtrain.profiler.analyzer.read.discover import RankInput
from diagtrain.profiler.analyzer.read.nccl_log import parse_nccl_log
from diagtrain.profiler.analyzer.read.trace_file import TraceError, TraceFile, read_trace
from diagtrain.profiler.analyzer.read.run_read import dump_and_problems
from diagtrain.profiler.util.bounded_read import InputError
from public_fixtures import NVRX_GPU_ERROR_1ST, PUBLIC

TRACES = {p.name.split(".")[0]: p for p in sorted((PUBLIC / "traces").glob("*/*.json.gz"))}
SMALL = ["rocm_mi250_minitoy", "cpu_only_gloo_rank34", "sampled_128rank_rank0", "h100_bert_small_inference__1016001"]
DUMPS = sorted(NVRX_GPU_ERROR_1ST.glob("_dump_*"))
NCCL_LOG = Path(__file__).parent / "fixtures" / "logs" / "nccl_info_8rank.log"
EXAMPLES = settings(max_examples=12, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
HANG_S = 60  # one example's limit: far above a real read (well under a second), a hang fails the test


def _set(key: str, value: object) -> Callable[[dict], None]:
    return lambda e: e.__setitem__(key, value)


def _set_arg(key: str, value: object) -> Callable[[dict], None]:
    return lambda e: e.__setitem__("args", {**(e.get("args") or {}), key: value})


# Damage to one duration event (in place), and what the health notes call it.
DAMAGES: dict[str, tuple[Callable[[dict], None], str]] = {
    "null name": (_set("name", None), "name is null"),
    "wrong-typed field": (_set("tid", [1, 2]), "tid is a list"),
    "NaN ts": (_set("ts", math.nan), "ts is not finite"),
    "infinite dur": (_set("dur", math.inf), "dur is not finite"),
    "negative dur": (_set("dur", -5), "impossible times"),
    "out-of-range ts": (_set("ts", 1e300), "impossible times"),
    "missing key": (lambda e: e.pop("ts"), "ts missing"),
    "string dur": (_set("dur", "12"), "dur is a string"),
    "not JSON": (lambda e: e.__setitem__("garble", True), "not valid JSON"),
    # A number that does not fit its field, in every numeric field the reader keeps (issue 51).
    "ts of 400 digits": (_set("ts", 10**400), "ts does not fit a number"),
    "dur of 400 digits": (_set("dur", 10**400), "dur does not fit a number"),
    "huge tid": (_set("tid", 10**30), "tid does not fit a 64-bit integer"),
    "infinite tid": (_set("tid", math.inf), "tid does not fit a 64-bit integer"),
    "huge stream": (_set_arg("stream", 1e308), "args.stream does not fit a 64-bit integer"),
    "negative huge correlation": (_set_arg("correlation", -(10**25)), "args.correlation does not fit a 64-bit integer"),
    "NaN correlation": (_set_arg("correlation", math.nan), "args.correlation does not fit a 64-bit integer"),
    "negative elements": (_set_arg("In msg nelems", -5), "args.In msg nelems is out of range"),
    "infinite elements": (_set_arg("In msg nelems", math.inf), "args.In msg nelems is out of range"),
    "huge group size": (_set_arg("Group size", 10**30), "args.Group size is out of range"),
}


def clean_doc(name: str) -> dict:
    """A shared trace as a document, its duration events with finite times only (the file's own)."""
    return json.loads(gzip.decompress(TRACES[name].read_bytes()))


def duration_rows(doc: dict) -> list[int]:
    """Positions of the duration events in ``traceEvents``."""
    return [i for i, e in enumerate(doc["traceEvents"]) if isinstance(e, dict) and e.get("ph") == "X"]


def layout(doc: dict) -> tuple[str, list[tuple[int, int]]]:
    """The document as JSON text, one event a line (an event marked ``garble`` is written broken),
    and where each event's text starts and ends."""
    parts, spans, at = ["{"], [], 1
    for n, (key, value) in enumerate(doc.items()):
        head = ("," if n else "") + json.dumps(key) + ":"
        if key != "traceEvents":
            parts.append(head + json.dumps(value, allow_nan=True))
            at += len(parts[-1])
            continue
        parts.append(head + "[\n")
        at += len(parts[-1])
        for i, event in enumerate(value):
            text = _event_text(event) + (",\n" if i + 1 < len(value) else "\n")
            spans.append((at, at + len(text) - 2))
            parts.append(text)
            at += len(text)
        parts.append("]")
        at += 1
    return "".join(parts) + "}", spans


def _event_text(event: object) -> str:
    if isinstance(event, dict) and event.get("garble"):
        return '{"ph": "X", "name": "garbled", "ts": 12,, "dur": }'
    return json.dumps(event, allow_nan=True)


def write(path: Path, text: str | bytes) -> Path:
    data = text.encode() if isinstance(text, str) else text
    path.write_bytes(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)
    return path


def without(doc: dict, rows: set[int]) -> dict:
    return {**doc, "traceEvents": [e for i, e in enumerate(doc["traceEvents"]) if i not in rows]}


def damaged(doc: dict, rows: list[int], kinds: list[str]) -> dict:
    """A copy of ``doc`` whose events at ``rows`` each got the damage of the matching kind."""
    events = list(doc["traceEvents"])
    for row, kind in zip(rows, kinds):
        events[row] = dict(events[row])
        DAMAGES[kind][0](events[row])
    return {**doc, "traceEvents": events}


def load(path: Path, cache: Path):
    return load_rank(RankInput(path.name, [path], 0), cache)


def same_events(a: TraceFile, b: TraceFile) -> None:
    """The two traces' event tables are equal, column by column."""
    assert list(a.events.columns) == list(b.events.columns)
    for column in a.events.columns:
        x, y = a.events[column], b.events[column]
        if isinstance(x.dtype, pd.CategoricalDtype):
            x, y = x.astype(str), y.astype(str)
        pd.testing.assert_series_equal(x, y, check_dtype=False, check_categorical=False)


def same_numbers(a, b) -> None:
    """Two rank results agree on their breakdown, their steps and their collectives."""
    assert a.breakdown == pytest.approx(b.breakdown, nan_ok=True)
    pd.testing.assert_frame_equal(a.steps.reset_index(drop=True), b.steps.reset_index(drop=True))
    assert len(a.collectives) == len(b.collectives)


def said(result, words: str) -> bool:
    """Whether the rank's health (its notes and messages) names ``words``."""
    return any(words in n["message"] for n in result.notes) or any(words in m for m in result.health)


# -- one kind of damage at a time ----------------------------------------------------------------


@pytest.mark.parametrize("kind", DAMAGES)
@pytest.mark.parametrize("trace", ["rocm_mi250_minitoy", "sampled_128rank_rank0"])
def test_a_bad_event_costs_that_event(tmp_path, trace, kind):
    doc = clean_doc(trace)
    rows = duration_rows(doc)[5::97][:4]  # a handful, spread over the trace
    bad = write(tmp_path / "bad.json.gz", layout(damaged(doc, rows, [kind] * len(rows)))[0])
    good = write(tmp_path / "good.json.gz", layout(without(doc, set(rows)))[0])
    result, expected = load(bad, tmp_path / "c1"), load(good, tmp_path / "c2")
    same_numbers(result, expected)
    assert said(result, DAMAGES[kind][1]) and said(result, f"{len(rows)} ")
    if kind not in ("negative dur", "out-of-range ts"):  # well-formed JSON: read fast, left out by the rank's load
        trace_read = read_trace(bad)
        assert trace_read.left_out == len(rows) and f"$.traceEvents[{rows[0]}]" in trace_read.notes[0]["message"]
        same_events(trace_read, read_trace(good))


def _cut_at(doc: dict, share: float) -> tuple[str, int, set[int]]:
    """The document's text, a cut ``share`` of the way through its events, and the events complete before it."""
    text, spans = layout(doc)
    cut = int(spans[0][0] + share * (spans[-1][1] - spans[0][0])) + 3  # inside an event's text
    return text, cut, {i for i, (_, end) in enumerate(spans) if end <= cut}


@pytest.mark.parametrize("how", ["truncated gzip", "truncated JSON"])
@pytest.mark.parametrize("trace", ["rocm_mi250_minitoy", "sampled_128rank_rank0"])
def test_a_file_cut_short_keeps_what_was_written(tmp_path, trace, how):
    doc = clean_doc(trace)
    text, cut, complete = _cut_at(doc, 0.7)
    if how == "truncated gzip":
        packed = gzip.compress(text.encode(), mtime=0)
        packed = packed[:len(packed) * 7 // 10]
        written = len(zlib.decompressobj(31).decompress(packed))
        complete = {i for i, (_, end) in enumerate(layout(doc)[1]) if end <= written}
        path = tmp_path / "cut.json.gz"
        path.write_bytes(packed)
    else:
        path = write(tmp_path / "cut.json", text[:cut])
    before = without(doc, set(range(len(doc["traceEvents"]))) - complete)
    partial, expected = read_trace(path), read_trace(write(tmp_path / "before.json", layout(before)[0]))
    same_events(partial, expected)  # every complete event before the cut, nothing else
    kept_x = [e for i, e in enumerate(doc["traceEvents"]) if i in complete and e.get("ph") == "X"]
    assert partial.complete_until_us <= kept_x[-1]["ts"] + kept_x[-1]["dur"]
    note = next(n["message"] for n in partial.notes if n["check"] == "partial_trace")
    assert "ends early in $.traceEvents[" in note and "partial" in note
    if how == "truncated gzip":
        assert "gzip stream ends early" in note
    # The missing tail is missing evidence: the rank's window and its steps end where the evidence does.
    result, whole = load(path, tmp_path / "c1"), load(TRACES[trace], tmp_path / "c2")
    assert said(result, "the trace is partial") and result.skipped and "ends early" in result.skipped[0].reason
    until = partial.complete_until_us + partial.epoch_offset_us
    assert (result.steps["end_us"] <= until + 1e-6).all()
    clipped = read_trace(path)
    _clip_to_complete(clipped)
    assert clipped.events["end"].max() <= partial.complete_until_us
    # The sampled trace writes its device work with its launches, in passes that go back in time (a later
    # pass, lost to the cut, can fall inside the kept window): its device time is not reported, and says so.
    # The ROCm one writes every launch before its device work: an unanswered launch shows every lost kernel,
    # unless the cut came before any device work (the gzip cut here): then all of it is lost.
    unvouched = trace == "sampled_128rank_rank0" or not (partial.events["stream"] >= 0).any()
    assert partial.device_time_unknown == unvouched
    assert any("device time (busy and idle) is not reported" in n["message"] for n in partial.notes) == unvouched
    if unvouched:
        assert result.on_gpu and result.breakdown == {} and result.steps["idle_us"].isna().all()
    else:
        assert result.breakdown["idle_us"] <= whole.breakdown["idle_us"]


def _device_missing_inside(cut: TraceFile, full: TraceFile) -> int:
    """The full file's device events inside the cut trace's kept window that the cut read lacks."""
    lo, until = cut.events["ts"].min(), cut.complete_until_us
    device = lambda t: t.events[t.events["stream"] >= 0]  # noqa: E731
    inside = device(full)[lambda d: (d["ts"] >= lo) & (d["end"] <= until)]
    kept = set(zip(*(device(cut)[c] for c in ("ts", "stream", "correlation"))))
    return sum(key not in kept for key in zip(inside["ts"], inside["stream"], inside["correlation"]))


@pytest.mark.parametrize("share", [0.55, 0.75, 0.9, 0.97])
def test_a_cut_among_unordered_device_work_reports_no_device_time(tmp_path, share):
    """HTA's sampled trace writes each kernel next to its launch, in passes that restart back in time: a
    cut loses passes that can lie inside the kept window. The host part (written whole, first) still
    gives the steps the full file gives; the device time is not reported rather than counted idle."""
    doc = clean_doc("sampled_128rank_rank0")
    text, cut, _ = _cut_at(doc, share)
    path = write(tmp_path / "cut.json", text[:cut])
    partial, full = read_trace(path), read_trace(TRACES["sampled_128rank_rank0"])
    assert partial.device_time_unknown and (partial.events["stream"] >= 0).any()
    lost_inside = _device_missing_inside(partial, full)
    result, whole = load(path, tmp_path / "c1"), load(TRACES["sampled_128rank_rank0"], tmp_path / "c2")
    assert result.on_gpu and result.breakdown == {} and result.steps["idle_us"].isna().all()
    assert result.steps["compute_us"].isna().all()  # no device busy time from a device timeline with holes
    # The undamaged part: the host ops of the window (written whole, before the device work and its
    # launches) are the full file's, and so are its steps' times.
    clipped = read_trace(path)
    _clip_to_complete(clipped)
    host = lambda t: t.events[(t.events["stream"] < 0) & (t.events["cat"] != "cuda_runtime")]  # noqa: E731
    window = host(full)[lambda h: h["end"] <= partial.complete_until_us].reset_index(drop=True)
    pd.testing.assert_frame_equal(host(clipped)[["name", "ts", "dur"]].astype({"name": str}).reset_index(drop=True),
                                  window[["name", "ts", "dur"]].astype({"name": str}))
    times = ["step", "start_us", "end_us", "wall_us"]
    expected = whole.steps[whole.steps["step"].isin(result.steps["step"])][times].reset_index(drop=True)
    pd.testing.assert_frame_equal(result.steps[times].reset_index(drop=True), expected)
    if share == 0.75:  # a pass written later, lost to this cut, falls inside the kept window
        assert lost_inside > 100 and len(expected) == 1


@pytest.mark.parametrize("trace", ["sampled_128rank_rank0", "rocm_mi250_minitoy"])
def test_a_gpu_trace_cut_before_its_device_work_is_no_cpu_job(tmp_path, trace):
    """Cut in its host part, a GPU trace has no kernel, and here no launch either (only CPU ops: ROCm's lists
    its GPUs in deviceProperties, HTA's sampled one has NCCL as its backend): its device time is unknown,
    not a CPU job's (whose idle is the host's). A CPU job's trace cut so stays a CPU job's."""
    text, cut, _ = _cut_at(clean_doc(trace), 0.05)
    path = write(tmp_path / "cut.json", text[:cut])
    partial = read_trace(path)
    assert not (partial.events["stream"] >= 0).any() and set(partial.events["cat"]) <= {"cpu_op", "user_annotation"}
    assert partial.device_time_unknown and partial.on_gpu
    result = load(path, tmp_path / "c")
    assert result.on_gpu and result.breakdown == {}


def test_a_cpu_trace_cut_short_stays_a_cpu_trace(tmp_path):
    text, cut, _ = _cut_at(clean_doc("cpu_only_gloo_rank34"), 0.5)
    partial = read_trace(write(tmp_path / "cut.json", text[:cut]))
    assert partial.cut and not partial.device_time_unknown and not partial.on_gpu


@pytest.mark.parametrize("share", [0.8, 0.88, 0.95])
def test_a_cut_among_announced_device_work_loses_no_kernel_inside_its_window(tmp_path, share):
    """The ROCm trace writes every launch before its device work: the window ends at the first launch the
    cut left unanswered, so no kernel of the full file inside it is missing, and its idle is the full file's."""
    doc = clean_doc("rocm_mi250_minitoy")
    text, cut, _ = _cut_at(doc, share)
    partial, full = read_trace(write(tmp_path / "cut.json", text[:cut])), read_trace(TRACES["rocm_mi250_minitoy"])
    assert not partial.device_time_unknown and (partial.events["stream"] >= 0).any()
    assert _device_missing_inside(partial, full) == 0


def test_a_cut_after_the_events_loses_only_the_keys_after_them(tmp_path):
    doc = clean_doc("rocm_mi250_minitoy")
    text, spans = layout(doc)
    trace = read_trace(write(tmp_path / "cut.json", text[:spans[-1][1] + 20]))
    assert len(trace.events) == len(read_trace(TRACES["rocm_mi250_minitoy"]).events)
    assert trace.complete_until_us is None and trace.base_time_ns is None
    assert any(n["check"] == "partial_trace" and n["severity"] == "info" for n in trace.notes)


def test_a_trace_with_no_usable_event_is_refused_saying_why(tmp_path):
    doc = clean_doc("cpu_only_gloo_rank34")
    rows = duration_rows(doc)
    path = write(tmp_path / "bad.json", layout(damaged(doc, rows, ["null name"] * len(rows)))[0])
    with pytest.raises(TraceError, match="no duration events"):
        read_trace(path)
    with pytest.raises(TraceError, match="not a PyTorch Profiler trace"):
        read_trace(write(tmp_path / "cut.json", layout(doc)[0][:30]))


# -- flight-recorder dumps, step records, logs ---------------------------------------------------


def _json_dump(tmp_path: Path) -> tuple[dict, str]:
    dump = fr.read_dump(DUMPS[0])
    dump.pop("malformed_entries")
    return dump, json.dumps(dump, indent=1)


def test_a_json_dump_keeps_its_good_entries(tmp_path):
    dump, text = _json_dump(tmp_path)
    entries = dump["entries"]
    broken = [dict(e) for e in entries]
    broken[3]["profiling_name"] = None  # a wrong-typed field
    body = ",\n".join('{"record_id": 1,, }' if i == 7 else json.dumps(e) for i, e in enumerate(broken))
    doc = {**dump, "entries": []}
    path = write(tmp_path / "dump_0", json.dumps(doc).replace('"entries": []', f'"entries": [{body}]'))
    read = fr.read_dump(path)
    assert read["malformed_entries"] == 2 and len(read["entries"]) == len(entries) - 2
    assert read["pg_config"] == dump["pg_config"]


def test_a_json_dump_cut_short_keeps_the_entries_before_the_cut(tmp_path):
    dump, text = _json_dump(tmp_path)
    cut = text.index('"record_id"', text.index('"entries"') + 2000)
    path = write(tmp_path / "dump_0", text[:cut + 5])
    read, problems = dump_and_problems(path)
    complete = text[:cut].count('"record_id"')
    assert 0 < len(read["entries"]) == complete and read["malformed_entries"] == 0
    assert any("ends early in $.entries[" in p for p in problems)


def test_a_pickled_dump_cut_short_is_refused_saying_so(tmp_path):
    data = DUMPS[0].read_bytes()
    with pytest.raises(InputError, match="the pickle ends early"):
        fr.read_dump(write(tmp_path / "dump_0", data[:len(data) // 2]))


def test_a_bad_step_record_costs_that_line(tmp_path):
    from diagtrain.profiler.analyzer.read.step_cache import read_steps
    lines = [json.dumps({"rank": 0, "step": s, "start": 100.0 + s, "end": 100.5 + s, "duration_ms": 500.0})
             for s in range(1, 9)]
    lines[3] = '{"rank": 0, "step": 4, "start": 1'  # a line cut in the middle of the file
    lines[5] = json.dumps({"rank": 0, "step": 6, "start": "x", "end": None, "duration_ms": math.nan})
    found = read_steps(write(tmp_path / "steps.jsonl", "\n".join(lines) + '\n{"rank": 0, "st'), 0)
    assert list(found.table["step"]) == [1, 2, 3, 5, 7, 8] and len(found.bad_lines) + len(found.impossible) == 2


def test_a_bad_log_line_costs_that_line():
    lines = NCCL_LOG.read_text(errors="replace").splitlines()
    clean = parse_nccl_log(lines)
    noisy = parse_nccl_log(lines + ["\x00\xff garbage ]] NCCL INFO {", "NCCL INFO Channel 00/0", lines[-1][:7]])
    for part in ("communicators", "rings", "trees", "transports", "collectives"):
        assert getattr(noisy, part) == getattr(clean, part), part


# -- random damage to real files -----------------------------------------------------------------


class _Hang(Exception):
    pass


def _alarm(*_: object) -> None:
    raise _Hang


@EXAMPLES
@given(trace=st.sampled_from(SMALL), data=st.data())
def test_random_damage_to_real_traces(tmp_path_factory, trace, data):
    """A handful of bad events, maybe a cut: read within the limit, the rank kept while usable events remain."""
    doc = clean_doc(trace)
    rows = duration_rows(doc)
    bad = data.draw(st.lists(st.sampled_from(rows), min_size=1, max_size=4, unique=True))
    kinds = data.draw(st.lists(st.sampled_from(list(DAMAGES)), min_size=len(bad), max_size=len(bad)))
    text = layout(damaged(doc, bad, kinds))[0]
    cut = data.draw(st.one_of(st.none(), st.integers(1, len(text) - 1)))
    packed = data.draw(st.booleans())
    folder = tmp_path_factory.mktemp("random")
    path = folder / ("trace.json.gz" if packed else "trace.json")
    write(path, text if cut is None else text[:cut])
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(HANG_S)
    try:
        result = load(path, folder / "cache")
    except Exception as e:  # noqa: BLE001 - only an unusable trace may be refused, and only as one
        assert cut is not None or len(bad) == len(rows), f"{trace}: rank thrown away: {e}"
        return
    finally:
        signal.alarm(0)
    usable = len(rows) - len(bad)
    assert result.rank >= 0
    if cut is None:
        assert said(result, f"{len(bad)} ") or usable == len(rows)


@EXAMPLES
@given(dump=st.sampled_from(DUMPS), cut=st.floats(0.05, 0.95), as_json=st.booleans())
def test_random_cuts_of_real_dumps(tmp_path_factory, dump, cut, as_json):
    """A dump cut anywhere: its complete entries (JSON), or a refusal that says the pickle is cut (pickle)."""
    data = json.dumps(fr.read_dump(dump)).encode() if as_json else dump.read_bytes()
    path = write(tmp_path_factory.mktemp("dump") / "dump_0", data[:int(len(data) * cut)])
    try:
        read = fr.read_dump(path)
    except InputError as e:
        assert not as_json or '"entries"' not in data[:int(len(data) * cut)].decode(errors="replace"), e
        assert as_json or "ends early" in e.reason or "neither JSON nor a pickle" in e.reason
        return
    assert as_json and read.get("cut_short") and isinstance(read["entries"], list)


def test_real_pickles_are_still_read_through_the_restricted_unpickler(tmp_path):
    for dump in DUMPS[:3]:
        assert fr.read_dump(dump)["entries"]
    evil = pickle.dumps({"entries": [], "x": print}, protocol=2)
    with pytest.raises(InputError, match="unsafe pickle"):
        fr.read_dump(write(tmp_path / "dump_0", evil))
