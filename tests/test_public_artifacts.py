"""Real artifacts from other people's jobs (tests/fixtures/public/, provenance in its README) read right.

Each file was written by a real run: NCCL_DEBUG=INFO logs of nccl-tests on two A100s, flight-recorder
dumps of a 16-rank MoE job with injected faults, Kineto traces from a B200 and an MI300X. Every
check states a value the file itself or an independent reference (nccl-tests' own header,
nvidia-resiliency-ext's verdict, Holistic Trace Analysis) vouches for.
"""

from __future__ import annotations

import gzip
import json
import logging
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from diagtrain.profiler.analyzer.per_rank.breakdown import gpu_breakdown
from diagtrain.profiler.analyzer.read import flight_records as fr
from diagtrain.profiler.analyzer.read.nccl_log import NcclLog, parse_nccl_log
from diagtrain.profiler.analyzer.read.trace_file import read_trace

PUBLIC = Path(__file__).parent / "fixtures" / "public"
LOGS, DUMPS, TRACES = PUBLIC / "nccl_logs", PUBLIC / "flight_recorder", PUBLIC / "traces"
AGREEMENT = 0.01  # the bar: within 1% of HTA's value


def log_lines(name: str) -> list[str]:
    with gzip.open(LOGS / name, "rt", encoding="utf-8", errors="replace") as f:
        return f.readlines()


def nccl_log(name: str) -> NcclLog:
    """The log read as the analyzer reads a rank's nccl.log (tables.py: parse_nccl_log of its lines)."""
    return parse_nccl_log(log_lines(name))


# --- NCCL_DEBUG=INFO: nccl-tests all_reduce_perf, 2x A100, NCCL 2.27.7 -------------------------

NCCL_TESTS = "nccl_tests_all_reduce_2xA100.log.gz"
TOPO_FAIL = "nccl_tests_all_reduce_2xA100_topo_fail.log.gz"


def test_nccl_227_log_gives_version_and_the_communicator_of_both_ranks():
    log = nccl_log(NCCL_TESTS)
    assert log.version == "2.27.7+cuda13.0"  # 2.27 prints it as an INFO line, not a bare one
    assert [(c.rank, c.nranks, c.cuda_dev, c.nvml_dev) for c in log.communicators] == [(0, 2, 0, 0), (1, 2, 1, 1)]
    assert {c.comm_id for c in log.communicators} == {"0x54fe282d32a87d85"}
    assert all(c.complete for c in log.communicators)
    assert log.warnings == []


def test_nccl_bus_ids_are_the_devices_nccl_tests_itself_lists():
    # nccl-tests' header in the same file: "#  Rank  0 Group  0 Pid  64904 on mew0 device  0 [0000:17:00] ..."
    listed = re.findall(r"#\s+Rank\s+(\d+) .* device\s+\d+ \[(\w{4}:\w\w:\w\w)\]", "".join(log_lines(NCCL_TESTS)))
    assert listed == [("0", "0000:17:00"), ("1", "0000:65:00")]
    by_rank = {c.rank: c.pci_bus_id for c in nccl_log(NCCL_TESTS).communicators}
    assert {int(r): by_rank[int(r)] for r, _ in listed} == {int(r): f"{bus}.0" for r, bus in listed}


def test_nccl_227_rings_come_from_channel_lines_only():
    log = nccl_log(NCCL_TESTS)
    # "Channel NN/24 : 0 1" once per channel; 2.27's per-rank "Ring NN : 0 -> 1 -> 0" lines repeat them.
    assert [r.channel for r in log.rings] == list(range(24))
    assert {tuple(r.ranks) for r in log.rings} == {(0, 1)}
    assert len(log.trees) == 48  # "Trees [0] ... [23] ..." from each of the 2 ranks


def test_nccl_227_transports_are_nvlink_p2p_both_ways_on_every_channel():
    log = nccl_log(NCCL_TESTS)
    assert log.transport_counts() == {"P2P": 48, "SHM": 0, "NET/IB": 0, "NET/Socket": 0, "other": 0}
    assert {e.via for e in log.transports} == {"P2P/direct pointer/read"}
    assert {(e.src_rank, e.dst_rank) for e in log.transports} == {(0, 1), (1, 0)}
    assert sorted({e.channel for e in log.transports}) == list(range(24))


def test_every_coll_line_is_read_even_where_nccl_tests_output_shares_its_line():
    lines = log_lines(NCCL_TESTS)
    log = parse_nccl_log(lines)
    assert len(log.collectives) == sum(line.count("AllReduce: opCount") for line in lines) == 990
    assert {(c.op, c.datatype, c.reduce_op, c.nranks) for c in log.collectives} == {("AllReduce", "fp32", "sum", 2)}
    assert {c.comm for c in log.collectives} == {c.comm for c in log.communicators}
    # nccl-tests' header: "minBytes 8388608 maxBytes 8589934592"
    assert min(c.nbytes for c in log.collectives) == 8388608
    assert max(c.nbytes for c in log.collectives) == 8589934592
    assert log.collectives[-1].count == 2147483648  # the last line: the 8 GiB in-place run on rank 1's comm
    assert log.collectives[-1].comm == "0x55b6aa754530"


def test_a_topology_file_that_cuts_channels_shows_as_fewer_rings_and_edges():
    healthy, cut = nccl_log(NCCL_TESTS), nccl_log(TOPO_FAIL)
    assert cut.version == healthy.version
    assert {c.comm_id for c in cut.communicators} == {"0xde843772bfa53d08"}
    assert (len(cut.rings), len(healthy.rings)) == (2, 24)
    assert (cut.transport_counts()["P2P"], healthy.transport_counts()["P2P"]) == (4, 48)
    assert len(cut.collectives) == 990


# --- flight recorder: nvidia-resiliency-ext's 16-rank MoE job --------------------------------

def analyze(folder: Path, out: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "diagtrain.profiler.cli", "analyze", str(folder), "--out", str(out),
                           "--quiet"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads((out / "report.json").read_text())


@pytest.mark.jobs
def test_gpu_error_dumps_name_the_ranks_nvidia_resiliency_ext_names(tmp_path):
    # Its reference: PG 72, EXPERT_MODEL_PARALLEL_GROUP, nccl:all_to_all, 2048x5120 BFloat16, missing 9, 14.
    report = analyze(DUMPS / "nvrx_gpu_error_2nd", tmp_path / "out")
    assert report["run"]["dumps"] == 16
    assert "collective_mismatch" not in [f["kind"] for f in report["findings"]]
    [hang] = [f for f in report["findings"] if f["kind"] == "hang"]
    assert hang["ranks"] == [9, 14]
    assert (hang["metrics"]["op"], hang["metrics"]["group"], hang["metrics"]["seq"]) == \
        ("nccl:all_to_all", "EXPERT_MODEL_PARALLEL_GROUP", 44791)
    assert hang["metrics"]["waiting"] == [8, 10, 11, 12, 13, 15]
    assert len(hang["metrics"]["later_blocked"]) == 6
    assert "rank 9 last entered all_to_all #44790 there, completed up to #44787" in hang["explanation"]
    hang_doc = json.loads((tmp_path / "out" / "analysis" / "hang.json").read_text())
    assert hang_doc["blocked"][0] == {"group_key": "72:8-15", "seq": 44791}
    [row] = [r for r in hang_doc["flight_recorder"] if (r["group_key"], r["seq"]) == ("72:8-15", 44791)]
    assert row["missing"] == [9, 14]
    assert set(row["sizes"].values()) == {"[[2048, 5120]] ['BFloat16']"}


def test_lock_gil_dumps_are_read_as_written():
    folder = DUMPS / "nvrx_lock_gil_1st"
    assert not fr.looks_like_dump(folder / "fault_injection.log")
    dumps = {r: fr.read_dump(folder / f"_dump_{r}") for r in range(16)}
    assert {d["version"] for d in dumps.values()} == {"2.9"}
    assert [r for r, d in dumps.items() if not fr.entries(r, d)] == [9, 14]
    assert fr.groups_of_dump(dumps[9])["72"] == {"desc": "EXPERT_MODEL_PARALLEL_GROUP", "ranks": list(range(8, 16))}
    expert = [e for e in fr.entries(8, dumps[8]) if e.pg == "72"]
    assert [(e.seq, e.op, e.pg_id) for e in expert] == [(45265, "nccl:all_to_all", "11"), (45266, "nccl:all_to_all", "11"),
                                                         (45267, "nccl:all_to_all", "11")]
    assert (expert[0].sizes, expert[0].dtypes) == ([[2048, 5120]], ["BFloat16"])
    assert dumps[8]["pg_status"]["11"]["last_enqueued_collective"] == 45267
    assert {dumps[r]["pg_status"]["11"]["last_enqueued_collective"] for r in (9, 14)} == {45264}


@pytest.mark.jobs
def test_ranks_whose_dumps_hold_no_entries_are_named_by_their_group_status(tmp_path):
    # Ranks 9 and 14 (GIL locked) recorded nothing; their pg_status, keyed by their own group ids, says
    # they stopped at #45264 of the expert group, which the other six entered #45265 of.
    report = analyze(DUMPS / "nvrx_lock_gil_1st", tmp_path / "out")
    [hang] = [f for f in report["findings"] if f["kind"] == "hang"]
    assert hang["ranks"] == [9, 14]
    assert (hang["metrics"]["op"], hang["metrics"]["group"], hang["metrics"]["seq"]) == \
        ("nccl:all_to_all", "EXPERT_MODEL_PARALLEL_GROUP", 45265)
    assert hang["metrics"]["waiting"] == [8, 10, 11, 12, 13, 15]
    assert "rank 9 last entered #45264 there by its process-group status" in hang["explanation"]


def test_group_ids_are_not_paired_with_names_against_what_the_entries_show():
    folder = DUMPS / "nvrx_lock_gil_1st"
    dumps = {r: fr.read_dump(folder / f"_dump_{r}") for r in range(16)}
    entries = fr.keyed_by_members(dumps, {r: fr.groups_of_dump(d) for r, d in dumps.items()})
    assert fr.progress(dumps, entries)[("72:8-15", 9)].entered == 45264
    for e in entries:  # rank 8's expert-group collectives under another of its ids: the order is not creation's
        if e.rank == 8 and e.pg_id == "11":
            e.pg_id = "10"
    assert ("72:8-15", 9) not in fr.progress(dumps, entries)


# --- Kineto traces: B200 (NCCL) and MI300X (RCCL) ----------------------------------------------

B200 = TRACES / "tracelens_b200_eager_rank0.json.gz"
MI300X = TRACES / "tracelens_mi300x_resnet_ddp_rank0.json.gz"


def hta_analysis(tmp_path: Path, trace: Path):
    """HTA 0.5's analysis of one trace; a missing reference fails the test (a skip would hide an unchecked result)."""
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError as e:
        pytest.fail(f"Holistic Trace Analysis, the reference, cannot be imported ({e}): "
                    "pip install --no-deps HolisticTraceAnalysis==0.5.0")
    logging.getLogger("hta").setLevel(logging.ERROR)
    folder = tmp_path / "hta"
    folder.mkdir()
    shutil.copy(trace, folder)
    return TraceAnalysis(trace_dir=str(folder))


def test_b200_trace_header_gives_rank_world_and_nccl_version():
    trace = read_trace(B200)
    assert (trace.rank, trace.world_size, trace.backend, trace.nccl_version) == (0, 8, "nccl", "2.27.5")
    assert len(trace.pg_config) == 15
    device = trace.events[trace.events["stream"] >= 0]
    assert set(device["stream"]) == {7}
    comm = device[device["kind"].astype(str) == "comm"]
    assert comm["name"].astype(str).tolist() == ["ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"]


def test_b200_breakdown_matches_hta_and_names_the_one_difference(tmp_path):
    expected = hta_analysis(tmp_path, B200).get_temporal_breakdown(visualize=False).iloc[0]
    trace = read_trace(B200)
    ours = gpu_breakdown(trace.events)
    assert ours.total_us == pytest.approx(expected["kernel_time(us)"], rel=AGREEMENT)
    assert ours.idle_us == pytest.approx(expected["idle_time(us)"], rel=AGREEMENT)
    assert ours.compute_us == pytest.approx(expected["compute_time(us)"], rel=AGREEMENT)
    assert ours.non_compute_us == pytest.approx(expected["non_compute_time(us)"], rel=AGREEMENT)
    # HTA counts the Triton launch's host op (it carries a stream) as kernel time; the note says so.
    [note] = [n["message"] for n in trace.notes if n["check"] == "departs_from_hta"]
    assert "host events with a stream argument" in note and "1 event (74.4 µs" in note
    assert expected["compute_time(us)"] - ours.compute_us == pytest.approx(74.4, abs=1.5)


def test_mi300x_trace_header_and_rccl_kernels():
    trace = read_trace(MI300X)
    assert (trace.rank, trace.world_size, trace.backend, trace.nccl_version) == (0, 8, "nccl", "2.22.3")
    device = trace.events[trace.events["stream"] >= 0]
    assert len(device) == 3653 and set(device["stream"]) == {0, 4}
    comm = device[device["kind"].astype(str) == "comm"]
    assert comm["name"].astype(str).tolist() == ["ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)"] * 17


def hta_rule_by_hand(path: Path) -> tuple[float, float, float]:
    """HTA's temporal breakdown rule on the raw JSON, plainly: device work launched before the last
    ProfilerStep starts (the later of its host and device annotations), timestamps rounded inward,
    window first to last; returns (window, idle, communication) in µs."""
    with gzip.open(path, "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    device_cats = ("kernel", "gpu_memcpy", "gpu_memset")
    cut = max(e["ts"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    launched = {e["args"]["correlation"] for e in events
                if e.get("cat") not in device_cats and "correlation" in e.get("args", {}) and e["ts"] < cut}
    kept = [e for e in events if e.get("cat") in device_cats and e["args"].get("correlation") in launched]
    spans = [(math.ceil(e["ts"]), math.floor(e["ts"] + e["dur"])) for e in kept]
    comm = [s for s, e in zip(spans, kept) if e["cat"] == "kernel" and "nccl" in e["name"].lower()]
    window = max(b for _, b in spans) - min(a for a, _ in spans)
    return window, window - union_length(spans), union_length(comm)


def union_length(spans: list[tuple[float, float]]) -> float:
    total, start, end = 0.0, None, None
    for s, e in sorted(spans):
        if end is None or s > end:
            total += 0.0 if end is None else end - start
            start, end = s, e
        else:
            end = max(end, e)
    return total + (0.0 if end is None else end - start)


def test_mi300x_breakdown_matches_htas_rule_where_hta_itself_fails(tmp_path):
    # HTA 0.5.0 cannot load this trace (its correlation-index column is int16; the ids pass 32767).
    with pytest.raises(TypeError):
        hta_analysis(tmp_path, MI300X)
    ours = gpu_breakdown(read_trace(MI300X).events)
    assert hta_rule_by_hand(MI300X) == (56517, 1541, 47191)
    assert (ours.total_us, ours.idle_us, ours.comm_us) == (56517, 1541, 47191)
    assert ours.idle_us + ours.compute_us + ours.non_compute_us == pytest.approx(ours.total_us)
