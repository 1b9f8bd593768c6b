"""Parsers for the text logs a rank leaves behind: NCCL_DEBUG=INFO output and stderr errors.

Formats are those in shared/reference/logs-and-dumps.md. Every parser is tolerant: a line it does
not recognize is counted or ignored, never an error, because a log cut off by a killed rank or
interleaved with a trainer's own prints is the normal case, not the exception.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

# ---------------------------------------------------------------------------------------------
# Launcher prefixes and the shared line loop
# ---------------------------------------------------------------------------------------------

# One prefix per launcher; they can nest (mpirun around torchrun), so stripping repeats.
_LAUNCHER_PREFIX = re.compile(
    r"^(?:"
    r"\[\d+,(?P<mpi>\d+)\]<std(?:out|err)>:"  # Open MPI --tag-output: [jobid,rank]<stdout>:
    r"|\[(?:rank|default)?(?P<bracket>\d+)\]:?"  # torchrun [rank3]: / --tee [default3]: / "[0] "
    r"|\((?:[\w.-]+ )?pid=\d+(?:, ip=[^)]*)?\)"  # Ray: (RayTrainWorker pid=123, ip=10.0.0.1)
    r"|(?P<srun>\d+): "  # srun --label: "3: "
    r")[ \t]?"
)


def strip_launcher_prefix(line: str) -> tuple[str, int | None]:
    """Remove launcher prefixes and the line end; return the text and the rank a prefix named.

    The rank is the innermost prefix's (None for Ray, which names a pid, or when there is none).
    """
    text = line.rstrip("\r\n")
    rank = None
    while match := _LAUNCHER_PREFIX.match(text):
        named = match.group("mpi") or match.group("bracket") or match.group("srun")
        rank = int(named) if named is not None else rank
        text = text[match.end():]
    return text.strip(), rank


def _stripped_lines(lines: Iterable[str]) -> Iterator[tuple[int, str, int | None]]:
    """(1-based line number, text without prefixes, launcher rank) for every non-blank line."""
    for line_no, raw in enumerate(lines, start=1):
        text, rank = strip_launcher_prefix(raw)
        if text:
            yield line_no, text, rank


def _int_or_text(value: str) -> int | str:
    """Numbers become ints (negative ones too: torch prints -1 for "no work yet")."""
    return int(value) if re.fullmatch(r"-?\d+", value) else value


# ---------------------------------------------------------------------------------------------
# NCCL_DEBUG=INFO
# ---------------------------------------------------------------------------------------------

# NCCL's ncclDataType_t and ncclRedOp_t, in enum order (nccl.h).
DATATYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "fp16", "fp32", "fp64", "bf16",
             "fp8e4m3", "fp8e5m2")
REDUCE_OPS = ("sum", "prod", "max", "min", "avg")
# Bytes per element, for turning a COLL line's count into the buffer size that bandwidth needs.
DATATYPE_BYTES = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "fp16": 2,
                  "fp32": 4, "fp64": 8, "bf16": 2, "fp8e4m3": 1, "fp8e5m2": 1}
TRANSPORT_FAMILIES = ("P2P", "SHM", "NET/IB", "NET/Socket", "other")


@dataclass
class Communicator:
    """One communicator on one rank, from its `Init START` / `Init COMPLETE` lines."""

    comm: str  # the pointer NCCL prints, e.g. "0x55d4c8a0b9f0"; COLL lines name it too
    rank: int
    nranks: int
    cuda_dev: int
    nvml_dev: int | None  # absent before NCCL 2.19
    bus_id: str  # hex as printed ("18000"); see pci_bus_id
    comm_id: str | None  # absent in older NCCL
    line_no: int
    complete: bool = False  # False: init started and never finished (a hang in init)

    @property
    def pci_bus_id(self) -> str:
        """The busId in PCI form (NCCL's int64ToBusId): "18000" -> "0000:18:00.0"."""
        value = int(self.bus_id, 16)
        return f"{value >> 20:04x}:{(value >> 12) & 0xff:02x}:{(value >> 4) & 0xff:02x}.{value & 0xf:x}"


@dataclass
class Ring:
    """One ring: the rank order of a channel (`Channel 00/02 : 0 1 2 3`)."""

    channel: int
    ranks: list[int]
    line_no: int


@dataclass
class Tree:
    """One channel's tree as printed (`-1/-1/-1->0->1`: children -> rank -> parent)."""

    channel: int
    raw: str
    line_no: int


@dataclass
class TransportEdge:
    """A connection of one channel between two ranks, and the transport it uses."""

    channel: int
    src_rank: int
    src_dev: str  # the device in brackets: CUDA device in recent NCCL, busId (hex) in older NCCL
    dst_rank: int
    dst_dev: str
    via: str  # everything after "via", e.g. "NET/IB/2/GDRDMA"
    family: str  # one of TRANSPORT_FAMILIES
    direction: str | None  # "send" / "receive" for NET edges, None otherwise
    line_no: int


@dataclass
class CollLine:
    """One collective call logged under NCCL_DEBUG_SUBSYS=COLL."""

    op: str  # "AllReduce", "Broadcast", ...
    op_count: int
    count: int
    datatype: str
    reduce_op: str
    root: int
    comm: str
    nranks: int | None
    line_no: int

    @property
    def nbytes(self) -> int | None:
        """count x element size; None for a datatype NCCL added after this table."""
        size = DATATYPE_BYTES.get(self.datatype)
        return None if size is None else self.count * size


@dataclass
class LogLine:
    """A NCCL WARN: its message, where NCCL raised it, and its timestamp when NCCL printed one."""

    line_no: int
    text: str
    source: str | None  # "transport/net_ib.cc:1696"
    timestamp: str | None  # "2025-03-04 10:22:31" (NCCL 2.26+), the host's local time
    time: float | None = None  # the timestamp as Unix seconds on the run's clock (set by the tables)


@dataclass
class NcclLog:
    """Everything read from one NCCL_DEBUG=INFO log.

    ``skipped`` counts lines that are not NCCL lines at all (trainer prints, garbage); NCCL INFO
    lines whose message is not one of the kinds above are normal and not counted.
    """

    version: str | None = None
    communicators: list[Communicator] = field(default_factory=list)
    rings: list[Ring] = field(default_factory=list)
    trees: list[Tree] = field(default_factory=list)
    transports: list[TransportEdge] = field(default_factory=list)
    collectives: list[CollLine] = field(default_factory=list)
    warnings: list[LogLine] = field(default_factory=list)
    skipped: int = 0

    def transport_counts(self) -> dict[str, int]:
        """Edges per transport family (every family present, zero included)."""
        counts = dict.fromkeys(TRANSPORT_FAMILIES, 0)
        for edge in self.transports:
            counts[edge.family] += 1
        return counts


# `[timestamp] host:pid:tid [cudaDev] [file.cc:LINE [(func)] ]NCCL LEVEL message`. search(), not
# match(): a launcher prefix we do not know still leaves the header findable.
_NCCL_HEADER = re.compile(
    r"(?:\[(?P<ts>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?)\]\s*)?"
    r"[^\s:\[\]]+:\d+:\d+ \[\d+\] "
    r"(?:(?P<source>[\w./+-]+:\d+)(?: \([^)]*\))? )?"
    r"NCCL (?P<level>INFO|WARN|TRACE|CALL)\b ?(?P<msg>.*)$"
)
_VERSION = re.compile(r"NCCL version (?P<version>\S+)")
_COMM_INIT = re.compile(
    r"\bcomm (?P<comm>0x[0-9a-fA-F]+|\(nil\)) rank (?P<rank>\d+) nranks (?P<nranks>\d+) "
    r"cudaDev (?P<cuda>-?\d+)(?: nvmlDev (?P<nvml>-?\d+))? busId (?P<bus>[0-9a-fA-F]+)"
    r"(?P<rest>.*?) - Init (?P<state>START|COMPLETE)"
)
_COMM_ID = re.compile(r"\bcommId (0x[0-9a-fA-F]+)")
# Older NCCL said "Ring 00 : 0 1 2 3"; newer "Channel 00/02 : 0 1 2 3".
_RING = re.compile(r"^(?:Channel|Ring) (?P<channel>\d+)(?:/\d+)? :(?P<ranks>(?:\s+\d+)+)\s*$")
_TREES = re.compile(r"^Trees\b")
_TREE_ENTRY = re.compile(r"\[(\d+)\]\s*(\S+)")
_TRANSPORT = re.compile(
    r"^(?:Channel|Ring) (?P<channel>\d+)(?:/\d+)? : (?P<src>\d+)\[(?P<src_dev>\w+)\] -> "
    r"(?P<dst>\d+)\[(?P<dst_dev>\w+)\](?: \[(?P<dir>send|receive)\])? via (?P<via>.+?)\s*$"
)
_COLL = re.compile(
    r"^(?P<op>\w+): opCount (?P<op_count>[0-9a-fA-F]+) sendbuff \S+ recvbuff \S+ count (?P<count>\d+) "
    r"datatype (?P<datatype>\d+) op (?P<redop>\d+) root (?P<root>-?\d+) comm (?P<comm>\S+)"
    r"(?: \[nranks=(?P<nranks>\d+)\])?"
)
# NET/IBext_v8 is the nccl-rdma-sharp plugin's InfiniBand transport, so it is IB too.
_FAMILY_PATTERNS = (
    ("P2P", re.compile(r"^P2P\b")),
    ("SHM", re.compile(r"^SHM\b")),
    ("NET/IB", re.compile(r"^NET/IB(?:ext\w*)?/")),
    ("NET/Socket", re.compile(r"^NET/Socket/")),
)


def transport_family(via: str) -> str:
    """Classify a transport ("P2P/IPC/read", "NET/IBext_v8/2", ...) into TRANSPORT_FAMILIES."""
    for family, pattern in _FAMILY_PATTERNS:
        if pattern.match(via):
            return family
    return "other"


def _code_name(names: tuple[str, ...], code: int) -> str:
    """A datatype or reduce op by its NCCL code; codes newer than the table stay visible."""
    return names[code] if 0 <= code < len(names) else f"unknown({code})"


def _on_version(log: NcclLog, m: re.Match, line_no: int) -> None:
    log.version = log.version or m.group("version")


def _on_comm(log: NcclLog, m: re.Match, line_no: int) -> None:
    comm_id = _COMM_ID.search(m.group("rest"))
    comm = Communicator(
        comm=m.group("comm"), rank=int(m.group("rank")), nranks=int(m.group("nranks")),
        cuda_dev=int(m.group("cuda")), nvml_dev=int(m.group("nvml")) if m.group("nvml") else None,
        bus_id=m.group("bus"), comm_id=comm_id.group(1) if comm_id else None, line_no=line_no)
    key = (comm.comm, comm.comm_id, comm.rank)
    # START and COMPLETE print the same fields: keep one record, the first line, and mark it done.
    known = next((c for c in log.communicators if (c.comm, c.comm_id, c.rank) == key), None)
    if known is None:
        log.communicators.append(comm)
        known = comm
    known.complete = known.complete or m.group("state") == "COMPLETE"


def _on_ring(log: NcclLog, m: re.Match, line_no: int) -> None:
    log.rings.append(Ring(int(m.group("channel")), [int(r) for r in m.group("ranks").split()], line_no))


def _on_trees(log: NcclLog, m: re.Match, line_no: int) -> None:
    for channel, raw in _TREE_ENTRY.findall(m.string):
        log.trees.append(Tree(int(channel), raw, line_no))


def _on_transport(log: NcclLog, m: re.Match, line_no: int) -> None:
    via = m.group("via")
    log.transports.append(TransportEdge(
        channel=int(m.group("channel")), src_rank=int(m.group("src")), src_dev=m.group("src_dev"),
        dst_rank=int(m.group("dst")), dst_dev=m.group("dst_dev"), via=via,
        family=transport_family(via), direction=m.group("dir"), line_no=line_no))


def _on_coll(log: NcclLog, m: re.Match, line_no: int) -> None:
    log.collectives.append(CollLine(
        op=m.group("op"), op_count=int(m.group("op_count"), 16), count=int(m.group("count")),
        datatype=_code_name(DATATYPES, int(m.group("datatype"))),
        reduce_op=_code_name(REDUCE_OPS, int(m.group("redop"))), root=int(m.group("root")),
        comm=m.group("comm"), nranks=int(m.group("nranks")) if m.group("nranks") else None,
        line_no=line_no))


# Tried in order on an INFO message; the first match wins. Transport before ring: both start
# with "Channel NN", and only the transport form has "->".
_INFO_HANDLERS: tuple[tuple[re.Pattern, Callable[[NcclLog, re.Match, int], None]], ...] = (
    (_VERSION, _on_version),
    (_COMM_INIT, _on_comm),
    (_TRANSPORT, _on_transport),
    (_RING, _on_ring),
    (_TREES, _on_trees),
    (_COLL, _on_coll),
)


def _on_info(log: NcclLog, message: str, line_no: int) -> None:
    for pattern, handler in _INFO_HANDLERS:
        if match := pattern.search(message):
            handler(log, match, line_no)
            return


def parse_nccl_log(lines: Iterable[str]) -> NcclLog:
    """Parse NCCL_DEBUG=INFO output (any launcher prefix) into an NcclLog; never raises on content."""
    log = NcclLog()
    for line_no, text, _rank in _stripped_lines(lines):
        header = _NCCL_HEADER.search(text)
        if header is None:
            # The VERSION level prints "NCCL version ..." with no host:pid:tid header.
            if version := _VERSION.match(text):
                _on_version(log, version, line_no)
            else:
                log.skipped += 1
        elif header.group("level") == "WARN":
            log.warnings.append(LogLine(line_no, header.group("msg").strip(), header.group("source"),
                                        header.group("ts")))
        elif header.group("level") == "INFO":
            _on_info(log, header.group("msg"), line_no)
    return log


def read_nccl_log(path: str | Path) -> NcclLog:
    """parse_nccl_log on a file; a missing file gives an empty NcclLog (NCCL_DEBUG was off)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return parse_nccl_log(f)
    except FileNotFoundError:
        return NcclLog()


# ---------------------------------------------------------------------------------------------
# stderr: ProcessGroupNCCL watchdog, gloo, c10d
# ---------------------------------------------------------------------------------------------

EVENT_KINDS = ("nccl_watchdog_timeout", "nccl_watchdog_progress", "nccl_failed", "watchdog_stuck",
               "blocking_wait_timeout", "gloo_timeout", "gloo_peer_closed", "size_mismatch",
               "collective_mismatch", "monitored_barrier")


@dataclass
class LogEvent:
    """One recognized error line from a rank's stderr.

    ``fields`` holds what the line says (see parse_errors); ``rank`` there is the rank the message
    names, or else the one the launcher prefix names.
    """

    kind: str  # one of EVENT_KINDS
    line_no: int
    text: str  # the line without launcher prefixes
    fields: dict[str, Any] = field(default_factory=dict)
    timestamp: str | None = None  # glog's "1123 05:26:37.351571" (month, day, local time), when the line has it
    time: float | None = None  # the timestamp as Unix seconds on the run's clock (set by the tables)


# torch's logPrefix(): "[Rank 3]", "[PG 0 Rank 3]", "[PG ID 0 PG GUID 0(default_pg) Rank 3]".
_PG_HEADER = re.compile(
    r"\[(?:PG (?:ID )?(?P<pg_id>\d+) (?:PG GUID (?P<pg_guid>[^\s(\]]+)(?:\((?P<pg_desc>[^)]*)\))? )?)?"
    r"Rank (?P<rank>\d+)\]"
)
# WorkNCCL(SeqNum=N, OpType=X, NumelIn=X, NumelOut=Y, Timeout(ms)=T); older torch has fewer keys.
_WORK_FIELDS = (
    ("seq", re.compile(r"SeqNum=(\d+)")),
    ("op_type", re.compile(r"OpType=(\w+)")),
    ("numel_in", re.compile(r"NumelIn=(\d+)")),
    ("numel_out", re.compile(r"NumelOut=(\d+)")),
    ("timeout_ms", re.compile(r"Timeout\(ms\)=(\d+)")),
    ("ran_for_ms", re.compile(r"ran for (\d+) milliseconds")),
)
# "[E1122 ... ProcessGroupNCCL.cpp:632]", "[/.../gloo/transport/tcp/unbound_buffer.cc:78]".
_SOURCE = re.compile(r"([\w.-]+\.(?:cc|cpp|c|h|hpp|py)):(\d+)\]")
# The watchdog's failing work: 2.6+ "work sequence id: N", 2.4/2.5 "at work: N", 2.3 "Timeout at
# NCCL work: N". The dump-signal and periodic-update wordings have none.
_FAILED_SEQ = re.compile(r"(?:work sequence id|detected by watchdog at work|Timeout at NCCL work): (-?\d+)")
_FINGERPRINT = re.compile(r"Rank (\d+) is running collective: (?=CollectiveFingerPrint\()")


def _balanced(text: str, start: int) -> str:
    """text[start:] up to the parenthesis closing the first one opened (fingerprints nest parens)."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0 and text[i] == ")":
            return text[start:i + 1]
    return text[start:]  # cut off mid-fingerprint: keep what is there


def _fingerprints(text: str) -> dict[str, Any]:
    prints = {int(m.group(1)): _balanced(text, m.end()) for m in _FINGERPRINT.finditer(text)}
    return {"ranks": list(prints), "fingerprints": prints}


def _rank_list(text: str) -> dict[str, Any]:
    found = re.search(r"Ranks? (\d+(?:, ?\d+)*) failed", text)
    return {"ranks": [int(r) for r in found.group(1).split(",")]} if found else {}


def _failed_seq(text: str) -> dict[str, Any]:
    found = _FAILED_SEQ.search(text)
    return {"failed_seq": int(found.group(1))} if found else {}


@dataclass(frozen=True)
class _Rule:
    """A kind of error line: the pattern that recognizes it, and any extra field extraction."""

    kind: str
    pattern: re.Pattern
    extra: Callable[[str], dict[str, Any]] | None = None


# Tried in order; the first match names the line. Timeout before progress and failed: torch
# repeats the timeout text inside "watchdog thread terminated with exception: ..." lines.
_RULES = (
    _Rule("nccl_watchdog_timeout", re.compile(r"Watchdog caught collective operation timeout")),
    _Rule("blocking_wait_timeout", re.compile(r"timed out in blocking wait")),
    _Rule("nccl_watchdog_progress", re.compile(
        r"last enqueued (?:NCCL )?work: (?P<last_enqueued>-?\d+), "
        r"last completed (?:NCCL )?work: (?P<last_completed>-?\d+)", re.IGNORECASE), _failed_seq),
    _Rule("watchdog_stuck", re.compile(r"watchdog got stuck for (?P<stuck_s>\d+) seconds"
                                       r"|Heartbeat monitor timed out")),
    _Rule("nccl_failed", re.compile(r"Some NCCL operations have failed or timed out")),
    _Rule("gloo_timeout", re.compile(r"Timed out waiting (?P<timeout_ms>\d+)ms for (?P<operation>\w+) operation")),
    # "Read error [addr]: Connection reset by peer" is the same event seen from the reading side.
    _Rule("gloo_peer_closed", re.compile(r"(?:Connection closed by peer|Read error) (?P<peer>\[[^\]]+\]:\d+)")),
    _Rule("size_mismatch", re.compile(
        r"op\.preamble\.length <= op\.nbytes\. (?P<received_bytes>\d+) vs (?P<expected_bytes>\d+)"
        r"|Received data size doesn't match expected size")),
    _Rule("collective_mismatch", re.compile(r"Detected mismatch between collectives on ranks"), _fingerprints),
    _Rule("monitored_barrier", re.compile(r"failed to pass monitoredBarrier in (?P<timeout_ms>\d+) ms"), _rank_list),
    # The process itself dying: libstdc++'s last words before abort(), and faulthandler's.
    _Rule("cpp_terminate", re.compile(r"terminate called (?:without an active exception"
                                      r"|after throwing an instance of '(?P<exception>[^']+)')")),
    _Rule("fatal_python_error", re.compile(r"Fatal Python error: (?P<error>\w[\w ]*)")),
)
PROCESS_DEATHS = ("cpp_terminate", "fatal_python_error")  # kinds of line printed only as the process dies


def _common_fields(text: str) -> dict[str, Any]:
    """Fields any error line may carry: the PG/rank prefix, WorkNCCL details, the source line."""
    fields: dict[str, Any] = {}
    if header := _PG_HEADER.search(text):
        fields.update({k: v for k, v in header.groupdict().items() if v is not None})
        fields["rank"] = int(header.group("rank"))
        if header.group("pg_id") is not None:
            fields["pg_id"] = int(header.group("pg_id"))
    if "WorkNCCL(" in text:
        for name, pattern in _WORK_FIELDS:
            if found := pattern.search(text):
                fields[name] = _int_or_text(found.group(1))
    if source := _SOURCE.search(text):
        fields["source"] = f"{source.group(1)}:{source.group(2)}"
    return fields


# glog's prefix on torch's C++ messages: "[E1123 05:26:37.351571345 ProcessGroupGloo.cpp:...]".
_GLOG_STAMP = re.compile(r"\[[IWEF](\d{4} \d\d:\d\d:\d\d(?:\.\d+)?)\s")


def local_to_unix(timestamp: str, utc_offset_s: float, year: int) -> float | None:
    """A log line's local time as Unix seconds: NCCL's "2025-03-04 10:22:31" or glog's "0304 10:22:31.5"
    (which has no year: ``year`` is the one the rank started in). None when it does not parse."""
    stamp = timestamp.strip().replace("T", " ").replace(",", ".")
    if re.fullmatch(r"\d{4} .*", stamp):
        stamp = f"{year}-{stamp[:2]}-{stamp[2:4]}{stamp[4:]}"
    day, _, fraction = stamp.partition(".")
    try:
        local = datetime.fromisoformat(day).replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None
    return local - utc_offset_s + (float(f"0.{fraction}") if fraction.isdigit() else 0.0)


def _event(rule: _Rule, match: re.Match, line_no: int, text: str, launcher_rank: int | None) -> LogEvent:
    fields = _common_fields(text)
    fields.update({k: _int_or_text(v) for k, v in match.groupdict().items() if v is not None})
    if rule.extra is not None:
        fields.update(rule.extra(text))
    if launcher_rank is not None:
        fields.setdefault("rank", launcher_rank)
    stamp = _GLOG_STAMP.search(text)
    return LogEvent(rule.kind, line_no, text, fields, stamp.group(1) if stamp else None)


def parse_errors(lines: Iterable[str]) -> list[LogEvent]:
    """Find watchdog, gloo and c10d error lines in stderr text, one LogEvent per line, in order.

    Field names: seq, op_type, numel_in, numel_out, timeout_ms, ran_for_ms, pg_id, pg_guid,
    pg_desc, rank, last_enqueued, last_completed, failed_seq, stuck_s, operation, peer,
    received_bytes, expected_bytes, ranks, fingerprints ({rank: text}), source; each only when
    the line has it. torch often prints one message twice (log line, then exception): both count.
    """
    events = []
    for line_no, text, launcher_rank in _stripped_lines(lines):
        for rule in _RULES:
            if match := rule.pattern.search(text):
                events.append(_event(rule, match, line_no, text, launcher_rank))
                break
    return events


@dataclass
class LowestEnqueued:
    """In one process group, the ranks whose last enqueued work is behind the others'."""

    pg_id: int | None  # None when torch printed no PG in the prefix
    ranks: list[int]
    last_enqueued: int  # theirs
    others_enqueued: int  # the highest any rank reached


def lowest_enqueued(events: dict[int, list[LogEvent]]) -> list[LowestEnqueued]:
    """Per PG, the ranks whose last enqueued work is lowest: they never issued what others wait in.

    Uses each rank's latest progress line per PG; a PG where every rank reached the same work, or
    that no progress line mentions, gives nothing. A rank that printed no progress line is not judged.
    """
    enqueued: dict[int | None, dict[int, int]] = {}
    for rank, rank_events in events.items():
        for event in rank_events:
            if event.kind == "nccl_watchdog_progress":
                enqueued.setdefault(event.fields.get("pg_id"), {})[rank] = event.fields["last_enqueued"]
    result = []
    for pg_id, by_rank in sorted(enqueued.items(), key=lambda item: (item[0] is None, item[0] or 0)):
        low, high = min(by_rank.values()), max(by_rank.values())
        if low < high:
            result.append(LowestEnqueued(pg_id, sorted(r for r, n in by_rank.items() if n == low), low, high))
    return result
