"""Collectives matched across ranks: who arrived last, and a group's key held once for all its rows
(at 1,024 ranks a key names 1,024 members, and a copy per row held gigabytes)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given
from hypothesis import strategies as st

from diagtrain.profiler.analyzer.per_rank.collectives import last_to_arrive, match
from diagtrain.profiler.run_dir import group_key, group_members

RANKS = 64
CALLS = 50


def rank_rows(rank: int, members: tuple[int, ...]) -> pd.DataFrame:
    """One rank's all-reduces as rank_collectives gives them: its rows share one members tuple.
    Rank (seq % RANKS) arrives last at collective ``seq``, 1 ms after the others."""
    seq = np.arange(CALLS)
    late = (seq % RANKS) == rank
    return pd.DataFrame({
        "rank": rank, "pg": "0", "pg_desc": "default_pg", "group_ranks": [members] * CALLS, "op": "all_reduce",
        "seq": seq, "ts": seq * 100.0 + late * 1000.0, "dur": 2000.0 - late * 1000.0, "bytes": 4096.0,
        "issued_ts": np.nan, "issue_gap_us": np.nan, "is_p2p": False})


def test_a_groups_key_is_one_object_for_all_its_rows_and_the_last_rank_is_found():
    members = tuple(range(RANKS))
    table = match(pd.concat([rank_rows(r, members) for r in range(RANKS)], ignore_index=True))
    # A pointer per row to one key (and one members tuple) per group, not the key's bytes per row.
    assert table["group"].dtype == object and len({id(k) for k in table["group"]}) == 1
    assert len({id(m) for m in table["group_ranks"]}) == 1 and table["group_ranks"].iloc[0] == members
    assert table.memory_usage(deep=False)["group"] == 8 * len(table)
    assert (table["last_rank"] == table["seq"] % RANKS).all()
    assert (table["ranks_seen"] == RANKS).all() and (table["transfer_us"] == 1000.0).all()


def test_last_to_arrive_leaves_out_rows_that_cannot_be_matched():
    t = pd.DataFrame({"group": np.array(["a", "a", "a", "b", "b", None, "c", "d"], dtype=object), "op": "x",
                      "seq": [1, 1, 1, 2, 2, 3, np.nan, 4], "arrived_ts": [5.0, 9.0, 7.0, 1.0, np.nan, 3.0, 4.0, 2.0],
                      "rank": [0, 1, 2, 0, 1, 0, 1, 3]})
    shared = pd.Series([True] * 7 + [False])
    last = last_to_arrive(t, shared).tolist()
    # b: rank 1's arrival is unknown; no group, no sequence number, one rank alone: no last rank.
    assert last[:4] == [1.0, 1.0, 1.0, 0.0] and all(np.isnan(x) for x in last[4:])
    assert last_to_arrive(t.iloc[:0], shared.iloc[:0]).empty


@given(st.lists(st.integers(0, 5000), max_size=40), st.sampled_from(["0", "mesh_dp", "a:b"]))
def test_a_group_key_gives_back_its_members(members, pg):
    assert group_members(group_key(pg, tuple(members))) == tuple(members)


def test_group_keys_of_whole_meshes_stay_short():
    """Every groupby on the key hashes it whole for each row: it must not list 1,024 ranks."""
    assert group_key("0", tuple(range(1024))) == "0:0-1023"
    assert group_key("mesh_dp", tuple(range(3, 1024, 8))) == "mesh_dp:3-1019/8"
    assert group_key("0", (0, 1)) == "0:0,1"  # two ranks: as before
    assert group_members("0:0,1,2,3") == (0, 1, 2, 3)  # keys written before ranges were


def test_a_call_takes_only_a_flight_recorder_entry_of_its_own_kind():
    """gloo: a send (which records no entry) ran just before an all-gather whose entry was created 0.2 ms after the
    send began, within the slack: the send took it and the all-gather was left unnamed (a 3D job's flaky count)."""
    from diagtrain.profiler.analyzer.per_rank.collectives import op_kind
    from diagtrain.profiler.analyzer.per_rank.host_calls import flight_recorder_entries

    calls = pd.DataFrame({"name": ["c10d::send", "c10d::_allgather_base_", "c10d::_reduce_scatter_base_", "c10d::barrier"],
                          "ts": [1000.0, 1207.0, 5000.0, 9000.0], "end": [1036.0, 1307.0, 5100.0, 9050.0]})
    entries = pd.DataFrame({"profiling_name": ["gloo:all_gather", "gloo:all_reduce", "gloo:all_reduce"],
                            "created_us": [1228.0, 5010.0, 9010.0]})
    kinds = [np.array([op_kind(n) for n in names], dtype=np.int64)
             for names in (calls["name"], entries["profiling_name"])]
    # The all-gather its own entry; the reduce-scatter gloo's all-reduce (it runs as one); a barrier any.
    assert flight_recorder_entries(calls, entries, *kinds).tolist() == [-1, 0, 1, 2]
