"""Log parsers: NCCL_DEBUG=INFO logs and the watchdog / gloo / c10d errors in stderr."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from conftest import PG_TIMEOUT_S
from diagtrain.profiler.analyzer.read.log_lines import strip_launcher_prefix
from diagtrain.profiler.analyzer.read.nccl_log import parse_nccl_log, read_nccl_log, transport_family
from diagtrain.profiler.analyzer.read.stderr_errors import LowestEnqueued, lowest_enqueued, parse_errors

LOGS = Path(__file__).parent / "fixtures" / "logs"


def errors(name: str):
    return parse_errors((LOGS / name).read_text(encoding="utf-8").splitlines())


def by_rank(events) -> dict[int, list]:
    """Split one combined (torchrun) stderr into per-rank event lists, as ranks/<r>/stderr.log are."""
    ranks = defaultdict(list)
    for event in events:
        if "rank" in event.fields:  # "terminate called ... what():" lines carry no rank
            ranks[event.fields["rank"]].append(event)
    return dict(ranks)


# --- launcher prefixes -------------------------------------------------------------------------

@pytest.mark.parametrize("line,text,rank", [
    ("[1,3]<stdout>:host:1:2 [3] NCCL INFO x\n", "host:1:2 [3] NCCL INFO x", 3),
    ("[1,5]<stderr>:[rank5]: RuntimeError: boom", "RuntimeError: boom", 5),
    ("[0] host:1:2 [0] NCCL INFO x", "host:1:2 [0] NCCL INFO x", 0),
    ("[rank3]:[E1122 ProcessGroupNCCL.cpp:632] [Rank 3] x", "[E1122 ProcessGroupNCCL.cpp:632] [Rank 3] x", 3),
    ("[default2]:hello", "hello", 2),
    ("(RayTrainWorker pid=123, ip=10.0.0.1) host:1:2 [0] NCCL INFO x", "host:1:2 [0] NCCL INFO x", None),
    ("(Worker pid=123) text", "text", None),
    ("7: srun labelled", "srun labelled", 7),
    ("[Rank 0]: Ranks 1 failed", "[Rank 0]: Ranks 1 failed", None),  # torch's own prefix stays
    ("plain line\r\n", "plain line", None),
])
def test_launcher_prefixes_are_stripped(line, text, rank):
    assert strip_launcher_prefix(line) == (text, rank)


# --- NCCL_DEBUG=INFO ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def nccl8():
    return read_nccl_log(LOGS / "nccl_info_8rank.log")


def test_version_and_communicators(nccl8):
    assert nccl8.version == "2.21.5+cuda12.4"
    assert [c.rank for c in nccl8.communicators] == list(range(8))  # START and COMPLETE: one each
    assert {c.nranks for c in nccl8.communicators} == {8}
    assert {c.comm_id for c in nccl8.communicators} == {"0x5b0c2ec54bd0c2b2"}
    rank3 = nccl8.communicators[3]
    assert (rank3.comm, rank3.cuda_dev, rank3.nvml_dev, rank3.bus_id) == ("0x5593d1b2e7f0", 3, 3, "5d000")
    assert rank3.pci_bus_id == "0000:5d:00.0"
    # Rank 7 printed Init START and never Init COMPLETE.
    assert [c.rank for c in nccl8.communicators if not c.complete] == [7]


def test_rings_and_trees(nccl8):
    assert [(r.channel, r.ranks) for r in nccl8.rings] == [(0, list(range(8))), (1, list(range(8)))]
    assert [(t.channel, t.raw) for t in nccl8.trees] == [
        (0, "1/4/-1->0->-1"), (1, "1/-1/-1->0->4"), (0, "5/-1/-1->4->0"), (1, "5/0/-1->4->-1")]


def test_transports_are_classified(nccl8):
    assert nccl8.transport_counts() == {"P2P": 4, "SHM": 2, "NET/IB": 4, "NET/Socket": 2, "other": 0}
    gdr = next(e for e in nccl8.transports if e.via == "NET/IB/2/GDRDMA")
    assert (gdr.channel, gdr.src_rank, gdr.src_dev, gdr.dst_rank, gdr.dst_dev, gdr.direction) == (1, 3, "3", 4, "0", "send")
    shm = next(e for e in nccl8.transports if e.family == "SHM")
    assert (shm.src_rank, shm.dst_rank, shm.via, shm.direction) == (2, 3, "SHM/direct/direct", None)


@pytest.mark.parametrize("via,family", [
    ("P2P/IPC", "P2P"), ("P2P/IPC/read", "P2P"), ("P2P/CUMEM", "P2P"), ("P2P/direct pointer", "P2P"),
    ("SHM/direct/direct", "SHM"), ("NET/IB/0", "NET/IB"), ("NET/IB/2/GDRDMA", "NET/IB"),
    ("NET/IBext_v8/2", "NET/IB"), ("NET/Socket/0", "NET/Socket"), ("NET/AWS Libfabric/0", "other"),
    ("NVLS", "other"),
])
def test_transport_family(via, family):
    assert transport_family(via) == family


def test_collectives_decode_hex_op_count_and_codes(nccl8):
    colls = nccl8.collectives
    assert [(c.op, c.op_count) for c in colls] == [
        ("AllReduce", 0), ("AllReduce", 0x1a), ("Broadcast", 0x1b), ("ReduceScatter", 0x2f),
        ("AllGather", 0x30), ("AllReduce", 0x31)]
    first = colls[0]
    assert (first.count, first.datatype, first.reduce_op, first.comm, first.nranks) == (
        1048576, "fp32", "sum", "0x55d4c8a0b9f0", 8)
    assert first.nbytes == 4 * 1048576
    assert [c.datatype for c in colls] == ["fp32", "bf16", "int64", "fp16", "fp8e5m2", "unknown(13)"]
    assert (colls[2].root, colls[3].reduce_op, colls[5].reduce_op) == (3, "avg", "max")
    assert colls[5].nbytes is None  # a datatype newer than the table: no size guessed


def test_warnings_with_and_without_timestamp(nccl8):
    stamped, plain = nccl8.warnings
    assert stamped.timestamp == "2025-03-04 10:22:31"
    assert stamped.source == "transport/net_ib.cc:1696"
    assert stamped.text.startswith("NET/IB : Got completion from peer 10.1.0.11<48152> with status=12")
    assert "vendor err 129" in stamped.text
    assert (plain.timestamp, plain.source) == (None, "misc/socket.cc:50")
    assert plain.text == "socketProgress: Connection closed by remote peer node-b<57321>"


def test_garbage_lines_are_counted_as_skipped(nccl8):
    # 3 header comments, 2 trainer prints, a cut-off NCCL line, a ring without NCCL header,
    # 2 traceback lines, 1 line of invalid bytes. Blank lines and unparsed NCCL INFO lines are not.
    assert nccl8.skipped == 10


def test_legacy_nccl_and_ray_prefix():
    log = read_nccl_log(LOGS / "nccl_info_legacy_socket.log")
    assert log.version == "2.10.3+cuda11.3"
    (comm,) = log.communicators
    assert (comm.rank, comm.nranks, comm.bus_id, comm.nvml_dev, comm.comm_id, comm.complete) == (
        0, 2, "1a000", None, None, True)
    assert log.transport_counts()["NET/Socket"] == 4
    assert {(e.src_dev, e.dst_dev) for e in log.transports} == {("1a000", "3b000"), ("3b000", "1a000")}
    assert [(w.source, w.timestamp) for w in log.warnings] == [("include/socket.h:423", None)]
    assert log.skipped == 3  # the header comments


def test_bad_input_never_raises(tmp_path):
    junk = ["", "\x00\xff", "NCCL INFO", "host:1:2 [0] NCCL INFO Channel 00/02 : x y",
            "host:1:2 [0] NCCL INFO comm 0x1 rank x nranks", "host:1:2 [0] NCCL WARN",
            "host:1:2 [0] NCCL INFO AllReduce: opCount zz sendbuff", "[1,0]<stdout>:", "(("]
    log = parse_nccl_log(junk)
    assert log.communicators == log.rings == log.transports == log.collectives == []
    assert log.skipped == 3  # "\x00\xff", "NCCL INFO", "((" (blank ones are not counted)
    assert parse_errors(junk) == []
    assert read_nccl_log(tmp_path / "missing.log") == parse_nccl_log([])
    (tmp_path / "bytes.log").write_bytes(b"\xff\xfe\x80 not utf-8\nNCCL version 2.30.1+cuda13.0\n")
    assert read_nccl_log(tmp_path / "bytes.log").version == "2.30.1+cuda13.0"


# --- stderr: watchdog --------------------------------------------------------------------------

def test_watchdog_timeout_fields():
    events = errors("stderr_nccl_watchdog.log")
    timeout = next(e for e in events if e.kind == "nccl_watchdog_timeout")
    assert timeout.fields == {
        "rank": 0, "seq": 7220, "op_type": "ALLREDUCE", "numel_in": 25165824, "numel_out": 25165824,
        "timeout_ms": 600000, "ran_for_ms": 600034, "source": "ProcessGroupNCCL.cpp:632"}
    assert timeout.line_no == 5 and timeout.text.startswith("[E1122 10:15:02.162555850 ProcessGroupNCCL.cpp:632] [Rank 0]")


def test_watchdog_kinds_and_progress():
    events = errors("stderr_nccl_watchdog.log")
    assert [e.kind for e in events] == [
        "nccl_watchdog_timeout", "nccl_watchdog_progress", "nccl_watchdog_timeout", "nccl_watchdog_progress",
        "nccl_watchdog_timeout", "nccl_watchdog_progress", "nccl_watchdog_progress", "nccl_failed",
        "nccl_watchdog_timeout", "cpp_terminate", "watchdog_stuck"]
    # The watchdog's exception ends the process through std::terminate.
    assert events[9].fields == {"exception": "c10::DistBackendError"} and events[9].line_no == 17
    progress = events[1].fields
    assert (progress["pg_id"], progress["pg_guid"], progress["pg_desc"], progress["rank"]) == (0, "0", "default_pg", 0)
    assert (progress["failed_seq"], progress["last_enqueued"], progress["last_completed"]) == (7220, 7220, 7219)
    dump_signal = events[6].fields  # rank 2: no failing work of its own, one work behind
    assert (dump_signal["rank"], dump_signal["last_enqueued"], "failed_seq" in dump_signal) == (2, 7219, False)
    assert events[-1].fields["stuck_s"] == 480 and events[-1].fields["rank"] == 3


def test_lowest_enqueued_names_the_rank_that_never_issued_the_collective():
    per_rank = by_rank(errors("stderr_nccl_watchdog.log"))
    assert sorted(per_rank) == [0, 1, 2, 3]
    assert lowest_enqueued(per_rank) == [LowestEnqueued(pg_id=0, ranks=[2], last_enqueued=7219, others_enqueued=7220)]


def test_lowest_enqueued_is_empty_without_a_laggard():
    assert lowest_enqueued({}) == []
    assert lowest_enqueued(by_rank(errors("stderr_gloo_c10d.log"))) == []  # no progress lines
    legacy = by_rank(errors("stderr_nccl_watchdog_legacy.log"))
    assert lowest_enqueued({1: legacy[1]}) == []  # one rank alone is behind no one


def test_legacy_watchdog_wordings():
    events = errors("stderr_nccl_watchdog_legacy.log")
    assert [e.kind for e in events] == [
        "nccl_watchdog_timeout", "nccl_watchdog_progress", "nccl_watchdog_timeout",
        "nccl_watchdog_progress", "nccl_failed", "blocking_wait_timeout"]
    torch24 = events[1].fields  # "Exception (either an error or timeout) detected by watchdog at work"
    assert (torch24["pg_id"], torch24["pg_guid"], "pg_desc" in torch24, torch24["rank"]) == (2, "3", False, 1)
    assert (torch24["failed_seq"], torch24["last_enqueued"], torch24["last_completed"]) == (32, 32, 31)
    old_timeout = events[2].fields  # no NumelIn / NumelOut
    assert old_timeout == {"rank": 5, "seq": 5, "op_type": "BROADCAST", "timeout_ms": 1800000,
                           "ran_for_ms": 1806496, "source": "ProcessGroupNCCL.cpp:523"}
    torch23 = events[3].fields  # "Timeout at NCCL work"; -1: nothing completed yet
    assert (torch23["pg_id"], torch23["failed_seq"], torch23["last_completed"]) == (0, 5, -1)
    blocking = events[5].fields
    assert (blocking["seq"], blocking["op_type"], blocking["timeout_ms"], blocking["numel_out"]) == (
        12, "REDUCE_SCATTER", 5000, 1024)


# --- stderr: gloo and c10d ---------------------------------------------------------------------

def test_gloo_and_c10d_errors():
    events = errors("stderr_gloo_c10d.log")
    assert [e.kind for e in events] == [
        "gloo_timeout", "gloo_peer_closed", "cpp_terminate", "size_mismatch", "gloo_peer_closed",
        "collective_mismatch", "monitored_barrier", "monitored_barrier"]
    timeout, closed, terminate, size, reset, mismatch, one, many = events
    assert terminate.fields == {"exception": "gloo::EnforceNotMet"}
    assert (timeout.fields["timeout_ms"], timeout.fields["operation"], timeout.fields["rank"]) == (8000, "recv", 1)
    assert timeout.fields["source"] == "unbound_buffer.cc:78"
    assert (closed.fields["peer"], closed.fields["rank"]) == ("[127.0.0.1]:30601", 0)
    assert (size.fields["received_bytes"], size.fields["expected_bytes"]) == (8, 4)
    assert reset.fields["peer"] == "[127.0.0.1]:59616"
    assert mismatch.fields["ranks"] == [0, 1]
    prints = mismatch.fields["fingerprints"]
    assert prints[0].startswith("CollectiveFingerPrint(SequenceNumber=0, OpType=ALLREDUCE, TensorShape=[4, 5]")
    assert prints[1].startswith("CollectiveFingerPrint(SequenceNumber=0, OpType=BROADCAST")
    assert prints[0].endswith("memory_format=(nullopt)))") and prints[1].endswith("memory_format=(nullopt)))")
    assert (one.fields["ranks"], one.fields["timeout_ms"], one.fields["rank"]) == ([1], 3000, 0)
    assert many.fields["ranks"] == [1, 2]


@pytest.mark.jobs
def test_real_gloo_hang_stderr(gloo_timeout_run):
    """A real 2-rank job where rank 1 skips a collective: gloo times out after --pg-timeout."""
    run = gloo_timeout_run
    assert run.returncode != 0
    events = parse_errors(run.stderr.splitlines())
    timeouts = [e for e in events if e.kind == "gloo_timeout"]
    assert timeouts, run.stderr[-3000:]
    assert {e.fields["timeout_ms"] for e in timeouts} == {PG_TIMEOUT_S * 1000}
    assert {e.fields["rank"] for e in events} <= {0, 1}
