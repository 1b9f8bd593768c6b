"""hang, crash, crash_at_exit, host_lost, interrupted and collective_mismatch: why a job stopped (in one sentence:
report/words/hang.py).

When something stopped first (stops.py, every host on one clock): a rank that died (its exception
and line, or the signal that killed it), a host lost or stopped by a signal, is the cause, and the
other ranks' connection errors after it are named as its consequences. A run interrupted while
making progress is only that, whatever its flight recorder shows.

When nothing did (a hang), the flight-recorder dumps say, per process group, the last collective
each rank entered: the earliest collective that some members entered and others never did is what
everything waits on, and the ranks that never entered it are the cause. Their stacks say where
they are instead. Ranks that all agree in the flight recorder but one of them is in user code
while the rest are inside torch point at that rank (a pipeline stage that never sends, code stuck
before a collective).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diagtrain.profiler.analyzer.read import flight_records as fr
from diagtrain.profiler.analyzer.run import divergence, stops
from diagtrain.profiler.analyzer.judge.findings import Candidate
from diagtrain.profiler.analyzer.run.tables import Tables
from diagtrain.profiler.util.settings import section, setting
from diagtrain.profiler.run_dir import STOPPED


@section("hang")
class Hang:
    """When a run stopped by a signal had been stuck (a hang) rather than interrupted mid-work."""

    # Whoever stops a job because it hangs has watched it do nothing for a while, and checkpoints or
    # evaluations rarely hold every rank's steps this long.
    stuck_before_stop_s: float = setting(60.0, "a run stopped after this long without any rank finishing a step "
                                         "was stuck, not stopped mid-work; shorter stops are interruptions")
    stuck_steps: int = setting(10, "... and the stall must be at least this many typical steps long")


# Frames inside these paths are torch waiting on other ranks (collectives, p2p, DDP's backward).
TORCH_COMM_PATHS = ("torch/distributed/", "torch/autograd/", "torch/nn/parallel/")
LIBRARY_MARKERS = ("site-packages/", "dist-packages/", "/lib/python3", "<frozen")
SETTINGS = (Hang,)


def detect(tables: Tables) -> list[Candidate]:
    """Mismatched collectives, and for a run that stopped, the one finding that says why."""
    s = Hang.active()
    if not tables.dumps and tables.manifest.get("status") not in STOPPED:
        return []
    entries = tables.flight_records
    findings = [_mismatch(m) for m in fr.mismatches(entries, fr.members({}, entries))]
    status = tables.manifest.get("status")
    if status not in STOPPED:
        # Dumps without a run record (a folder of NCCL's dumps): how the job ended is theirs to say.
        if status is None and (blocked := blocked_in_order(tables, entries)):
            findings += _hangs_in_collectives(tables, blocked)
        return findings
    findings += _mismatch_in_logs(tables)
    blocked = blocked_in_order(tables, entries)
    record = stops.collect(tables)
    cause = stops.first_cause(record, hung=status == "hung")
    stalled_s = _stalled_before(tables, cause, s) if cause is not None and cause.kind in stops.BY_SIGNAL else None
    if cause is None or (stalled_s is not None and stalled_s >= s.stuck_before_stop_s):
        # No rank died, or the run was stopped after a long time without a step: what held it?
        if blocked:
            findings += _hangs_in_collectives(tables, blocked, stalled_s)
        elif status == "hung" and (finding := _hang_in_user_code(tables)):
            findings.append(finding)
        elif cause is not None:
            findings.append(_interrupted(tables, cause, record, stalled_s))
    elif cause.kind in (stops.HOST_LOST, stops.WRAPPER_FAILED):
        findings.append(_host_lost(tables, cause, record))
    elif cause.kind == stops.EXIT_CRASH:
        findings.append(_exit_crash(tables, cause))
    elif cause.kind == stops.LEFT:
        findings.append(_left(tables, cause, record))
    elif cause.kind in stops.BY_SIGNAL:
        # Ranks stopped mid-step, some inside a collective their peers had not reached: not a hang.
        findings.append(_interrupted(tables, cause, record, stalled_s))
    else:
        findings.append(_crash(tables, cause, record, blocked))
    return findings


def _stalled_before(tables: Tables, cause: stops.Stop, s: Hang) -> float | None:
    """Seconds between the last step any rank finished and the stop, when that is ``stuck_steps`` steps long."""
    steps = tables.steps
    if cause.time is None or steps.empty or "end" not in steps or steps["end"].isna().all():
        return None
    step_s = float(steps["wall_ms"].median()) / 1e3 if "wall_ms" in steps else 0.0
    stalled = cause.time - float(steps["end"].max())
    return stalled if stalled > s.stuck_steps * step_s else None


def blocked_in_order(tables: Tables, entries: list[fr.Entry]) -> list[fr.Blocked]:
    """Collectives some members entered and others never did, the one everything waits on first."""
    unknown = {r for r, dump in tables.dumps.items() if fr.wrapped(dump)}
    blocked = fr.blocked(entries, fr.members({}, entries), set(tables.dumps), reached(tables), unknown)
    return sorted(blocked, key=lambda b: (_step_entered(tables, b), b.since_ns))


def reached(tables: Tables) -> dict[tuple[str, int], fr.Progress]:
    """How far each rank got on each group, by its flight recorder."""
    return fr.progress(tables.dumps, tables.flight_records)


def _step_entered(tables: Tables, b: fr.Blocked) -> float:
    """The step the waiting ranks were in when they entered ``b``.

    A rank that skipped a collective runs on into the next step and blocks there, possibly before
    its peer reaches the skipped one: the collective of the earlier step is the cause, whichever
    was entered first by the clock.
    """
    steps = tables.steps
    if steps.empty or "start" not in steps:
        return 0.0
    at = b.since_ns / 1e9
    found = []
    for rank in b.waiting:
        started = steps.loc[(steps["rank"] == rank) & (steps["start"] <= at), "step"]
        finished = steps.loc[(steps["rank"] == rank) & (steps["end"] <= at), "step"]
        # Inside a recorded step, or in the one after the last finished step (not recorded yet).
        found.append(float(started.max()) if len(started) and (finished.empty or started.max() > finished.max())
                     else float(finished.max()) + 1 if len(finished) else 0.0)
    return min(found, default=0.0)


@dataclass
class Origin:
    """A collective blocked because ranks that wait in no blocked collective never came: a fault of its own, with
    the blocked collectives that follow from it."""

    first: fr.Blocked
    roots: frozenset[int]  # its missing ranks that wait in no blocked collective: stopped elsewhere
    consequences: list[fr.Blocked] = field(default_factory=list)


def origins(blocked: list[fr.Blocked]) -> list[Origin]:
    """The independent origins of a hang, in the order blocked (everything-waits-on-first first). A rank missing
    from a collective because it waits in another blocked one is no origin; a collective whose missing ranks an
    earlier origin already names is a consequence, as is one whose missing ranks wait behind an origin. Where every
    missing rank waits somewhere (ranks waiting for each other: collectives issued in different orders), the first
    blocked collective is the one origin, as before."""
    waiting = {r for b in blocked for r in b.waiting}
    found: list[Origin] = []
    unexplained: list[fr.Blocked] = []
    for b in blocked:
        roots = frozenset(r for r in b.missing if r not in waiting)
        named = next((o for o in found if roots and roots <= o.roots), None)
        if named is not None:
            named.consequences.append(b)
        elif roots:
            found.append(Origin(b, roots))
        else:
            unexplained.append(b)
    if not found:
        return [Origin(blocked[0], frozenset(blocked[0].missing), blocked[1:])]
    for b in unexplained:  # ranks waiting behind an origin: under the origin they wait for
        _behind(b, blocked, found).consequences.append(b)
    for o in found:
        o.consequences.sort(key=blocked.index)
    return found


def _behind(b: fr.Blocked, blocked: list[fr.Blocked], found: list[Origin]) -> Origin:
    """The origin a blocked collective waits behind: followed through the collectives its missing ranks wait in."""
    seen, todo = set(), [b]
    while todo:
        at = todo.pop(0)
        for o in found:
            if o.first is at or at in o.consequences:
                return o
        seen.add(id(at))
        todo += [c for c in blocked if id(c) not in seen and set(c.waiting) & set(at.missing)]
    return found[0]


def _hangs_in_collectives(tables: Tables, blocked: list[fr.Blocked], stalled_s: float | None = None) -> list[Candidate]:
    """One finding per independent origin of the hang, each with the consequences that follow from it."""
    found = origins(blocked)
    others = [o.first for o in found]
    return [_hang_in_collective(tables, o.first, stalled_s, o.consequences,
                                [b for b in others if b is not o.first]) for o in found]


def _hang_in_collective(tables: Tables, b: fr.Blocked, stalled_s: float | None = None,
                        later: list[fr.Blocked] = (), besides: list[fr.Blocked] = ()) -> Candidate:
    group = b.pg_desc or b.pg.split(":")[0]
    return Candidate(
        kind="hang", ranks=b.missing,
        facts={"case": "collective", **_blocked(b), "waiting": b.waiting, "since_ns": b.since_ns,
               "where": [_where_in(tables, r, b) for r in b.missing], "stalled_s": stalled_s,
               **_wavefront(b, list(later)),
               # Faults of their own: ranks not waiting for this one, in groups it does not hold up.
               "besides": [{"missing": x.missing, **_blocked(x)} for x in besides],
               "stuck_on_device": _stuck_on_device(tables, b)},
        metrics={"group": group, "seq": b.seq, "op": b.op, "waiting": b.waiting, "missing": b.missing,
                 "later_blocked": [{"group": x.pg_desc or x.pg, "seq": x.seq, "op": x.op, "missing": x.missing}
                                   for x in later][:20],
                 "independent_origins": len(besides) + 1},
        evidence=_evidence(tables, b),
    )


def _blocked(b: fr.Blocked) -> dict[str, Any]:
    """A blocked collective as its words name it: its op, number and group."""
    return {"op": _op(b.op), "seq": b.seq, "pg_desc": b.pg_desc, "pg": b.pg}


def _stuck_on_device(tables: Tables, b: fr.Blocked) -> list[int]:
    """The missing ranks whose own enqueued collectives never completed: their device stopped."""
    progress = reached(tables)
    return [r for r in b.missing
            if (p := progress.get((b.pg, r))) and p.completed is not None and p.completed < p.entered]


def _wavefront(first: fr.Blocked, later: list[fr.Blocked]) -> dict[str, Any]:
    """The collectives blocked after the first, told apart: the same ranks missing again (the fault spreading
    to their other groups), and ranks missing because they wait in the first."""
    again = [x for x in later if set(x.missing) <= set(first.missing)]
    return {"again": [{"op": _op(x.op), "seq": x.seq, "group": x.pg_desc or x.pg.split(":")[0]} for x in again[:5]],
            "again_count": len(again),
            "waiting_elsewhere": sorted({r for x in later for r in x.missing if r in first.waiting})}


def _where_in(tables: Tables, rank: int, b: fr.Blocked) -> dict[str, Any]:
    """Where a missing rank is: its stack, else how far its flight recorder (or its process-group status) says it
    got on the group."""
    if rank in tables.stacks or rank in tables.exits:
        return {"rank": rank, "at": _where(tables, rank)}
    last = b.missing_last.get(rank)
    progress = reached(tables).get((b.pg, rank))
    completed = progress.completed if progress is not None else None
    if last is None and progress is not None and progress.entered:
        return {"rank": rank, "status_entered": progress.entered, "completed": completed}
    if last is None:
        return {"rank": rank}
    return {"rank": rank, "last_op": _op(last.op), "last_seq": last.seq,
            "completed": completed if completed is not None and completed < last.seq else None}


def _crash(tables: Tables, cause: stops.Stop, record: list[stops.Stop], blocked: list[fr.Blocked]) -> Candidate:
    # The first to die is the cause; the others' errors ("connection closed by peer") follow from it.
    rank = cause.ranks[0]
    waiting = next((b for b in blocked if rank in b.missing), blocked[0] if blocked else None)
    held = None
    if waiting and (others := [r for r in waiting.waiting if r != rank]):
        held = {"waiting": others, "op": _op(waiting.op), "seq": waiting.seq,
                "group": waiting.pg_desc or waiting.pg.split(":")[0]}
    return Candidate(
        kind="crash", ranks=[rank],
        facts={"host": _host(tables, rank), "cause": cause.kind, "detail": cause.detail,
               "at": _where(tables, rank) if cause.kind == stops.KILLED else cause.where or _where(tables, rank),
               "held": held, **_followed(tables, cause, record)},
        metrics={"exit_code": cause.code, "waiting_in": waiting.op if waiting else None, "cause": cause.kind},
        evidence=_stop_evidence(cause, record) + (_evidence(tables, waiting) if waiting else []),
        time_range=_instant(cause),
    )


def _left(tables: Tables, cause: stops.Stop, record: list[stops.Stop]) -> Candidate:
    """A rank whose script ended well while its peers waited for it: the origin, and they the consequence."""
    rank = cause.ranks[0]
    after = stops.consequences(record, cause)
    waiting = sorted({r for s in after for r in s.ranks}) or sorted(r for r in tables.rank_hosts if r != rank)
    parted = divergence.parting(tables, rank, waiting)
    missed = parted.missed[0] if parted.missed else None
    return Candidate(
        kind="sequence_divergence", ranks=[rank], steps=[parted.step] if parted.step else [],
        facts={"host": _host(tables, rank), "detail": cause.detail, "time": cause.time,
               "parted": {"how": parted.how, "step": parted.step, "mine": parted.mine or 0, "peers": parted.peers or 0,
                          "last": parted.last_step, "peers_last": parted.peers_last_step},
               "missed": {"entered_by": missed.entered_by, "op": missed.op, "seq": missed.seq, "group": missed.group,
                          "last_of_leaver": missed.last_of_leaver} if missed else None,
               **_followed(tables, cause, record)},
        metrics={"exit_code": 0, "cause": cause.kind, "parted": parted.how, "parted_step": parted.step,
                 "mine": parted.mine, "peers": parted.peers, "last_step": parted.last_step,
                 "peers_last_step": parted.peers_last_step, "waiting": waiting,
                 "missed": [{"group": m.group, "seq": m.seq, "op": m.op, "entered_by": m.entered_by} for m in parted.missed]},
        evidence=_stop_evidence(cause, record), time_range=_instant(cause),
    )


def _exit_crash(tables: Tables, cause: stops.Stop) -> Candidate:
    """The training finished; a process died after its script ended, and the launcher called the job failed."""
    steps = tables.steps.loc[tables.steps["rank"].isin(cause.ranks), "step"] if not tables.steps.empty else []
    return Candidate(
        kind="crash_at_exit", ranks=cause.ranks,
        facts={"hosts": _hosts(tables, cause.ranks), "last_step": int(max(steps)) if len(steps) else None,
               "detail": cause.detail, "exit_code": tables.manifest.get("exit_code")},
        metrics={"exit_code": tables.manifest.get("exit_code"), "cause": cause.kind},
        evidence=cause.evidence[:12], time_range=_instant(cause),
    )


def _host_lost(tables: Tables, cause: stops.Stop, record: list[stops.Stop]) -> Candidate:
    """A host lost (its wrapper gone without ending its record), or diagtrain's wrapper there failed."""
    return Candidate(
        kind="host_lost", ranks=cause.ranks,
        facts={"case": "lost" if cause.kind == stops.HOST_LOST else "wrapper_failed", "host": cause.host,
               "detail": cause.detail, "time": cause.time, **_followed(tables, cause, record)},
        metrics={"host": cause.host, "last_seen": cause.time, "cause": cause.kind},
        evidence=_stop_evidence(cause, record), time_range=_instant(cause),
    )


def _interrupted(tables: Tables, cause: stops.Stop, record: list[stops.Stop], stalled_s: float | None) -> Candidate:
    """A run stopped by a signal: the cause when it made ranks elsewhere fail, else only a fact."""
    ran_ranks = set(tables.rank_hosts.values())
    interrupted = {s.host for s in record if s.kind == stops.HOST_INTERRUPTED}
    whole_run = not stops.consequences(record, cause) or ran_ranks <= interrupted
    by_host = cause.kind == stops.HOST_INTERRUPTED
    facts = {"whole_run": whole_run, "by_host": by_host, "host": cause.host, "stopped_ranks": cause.ranks,
             "rank_host": None if by_host else _host(tables, cause.ranks[0]), "signal": cause.detail,
             "time": cause.time, "stalled_s": stalled_s}
    if whole_run:
        return Candidate(
            kind="interrupted", ranks=sorted(tables.rank_hosts) or cause.ranks, facts=facts,
            metrics={"signal": cause.detail, "stalled_s": stalled_s, "cause": cause.kind},
            evidence=cause.evidence[:12], time_range=_instant(cause),
        )
    return Candidate(
        kind="interrupted", ranks=cause.ranks, facts={**facts, **_followed(tables, cause, record)},
        metrics={"signal": cause.detail, "host": cause.host, "cause": cause.kind},
        evidence=_stop_evidence(cause, record), time_range=_instant(cause),
    )


def _followed(tables: Tables, cause: stops.Stop, record: list[stops.Stop]) -> dict[str, Any]:
    """The ranks that failed after the cause: those whose connection errors say they lost their peers (the first
    error, and their hosts), and the others."""
    after = stops.consequences(record, cause)
    lost = sorted({r for s in after if s.kind == stops.CONNECTION for r in s.ranks})
    other = sorted({r for s in after if s.kind != stops.CONNECTION for r in s.ranks} - set(lost))
    error = next((s.detail for s in after if s.kind == stops.CONNECTION), None)
    return {"followed": {"lost": lost, "lost_hosts": _hosts(tables, lost),
                         "error": stops.connection_error(error) if lost else None, "other": other}}


def _stop_evidence(cause: stops.Stop, record: list[stops.Stop]) -> list[dict]:
    return [e for s in [cause, *stops.consequences(record, cause)] for e in s.evidence][:12]


def _instant(stop: stops.Stop) -> tuple[float, float] | None:
    return (stop.time, stop.time) if stop.time is not None else None


def _host(tables: Tables, rank: int) -> str | None:
    """The rank's host, where the job ran on several (else None: one host need not be named)."""
    host = tables.rank_hosts.get(rank)
    return host if host and len(set(tables.rank_hosts.values())) > 1 else None


def _hosts(tables: Tables, ranks: list[int]) -> list[str]:
    """The ranks' hosts, where the job ran on several (else none)."""
    hosts = sorted({h for r in ranks if (h := tables.rank_hosts.get(r))})
    return hosts if hosts and len(set(tables.rank_hosts.values())) > 1 else []


def _mismatch_in_logs(tables: Tables) -> list[Candidate]:
    found = []
    for rank, events in sorted(tables.log_events.items()):
        for e in events:
            if e.kind in ("size_mismatch", "collective_mismatch"):
                found.append(Candidate(
                    kind="collective_mismatch", ranks=[rank], facts={"case": "log", "text": e.text[:300]},
                    metrics={"log_kind": e.kind, **{k: v for k, v in e.fields.items() if isinstance(v, (int, str))}},
                    evidence=[{"type": "log", "rank": rank, "file": "stderr.log", "line": e.line_no}],
                ))
                break
    return found


def _hang_in_user_code(tables: Tables) -> Candidate | None:
    in_torch = {r for r in tables.stacks if _waiting_in_torch(tables, r)}
    outside = sorted(set(tables.stacks) - in_torch)
    if not outside or not in_torch:
        return None
    return Candidate(
        kind="hang", ranks=outside,
        facts={"case": "user_code", "where": [_where(tables, r) for r in outside],
               "waits": [{"rank": r, "in": _innermost(tables, r)} for r in sorted(in_torch)[:4]]},
        metrics={"outside": outside, "waiting": sorted(in_torch)},
        evidence=[{"type": "stack", "rank": r, "where": _where(tables, r)} for r in sorted(tables.stacks)],
    )


def _mismatch(m: fr.Mismatch) -> Candidate:
    return Candidate(
        kind="collective_mismatch", ranks=sorted(m.versions),
        facts={"case": "flight_recorder", "seq": m.seq, "group": m.pg_desc or m.pg,
               "versions": [[r, v] for r, v in sorted(m.versions.items())[:8]]},
        metrics={"group": m.pg, "seq": m.seq},
        evidence=[{"type": "flight_recorder", "rank": r, "collective": v} for r, v in sorted(m.versions.items())],
    )


def _main_frames(tables: Tables, rank: int) -> list[dict]:
    threads = (tables.stacks.get(rank) or {}).get("threads") or []
    main = next((t for t in threads if t.get("main")), None)
    # Frames of diagtrain's own wrappers (always-on counters, step hooks) are seen through.
    return [f for f in main["frames"] if not f.get("diagtrain")] if main else []


def _where(tables: Tables, rank: int) -> str:
    """The innermost frame of the rank's own code (not a library), else what its exit record says."""
    frames = _main_frames(tables, rank)
    own = [f for f in frames if not any(m in f["file"] for m in LIBRARY_MARKERS)]
    if own:
        f = own[-1]
        return f"{f['file']}:{f['line']} ({f['function']})"
    exit_record = tables.exits.get(rank) or {}
    return exit_record.get("where") or "an unknown place (no stack dump)"


def _innermost(tables: Tables, rank: int) -> str:
    frames = _main_frames(tables, rank)
    if not frames:
        return "?"
    f = frames[-1]
    return f"{f['file'].split('site-packages/')[-1]}:{f['line']} ({f['function']})"


def _waiting_in_torch(tables: Tables, rank: int) -> bool:
    frames = _main_frames(tables, rank)[-6:]
    return any(any(p in f["file"] for p in TORCH_COMM_PATHS) for f in frames)


def _evidence(tables: Tables, b: fr.Blocked) -> list[dict]:
    evidence = [{"type": "flight_recorder", "group": b.pg, "seq": b.seq, "op": b.op, "entered_by": b.waiting}]
    progress = reached(tables)
    for rank, last in b.missing_last.items():
        done = progress.get((b.pg, rank))
        evidence.append({"type": "flight_recorder", "rank": rank,
                         "last_entered": None if last is None else f"{last.op} #{last.seq}",
                         "last_completed": done.completed if done else None})
    for rank in b.missing:
        if rank in tables.stacks or rank in tables.exits:
            evidence.append({"type": "stack", "rank": rank, "where": _where(tables, rank),
                             "innermost": _innermost(tables, rank)})
    for rank, events in sorted(tables.log_events.items()):
        evidence += [{"type": "log", "rank": rank, "line": e.line_no, "text": e.text[:300]} for e in events[:2]]
    return evidence[:20]


def _op(profiling_name: str) -> str:
    return profiling_name.split(":", 1)[-1]
