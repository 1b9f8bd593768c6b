"""Where ranks' sequences parted: the step, and the collective, at which one rank stopped matching its peers.

Every rank of a synchronous job issues the same collectives in the same order, a step's worth at a time.
A rank that skips a batch (a `continue` before backward), leaves the loop early (uneven data, a `break` on
one rank) or issues a collective of its own runs ahead or behind from there: its peers later wait in a
collective it never issues, and fail ("Connection closed by peer") or hang once it has left. The records
say where: the always-on counters of each step (the batches' samples, the collectives issued), the steps
each rank finished, and the flight recorder (the last collective each rank entered in each group).
Only facts here; which rank is the origin is the judge's (judge/detectors/hang.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from diagtrain.profiler.analyzer.read import flight_records as fr

if TYPE_CHECKING:
    from diagtrain.profiler.analyzer.run.tables import Tables

# How a rank's steps parted from its peers'.
SKIPPED = "skipped"  # a step of its took more batches than its peers' (it skipped one's backward and optimizer step)
COLLECTIVES = "collectives"  # a step of its issued a different number of collectives
FEWER_STEPS = "fewer steps"  # it finished fewer steps than its peers
AT_THE_END = "at the end"  # the same steps as its peers; it left while they were still in a collective
# A step took "more batches" when its samples are at least this many times its peers' (one skipped batch doubles them).
MORE_BATCHES = 1.5


@dataclass
class Missed:
    """A collective the waiting ranks entered and the rank that left never issued."""

    group: str  # its description, else its key
    seq: int
    op: str
    entered_by: list[int]
    last_of_leaver: int  # the last sequence number the rank that left entered in that group


@dataclass
class Parting:
    """Where one rank's sequence parted from its peers'."""

    rank: int
    how: str  # one of SKIPPED, COLLECTIVES, FEWER_STEPS, AT_THE_END
    step: int | None  # the first step where it parted (None: not in the records)
    mine: float | None = None  # its samples or collectives in that step
    peers: float | None = None  # its peers' (median)
    last_step: int | None = None  # the last step it finished
    peers_last_step: int | None = None  # the last step its peers reached (finished, or were inside when they waited)
    missed: list[Missed] = field(default_factory=list)  # per group, the first collective it never issued


def parting(t: Tables, rank: int, peers: list[int]) -> Parting:
    """Where ``rank``'s steps and collectives parted from ``peers``': the first step that differs, else how its
    steps ended; and the collectives they entered that it never issued."""
    steps = t.steps
    mine = steps[steps["rank"] == rank] if not steps.empty else steps
    theirs = steps[steps["rank"].isin(peers)] if not steps.empty else steps
    last = int(mine["step"].max()) if len(mine) else None
    their_last = int(theirs["step"].max()) if len(theirs) else None
    never = missed(t, rank, peers)
    for column, how, differs in (("samples", SKIPPED, lambda m, p: m >= MORE_BATCHES * p),
                                 ("comm_calls", COLLECTIVES, lambda m, p: m != p)):
        found = _first_differing(mine, theirs, column, differs)
        if found is not None:
            step, m, p = found
            return Parting(rank, how, step, m, p, last, their_last, never)
    # Peers that entered collectives it never issued, after their last finished step, were inside the next one.
    reached = their_last + 1 if their_last is not None and never else their_last
    if last is not None and reached is not None and last < reached:
        return Parting(rank, FEWER_STEPS, last + 1, last_step=last, peers_last_step=reached, missed=never)
    return Parting(rank, AT_THE_END, None, last_step=last, peers_last_step=their_last, missed=never)


def _first_differing(mine, theirs, column: str, differs) -> tuple[int, float, float] | None:
    """The first step both recorded where ``column`` differs (``differs(mine, peers' median)``)."""
    if column not in mine or column not in theirs:
        return None
    peers = theirs.dropna(subset=[column]).groupby("step")[column].median()
    for step, value in mine.dropna(subset=[column]).sort_values("step")[["step", column]].itertuples(index=False):
        if step in peers.index and np.isfinite(value) and differs(float(value), float(peers[step])):
            return int(step), float(value), float(peers[step])
    return None


def missed(t: Tables, rank: int, peers: list[int],
           progress: dict[tuple[str, int], fr.Progress] | None = None) -> list[Missed]:
    """Per group the rank shares with ``peers``: the first collective they entered beyond its last (the flight
    recorder's; none without dumps). ``progress``: fr.progress of the run, where the caller has it already."""
    progress = fr.progress(t.dumps, t.flight_records) if progress is None else progress
    found = []
    for group in sorted({pg for pg, r in progress if r == rank}):
        mine = progress[(group, rank)].entered
        ahead = sorted(r for r in peers if (p := progress.get((group, r))) is not None and p.entered > mine)
        if not ahead:
            continue
        entry = next((e for e in t.flight_records if e.pg == group and e.rank in ahead and e.seq == mine + 1), None)
        desc = entry.pg_desc if entry is not None and entry.pg_desc not in (None, "undefined") else group.split(":")[0]
        found.append(Missed(desc, mine + 1, fr.op_name(entry.op) if entry is not None else "?", ahead, mine))
    return found
