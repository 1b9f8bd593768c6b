"""The NCCL_DEBUG=INFO output a rank leaves behind: communicators, rings, trees, transports, COLL lines.

Formats are those of the logs in tests/fixtures/logs/ and tests/fixtures/public/. The parser is tolerant: a
line it does not recognize is counted or ignored, never an error, because a log cut off by a killed rank or
interleaved with a trainer's own prints is the normal case, not the exception.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from diagtrain.profiler.analyzer.read.log_lines import stripped_lines

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
    for line_no, text, _rank in stripped_lines(lines):
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
