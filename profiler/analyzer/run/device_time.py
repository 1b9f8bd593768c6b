"""The device's view of each rank's step (CUDA events, NCCL's collective timing) as step-table columns.

On NCCL, ``Work.wait()`` and DDP's reducer return once a collective is queued on a CUDA stream: the
host runs ahead, every rank's host step lasts the same and its time blocked in collectives
(``comm_wait_ms``) is about 0. The device's timings say who waited for whom. A rank's step records
carry them for earlier steps, once their CUDA events completed (docs/run-directory.md):

- ``device_steps``: the device's step time and its idle time before the step (waiting for its host);
- ``device_colls``: each collective's time on the device, which includes its wait for the last peer to
  arrive. The group's shortest (same group and sequence number, across ranks) is the transfer; a rank's
  wait is its time beyond that, and the rank with the shortest arrived last.
- ``device_colls_lost``: the steps whose collectives the flight recorder's ring overwrote before the rank
  read them: that rank's waits in those steps are unknown, not zero.

Per rank and step this gives ``device_step_ms``, ``device_idle_ms``, ``device_comm_wait_ms`` (its waits
summed: ``comm_wait_ms`` on a GPU) and ``last_arrivals``, and ``time_source``: "device" where the whole
step was timed on the devices, else "host".
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.read.flight_records import Entry
from diagtrain.profiler.analyzer.read.run_files import DEVICE_LISTS, DeviceRecord, device_record
from diagtrain.profiler.run_dir import GroupKeys

DEVICE, HOST = "device", "host"  # the values of ``time_source``
DEVICE_COLUMNS = ("device_step_ms", "device_idle_ms", "device_comm_wait_ms", "last_arrivals")
STEP_FIELDS = ["rank", "step", "step_ms", "idle_before_ms"]
COLL_FIELDS = ["rank", "step", "group", "seq", "op", "ms"]
LOST_FIELDS = ["rank", "first_step", "last_step", "entries"]


def records_of(steps: pd.DataFrame) -> list[DeviceRecord]:
    """The device timings the step table's rows carry (run_files.device_lists), as records."""
    if not any(c in steps for c in DEVICE_LISTS):
        return []
    lists = [steps[c] if c in steps else pd.Series(None, index=steps.index, dtype=object) for c in DEVICE_LISTS]
    return [(int(r), *found) for r, *found in zip(steps["rank"], *lists) if any(_listed(x) for x in found)]


def records_of_rows(rank: int, rows: Iterable[dict[str, Any]], flushed: dict[str, list]) -> list[DeviceRecord]:
    """The device timings of one rank's step rows as read (dicts) and of its end-of-run line (``flushed``)."""
    found = [device_record(rank, row) for row in rows if any(name in row for name in DEVICE_LISTS)]
    return found + ([device_record(rank, flushed)] if flushed else [])


def _listed(value: Any) -> bool:
    return isinstance(value, (list, np.ndarray)) and len(value) > 0


def timings(records: list[DeviceRecord]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The device steps (rank, step, step_ms, idle_before_ms), collectives (rank, step, group, seq, op, ms) and
    lost collectives' steps (rank, first_step, last_step, entries) of the records; a timing read twice (a
    restarted job) counts once, the later one."""
    steps_table = _entries(records, 1, STEP_FIELDS).drop_duplicates(["rank", "step"], keep="last")
    colls_table = _entries(records, 2, COLL_FIELDS).drop_duplicates(["rank", "group", "seq"], keep="last")
    return steps_table, colls_table, _entries(records, 3, LOST_FIELDS)


def _entries(records: list[DeviceRecord], at: int, fields: list[str]) -> pd.DataFrame:
    """The entries of each record's list ``at`` as a table, with their record's rank: one list of every entry,
    the ranks repeated by count (a dict per entry cost most of this at 100,000 collectives)."""
    lists = [(r[0], r[at]) for r in records if _listed(r[at])]
    entries = [e for _, entries in lists for e in entries]
    table = pd.DataFrame.from_records(entries, columns=fields[1:]) if entries else pd.DataFrame(columns=fields[1:])
    table.insert(0, "rank", np.repeat([rank for rank, _ in lists], [len(e) for _, e in lists]).astype("int64"))
    return table


def keyed_groups(colls: pd.DataFrame, groups: dict[int, dict]) -> pd.DataFrame:
    """Groups keyed by their members where the rank's process groups say them (as the flight records are,
    flight_records.keyed_by_members): subgroups of one DeviceMesh dimension share a name."""
    if colls.empty or not groups:
        return colls
    pairs = colls[["rank", "group"]].drop_duplicates()
    key = GroupKeys()  # the world's group, in every rank's groups: written once, not once a rank
    keys = {(r, g): key(g, info["ranks"]) for r, g in zip(pairs["rank"], pairs["group"])
            if (info := (groups.get(int(r)) or {}).get(g)) and info.get("ranks")}
    if not keys:
        return colls
    keyed = pd.Series([keys.get(k) for k in zip(colls["rank"], colls["group"])], index=colls.index, dtype=object)
    return colls.assign(group=keyed.fillna(colls["group"]))


def flight_record_timings(entries: list[Entry], steps: pd.DataFrame) -> pd.DataFrame:
    """Collectives with a device duration in the flight records (TORCH_NCCL_ENABLE_TIMING=1), each in the
    rank's step whose host [start, end] holds its creation (entries outside every step are left out)."""
    timed = [(e.rank, e.pg, e.seq, e.op, e.duration_ms, e.created_ns / 1e9) for e in entries if e.duration_ms is not None]
    if not timed or steps.empty or "start" not in steps:
        return pd.DataFrame(columns=COLL_FIELDS)
    found = pd.DataFrame(timed, columns=["rank", "group", "seq", "op", "ms", "unix"]).astype({"rank": "int64"})
    spans = steps[["rank", "step", "start", "end"]].dropna().astype({"rank": "int64"}).sort_values("start")
    joined = pd.merge_asof(found.sort_values("unix"), spans, left_on="unix", right_on="start", by="rank",
                           direction="backward")
    joined = joined[joined["unix"] <= joined["end"]]
    return joined.astype({"step": "int64"})[COLL_FIELDS]


def collective_waits(colls: pd.DataFrame) -> pd.DataFrame:
    """Per rank and step: ``device_comm_wait_ms`` (its collectives' time beyond their group's shortest) and
    ``last_arrivals`` (how many of them it arrived last at: the shortest of its group). A collective not
    timed on every member the group was seen with gives no transfer: a step with one has an unknown wait.
    All collectives at once (this runs in every live judgement): a groupby over (group, seq), no loop."""
    if colls.empty:
        return pd.DataFrame({"rank": pd.Series(dtype="int64"), "step": pd.Series(dtype="int64"),
                             "device_comm_wait_ms": pd.Series(dtype=float), "last_arrivals": pd.Series(dtype=float)})
    ms = colls["ms"].astype(float)
    by_call = colls.groupby(["group", "seq"], sort=False)
    members = by_call["rank"].transform("nunique")
    complete = members == members.groupby(colls["group"]).transform("max")
    wait = (ms - by_call["ms"].transform("min")).where(complete)
    last = pd.Series(0, index=colls.index)
    last.loc[ms.groupby([colls["group"], colls["seq"]], sort=False).idxmin()] = 1  # the first of a tie
    per_step = pd.DataFrame({"rank": colls["rank"].astype("int64"), "step": colls["step"].astype("int64"), "wait": wait,
                             "unknown": wait.isna(), "last": last.where(complete, 0)})
    out = per_step.groupby(["rank", "step"], sort=False).agg(device_comm_wait_ms=("wait", "sum"),
                                                             unknown=("unknown", "max"),
                                                             last_arrivals=("last", "sum")).reset_index()
    out.loc[out["unknown"].astype(bool), "device_comm_wait_ms"] = np.nan
    return out.drop(columns="unknown")


def with_device_time(steps: pd.DataFrame, device_steps: pd.DataFrame, colls: pd.DataFrame,
                     lost: pd.DataFrame | None = None) -> pd.DataFrame:
    """The step table with the device's columns and ``time_source`` (its rows' raw device lists dropped);
    unchanged where no rank timed anything on a device (CPU runs read as before). ``lost``: the steps of a rank
    whose collectives its flight recorder lost (LOST_FIELDS), whose waits are unknown."""
    steps = steps.drop(columns=[c for c in DEVICE_LISTS if c in steps])
    if steps.empty or (device_steps.empty and colls.empty):
        return steps
    own = device_steps.rename(columns={"step_ms": "device_step_ms", "idle_before_ms": "device_idle_ms"})
    merged = steps.merge(own.astype({"rank": "int64", "step": "int64"}), on=["rank", "step"], how="left") \
        .merge(collective_waits(colls), on=["rank", "step"], how="left")
    # A step the device timed without a collective in it waited for nobody, on a rank whose collectives are
    # timed at all (without NCCL's timing, or on gloo, its waits are unknown: the host's view stands).
    timed = merged["device_step_ms"].notna()
    no_calls = timed & merged["last_arrivals"].isna() & merged["rank"].isin(colls["rank"].unique())
    merged.loc[no_calls, ["device_comm_wait_ms", "last_arrivals"]] = 0.0
    merged.loc[_in_spans(merged, lost), ["device_comm_wait_ms", "last_arrivals"]] = np.nan
    # Ranks are compared within a step: one timed on the devices is compared on them only where all its ranks are.
    known = timed & merged["device_comm_wait_ms"].notna()
    whole = known.groupby(merged["step"]).transform("all")
    merged["time_source"] = np.where(whole, DEVICE, HOST)
    merged.index = steps.index
    return merged


def add_device_time(steps: pd.DataFrame, records: Iterable[DeviceRecord], flight_records: list[Entry] = (),
                    groups: dict[int, dict] | None = None) -> pd.DataFrame:
    """The step table with the device's columns, from the device timings of ``records`` and the flight records'
    timed collectives (those the step records hold win: the same collective, read as the rank wrote it)."""
    records = list(records)
    if not records and not any(e.duration_ms is not None for e in flight_records):
        return steps.drop(columns=[c for c in DEVICE_LISTS if c in steps])  # a CPU run: nothing to add
    device_steps, colls, lost = timings(records)
    colls = keyed_groups(colls, groups or {})
    recorded = flight_record_timings(list(flight_records), steps)
    if not recorded.empty:
        colls = pd.concat([colls, recorded], ignore_index=True).drop_duplicates(["rank", "group", "seq"], keep="first")
    return with_device_time(steps, device_steps, colls, lost)


def _in_spans(steps: pd.DataFrame, lost: pd.DataFrame | None) -> pd.Series:
    """Which rows are a step of their rank that a span of ``lost`` covers (a few spans a run: one mask each)."""
    covered = pd.Series(False, index=steps.index)
    for rank, first, last in ([] if lost is None else zip(lost["rank"], lost["first_step"], lost["last_step"])):
        covered |= steps["rank"].eq(rank) & steps["step"].between(first, last)
    return covered


def on_device(steps: pd.DataFrame) -> pd.Series:
    """Which rows were timed on the device (``time_source`` "device")."""
    return steps["time_source"].eq(DEVICE) if "time_source" in steps else pd.Series(False, index=steps.index)


def timed_on_device(steps: pd.DataFrame) -> pd.Series:
    """Which rows' steps their device timed (a CUDA rank's), whether or not their collectives were."""
    return steps["device_step_ms"].notna() if "device_step_ms" in steps else pd.Series(False, index=steps.index)


def latest_timed(steps: pd.DataFrame) -> dict[int, dict[str, float]]:
    """Per rank, the device's columns of its latest step timed on the devices (``device_step`` its number): a
    step's device times arrive a record or two after the step, so the newest step has none yet."""
    timed = steps[on_device(steps)]
    if timed.empty:
        return {}
    last = timed.sort_values("step").groupby("rank").tail(1)
    return {int(row["rank"]): {"device_step": int(row["step"]),
                               **{c: float(row[c]) for c in DEVICE_COLUMNS if c in row and pd.notna(row[c])}}
            for _, row in last.iterrows()}
