"""One rank's point-to-point traffic, step by step: whom it sends to, whom it receives from.

Nothing in a trace declares pipeline stages; the sends and receives show them. In every pipeline
schedule (GPipe, 1F1B, interleaved, or hand-written send/recv) the first stage starts a step by
sending activations forward and every later stage starts it by receiving from the stage before.
So each rank's *first* point-to-point call of a step says where it sits: a send (first stage),
or a receive from its predecessor. Counts per step say how many microbatches went through.

The peer a call names is its rank within the call's group (c10d's convention); which group that
is, the structure inference decides (analyzer/run/structure.py), since the trace does not say.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.read.dialects import P2P_CALL, STEP_ANNOTATION, name_matches, step_marks

# The flight recorder's point-to-point entries (NCCL): "nccl:send 0->1", "nccl:recv 1<-0", ranks
# within the group. gloo records none.
FR_P2P = re.compile(r"^\w+:(send|recv) (\d+)(?:->|<-)(\d+)")
# Schedule annotations that carry the microbatch index: torch.distributed.pipelining's GPipe
# ("Forward 3", "Backward 3") and its runtime of actions ("PP:1F3": stage 1, forward, microbatch 3).
MICROBATCH_SPAN = re.compile(r"^(?:Forward|Backward) (\d+)$|^PP:\d+F(\d+)$")
WHOLE_TRACE = -1  # the step of calls in a trace without step annotations


@dataclass
class P2PCalls:
    """What one rank's point-to-point calls say (JSON-ready: it goes into the load cache)."""

    first: dict[int, list] = field(default_factory=dict)  # step -> [kind, peer] of its first call
    sends_per_step: dict[int, float] = field(default_factory=dict)  # peer -> median sends per step
    recvs_per_step: dict[int, float] = field(default_factory=dict)  # peer -> median receives per step
    microbatches: int | None = None  # from the schedule's annotations, when it writes them
    source: str = "traces"  # or "flight recorder", or "counters"

    @property
    def empty(self) -> bool:
        return not self.sends_per_step and not self.recvs_per_step

    @classmethod
    def from_json(cls, doc: dict) -> "P2PCalls":
        """Back from JSON, whose object keys are strings."""
        return cls(first={int(k): v for k, v in (doc.get("first") or {}).items()},
                   sends_per_step={int(k): v for k, v in (doc.get("sends_per_step") or {}).items()},
                   recvs_per_step={int(k): v for k, v in (doc.get("recvs_per_step") or {}).items()},
                   microbatches=doc.get("microbatches"), source=doc.get("source", "traces"))


def summarize(events: pd.DataFrame, comm: pd.DataFrame) -> P2PCalls:
    """The point-to-point calls of one rank per profiled step: ``comm`` its communication events with
    their ``peer`` (see TraceFile.comm_events), ``events`` all its events (the step annotations)."""
    host_calls = (comm["stream"] < 0).to_numpy() & (comm["peer"] >= 0).to_numpy()
    calls = comm[host_calls & name_matches(comm["name"], P2P_CALL)]
    if calls.empty:
        return P2PCalls()
    host = events[(events["stream"] < 0).to_numpy()]
    steps = events[step_marks(events)]
    calls = calls.assign(kind=np.where(calls["name"].astype(str) == "c10d::send", "send", "recv"),
                         step=_step_of(calls["ts"].to_numpy(), steps))
    return _summary(calls[calls["step"].notna()], microbatches=_microbatches(host, steps))


def from_flight_recorder(dump: dict, steps: pd.DataFrame) -> P2PCalls:
    """The same summary from a rank's flight-recorder dump, its entries put in the rank's recorded
    steps (``steps``: step, start, end in Unix seconds) by the time they were created."""
    rows = []
    for e in dump.get("entries") or []:
        m = FR_P2P.match(str(e.get("profiling_name", ""))) if e.get("is_p2p") else None
        if m:
            rows.append({"kind": m.group(1), "peer": int(m.group(3)), "ts": e.get("time_created_ns", 0) / 1e9})
    if not rows or steps.empty:
        return P2PCalls()
    calls = pd.DataFrame(rows)
    spans = steps.sort_values("start")
    at = np.searchsorted(spans["start"].to_numpy(), calls["ts"].to_numpy(), side="right") - 1
    inside = (at >= 0) & (calls["ts"].to_numpy() <= spans["end"].to_numpy()[np.maximum(at, 0)])
    calls = calls.assign(step=np.where(inside, spans["step"].to_numpy()[np.maximum(at, 0)], np.nan))
    found = _summary(calls[calls["step"].notna()], microbatches=None)
    found.source = "flight recorder"
    return found


def from_step_records(per_step: dict[int, dict]) -> P2PCalls:
    """The same summary from the always-on counters: per step, the first call and the calls per peer
    (run_files checked them), as the ranks' step records hold them."""
    if not per_step:
        return P2PCalls()
    steps = sorted(per_step)

    def per_step_median(kind: str) -> dict[int, float]:
        peers = {p for s in steps for p in per_step[s].get(kind, {})}
        return {p: float(np.median([per_step[s].get(kind, {}).get(p, 0) for s in steps])) for p in sorted(peers)}

    return P2PCalls(first={s: list(per_step[s]["first"]) for s in steps}, sends_per_step=per_step_median("send"),
                    recvs_per_step=per_step_median("recv"), microbatches=None, source="counters")


def _summary(calls: pd.DataFrame, microbatches: int | None) -> P2PCalls:
    """From calls (kind, peer, step, ts): the first call of each step and the counts per step."""
    if calls.empty:
        return P2PCalls()
    first = {int(s): [rows["kind"].iat[0], int(rows["peer"].iat[0])] for s, rows in calls.sort_values("ts").groupby("step")}
    per_peer = calls.groupby(["kind", "peer", "step"]).size().groupby(level=["kind", "peer"]).median()
    return P2PCalls(
        first=first,
        sends_per_step={int(p): float(n) for (k, p), n in per_peer.items() if k == "send"},
        recvs_per_step={int(p): float(n) for (k, p), n in per_peer.items() if k == "recv"},
        microbatches=microbatches,
    )


def _step_of(ts: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """The step annotation each time falls in (NaN outside all), or WHOLE_TRACE without any."""
    if steps.empty:
        return np.full(len(ts), WHOLE_TRACE, dtype=float)
    numbers = np.array([int(STEP_ANNOTATION.match(n).group(1)) for n in steps["name"].astype(str)], dtype=float)
    order = np.argsort(steps["ts"].to_numpy())
    starts, ends, numbers = steps["ts"].to_numpy()[order], steps["end"].to_numpy()[order], numbers[order]
    at = np.searchsorted(starts, ts, side="right") - 1
    inside = (at >= 0) & (ts <= ends[np.maximum(at, 0)])
    return np.where(inside, numbers[np.maximum(at, 0)], np.nan)


def _microbatches(host: pd.DataFrame, steps: pd.DataFrame) -> int | None:
    """Distinct microbatch indices per step in the schedule's annotations (their median)."""
    spans = host[name_matches(host["name"], MICROBATCH_SPAN)]
    if spans.empty:
        return None
    index = [int(next(g for g in MICROBATCH_SPAN.match(n).groups() if g is not None)) for n in spans["name"].astype(str)]
    per_step = pd.Series(index).groupby(_step_of(spans["ts"].to_numpy(), steps)).nunique()
    return int(per_step.median()) if len(per_step) else None
