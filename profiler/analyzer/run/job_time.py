"""Where the whole job's time went: the job's own ledger, beside the ranks' one (run/ledger.py).

The ranks' ledger charges a rank's excess over its peers; time that every rank loses together (each
waiting for its own data loader, a checkpoint every few steps, start-up) is nobody's excess and shows
there as nothing. Here the job's wall time, from its launch to its end, is split into categories that
add up to it:

- in each step, on the job's timeline (a step lasts from the last rank's end of the step before to the
  last rank's end of this one), what the ranks share: ``compute`` (the phases' own work, the device's busy
  time), ``data`` (the wait for the next batch; on a GPU also the device's idle time that its host's
  data wait left there), ``other`` (work outside any phase and phases that are not the model's: a
  checkpoint, logging, evaluation, gc called from the loop), ``between`` (time between one step's
  record and the next one's), ``profiler`` (diagtrain's own: the time between steps in which a profiled
  window's trace was written), ``imbalance`` (what the step lost to ranks' excess over their peers: the
  ranks' ledger's ``lost_ms``) and ``communication`` (the rest: transfers the job waits for, and
  pipeline stages waiting for each other). A rank's share of a part is its work there less its excess
  over its peers (``excess_<part>_ms``), so one slow rank's excess is imbalance, never data or compute;
  the job's is the median of its ranks'.
- ``startup``: from the launch to the end of the warm-up steps, less what the warm-up steps would have
  taken as steady ones (credited to the steps' categories), split where the ranks recorded when: the
  launcher and Python's start, imports, the process group's set-up, then building the job and its first
  steps (compilation, allocator warm-up).
- ``teardown``: from the last step's end to the job's end (for a hung or crashed job, until it stopped).

Only accounting here: which shares are findings is the judge's (judge/detectors/input_bound.py, ...).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from diagtrain.profiler.util.groups import Groups, distinct_rows, ranked, strictly_ordered
from diagtrain.profiler.analyzer.run.ledger import DEVICE_BUSY, DEVICE_IDLE, OUTSIDE, excess_column, work_column

if TYPE_CHECKING:  # built with the tables (tables.assemble)
    from diagtrain.profiler.analyzer.run.tables import Tables

COMPUTE, DATA, COMMUNICATION, IMBALANCE, OTHER, BETWEEN, PROFILER = (
    "compute", "data", "communication", "imbalance", "other", "between", "profiler")
STARTUP, TEARDOWN = "startup", "teardown"
STEP_CATEGORIES = (COMPUTE, DATA, COMMUNICATION, IMBALANCE, OTHER, BETWEEN, PROFILER)
CATEGORIES = (*STEP_CATEGORIES, STARTUP, TEARDOWN)
# Recorded phases that are not the model's work (a StepRecorder's own names, and the reference trainers').
NOT_COMPUTE = frozenset({"checkpoint", "ckpt", "save", "eval", "evaluation", "validation", "validate", "metrics",
                         "logging", "log"})
# The start-up's segments, in order, and the rank.json time each ends at (the last ends at the warm-up's end).
LAUNCH, IMPORTS, PROCESS_GROUP, FIRST_STEPS = "launch", "imports", "process group", "set-up and first steps"
SEGMENT_ENDS = ((LAUNCH, "process_started_at"), (IMPORTS, "torch_imported_at"),
                (PROCESS_GROUP, "process_group_ready_at"))
STEP_COLUMNS = ["step", "start", "end", "time_ms", "ranks", *(f"{c}_ms" for c in STEP_CATEGORIES)]


def column(category: str) -> str:
    """The job steps table's column of a category (ms per step)."""
    return f"{category}_ms"


def part_category(part: str) -> str:
    """The category of a ranks' ledger part: a phase, work outside the phases, or the device's time."""
    if part == "data":
        return DATA
    if part == OUTSIDE or part.lower() in NOT_COMPUTE:
        return OTHER
    return COMPUTE  # the model's phases, and the device's busy time (its idle time is split: _shared_parts)


def build(t: Tables) -> pd.DataFrame:
    """One row per step on the job's timeline: when it began and ended, its time, how many ranks recorded
    it, and its time per category (adding up to ``time_ms``); the typical work of each ledger part
    (``part_<part>_ms``) beside. Empty without the ranks' ledger."""
    if t.ledger.empty or t.steps.empty:
        return pd.DataFrame(columns=STEP_COLUMNS)
    return job_steps(step_parts(t, gaps(t.steps)))


def step_parts(t: Tables, gaps_of: pd.DataFrame, only: np.ndarray | None = None) -> pd.DataFrame:
    """Per step of the ranks' ledger (of the steps ``only``, where given), by step: the typical work of each part and
    category, the time its ranks lost (``imbalance_ms``) and its span (``start``, ``end``, ``ranks``), what
    :func:`job_steps` makes the job's steps of. ``gaps_of``: :func:`gaps` of ``t.steps``. A step's parts depend on
    its own rows and their gaps alone (run/live_ledger.py keeps those of the steps that stay)."""
    # The columns it reads, as arrays, cut before the rows: a long run's whole ledger is hundreds of MB, and on a
    # live window's few thousand rows pandas' per-call costs (a named aggregation, a column set at a time) were most
    # of the 20 ms this took at 8,192 ranks.
    read = [c for c in t.ledger.columns if c in ("rank", "step", "lost_ms") or str(c).startswith(("work_", "excess_"))]
    step_columns = [c for c in ("rank", "step", "start", "end", "data_ms") if c in t.steps]
    rows: np.ndarray | slice = slice(None)
    kept: np.ndarray | slice = slice(None)
    if only is not None:  # positions, not masks: each column cut gathers its few rows, not a pass over all of them
        rows, kept = positions_of(t.ledger["step"], only), positions_of(t.steps["step"], only)
    ledger = {c: t.ledger[c].to_numpy()[rows] for c in read}
    steps = {c: t.steps[c].to_numpy()[kept] for c in step_columns}
    gap_ms, exported = _gaps_of_rows(ledger, {c: gaps_of[c].to_numpy()[kept] for c in gaps_of.columns})
    shared = _shared_parts(ledger, steps, gap_ms, exported, [*t.phases, OUTSIDE, DEVICE_BUSY, DEVICE_IDLE])
    ledger_steps, ledger_codes = ranked(ledger["step"])
    by_step = Groups(ledger_codes, len(ledger_steps))
    typical = {c: by_step.median(values, skip_nan=True) for c, values in shared.items()}  # the job's typical rank
    lost = _lost_by_step(ledger["lost_ms"], ledger_codes, len(ledger_steps))
    numbers, start, end, ranks = _spans(steps)
    held = np.isin(numbers, ledger_steps) & ~np.isnan(start) & ~np.isnan(end)  # steps with ledger rows and a span
    at = np.searchsorted(ledger_steps, numbers[held])
    out = {c: _known(values[at]) for c, values in typical.items()}
    out.update({column(IMBALANCE): lost[at], "start": start[held], "end": end[held], "ranks": ranks[held]})
    return pd.DataFrame(out, index=pd.Index(numbers[held], name="step"))


def positions_of(values: pd.Series, only: np.ndarray) -> np.ndarray:
    """The positions of the rows whose value is one of ``only`` (where ``values.isin(only)``): by numpy's comparisons
    where both are integers of one type (a hash of each of a live window's rows cost 1 ms at 8,192 ranks x 20 steps)."""
    array, only = values.to_numpy(), np.asarray(only)
    if array.dtype == only.dtype and array.dtype.kind in "iu":
        return np.flatnonzero(np.isin(array, only))
    return np.flatnonzero(values.isin(only).to_numpy())


def _known(values: np.ndarray) -> np.ndarray:
    """NaN as 0 (a step's part nobody recorded)."""
    return np.where(np.isnan(values), 0.0, values)


def _spans(steps: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The steps table's steps (sorted), each one's earliest start and latest end (NaN left out, NaN where none is
    known) and its number of distinct ranks: ``groupby("step").agg(start=min, end=max, ranks=nunique)``."""
    numbers, codes = ranked(steps["step"])
    by_step = Groups(codes, len(numbers))
    start = by_step.minimum(steps["start"].astype(float), np.nan, skip_nan=True)
    end = by_step.maximum(steps["end"].astype(float), np.nan, skip_nan=True)
    _, first = distinct_rows(codes, steps["rank"])
    counted = first[~pd.isna(steps["rank"][first])]  # one row of each step's each rank; a missing rank is none
    return numbers, start, end, np.bincount(codes[counted], minlength=len(numbers)).astype(np.int64)


def _lost_by_step(lost_ms: np.ndarray, codes: np.ndarray, n: int) -> np.ndarray:
    """Per step (``codes``: each row's, of ``n``), its ledger rows' ``lost_ms`` summed in row order (NaN counted as
    none): a step's sum the same whichever other steps are there, as when a live window's new step is summed alone
    (pandas' group sum of a step differed in its last bit with and without the steps before it)."""
    lost = np.asarray(lost_ms, dtype=float)
    return np.bincount(codes, weights=np.where(np.isnan(lost), 0.0, lost), minlength=n)


def job_steps(parts: pd.DataFrame) -> pd.DataFrame:
    """The job's steps from their parts (:func:`step_parts`, steps in any order): each step on the job's timeline
    from the last rank's end of the step before, its time split into the categories."""
    parts = parts.sort_index()
    ends = parts["end"].to_numpy(dtype=float)
    before = np.r_[parts["start"].to_numpy(dtype=float)[:1], np.maximum.accumulate(ends)[:-1]]
    time_ms = np.clip(ends - before, 0.0, None) * 1e3
    categories = {c: parts[column(c)].to_numpy() if column(c) in parts else np.zeros(len(parts))
                  for c in (COMPUTE, DATA, OTHER, BETWEEN, PROFILER, IMBALANCE)}
    # One frame of the columns made, not a column set at a time (each rebuilt the frame's columns: 5 ms a window).
    return pd.DataFrame({"step": parts.index.to_numpy().astype(int), "start": parts["start"].to_numpy(), "end": ends,
                         "time_ms": time_ms, "ranks": parts["ranks"].to_numpy().astype(int),
                         **_fit(time_ms, categories),
                         **{part: parts[part].to_numpy() for part in parts.columns if part.startswith("part_")}})


def gaps(steps: pd.DataFrame) -> pd.DataFrame:
    """Per row of ``steps`` (rank, step), the time from the end of its rank's previous step record to the start of this
    one (``gap_ms``; 0 for a rank's first, and for a row without times), and whether the recorder wrote a profiled
    window's trace then (``exported``: the step before was the window's last)."""
    rank, step = steps["rank"].to_numpy(), steps["step"].to_numpy()
    start, end = steps["start"].to_numpy(dtype=float), steps["end"].to_numpy(dtype=float)
    profiled = steps["profiled"].fillna(False).to_numpy(dtype=bool) if "profiled" in steps else np.zeros(len(steps), bool)
    if not strictly_ordered(rank, step) or np.isnan(start).any() or np.isnan(end).any():
        return _gaps_sorted(steps, profiled)
    # Rows by rank, then step, every time known (a steps table as tables.step_table gives it): the row before is the
    # rank's step before, without a sort and a group-by of the table (25 ms at 8,192 ranks x 20 steps).
    after, exported, gap_ms = np.zeros(len(steps), bool), np.zeros(len(steps), bool), np.zeros(len(steps))
    after[1:] = rank[1:] == rank[:-1]
    late = (start[1:] - end[:-1]) * 1e3
    gap_ms[1:] = np.where(after[1:] & (late >= 0.0), late, 0.0)
    exported[1:] = after[1:] & profiled[:-1] & ~profiled[1:]
    return pd.DataFrame({"rank": rank, "step": step, "gap_ms": gap_ms, "exported": exported})


def _gaps_sorted(steps: pd.DataFrame, profiled: np.ndarray) -> pd.DataFrame:
    """:func:`gaps` of a table in any order, or with rows without times (left out)."""
    s = steps[["rank", "step", "start", "end"]].reset_index(drop=True).dropna().sort_values(["rank", "step"])
    previous_end = s.groupby("rank")["end"].shift()  # s's index: the rows' positions in ``steps``
    gap = ((s["start"] - previous_end) * 1e3).clip(lower=0.0).fillna(0.0)
    before = pd.Series(profiled[s.index], index=s.index)
    exported = before.groupby(s["rank"]).shift(fill_value=False).astype(bool) & ~before
    gap_ms, after_export = np.zeros(len(steps)), np.zeros(len(steps), dtype=bool)
    gap_ms[s.index], after_export[s.index] = gap.to_numpy(), exported.to_numpy()
    return pd.DataFrame({"rank": steps["rank"].to_numpy(), "step": steps["step"].to_numpy(), "gap_ms": gap_ms,
                         "exported": after_export})


def _gaps_of_rows(ledger: dict[str, np.ndarray], gaps_of: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The ledger rows' gaps (:func:`gaps`' columns, as arrays: ``gap_ms``, NaN where none, and ``exported``): by
    position where the ledger has the steps' rows in their order (a merge of the whole window cost 20 ms at 8,192
    ranks), else by rank and step."""
    found = _aligned(ledger, gaps_of, {c: gaps_of[c] for c in ("gap_ms", "exported")})
    return found["gap_ms"], found["exported"]


def _aligned(ledger: dict[str, np.ndarray], table: dict[str, np.ndarray], values: dict[str, np.ndarray]) \
        -> dict[str, np.ndarray]:
    """``values`` (columns of ``table``'s rows, by rank and step; both as arrays by name) per ledger row: by position
    where the ledger's ranks and steps are the table's, else by a merge (NaN where the table has no row)."""
    if all(len(ledger[c]) == len(table[c]) and np.array_equal(ledger[c], np.asarray(table[c]))
           for c in ("rank", "step")):
        return dict(values)
    rows = pd.DataFrame({"rank": np.asarray(table["rank"]), "step": np.asarray(table["step"]), **values})
    merged = pd.DataFrame({"rank": ledger["rank"], "step": ledger["step"]}).merge(rows, on=["rank", "step"], how="left")
    return {c: merged[c].to_numpy() for c in values}


def _shared_parts(ledger: dict[str, np.ndarray], steps: dict[str, np.ndarray], gap_ms: np.ndarray,
                  exported: np.ndarray, parts: list[str]) -> dict[str, np.ndarray]:
    """Per ledger row (``ledger``: its columns as arrays; ``steps``: the steps table's rows of its steps, as arrays;
    ``gap_ms``, ``exported``: its gaps), each category's work at its peers' level (work less its excess over them),
    and each part's (``part_<part>_ms``) of ``parts`` (those the ledger has); a device's idle time is data loading up
    to its host's data wait."""
    parts = [p for p in dict.fromkeys(parts) if work_column(p) in ledger]
    n = len(ledger["step"])
    out: dict[str, np.ndarray] = {}
    totals = {c: np.zeros(n) for c in (COMPUTE, DATA, OTHER)}
    for part in parts:
        work = np.asarray(ledger[work_column(part)], dtype=float)
        excess = np.asarray(ledger[excess_column(part)], dtype=float) if excess_column(part) in ledger else 0.0
        own = np.clip(np.nan_to_num(work - excess), 0.0, None)
        out[f"part_{part}_ms"] = own
        if part == DEVICE_IDLE:  # the device waited for its host: for data where the host waited for data
            data = np.minimum(own, _host_data(ledger, steps))
            totals[DATA] += data
            totals[OTHER] += own - data
        else:
            totals[part_category(part)] += own
    for c, values in totals.items():
        out[column(c)] = values
    gap = _known(np.asarray(gap_ms, dtype=float))
    exported = np.asarray(pd.Series(exported).fillna(False), dtype=bool) if exported.dtype == object else exported
    out[column(BETWEEN)], out[column(PROFILER)] = np.where(exported, 0.0, gap), np.where(exported, gap, 0.0)
    return out


def _host_data(ledger: dict[str, np.ndarray], steps: dict[str, np.ndarray]) -> np.ndarray:
    """Per ledger row, its host's data wait in the step (0 where not recorded)."""
    if "data_ms" not in steps:
        return np.zeros(len(ledger["step"]))
    found = _aligned(ledger, steps, {"data_ms": steps["data_ms"]})["data_ms"]
    return _known(np.asarray(found, dtype=float))


def _fit(time_ms: np.ndarray, categories: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each step's categories within its time (``time_ms``), by column: what its ranks share, and communication the
    rest; where what they share adds up to more (the ranks' steps are not cut at the same instant), scaled to fit."""
    known = sum(categories.values(), np.zeros(len(time_ms)))
    scale = np.where(known > time_ms, np.divide(time_ms, known, out=np.zeros(len(time_ms)), where=known > 0), 1.0)
    return {column(c): categories[c] * scale if c != COMMUNICATION else np.clip(time_ms - known, 0.0, None)
            for c in STEP_CATEGORIES}


@dataclass
class JobTime:
    """The run's wall time by category (seconds, adding up to ``wall_s``), the start-up's segments, and the
    steps it was judged on."""

    wall_s: float
    seconds: dict[str, float]  # category -> seconds, in CATEGORIES' order
    startup: dict[str, float] = field(default_factory=dict)  # segment -> seconds, adding up to seconds["startup"]
    per_step_ms: dict[str, float] = field(default_factory=dict)  # step category -> its mean over the steady steps
    steady_steps: int = 0
    warmup_steps: int = 0
    step_ms: float = 0.0  # the median steady step
    launched_at: float | None = None  # Unix seconds, on the run's clock
    ended_at: float | None = None
    finished: bool = True  # False: a running job's window (no teardown yet)

    @property
    def goodput(self) -> float:
        """The share of the wall time spent computing."""
        return self.seconds[COMPUTE] / self.wall_s if self.wall_s > 0 else 0.0

    def share(self, category: str) -> float:
        """A category's share of the wall time."""
        return self.seconds[category] / self.wall_s if self.wall_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        """report.json's ``job_time``."""
        d = asdict(self)
        d["goodput"] = round(self.goodput, 4)
        d["seconds"] = {k: round(v, 4) for k, v in self.seconds.items()}
        d["startup"] = {k: round(v, 4) for k, v in self.startup.items()}
        d["per_step_ms"] = {k: round(v, 3) for k, v in self.per_step_ms.items()}
        d["wall_s"], d["step_ms"] = round(self.wall_s, 4), round(self.step_ms, 3)
        return d


def totals(t: Tables, steady_steps: list[int], finished: bool = True) -> JobTime | None:
    """The run's wall time by category, from its job steps (``t.job_steps``) and ``steady_steps`` (the steps
    after warm-up), its launch and end (the manifest's; a running job ends at its last step) and the ranks'
    start-up times; None without steps."""
    steps = t.job_steps
    if steps.empty:
        return None
    first, last = float(steps["start"].min()), float(steps["end"].max())
    launched = _when(t.manifest.get("started_at"), first)
    ended = max(_when(t.manifest.get("ended_at") if finished else None, last), last)
    steady = steps[steps["step"].isin(steady_steps)] if steady_steps else steps
    warm = steps[steps["step"] < steady["step"].min()]
    begun = float(warm["end"].max()) if len(warm) else first  # the steady steps' timeline begins here
    step_ms = float(steady["time_ms"].median())
    startup = _segments(t, min(launched, begun), begun)
    # The warm-up steps did train: what they would have taken as steady steps is the steps' time, not start-up.
    credit = min(len(warm) * step_ms / 1e3, startup[FIRST_STEPS])
    startup[FIRST_STEPS] -= credit
    steady_s = {c: float(steady[column(c)].sum()) / 1e3 for c in STEP_CATEGORIES}
    steady_total = sum(steady_s.values())
    seconds = {c: steady_s[c] + (credit * steady_s[c] / steady_total if steady_total > 0 else 0.0)
               for c in STEP_CATEGORIES}
    seconds[STARTUP] = sum(startup.values())
    seconds[TEARDOWN] = max(ended - last, 0.0)
    # Launch to end, whole: the steps lie end to end from the warm-up's end (time_ms, build()).
    per_step = {c: v * 1e3 / len(steady) for c, v in steady_s.items()}
    return JobTime(wall_s=sum(seconds.values()), seconds=seconds, startup=startup, per_step_ms=per_step,
                   steady_steps=len(steady),
                   warmup_steps=len(warm), step_ms=step_ms, launched_at=launched, ended_at=ended, finished=finished)


def _segments(t: Tables, launched: float, begun: float) -> dict[str, float]:
    """The start-up's segments (seconds): from the launch to each time the ranks recorded (their median, on the
    run's clock), within the start-up; the last to the warm-up's end."""
    edges, names = [launched], []
    for name, key in SEGMENT_ENDS:
        times = [float(info[key]) + t.clock_shifts_us.get(rank, 0.0) / 1e6
                 for rank, info in t.rank_starts.items() if isinstance(info.get(key), (int, float))]
        if times:
            edges.append(min(max(float(np.median(times)), edges[-1]), begun))
            names.append(name)
    edges.append(max(begun, edges[-1]))
    names.append(FIRST_STEPS)
    return dict(zip(names, np.diff(edges).tolist()))


def _when(value: Any, default: float) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default
