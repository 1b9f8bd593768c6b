"""hang, crash, crash_at_exit, host_lost, interrupted and collective_mismatch: why a job stopped, in one sentence.

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
from datetime import datetime, timezone

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
    where = "; ".join(f"rank {r} {_where_in(tables, r, b)}" for r in b.missing)
    group = b.pg_desc or b.pg.split(":")[0]
    stopped = f" The run was interrupted after {stalled_s:.0f} s without a finished step." if stalled_s else ""
    stopped += _wavefront(b, list(later))
    if besides:  # faults of their own: ranks not waiting for this one, in groups it does not hold up
        stopped += (" Independently, " + "; ".join(f"rank{'s' if len(x.missing) > 1 else ''} {_list(x.missing)} never "
                                                    f"entered {_op(x.op)} #{x.seq} on {_group(x)}" for x in besides)
                    + " (a finding of its own): more than one rank stopped.")
    return Candidate(
        kind="hang", severity="critical", ranks=b.missing,
        explanation=(f"rank{'s' if len(b.missing) > 1 else ''} {_list(b.missing)} never entered {_op(b.op)} #{b.seq} "
                     f"on {_group(b)}; rank{'s' if len(b.waiting) > 1 else ''} {_list(b.waiting)} "
                     f"{'have' if len(b.waiting) > 1 else 'has'} waited in it since {_clock(b.since_ns)}; {where}."
                     f"{stopped}"),
        suggestion=_stuck_on_device(tables, b) or (
            "Find why that rank skipped or has not reached this collective: a condition that differs "
            "between ranks (a collective inside an `if`), an exception caught and ignored, or code that "
            "blocks before it. Every rank must issue the same collectives in the same order."),
        metrics={"group": group, "seq": b.seq, "op": b.op, "waiting": b.waiting, "missing": b.missing,
                 "later_blocked": [{"group": x.pg_desc or x.pg, "seq": x.seq, "op": x.op, "missing": x.missing}
                                   for x in later][:20],
                 "independent_origins": len(besides) + 1},
        evidence=_evidence(tables, b),
    )


def _group(b: fr.Blocked) -> str:
    """The group in words: its description, else its members (a group made without one: torch says "undefined")."""
    if b.pg_desc and b.pg_desc != "undefined":
        return f"the {b.pg_desc} group"
    members = b.pg.partition(":")[2]
    return f"the group of ranks {members}" if members else f"group {b.pg}"


def _stuck_on_device(tables: Tables, b: fr.Blocked) -> str | None:
    """The suggestion when a missing rank's own enqueued collectives never completed: its device stopped."""
    progress = reached(tables)
    stuck = [r for r in b.missing
             if (p := progress.get((b.pg, r))) and p.completed is not None and p.completed < p.entered]
    if not stuck:
        return None
    who = f"rank{'s' if len(stuck) > 1 else ''} {_list(stuck)}"
    return (f"The collectives {who} had already issued never completed on {'their' if len(stuck) > 1 else 'its'} "
            "device: it stopped making progress before it could reach this one. Look at that GPU first (a GPU "
            "error, an Xid in the kernel log `dmesg`, a kernel that never ends, NCCL_DEBUG=INFO's last lines), then "
            "at the code.")


def _wavefront(first: fr.Blocked, later: list[fr.Blocked]) -> str:
    """The collectives blocked after the first, told apart: the same ranks missing again (the fault spreading
    to their other groups), and ranks missing because they wait in the first."""
    if not later:
        return ""
    again = [x for x in later if set(x.missing) <= set(first.missing)]
    waiting = sorted({r for x in later for r in x.missing if r in first.waiting})
    text = ""
    if again:
        names = ", ".join(f"{_op(x.op)} #{x.seq} on {x.pg_desc or x.pg.split(':')[0]}" for x in again[:4])
        text += (f" The same rank{'s are' if len(first.missing) > 1 else ' is'} missing from {len(again)} later "
                 f"collective{'s' if len(again) > 1 else ''} of {'their' if len(first.missing) > 1 else 'its'} other "
                 f"groups ({names}{', ...' if len(again) > 4 else ''}): consequences, not other faults.")
    if waiting:
        text += (f" Rank{'s' if len(waiting) > 1 else ''} {_list(waiting)} {'are' if len(waiting) > 1 else 'is'} "
                 "missing elsewhere only because they wait in the first.")
    return text


def _where_in(tables: Tables, rank: int, b: fr.Blocked) -> str:
    """Where a missing rank is: its stack, else how far its flight recorder says it got on the group."""
    if rank in tables.stacks or rank in tables.exits:
        return f"is in {_where(tables, rank)}"
    last = b.missing_last.get(rank)
    progress = reached(tables).get((b.pg, rank))
    if last is None and progress is not None and progress.entered:
        done = f", completed up to #{progress.completed}" if progress.completed is not None else ""
        return (f"last entered #{progress.entered} there by its process-group status{done} (its dump holds no "
                "entries of the group)")
    if last is None:
        return "recorded no collective on that group"
    done = (f", completed up to #{progress.completed}" if progress and progress.completed is not None
            and progress.completed < last.seq else "")
    return f"last entered {_op(last.op)} #{last.seq} there{done}"


def _crash(tables: Tables, cause: stops.Stop, record: list[stops.Stop], blocked: list[fr.Blocked]) -> Candidate:
    # The first to die is the cause; the others' errors ("connection closed by peer") follow from it.
    rank = cause.ranks[0]
    waiting = next((b for b in blocked if rank in b.missing), blocked[0] if blocked else None)
    tail = ""
    if waiting:
        group = waiting.pg_desc or waiting.pg.split(":")[0]
        others = [r for r in waiting.waiting if r != rank]
        if others:
            tail = (f"; rank{'s' if len(others) > 1 else ''} {_list(others)} "
                    f"{'were' if len(others) > 1 else 'was'} waiting in {_op(waiting.op)} "
                    f"#{waiting.seq} on the {group} group, which it never entered")
    if cause.kind == stops.KILLED:
        what = f"was killed ({cause.detail}); it is in {_where(tables, rank)}"
    elif cause.kind == stops.CONNECTION:
        what = f"lost its connection to its peers first ({cause.detail[:300]}) at {cause.where or _where(tables, rank)}"
    else:
        what = f"crashed with {cause.detail} at {cause.where or _where(tables, rank)}"
    return Candidate(
        kind="crash", severity="critical", ranks=[rank],
        explanation=f"rank {rank}{_on_host(tables, rank)} {what}{tail}.{_followed(tables, cause, record)}",
        suggestion=(f"Nothing else stopped first: look at the network between rank {rank} and its peers, and at "
                    "anything outside this run that could have ended them." if cause.kind == stops.CONNECTION else
                    f"Fix the error on rank {rank} (ranks/{rank}/exit.json has its exception and line, its "
                    "stderr.log the traceback, or console.log where torch.multiprocessing.spawn started it); the "
                    "other ranks stopped because it did."),
        metrics={"exit_code": cause.code, "waiting_in": waiting.op if waiting else None, "cause": cause.kind},
        evidence=_stop_evidence(cause, record) + (_evidence(tables, waiting) if waiting else []),
        time_range=_instant(cause),
    )


# How a rank's sequence parted from its peers', in words (run/divergence.py).
PARTED = {
    divergence.SKIPPED: "in step {step} it took {mine:.0f} samples where its peers took {peers:.0f}: it skipped a batch's "
                        "backward and optimizer step (a `continue` in the loop), so from there its collectives ran one "
                        "step's worth ahead and its data ran out first",
    divergence.COLLECTIVES: "in step {step} it issued {mine:.0f} collectives where its peers issued {peers:.0f}: from "
                            "there its collectives were paired with the wrong ones of its peers",
    divergence.FEWER_STEPS: "it finished {last} steps and left while its peers went on into step {peers_last}: it left "
                            "the loop early (uneven data, a `break` on one rank)",
    divergence.AT_THE_END: "it finished the same steps as its peers ({last}), then ended while they were still in a "
                           "collective (one more than it made: a final barrier or all-reduce of theirs)",
}


def _left(tables: Tables, cause: stops.Stop, record: list[stops.Stop]) -> Candidate:
    """A rank whose script ended well while its peers waited for it: the origin, and they the consequence."""
    rank = cause.ranks[0]
    after = stops.consequences(record, cause)
    waiting = sorted({r for s in after for r in s.ranks}) or sorted(r for r in tables.rank_hosts if r != rank)
    parted = divergence.parting(tables, rank, waiting)
    words = PARTED[parted.how].format(step=parted.step, mine=parted.mine or 0, peers=parted.peers or 0,
                                      last=parted.last_step, peers_last=parted.peers_last_step)
    missed = parted.missed[0] if parted.missed else None
    entered = (f" Rank{'s' if len(missed.entered_by) > 1 else ''} {_list(missed.entered_by)} entered {missed.op} #{missed.seq} "
               f"on {missed.group}, which rank {rank} never issued (its last there was #{missed.last_of_leaver})."
               if missed else "")
    return Candidate(
        kind="sequence_divergence", severity="critical", ranks=[rank], steps=[parted.step] if parted.step else [],
        explanation=(f"rank {rank}{_on_host(tables, rank)} left the job while its peers still needed it: "
                     f"{cause.detail}{_at(cause)}. Where its sequence parted from its "
                     f"peers': {words}.{entered}{_followed(tables, cause, record)}"),
        suggestion=("Keep every rank's collectives in step: skip a bad batch on every rank together (all-reduce a "
                    "flag first), give every rank the same number of batches (DistributedSampler(drop_last=True), or "
                    "DDP's join() for uneven inputs), make a collective inside an `if` run on every rank, and end with "
                    "dist.barrier() before destroy_process_group()."),
        metrics={"exit_code": 0, "cause": cause.kind, "parted": parted.how, "parted_step": parted.step,
                 "mine": parted.mine, "peers": parted.peers, "last_step": parted.last_step,
                 "peers_last_step": parted.peers_last_step, "waiting": waiting,
                 "missed": [{"group": m.group, "seq": m.seq, "op": m.op, "entered_by": m.entered_by} for m in parted.missed]},
        evidence=_stop_evidence(cause, record), time_range=_instant(cause),
    )


def _exit_crash(tables: Tables, cause: stops.Stop) -> Candidate:
    """The training finished; a process died after its script ended, and the launcher called the job failed."""
    many = len(cause.ranks) > 1
    who = f"rank{'s' if many else ''} {_list(cause.ranks)}{_on_hosts(tables, cause.ranks)}"
    steps = tables.steps.loc[tables.steps["rank"].isin(cause.ranks), "step"] if not tables.steps.empty else []
    done = f" after step {int(max(steps))}" if len(steps) else ""
    said = f": {cause.detail[:300]}" if cause.detail else " without a message (every rank's script ended with code 0)"
    return Candidate(
        kind="crash_at_exit", severity="error", ranks=cause.ranks,
        explanation=(f"the training finished, but the job failed on its way out: {who}'s script ended with code 0"
                     f"{done}, then {'their processes' if many else 'its process'} died while Python shut "
                     f"down{said}. The launcher counted that as a failure (exit code "
                     f"{tables.manifest.get('exit_code')}); everything the ranks recorded before it is complete."),
        suggestion=("Free what holds a process group before the script ends: a DDP or FSDP model or an optimizer "
                    "kept in a global outlives `dist.destroy_process_group()`, and gloo's or NCCL's C++ threads then "
                    "die during the interpreter's teardown. Delete them (`del model, optimizer`) before destroying "
                    "the group, or keep them inside a `main()` function that returns first."),
        metrics={"exit_code": tables.manifest.get("exit_code"), "cause": cause.kind},
        evidence=cause.evidence[:12], time_range=_instant(cause),
    )


def _host_lost(tables: Tables, cause: stops.Stop, record: list[stops.Stop]) -> Candidate:
    if cause.kind == stops.HOST_LOST:
        ranks = f"; its ranks {_list(cause.ranks)} stopped without an exit record" if cause.ranks else ""
        what = (f"host {cause.host} was lost: its wrapper is gone without ending its record (killed, or the "
                f"machine went down), last seen{_at(cause)}{ranks}")
        todo = (f"Find out what happened to {cause.host} then: the scheduler's log (preemption, the OOM killer, "
                "a node failure) and the machine's kernel log; its ranks' stderr.log ends where they stopped.")
    else:
        what = f"diagtrain's wrapper on host {cause.host} failed ({cause.detail}){_at(cause)} and stopped its job"
        todo = f"This is diagtrain's fault, not the job's: report it with hosts/{cause.host}/host.json and console.log."
    return Candidate(
        kind="host_lost", severity="critical", ranks=cause.ranks,
        explanation=f"{what}.{_followed(tables, cause, record)}", suggestion=todo,
        metrics={"host": cause.host, "last_seen": cause.time, "cause": cause.kind},
        evidence=_stop_evidence(cause, record), time_range=_instant(cause),
    )


def _interrupted(tables: Tables, cause: stops.Stop, record: list[stops.Stop], stalled_s: float | None) -> Candidate:
    """A run stopped by a signal: the cause when it made ranks elsewhere fail, else only a fact."""
    ran_ranks = set(tables.rank_hosts.values())
    interrupted = {s.host for s in record if s.kind == stops.HOST_INTERRUPTED}
    whole_run = not stops.consequences(record, cause) or ran_ranks <= interrupted
    if cause.kind == stops.HOST_INTERRUPTED:
        who, how = f"host {cause.host}", f"was stopped by {cause.detail}"
    else:
        who = f"rank{'s' if len(cause.ranks) > 1 else ''} {_list(cause.ranks)}{_on_host(tables, cause.ranks[0])}"
        how = f"received {cause.detail}"
    progress = (f"; no rank had finished a step for {stalled_s:.0f} s before" if stalled_s is not None
                else "; the ranks were making progress until then")
    if whole_run:
        return Candidate(
            kind="interrupted", severity="info", ranks=sorted(tables.rank_hosts) or cause.ranks,
            explanation=(f"the run was interrupted: {who} {how}{_at(cause)}{progress}. Collectives that some ranks "
                         "had entered and others had not are where each rank was stopped, not a hang."),
            suggestion="Nothing to fix if the stop was meant; what was collected up to it is analyzed.",
            metrics={"signal": cause.detail, "stalled_s": stalled_s, "cause": cause.kind},
            evidence=cause.evidence[:12], time_range=_instant(cause),
        )
    return Candidate(
        kind="interrupted", severity="critical", ranks=cause.ranks,
        explanation=f"{who} {how}{_at(cause)}{progress}.{_followed(tables, cause, record)}",
        suggestion=(f"The job failed because {who} was stopped, not because of its code: find who sent "
                    f"{cause.detail} (a scheduler's preemption or time limit, a person, a health check)."),
        metrics={"signal": cause.detail, "host": cause.host, "cause": cause.kind},
        evidence=_stop_evidence(cause, record), time_range=_instant(cause),
    )


def _followed(tables: Tables, cause: stops.Stop, record: list[stops.Stop]) -> str:
    """A sentence on the ranks that failed after the cause, their connection errors called what they are."""
    after = stops.consequences(record, cause)
    lost = sorted({r for s in after if s.kind == stops.CONNECTION for r in s.ranks})
    other = sorted({r for s in after if s.kind != stops.CONNECTION for r in s.ranks} - set(lost))
    text = ""
    if lost:
        error = next(s.detail for s in after if s.kind == stops.CONNECTION)
        many = len(lost) > 1
        text += (f" Then rank{'s' if many else ''} {_list(lost)}{_on_hosts(tables, lost)} failed with "
                 f"{'connection errors' if many else 'a connection error'} ({stops.connection_error(error)}): "
                 f"{'they' if many else 'it'} lost {'their' if many else 'its'} peers, a consequence, not a fault of "
                 f"{'their' if many else 'its'} own.")
    if other:
        text += f" Rank{'s' if len(other) > 1 else ''} {_list(other)} stopped after it."
    return text


def _stop_evidence(cause: stops.Stop, record: list[stops.Stop]) -> list[dict]:
    return [e for s in [cause, *stops.consequences(record, cause)] for e in s.evidence][:12]


def _instant(stop: stops.Stop) -> tuple[float, float] | None:
    return (stop.time, stop.time) if stop.time is not None else None


def _on_host(tables: Tables, rank: int) -> str:
    host = tables.rank_hosts.get(rank)
    return f" on {host}" if host and len(set(tables.rank_hosts.values())) > 1 else ""


def _on_hosts(tables: Tables, ranks: list[int]) -> str:
    hosts = sorted({h for r in ranks if (h := tables.rank_hosts.get(r))})
    return f" on {', '.join(hosts)}" if hosts and len(set(tables.rank_hosts.values())) > 1 else ""


def _at(stop: stops.Stop) -> str:
    return f" at {_clock(int(stop.time * 1e9))}" if stop.time is not None else ""


def _mismatch_in_logs(tables: Tables) -> list[Candidate]:
    found = []
    for rank, events in sorted(tables.log_events.items()):
        for e in events:
            if e.kind in ("size_mismatch", "collective_mismatch"):
                found.append(Candidate(
                    kind="collective_mismatch", severity="critical", ranks=[rank],
                    explanation=f"rank {rank} received a collective that does not match its own: {e.text[:300]}",
                    suggestion="The ranks issued different collectives or sizes at the same point: make every rank "
                               "run the same sequence; TORCH_DISTRIBUTED_DEBUG=DETAIL names both sides.",
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
    waits = "; ".join(f"rank {r} waits in {_innermost(tables, r)}" for r in sorted(in_torch)[:4])
    return Candidate(
        kind="hang", severity="critical", ranks=outside,
        explanation=(f"rank{'s' if len(outside) > 1 else ''} {_list(outside)} "
                     f"{'are' if len(outside) > 1 else 'is'} outside any collective, in "
                     f"{'; '.join(_where(tables, r) for r in outside)}, while the others wait for it: {waits}."),
        suggestion="That code never reaches its next collective or send: look for a loop, a lock or I/O that does "
                   "not return on that rank.",
        metrics={"outside": outside, "waiting": sorted(in_torch)},
        evidence=[{"type": "stack", "rank": r, "where": _where(tables, r)} for r in sorted(tables.stacks)],
    )


def _mismatch(m: fr.Mismatch) -> Candidate:
    versions = "; ".join(f"rank {r}: {v}" for r, v in sorted(m.versions.items())[:8])
    return Candidate(
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


def _list(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def _clock(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%H:%M:%S UTC")
