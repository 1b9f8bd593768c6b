"""The error lines in a rank's stderr: ProcessGroupNCCL's watchdog, gloo, c10d, and a process's last words.

Formats are those of the logs in tests/fixtures/logs/ and tests/fixtures/public/. The parser is tolerant: a
line it does not recognize is counted or ignored, never an error, because a log cut off by a killed rank or
interleaved with a trainer's own prints is the normal case, not the exception.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from diagtrain.profiler.analyzer.read.log_lines import int_or_text, stripped_lines

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
                fields[name] = int_or_text(found.group(1))
    if source := _SOURCE.search(text):
        fields["source"] = f"{source.group(1)}:{source.group(2)}"
    return fields


# glog's prefix on torch's C++ messages: "[E1123 05:26:37.351571345 ProcessGroupGloo.cpp:...]".
_GLOG_STAMP = re.compile(r"\[[IWEF](\d{4} \d\d:\d\d:\d\d(?:\.\d+)?)\s")


def _event(rule: _Rule, match: re.Match, line_no: int, text: str, launcher_rank: int | None) -> LogEvent:
    fields = _common_fields(text)
    fields.update({k: int_or_text(v) for k, v in match.groupdict().items() if v is not None})
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
    for line_no, text, launcher_rank in stripped_lines(lines):
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
