"""Put ranks from several hosts on one clock.

Kineto's ``baseTimeNanoseconds`` gives each trace the wall clock of its host, which is right for
ranks of one host (one clock) but off by the hosts' clock skew across hosts. Collectives end at
nearly the same moment on every rank of a group, so a rank on another host whose collective end
times sit consistently early or late is shifted by that median offset.
"""

from __future__ import annotations

import pandas as pd

MIN_SHIFT_US = 500.0  # below this, offsets are collective jitter, not clock skew
MIN_MATCHED = 3  # collectives needed before a rank's offset is trusted


def offsets(collectives: pd.DataFrame, hosts: dict[int, str | None]) -> dict[int, float]:
    """Per rank on a host other than the reference rank's: µs to add to its times (if any)."""
    if collectives.empty or "group" not in collectives:
        return {}
    shared = collectives[collectives["ranks_seen"] > 1].assign(end=lambda c: c["ts"] + c["dur"])
    if shared.empty:
        return {}
    # The lowest rank's clock is the reference; compare with it in the collectives it shares.
    reference = int(shared["rank"].min())
    key = ["group", "op", "seq"]
    ref_ends = shared[shared["rank"] == reference].set_index(key)["end"]
    others = shared[shared["rank"] != reference].join(ref_ends.rename("ref_end"), on=key, how="inner")
    per_rank = (others["end"] - others["ref_end"]).groupby(others["rank"]).agg(["median", "size"])
    out = {}
    for rank, row in per_rank.iterrows():
        same_host = hosts.get(rank) == hosts.get(reference)
        if not same_host and row["size"] >= MIN_MATCHED and abs(row["median"]) >= MIN_SHIFT_US:
            out[int(rank)] = -float(row["median"])
    return out


def apply(shifts: dict[int, float], collectives: pd.DataFrame, steps: pd.DataFrame) -> None:
    """Shift the given ranks' collective and traced-step times, in place."""
    for rank, shift_us in shifts.items():
        collectives.loc[collectives["rank"] == rank, "ts"] += shift_us
        for column in ("trace_start", "trace_end"):
            if column in steps:
                steps.loc[steps["rank"] == rank, column] += shift_us / 1e6
    if shifts and not collectives.empty:
        order = collectives.sort_values("ts").groupby(["group", "op", "seq"], sort=False)["rank"].last()
        collectives["last_rank"] = collectives.set_index(["group", "op", "seq"]).index.map(order).to_numpy()
