"""A rank comes from a trace file's name only by a known exporter's pattern or numbers that fit the run,
never from an arbitrary number; where a rank came from, the report's health section says."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from diagtrain.profiler.analyzer.analyze import analyze
from diagtrain.profiler.analyzer.read.discover import discover
from diagtrain.profiler.analyzer.read.rank_names import ranks_from_names

# A small GPU trace without distributedInfo: its rank is whatever its name gives.
UNRANKED = Path(__file__).parent / "fixtures" / "dialects" / "kineto_2025_rank0.json"


def ranks(names: list[str]) -> list[int | None]:
    return [n.rank for n in ranks_from_names(names)]


@pytest.mark.parametrize("names, expected", [
    # An experiment id, a process id: trailing numbers that are no rank (the old rule took them).
    (["h100_bert_small_inference__1016001.json.gz"], [None]),
    (["step_1.json", "step_2.json"], [None, None]),
    # torch's tensorboard_trace_handler: <host>_<pid>.<time>.pt.trace.json holds no rank.
    (["gpu-node-3_48213.1700000000123.pt.trace.json"], [None]),
    (["node7_4242.1700000000123.pt.trace.json.gz", "node7_4243.1700000000456.pt.trace.json.gz"], [None, None]),
    # Exporters' patterns: rank<N>, rank-N, rank_N, however the rest of the name goes.
    (["rank0.json", "rank-3.json", "job_rank_12.json"], [0, 3, 12]),
    (["sampled_128rank_rank0.json.gz", "sampled_128rank_rank1.json.gz"], [0, 1]),  # 128rank is a word, not rank 128
    # Holistic Trace Analysis's test data names.
    (["rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"], [34]),
    (["sampled_rank-0.json.gz", "inference_rank_1.json.gz", "mtia_rank_0.json.gz"], [0, 1, 0]),
    (["benchmark_result_2869224_1695835535_trace.json.gz", "rank_non_gpu.json.gz", "h100_trace.json.gz"],
     [None, None, None]),
    # Not the word rank: a local rank repeats on every host; "frank2" is a name.
    (["node0_local_rank1.json"], [None]),
    (["h0_local_rank0.json", "h0_local_rank1.json", "h1_local_rank0.json", "h1_local_rank1.json"], [None] * 4),
    (["frank2.json"], [None]),
    # Two ranks in one name (tensor and pipeline parallel): which one is the job's is unknown.
    (["tp_rank1_pp_rank0.json", "tp_rank0_pp_rank0.json"], [None, None]),
    # Trailing numbers that are exactly 0..N-1 for N files are ranks, in their order, not the names'.
    ([f"worker{i}.json" for i in sorted(range(11), key=str)], [0, 1, 10, 2, 3, 4, 5, 6, 7, 8, 9]),
    (["a_1.json", "b_0.json"], [1, 0]),
    (["trace_00.json.gz", "trace_01.json.gz"], [0, 1]),
    # A handler's worker names (the time after them is never a rank).
    (["worker_0.1700000000001.pt.trace.json", "worker_1.1700000000002.pt.trace.json"], [0, 1]),
    (["rank0.json", "node_1.json"], [0, 1]),  # with the patterns' ranks, 0..N-1
    # ... and only then: one missing, one twice, one file that is not rank 0.
    (["a_0.json", "b_2.json"], [None, None]),
    (["a_0.json", "b_0.json"], [None, None]),
    (["a_0.json", "notes.json"], [None, None]),
    (["only_1.json"], [None]),
])
def test_rank_from_file_name(names, expected):
    assert ranks(names) == expected


def test_each_name_says_how_it_gave_its_rank_or_why_none():
    pattern, fit, arbitrary, bare = (ranks_from_names([n])[0] for n in
                                     ("rank-34.Jul_15.pt.trace.json", "t_0.json", "x__1016001.json", "x.json"))
    assert pattern.why == "its name's 'rank-34'"
    assert fit.why == "its name's trailing 0, the only rank of a single file"
    assert arbitrary.why == ("its name gives no rank: the trailing 1016001 is no rank pattern, nor 0, the only rank "
                             "of a single file")
    assert bare.why == "its name holds no rank"
    [a, b] = ranks_from_names(["a_1.json", "b_0.json"])
    assert a.why == "its name's trailing 1, the 2 names' numbers being 0..1"


def test_discover_gives_each_file_its_rank_from_the_whole_folder(tmp_path):
    for name in ("job_2.json", "job_0.json", "job_1.json", "tb_host_77.1700000000000.pt.trace.json"):
        shutil.copy(UNRANKED, tmp_path / name)
    inputs, _ = discover(tmp_path)
    # With the tensorboard file beside them, the numbers are not 0..N-1 for the four files.
    assert [(i.files[0].name, i.rank_hint) for i in inputs] == [("job_0.json", None), ("job_1.json", None),
                                                                ("job_2.json", None),
                                                                ("tb_host_77.1700000000000.pt.trace.json", None)]
    (tmp_path / "tb_host_77.1700000000000.pt.trace.json").unlink()
    inputs, _ = discover(tmp_path)
    assert [(i.files[0].name, i.rank_hint) for i in inputs] == [("job_0.json", 0), ("job_1.json", 1), ("job_2.json", 2)]


def notes_by_file(doc: dict) -> dict[str, str]:
    """The rank_from_name health notes, by trace file name (what follows the path)."""
    return {Path(path).name: message for path, message in
            (h["message"].split(": ", 1) for h in doc["health"] if h["check"] == "rank_from_name")}


def test_arbitrary_numbers_give_ranks_in_name_order_and_the_report_says_so(tmp_path):
    folder = tmp_path / "traces"
    folder.mkdir()
    for name in ("exp__1016002.json", "exp__1016001.json"):
        shutil.copy(UNRANKED, folder / name)
    doc = analyze(folder, tmp_path / "out", ["json"], workers=1)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    notes = notes_by_file(doc)
    assert notes["exp__1016001.json"] == (
        "no distributedInfo, and its name gives no rank: the trailing 1016001 is no rank pattern, nor are the 2 "
        "names' trailing numbers 0..1; analyzed as rank 0 (traces without a rank take the free ranks in name order)")
    assert notes["exp__1016002.json"].endswith(
        "analyzed as rank 1 (traces without a rank take the free ranks in name order)")


def test_a_rank_a_name_gave_is_not_kept_by_the_cache_once_the_folder_changes(tmp_path):
    folder, out = tmp_path / "traces", tmp_path / "out"
    folder.mkdir()
    for name in ("a_0.json", "a_1.json"):
        shutil.copy(UNRANKED, folder / name)
    doc = analyze(folder, out, ["json"], workers=1)
    assert notes_by_file(doc) == {
        "a_0.json": "no distributedInfo; rank 0 taken from its name's trailing 0, the 2 names' numbers being 0..1",
        "a_1.json": "no distributedInfo; rank 1 taken from its name's trailing 1, the 2 names' numbers being 0..1"}
    (folder / "a_0.json").unlink()  # alone, a_1.json's 1 is an arbitrary number: its cached rank 1 must go
    doc = analyze(folder, out, ["json"], workers=1)
    assert [r["rank"] for r in doc["ranks"]] == [0]
    assert notes_by_file(doc)["a_1.json"].startswith("no distributedInfo, and its name gives no rank: the trailing 1 ")
