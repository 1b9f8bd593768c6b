"""The hang detector's words (judge/detectors/hang.py): why a job stopped, in one sentence, and what to do about it.

Kinds and cases: hang (in a collective; in user code), crash, crash_at_exit, host_lost (lost; its wrapper failed),
interrupted, collective_mismatch (flight recorder; log), sequence_divergence.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from diagtrain.profiler.analyzer.report.words import Facts, Words
from diagtrain.profiler.analyzer.run import divergence, stops


def _s(items: list) -> str:
    return "s" if len(items) > 1 else ""


def _list(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def _clock(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%H:%M:%S UTC")


def _at(time: float | None) -> str:
    return f" at {_clock(int(time * 1e9))}" if time is not None else ""


def _on(host: str | None) -> str:
    return f" on {host}" if host else ""


def _on_hosts(hosts: list[str]) -> str:
    return f" on {', '.join(hosts)}" if hosts else ""


def _group(b: dict[str, Any]) -> str:
    """The group in words: its description, else its members (a group made without one: torch says "undefined")."""
    if b["pg_desc"] and b["pg_desc"] != "undefined":
        return f"the {b['pg_desc']} group"
    members = b["pg"].partition(":")[2]
    return f"the group of ranks {members}" if members else f"group {b['pg']}"


def _followed(f: Facts) -> str:
    """A sentence on the ranks that failed after the cause, their connection errors called what they are."""
    after = f["followed"]
    lost, other = after["lost"], after["other"]
    text = ""
    if lost:
        many = len(lost) > 1
        text += (f" Then rank{_s(lost)} {_list(lost)}{_on_hosts(after['lost_hosts'])} failed with "
                 f"{'connection errors' if many else 'a connection error'} ({after['error']}): "
                 f"{'they' if many else 'it'} lost {'their' if many else 'its'} peers, a consequence, not a fault of "
                 f"{'their' if many else 'its'} own.")
    if other:
        text += f" Rank{_s(other)} {_list(other)} stopped after it."
    return text


# -- hang ---------------------------------------------------------------------------------------------------------

def _where_in(w: dict[str, Any]) -> str:
    """Where a missing rank is: its stack, else how far its flight recorder says it got on the group."""
    done = f", completed up to #{w['completed']}" if w.get("completed") is not None else ""
    if "at" in w:
        return f"is in {w['at']}"
    if "status_entered" in w:
        return (f"last entered #{w['status_entered']} there by its process-group status{done} (its dump holds no "
                "entries of the group)")
    if "last_seq" not in w:
        return "recorded no collective on that group"
    return f"last entered {w['last_op']} #{w['last_seq']} there{done}"


def _wavefront(f: Facts) -> str:
    """The collectives blocked after the first, told apart: the same ranks missing again (the fault spreading
    to their other groups), and ranks missing because they wait in the first."""
    again, count, waiting, missing = f["again"], f["again_count"], f["waiting_elsewhere"], f["missing"]
    text = ""
    if again:
        names = ", ".join(f"{x['op']} #{x['seq']} on {x['group']}" for x in again[:4])
        text += (f" The same rank{'s are' if len(missing) > 1 else ' is'} missing from {count} later "
                 f"collective{'s' if count > 1 else ''} of {'their' if len(missing) > 1 else 'its'} other "
                 f"groups ({names}{', ...' if count > 4 else ''}): consequences, not other faults.")
    if waiting:
        text += (f" Rank{_s(waiting)} {_list(waiting)} {'are' if len(waiting) > 1 else 'is'} "
                 "missing elsewhere only because they wait in the first.")
    return text


def _in_collective(f: Facts) -> str:
    f = {**f, "missing": f["ranks"]}  # the ranks that never entered it
    missing, waiting = f["missing"], f["waiting"]
    where = "; ".join(f"rank {w['rank']} {_where_in(w)}" for w in f["where"])
    stopped = (f" The run was interrupted after {f['stalled_s']:.0f} s without a finished step." if f["stalled_s"]
               else "") + _wavefront(f)
    if f["besides"]:
        stopped += (" Independently, " + "; ".join(f"rank{_s(x['missing'])} {_list(x['missing'])} never entered "
                                                    f"{x['op']} #{x['seq']} on {_group(x)}" for x in f["besides"])
                    + " (a finding of its own): more than one rank stopped.")
    return (f"rank{_s(missing)} {_list(missing)} never entered {f['op']} #{f['seq']} on {_group(f)}; "
            f"rank{_s(waiting)} {_list(waiting)} {'have' if len(waiting) > 1 else 'has'} waited in it since "
            f"{_clock(f['since_ns'])}; {where}.{stopped}")


def _in_collective_suggestion(f: Facts) -> str:
    stuck = f["stuck_on_device"]
    if not stuck:
        return ("Find why that rank skipped or has not reached this collective: a condition that differs between ranks "
                "(a collective inside an `if`), an exception caught and ignored, or code that blocks before it. Every "
                "rank must issue the same collectives in the same order.")
    return (f"The collectives rank{_s(stuck)} {_list(stuck)} had already issued never completed on "
            f"{'their' if len(stuck) > 1 else 'its'} device: it stopped making progress before it could reach this "
            "one. Look at that GPU first (a GPU error, an Xid in the kernel log `dmesg`, a kernel that never ends, "
            "NCCL_DEBUG=INFO's last lines), then at the code.")


def _in_user_code(f: Facts) -> str:
    outside = f["ranks"]
    waits = "; ".join(f"rank {w['rank']} waits in {w['in']}" for w in f["waits"])
    return (f"rank{_s(outside)} {_list(outside)} {'are' if len(outside) > 1 else 'is'} outside any collective, in "
            f"{'; '.join(f['where'])}, while the others wait for it: {waits}.")


# -- a rank or host that stopped first ----------------------------------------------------------------------------

def _crash(f: Facts) -> str:
    rank, held = f["ranks"][0], f["held"]
    if f["cause"] == stops.KILLED:
        what = f"was killed ({f['detail']}); it is in {f['at']}"
    elif f["cause"] == stops.CONNECTION:
        what = f"lost its connection to its peers first ({f['detail'][:300]}) at {f['at']}"
    else:
        what = f"crashed with {f['detail']} at {f['at']}"
    tail = (f"; rank{_s(held['waiting'])} {_list(held['waiting'])} {'were' if len(held['waiting']) > 1 else 'was'} "
            f"waiting in {held['op']} #{held['seq']} on the {held['group']} group, which it never entered" if held else "")
    return f"rank {rank}{_on(f['host'])} {what}{tail}.{_followed(f)}"


def _crash_suggestion(f: Facts) -> str:
    rank = f["ranks"][0]
    if f["cause"] == stops.CONNECTION:
        return (f"Nothing else stopped first: look at the network between rank {rank} and its peers, and at anything "
                "outside this run that could have ended them.")
    return (f"Fix the error on rank {rank} (ranks/{rank}/exit.json has its exception and line, its stderr.log the "
            "traceback, or console.log where torch.multiprocessing.spawn started it); the other ranks stopped because "
            "it did.")


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


def _left(f: Facts) -> str:
    rank, parted, missed = f["ranks"][0], f["parted"], f["missed"]
    words = PARTED[parted["how"]].format(**{k: v for k, v in parted.items() if k != "how"})
    entered = (f" Rank{_s(missed['entered_by'])} {_list(missed['entered_by'])} entered {missed['op']} #{missed['seq']} "
               f"on {missed['group']}, which rank {rank} never issued (its last there was #{missed['last_of_leaver']})."
               if missed else "")
    return (f"rank {rank}{_on(f['host'])} left the job while its peers still needed it: {f['detail']}{_at(f['time'])}. "
            f"Where its sequence parted from its peers': {words}.{entered}{_followed(f)}")


def _exit_crash(f: Facts) -> str:
    ranks = f["ranks"]
    many = len(ranks) > 1
    done = f" after step {f['last_step']}" if f["last_step"] is not None else ""
    said = f": {f['detail'][:300]}" if f["detail"] else " without a message (every rank's script ended with code 0)"
    return (f"the training finished, but the job failed on its way out: rank{_s(ranks)} {_list(ranks)}"
            f"{_on_hosts(f['hosts'])}'s script ended with code 0{done}, then "
            f"{'their processes' if many else 'its process'} died while Python shut down{said}. The launcher counted "
            f"that as a failure (exit code {f['exit_code']}); everything the ranks recorded before it is complete.")


def _host_lost(f: Facts) -> str:
    ranks = f"; its ranks {_list(f['ranks'])} stopped without an exit record" if f["ranks"] else ""
    return (f"host {f['host']} was lost: its wrapper is gone without ending its record (killed, or the machine went "
            f"down), last seen{_at(f['time'])}{ranks}.{_followed(f)}")


def _wrapper_failed(f: Facts) -> str:
    return (f"diagtrain's wrapper on host {f['host']} failed ({f['detail']}){_at(f['time'])} and stopped its job."
            f"{_followed(f)}")


def _who(f: Facts) -> tuple[str, str]:
    """Who was stopped by a signal, and how."""
    if f["by_host"]:
        return f"host {f['host']}", f"was stopped by {f['signal']}"
    ranks = f["stopped_ranks"]
    return f"rank{_s(ranks)} {_list(ranks)}{_on(f['rank_host'])}", f"received {f['signal']}"


def _interrupted(f: Facts) -> str:
    who, how = _who(f)
    progress = (f"; no rank had finished a step for {f['stalled_s']:.0f} s before" if f["stalled_s"] is not None
                else "; the ranks were making progress until then")
    if f["whole_run"]:
        return (f"the run was interrupted: {who} {how}{_at(f['time'])}{progress}. Collectives that some ranks had "
                "entered and others had not are where each rank was stopped, not a hang.")
    return f"{who} {how}{_at(f['time'])}{progress}.{_followed(f)}"


def _interrupted_suggestion(f: Facts) -> str:
    if f["whole_run"]:
        return "Nothing to fix if the stop was meant; what was collected up to it is analyzed."
    return (f"The job failed because {_who(f)[0]} was stopped, not because of its code: find who sent {f['signal']} "
            "(a scheduler's preemption or time limit, a person, a health check).")


def _mismatch(f: Facts) -> str:
    versions = "; ".join(f"rank {r}: {v}" for r, v in f["versions"])
    return f"ranks disagree on collective #{f['seq']} of the {f['group']} group: {versions}."


WORDS = {
    "hang/collective": Words(_in_collective, _in_collective_suggestion),
    "hang/user_code": Words(
        _in_user_code,
        "That code never reaches its next collective or send: look for a loop, a lock or I/O that does not return on "
        "that rank."),
    "crash": Words(_crash, _crash_suggestion),
    "crash_at_exit": Words(
        _exit_crash,
        "Free what holds a process group before the script ends: a DDP or FSDP model or an optimizer kept in a global "
        "outlives `dist.destroy_process_group()`, and gloo's or NCCL's C++ threads then die during the interpreter's "
        "teardown. Delete them (`del model, optimizer`) before destroying the group, or keep them inside a `main()` "
        "function that returns first."),
    "host_lost/lost": Words(
        _host_lost,
        lambda f: (f"Find out what happened to {f['host']} then: the scheduler's log (preemption, the OOM killer, a "
                   "node failure) and the machine's kernel log; its ranks' stderr.log ends where they stopped.")),
    "host_lost/wrapper_failed": Words(
        _wrapper_failed,
        lambda f: (f"This is diagtrain's fault, not the job's: report it with hosts/{f['host']}/host.json and "
                   "console.log.")),
    "interrupted": Words(_interrupted, _interrupted_suggestion),
    "collective_mismatch/flight_recorder": Words(
        _mismatch,
        "The ranks issued different collectives (or shapes) at the same point: make every rank run the same sequence; "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL checks this at each call."),
    "collective_mismatch/log": Words(
        lambda f: f"rank {f['ranks'][0]} received a collective that does not match its own: {f['text']}",
        "The ranks issued different collectives or sizes at the same point: make every rank run the same sequence; "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL names both sides."),
    "sequence_divergence": Words(
        _left,
        "Keep every rank's collectives in step: skip a bad batch on every rank together (all-reduce a flag first), give "
        "every rank the same number of batches (DistributedSampler(drop_last=True), or DDP's join() for uneven inputs), "
        "make a collective inside an `if` run on every rank, and end with dist.barrier() before "
        "destroy_process_group()."),
}
