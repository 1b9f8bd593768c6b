"""How a run stopped: every host's and rank's end, on one clock, and which came first.

A job spread over hosts stops as a cascade: one host is interrupted, killed or lost, one rank
raises or is killed, and its peers then fail with connection errors ("Connection reset by peer",
"Connection closed by peer") because it went away. The records say each part of it: the host
records (a wrapper interrupted by a signal, a wrapper gone: ``abandoned``, a wrapper that failed),
the exit records (an exception, a signal, a non-zero ``sys.exit``) and ranks that left none. With
every time on the reference clock (clocks.py), the first stop that is not a lost connection is the
cause; the connection errors after it are what followed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from diagtrain.profiler.analyzer.read import flight_records as fr
from diagtrain.profiler.analyzer.read.stderr_errors import PROCESS_DEATHS
from diagtrain.profiler.analyzer.run.divergence import missed
from diagtrain.profiler.analyzer.run.tables import Tables

# Errors a rank raises because a peer went away, not because of a fault of its own; the most telling
# phrase first (gloo's "Read error [addr]: Connection reset by peer" is named by its second half).
CONNECTION_ERRORS = tuple(re.compile(p, re.IGNORECASE) for p in (
    r"Connection (?:reset|closed|refused)(?: by peer)?", r"Broken pipe", r"Socket Timeout", r"DistNetworkError",
    r"NCCL communicator was aborted", r"remote (?:worker|process) (?:crash|exit)\w*", r"Read error",
    r"failed to recv", r"Connection was likely closed", r"The connection to the C10d store has failed"))


def connection_error(text: str) -> str | None:
    """The phrase that makes ``text`` a lost connection, or None."""
    return next((m.group(0) for p in CONNECTION_ERRORS if (m := p.search(text))), None)


# A connection error recorded this long before another stop is still taken as its consequence:
# a killed process's own records come after its sockets closed (exit dumps, the wrapper's poll).
CONSEQUENCE_SLACK_S = 1.0

# Kinds of stop, by what they say about the cause.
HOST_INTERRUPTED = "host_interrupted"  # a wrapper got SIGINT, SIGTERM or SIGHUP and stopped its job
HOST_LOST = "host_lost"  # a wrapper vanished (SIGKILL, the machine went down)
WRAPPER_FAILED = "wrapper_failed"  # diagtrain's wrapper itself failed and stopped its job
SIGNALLED = "signalled"  # a rank ended on SIGINT or SIGTERM (its own record)
KILLED = "killed"  # a rank ended with no record at all (SIGKILL, a C++ abort)
EXCEPTION = "exception"  # a rank raised, or called sys.exit with a failure code
EXIT_CRASH = "exit_crash"  # a rank's script ended well, then its process died while Python shut down
LEFT = "left"  # a rank's script ended well (code 0) while its peers still waited for it in a collective
CONNECTION = "connection"  # a rank raised because a peer went away
BY_SIGNAL = (HOST_INTERRUPTED, SIGNALLED)


@dataclass
class Stop:
    """One host's or rank's end."""

    kind: str
    time: float | None  # Unix seconds on the reference clock; None when nothing says when
    ranks: list[int]
    host: str | None = None
    detail: str = ""  # the signal, the exception
    where: str | None = None  # the rank's innermost line of its own code
    code: int | None = None
    evidence: list[dict] = field(default_factory=list)

    @property
    def sort_time(self) -> float:
        return -math.inf if self.time is None else self.time


def collect(tables: Tables) -> list[Stop]:
    """Every stop the records show, earliest first."""
    found: list[Stop] = []
    lost_ranks: set[int] = set()
    for host in tables.hosts:
        name = host.get("name")
        ranks = sorted(r for r, h in tables.rank_hosts.items() if h == name)
        if host.get("status") == "abandoned":
            silent = [r for r in ranks if not tables.exits.get(r)]
            lost_ranks.update(silent)
            found.append(Stop(HOST_LOST, host.get("last_seen"), silent or ranks, name,
                              "its wrapper is gone without ending its record",
                              evidence=[{"type": "host", "host": name, "last_seen": host.get("last_seen")}]))
        elif isinstance(host.get("interrupted"), dict):
            signal = host["interrupted"]
            found.append(Stop(HOST_INTERRUPTED, signal.get("time"), ranks, name, str(signal.get("signal")),
                              evidence=[{"type": "host", "host": name, "interrupted": signal}]))
        elif host.get("wrapper_error"):
            found.append(Stop(WRAPPER_FAILED, host.get("ended_at"), ranks, name, str(host["wrapper_error"]),
                              evidence=[{"type": "host", "host": name, "wrapper_error": host["wrapper_error"]}]))
    for rank, record in sorted(tables.exits.items()):
        if record:
            stop = _rank_stop(tables, rank, record)
            if stop is not None:
                found.append(stop)
    if tables.manifest.get("status") in ("failed", "hung"):
        found += _left_early(tables, found)
    if tables.manifest.get("status") == "failed":
        found += _exit_crashes(tables)
        # A rank with no exit record died abruptly (a C++ abort, SIGKILL): its last step is when it was last seen.
        for rank in sorted(set(tables.rank_hosts) - set(tables.exits) - lost_ranks):
            found.append(Stop(KILLED, _last_seen(tables, rank), [rank], tables.rank_hosts.get(rank),
                              _abrupt_cause(tables, rank), evidence=[{"type": "exit", "rank": rank, "record": None}]))
    return sorted(found, key=lambda s: (s.sort_time, s.ranks))


def first_cause(stops: list[Stop], hung: bool = False) -> Stop | None:
    """The stop that started the cascade: the earliest that is not a lost connection, unless a lost
    connection came well before anything else. In a run the watchdog stopped (``hung``), the
    signals were its own and cause nothing."""
    if hung:
        stops = [s for s in stops if s.kind != SIGNALLED]
    causes = [s for s in stops if s.kind != CONNECTION]
    lost = [s for s in stops if s.kind == CONNECTION]
    if not causes:
        return lost[0] if lost else None
    first = causes[0]
    if lost and lost[0].sort_time < first.sort_time - CONSEQUENCE_SLACK_S:
        return lost[0]
    return first


def consequences(stops: list[Stop], cause: Stop) -> list[Stop]:
    """The stops after the cause on other ranks that failed (errors, connections lost, killed)."""
    return [s for s in stops if s is not cause and s.kind in (CONNECTION, EXCEPTION, KILLED)
            and not set(s.ranks) & set(cause.ranks)]


def _rank_stop(tables: Tables, rank: int, record: dict) -> Stop | None:
    reason, text = record.get("reason"), str(record.get("exception") or "")
    common = {"time": record.get("time"), "ranks": [rank], "host": tables.rank_hosts.get(rank),
              "where": record.get("where"), "code": record.get("code"),
              "evidence": [{"type": "exit", "rank": rank, **{k: record.get(k) for k in ("code", "reason", "exception", "where")}}]}
    if reason == "exception":
        return Stop(CONNECTION if connection_error(text) else EXCEPTION, detail=text, **common)
    if reason in ("terminated", "interrupted"):
        return Stop(SIGNALLED, detail="SIGTERM" if reason == "terminated" else "SIGINT", **common)
    if reason == "sys.exit" and record.get("code") not in (0, None):
        return Stop(EXCEPTION, detail=f"sys.exit({record.get('code')})", **common)
    return None


def _left_early(tables: Tables, stops: list[Stop]) -> list[Stop]:
    """Ranks whose script ended with code 0 before a peer that was no further along failed with a lost connection,
    or, in a hung run, while a peer was still running: a rank that skipped a batch, left its loop early or issued
    one collective fewer ends its script first, and leaves its peers waiting in a collective it never issues.
    (A rank that died on its way out is an exit crash, not this.)"""
    ended = {r: e for r, e in tables.exits.items() if e and e.get("code") == 0 and isinstance(e.get("time"), (int, float))
             and not any(d.kind in PROCESS_DEATHS for d in tables.log_events.get(r, []))}
    hung = tables.manifest.get("status") == "hung"
    progress = fr.progress(tables.dumps, tables.flight_records) if hung and ended else {}  # once, not once a rank
    left = []
    for rank, record in sorted(ended.items()):
        mine = _last_step(tables, rank)
        waited = [s for s in stops if rank not in s.ranks and s.kind == CONNECTION and s.time is not None
                  and s.time >= record["time"] - CONSEQUENCE_SLACK_S]
        # In a hung run, the peers the flight recorder shows in a collective it never issued (not stuck elsewhere).
        still = [r for m in missed(tables, rank, [r for r in tables.rank_hosts if r != rank and r not in ended],
                                   progress) for r in m.entered_by] if hung else []
        behind = [r for s in waited for r in s.ranks] + still
        if behind and all(mine <= _last_step(tables, r) for r in behind):
            left.append(Stop(LEFT, record["time"], [rank], tables.rank_hosts.get(rank),
                             f"its script ended (exit code 0) after step {mine}", code=0,
                             evidence=[{"type": "exit", "rank": rank, "code": 0, "reason": record.get("reason"),
                                        "last_step": mine}]))
    return left


def _last_step(tables: Tables, rank: int) -> int:
    steps = tables.steps
    mine = steps.loc[steps["rank"] == rank, "step"] if not steps.empty else []
    return int(max(mine)) if len(mine) else 0


def _exit_crashes(tables: Tables) -> list[Stop]:
    """Ranks whose script ended with code 0 and whose process then died: the exit record is written
    at exit, before the interpreter's teardown, so only the stderr lines after it say so. When none
    says more, and no other rank failed on its own (every other one was stopped by the launcher's
    SIGTERM, and none vanished), the failure is still in the teardown of the ranks that ended well."""
    ended_well = {r: e for r, e in tables.exits.items() if e and e.get("code") == 0}
    others = [e for r, e in tables.exits.items() if r not in ended_well]
    only_stopped = (all(e and e.get("reason") == "terminated" for e in others)
                    and set(tables.exits) >= set(tables.rank_hosts))
    found = []
    for rank, record in sorted(ended_well.items()):
        deaths = [e for e in tables.log_events.get(rank, []) if e.kind in PROCESS_DEATHS]
        if deaths:
            found.append(Stop(EXIT_CRASH, record.get("time"), [rank], tables.rank_hosts.get(rank),
                              "; ".join(dict.fromkeys(e.text.strip() for e in deaths[:3])), code=0,
                              evidence=[{"type": "exit", "rank": rank, "code": 0, "reason": record.get("reason")},
                                        *({"type": "log", "rank": rank, "file": "stderr.log", "line": e.line_no,
                                           "text": e.text[:300]} for e in deaths[:3])]))
    if not found and ended_well and only_stopped:
        times = [e["time"] for e in ended_well.values() if e.get("time") is not None]
        found.append(Stop(EXIT_CRASH, max(times, default=None), sorted(ended_well), detail="", code=0,
                          evidence=[{"type": "exit", "rank": r, "code": 0, "reason": e.get("reason")}
                                    for r, e in sorted(ended_well.items())][:12]))
    return found


def _last_seen(tables: Tables, rank: int) -> float | None:
    steps = tables.steps
    if steps.empty or "end" not in steps:
        return None
    ends = steps.loc[steps["rank"] == rank, "end"].dropna()
    return float(ends.max()) if len(ends) else None


def _abrupt_cause(tables: Tables, rank: int) -> str:
    events = tables.log_events.get(rank) or []
    return events[0].text if events else "a signal (no exit record, no Python exception)"
