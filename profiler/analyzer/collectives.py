"""Collectives: one row per collective a rank ran, then matched across the ranks of its group.

On GPU traces the NCCL kernels (or ``record_param_comms``) carry the op, size, dtype and process
group. On CPU (gloo) traces the host ops carry only the op and the input shapes; the group and the
sequence number come from the flight-recorder dump, matched to each op by name and start time.
Matching across ranks is by (group, sequence within the group), so DP, TP and PP groups of a 3D
run are told apart. Bandwidth uses the nccl-tests factors.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.trace_file import COMM

DTYPE_BYTES = {"float": 4, "float32": 4, "c10::half": 2, "half": 2, "float16": 2, "c10::bfloat16": 2,
               "bfloat16": 2, "double": 8, "float64": 8, "int": 4, "int32": 4, "long int": 8, "int64": 8,
               "long": 8, "unsigned char": 1, "uint8": 1, "char": 1, "int8": 1, "bool": 1, "signed char": 1}
# nccl-tests bus-bandwidth factors, by op, as a function of the group size n.
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
}
# Ops whose nccl-tests size is the whole (gathered) buffer: count x element size x ranks.
WHOLE_BUFFER_OPS = {"all_gather", "reduce_scatter", "all_to_all"}
FR_MATCH_TOLERANCE_US = 5_000  # a flight-recorder entry is created within this of the op's start
_OP_ALIASES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
               "all_gather_into_tensor": "all_gather", "_allgather_base": "all_gather",
               "reduce_scatter_tensor": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
               "alltoall": "all_to_all", "all_to_all_single": "all_to_all", "alltoall_base": "all_to_all",
               "sendrecv": "send_recv"}
_KERNEL_OP = re.compile(r"^(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)", re.IGNORECASE)
COLUMNS = ["rank", "pg", "pg_desc", "group_ranks", "op", "seq", "ts", "dur", "bytes"]


def normalize_op(name: str) -> str:
    """``gloo:all_reduce``, ``allreduce``, ``ncclDevKernel_AllReduce_...`` → ``all_reduce``."""
    m = _KERNEL_OP.match(name)
    if m:
        name = re.sub(r"(?<!^)([A-Z])", r"_\1", m.group(1)).lower()
    name = name.split(":", 1)[-1].split("::", 1)[-1].rstrip("_").lower()
    name = name.split(" ")[0]
    return _OP_ALIASES.get(name, name)


def rank_collectives(events: pd.DataFrame, rank: int, epoch_offset_us: int, pg_config: list[dict],
                     flight_recorder: dict | None) -> pd.DataFrame:
    """This rank's collectives, one row each, with epoch-µs start times."""
    gpu = events[(events["kind"] == COMM) & (events["stream"] >= 0)]
    if len(gpu):
        table = _from_kernels(gpu)
    else:
        table = _from_host_ops(events[(events["kind"] == COMM) & (events["stream"] < 0)], flight_recorder,
                               epoch_offset_us)
    if table.empty:
        return pd.DataFrame(columns=COLUMNS)
    table["ts"] = table["ts"] + epoch_offset_us
    table["rank"] = rank
    groups = {str(g.get("pg_name")): g for g in pg_config}
    table["group_ranks"] = [tuple(groups.get(pg, {}).get("ranks") or ()) for pg in table["pg"]]
    table["pg_desc"] = [groups.get(pg, {}).get("pg_desc") or desc for pg, desc in zip(table["pg"], table["pg_desc"])]
    missing = table["seq"].isna()
    if missing.any():  # no sequence numbers: order within (group, op) on this rank
        table.loc[missing, "seq"] = table[missing].groupby(["pg", "op"]).cumcount() + 1
    table["seq"] = table["seq"].astype(int)
    return table[COLUMNS]


def _from_kernels(kernels: pd.DataFrame) -> pd.DataFrame:
    sizes = np.array([DTYPE_BYTES.get(str(d).lower(), np.nan) for d in kernels["dtype"]])
    ops = [normalize_op(c) if c else normalize_op(str(n)) for c, n in zip(kernels["collective"], kernels["name"])]
    group = kernels["group_size"].to_numpy()
    nbytes = kernels["in_nelems"].to_numpy() * sizes
    whole = np.array([op in WHOLE_BUFFER_OPS for op in ops])
    nbytes = np.where(whole & (group > 0), nbytes * group, nbytes)
    return pd.DataFrame({"pg": [p or "?" for p in kernels["pg_name"]], "pg_desc": list(kernels["pg_desc"]),
                         "op": ops, "seq": np.nan, "ts": kernels["ts"].to_numpy(), "dur": kernels["dur"].to_numpy(),
                         "bytes": nbytes})


def _from_host_ops(ops: pd.DataFrame, flight_recorder: dict | None, epoch_offset_us: int) -> pd.DataFrame:
    # gloo:* is the collective itself; c10d::* wraps it (and record_param_comms annotates it).
    names = ops["name"].astype(str)
    top = ops[names.str.startswith("gloo:") | names.str.startswith("nccl:")]
    if top.empty:
        top = ops[names.str.startswith("c10d::")]
    table = pd.DataFrame({"name": top["name"].astype(str).to_numpy(), "op": [normalize_op(n) for n in top["name"].astype(str)],
                          "ts": top["ts"].to_numpy(), "dur": top["dur"].to_numpy(),
                          "bytes": [_bytes_from_shapes(d, t) for d, t in zip(top["input_dims"], top["input_type"])],
                          "pg": "?", "pg_desc": None, "seq": np.nan})
    if flight_recorder and not table.empty:
        _attach_flight_recorder(table, flight_recorder, epoch_offset_us)
    return table.drop(columns="name")


def _bytes_from_shapes(dims, types) -> float:
    if not dims:
        return np.nan
    total = 0.0
    for shape, dtype in zip(dims, types or []):
        if isinstance(shape, list) and shape and all(isinstance(x, int) for x in shape):
            total += float(np.prod(shape)) * DTYPE_BYTES.get(str(dtype).lower(), 4)
    return total or np.nan


def _attach_flight_recorder(table: pd.DataFrame, dump: dict, epoch_offset_us: int) -> None:
    """Give each host op the group and sequence of the flight-recorder entry created with it."""
    entries = pd.DataFrame(dump.get("entries") or [])
    if entries.empty:
        return
    entries["created_us"] = entries["time_created_ns"] / 1e3
    for name, rows in table.groupby("name"):
        cands = entries[entries["profiling_name"] == name].sort_values("created_us")
        if cands.empty:
            continue
        starts = rows["ts"].to_numpy() + epoch_offset_us
        created = cands["created_us"].to_numpy()
        pos = np.clip(np.searchsorted(created, starts), 1, len(created)) - 1
        nxt = np.clip(pos + 1, 0, len(created) - 1)
        best = np.where(np.abs(created[nxt] - starts) < np.abs(created[pos] - starts), nxt, pos)
        ok = np.abs(created[best] - starts) <= FR_MATCH_TOLERANCE_US
        chosen = cands.iloc[best[ok]]
        index = rows.index[ok]
        table.loc[index, "pg"] = [pg[0] for pg in chosen["process_group"]]
        table.loc[index, "pg_desc"] = [pg[1] for pg in chosen["process_group"]]
        table.loc[index, "seq"] = chosen["collective_seq_id"].to_numpy()
        sizes = [_fr_bytes(s, d) for s, d in zip(chosen["input_sizes"], chosen["input_dtypes"])]
        table.loc[index, "bytes"] = np.where(np.isnan(table.loc[index, "bytes"].astype(float)), sizes,
                                             table.loc[index, "bytes"].astype(float))


def _fr_bytes(sizes, dtypes) -> float:
    return _bytes_from_shapes(sizes, dtypes)


def match(collectives: pd.DataFrame) -> pd.DataFrame:
    """One row per (rank, collective) with the group's transfer time, each rank's wait, bandwidth."""
    if collectives.empty:
        return collectives.assign(transfer_us=[], wait_us=[], last_rank=[], algbw_gbps=[], busbw_gbps=[])
    table = collectives.copy()
    table["group"] = [f"{pg}:{','.join(map(str, r))}" for pg, r in zip(table["pg"], table["group_ranks"])]
    key = ["group", "op", "seq"]
    by = table.groupby(key, sort=False)
    table["transfer_us"] = by["dur"].transform("min")
    table["wait_us"] = table["dur"] - table["transfer_us"]
    last = table.sort_values("ts").groupby(key, sort=False)["rank"].last().rename("last_rank")
    table = table.merge(last, left_on=key, right_index=True, how="left")
    by = table.groupby(key, sort=False)
    table["ranks_seen"] = by["rank"].transform("nunique")
    size = table["group_ranks"].map(len).where(lambda s: s > 0, table["ranks_seen"])
    table["algbw_gbps"] = table["bytes"] / (table["transfer_us"] * 1e3)  # bytes/µs/1e3 = GB/s
    factor = np.array([BUS_FACTOR.get(op, lambda n: 1.0)(n) if n > 0 else 1.0 for op, n in zip(table["op"], size)])
    table["busbw_gbps"] = table["algbw_gbps"] * factor
    return table
