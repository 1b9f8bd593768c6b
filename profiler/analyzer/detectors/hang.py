"""hang, crash and collective_mismatch: why a job stopped making progress, in one sentence.

The flight-recorder dumps say, per process group, the last collective each rank entered: the
earliest collective that some members entered and others never did is what everything waits on,
and the ranks that never entered it are the cause. Their stacks say where they are instead. A
rank that died (exit record with its exception) is the cause of the others' wait. Ranks that all
agree in the flight recorder but one of them is in user code while the rest are inside torch
point at that rank (a pipeline stage that never sends, code stuck before a collective).
"""

from __future__ import annotations

from datetime import datetime, timezone

from diagtrain.profiler.analyzer import flight_records as fr
from diagtrain.profiler.analyzer.findings import Finding
from diagtrain.profiler.analyzer.tables import Tables
from diagtrain.profiler.manifest import STOPPED

# Frames inside these paths are torch waiting on other ranks (collectives, p2p, DDP's backward).
TORCH_COMM_PATHS = ("torch/distributed/", "torch/autograd/", "torch/nn/parallel/")
LIBRARY_MARKERS = ("site-packages/", "dist-packages/", "/lib/python3", "<frozen")


def detect(tables: Tables) -> list[Finding]:
    if not tables.dumps and tables.manifest.get("status") not in STOPPED:
        return []
    entries = tables.flight_records
    findings = [_mismatch(m) for m in fr.mismatches(entries)]
    status = tables.manifest.get("status")
    if status not in STOPPED:
        return findings
    findings += _mismatch_in_logs(tables)
    blocked = blocked_in_order(tables, entries)
    crashed = {r: e for r, e in tables.exits.items() if e and e.get("reason") == "exception"}
    if status == "failed":
        # A rank with no exit record died abruptly (a C++ abort, a signal): usually the first to go.
        crashed.update({r: _abrupt_exit(tables, r) for r in tables.rank_hosts if r not in tables.exits})
    if crashed:
        findings.append(_crash(tables, crashed, blocked))
    elif blocked:
        findings.append(_hang_in_collective(tables, blocked[0]))
    elif status == "hung":
        finding = _hang_in_user_code(tables)
        if finding:
            findings.append(finding)
    return findings


def blocked_in_order(tables: Tables, entries: list[fr.Entry]) -> list[fr.Blocked]:
    """Collectives some members entered and others never did, the one everything waits on first."""
    blocked = fr.blocked(entries, fr.members({}, entries), set(tables.dumps))
    return sorted(blocked, key=lambda b: (_step_entered(tables, b), b.since_ns))


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


def _hang_in_collective(tables: Tables, b: fr.Blocked) -> Finding:
    where = "; ".join(f"rank {r} is in {_where(tables, r)}" for r in b.missing)
    group = b.pg_desc or b.pg.split(":")[0]
    return Finding(
        kind="hang", severity="critical", ranks=b.missing,
        explanation=(f"rank{'s' if len(b.missing) > 1 else ''} {_list(b.missing)} never entered {_op(b.op)} #{b.seq} "
                     f"on the {group} group; rank{'s' if len(b.waiting) > 1 else ''} {_list(b.waiting)} "
                     f"{'have' if len(b.waiting) > 1 else 'has'} waited in it since {_clock(b.since_ns)}; {where}."),
        suggestion=("Find why that rank skipped or has not reached this collective: a condition that differs "
                    "between ranks (a collective inside an `if`), an exception caught and ignored, or code that "
                    "blocks before it. Every rank must issue the same collectives in the same order."),
        metrics={"group": group, "seq": b.seq, "op": b.op, "waiting": b.waiting, "missing": b.missing},
        evidence=_evidence(tables, b),
    )


def _crash(tables: Tables, crashed: dict[int, dict], blocked: list[fr.Blocked]) -> Finding:
    # The first to die is the cause; the others' errors ("connection closed by peer") follow from it.
    rank = min(crashed, key=lambda r: (crashed[r].get("time") or float("inf"), r))
    exit_record = crashed[rank]
    waiting = next((b for b in blocked if rank in b.missing), blocked[0] if blocked else None)
    tail = ""
    if waiting:
        group = waiting.pg_desc or waiting.pg.split(":")[0]
        others = [r for r in waiting.waiting if r != rank]
        if others:
            tail = (f"; rank{'s' if len(others) > 1 else ''} {_list(others)} "
                    f"{'were' if len(others) > 1 else 'was'} waiting in {_op(waiting.op)} "
                    f"#{waiting.seq} on the {group} group, which it never entered")
    return Finding(
        kind="crash", severity="critical", ranks=[rank],
        explanation=f"rank {rank} crashed with {exit_record.get('exception')} at {exit_record.get('where')}{tail}.",
        suggestion=f"Fix the error on rank {rank} (ranks/{rank}/stderr.log has the traceback); the other ranks "
                   "stopped because it did.",
        metrics={"exit_code": exit_record.get("code"), "waiting_in": waiting.op if waiting else None},
        evidence=[{"type": "exit", "rank": r, **{k: e.get(k) for k in ("code", "exception", "where")}}
                  for r, e in sorted(crashed.items())] + (_evidence(tables, waiting) if waiting else []),
    )


def _abrupt_exit(tables: Tables, rank: int) -> dict:
    events = tables.log_events.get(rank) or []
    cause = events[0].text if events else "a signal (no exit record, no Python exception)"
    return {"reason": "killed", "exception": cause, "where": _where(tables, rank), "time": float("-inf")}


def _mismatch_in_logs(tables: Tables) -> list[Finding]:
    found = []
    for rank, events in sorted(tables.log_events.items()):
        for e in events:
            if e.kind in ("size_mismatch", "collective_mismatch"):
                found.append(Finding(
                    kind="collective_mismatch", severity="critical", ranks=[rank],
                    explanation=f"rank {rank} received a collective that does not match its own: {e.text[:300]}",
                    suggestion="The ranks issued different collectives or sizes at the same point: make every rank "
                               "run the same sequence; TORCH_DISTRIBUTED_DEBUG=DETAIL names both sides.",
                    metrics={"log_kind": e.kind, **{k: v for k, v in e.fields.items() if isinstance(v, (int, str))}},
                    evidence=[{"type": "log", "rank": rank, "file": "stderr.log", "line": e.line_no}],
                ))
                break
    return found


def _hang_in_user_code(tables: Tables) -> Finding | None:
    in_torch = {r for r in tables.stacks if _waiting_in_torch(tables, r)}
    outside = sorted(set(tables.stacks) - in_torch)
    if not outside or not in_torch:
        return None
    waits = "; ".join(f"rank {r} waits in {_innermost(tables, r)}" for r in sorted(in_torch)[:4])
    return Finding(
        kind="hang", severity="critical", ranks=outside,
        explanation=(f"rank{'s' if len(outside) > 1 else ''} {_list(outside)} "
                     f"{'are' if len(outside) > 1 else 'is'} outside any collective, in "
                     f"{'; '.join(_where(tables, r) for r in outside)}, while the others wait for it: {waits}."),
        suggestion="That code never reaches its next collective or send: look for a loop, a lock or I/O that does "
                   "not return on that rank.",
        metrics={"outside": outside, "waiting": sorted(in_torch)},
        evidence=[{"type": "stack", "rank": r, "where": _where(tables, r)} for r in sorted(tables.stacks)],
    )


def _mismatch(m: fr.Mismatch) -> Finding:
    versions = "; ".join(f"rank {r}: {v}" for r, v in sorted(m.versions.items())[:8])
    return Finding(
        kind="collective_mismatch", severity="critical", ranks=sorted(m.versions),
        explanation=f"ranks disagree on collective #{m.seq} of the {m.pg_desc or m.pg} group: {versions}.",
        suggestion="The ranks issued different collectives (or shapes) at the same point: make every rank run "
                   "the same sequence; TORCH_DISTRIBUTED_DEBUG=DETAIL checks this at each call.",
        metrics={"group": m.pg, "seq": m.seq},
        evidence=[{"type": "flight_recorder", "rank": r, "collective": v} for r, v in sorted(m.versions.items())],
    )


def _main_frames(tables: Tables, rank: int) -> list[dict]:
    threads = (tables.stacks.get(rank) or {}).get("threads") or []
    main = next((t for t in threads if t.get("main")), None)
    return main["frames"] if main else []


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
    for rank, last in b.missing_last.items():
        evidence.append({"type": "flight_recorder", "rank": rank,
                         "last_entered": None if last is None else f"{last.op} #{last.seq}"})
    for rank in b.missing:
        evidence.append({"type": "stack", "rank": rank, "where": _where(tables, rank),
                         "innermost": _innermost(tables, rank)})
    for rank, events in sorted(tables.log_events.items()):
        evidence += [{"type": "log", "rank": rank, "line": e.line_no, "text": e.text[:300]} for e in events[:2]]
    return evidence[:20]


def _op(profiling_name: str) -> str:
    return profiling_name.split(":", 1)[-1]


def _list(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def _clock(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%H:%M:%S UTC")
