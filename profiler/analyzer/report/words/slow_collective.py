"""slow_collective's words (judge/detectors/slow_collective.py), by case: a rank late at its collectives, a group's
transfers slow against its twin groups', or often slow against its own best."""

from __future__ import annotations

from diagtrain.profiler.analyzer.report.words import Facts, Words


def _late_arrival(f: Facts) -> str:
    where = "; ".join(f"{g['late_share']:.0%} of its {g['collectives']} on the {g['group']} group, "
                      f"{g['lateness_ms']:.1f} ms after the first rank on average" for g in f["groups"])
    gap = f["extra_gap_ms"]
    paused = ("" if gap is None else f"; right before each call it pauses {gap:.1f} ms longer than its peers"
              if f["paused"] else "; it pauses no longer than its peers right before its calls")
    return (f"rank {f['ranks'][0]} arrives last at collectives: {where}{paused}; its peers wait about "
            f"{f['peer_wait_ms']:.1f} ms in each"
            + ("." if f["before_calls"] else ": the time is lost in its own work earlier in the step (a straggler), not "
               "on its way to the collectives."))


def _late_suggestion(f: Facts) -> str:
    rank = f["ranks"][0]
    if f["before_calls"]:
        return (f"The delay sits right before rank {rank}'s collective calls: look for work or synchronization it does "
                "before each collective (communication hooks, logging, a slow NIC or CPU affinity on its host).")
    return (f"Compare rank {rank}'s work before its first collective of a step with its peers' (profile a few steps "
            "with --profile-steps).")


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**20:.0f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.0f} KiB"


def _twin_groups(f: Facts) -> str:
    return (f"{f['busbw_gbps']:.2f} GB/s bus bandwidth, under {f['fraction']:.0%} of the {f['expected_busbw_gbps']:.2f} "
            f"GB/s the other {f['twin_label']} groups reach for the same op and size")


def _intermittent(f: Facts) -> str:
    return (f"{f['busbw_gbps']:.2f} GB/s bus bandwidth in {f['slow_transfers']} of {f['transfers']} transfers, under "
            f"{f['fraction']:.0%} of the {f['expected_busbw_gbps']:.2f} GB/s this group reaches at its best for that size")


def _bandwidth(measured) -> Words:
    """A group's transfers slow for their size, ``measured`` against what they are compared with."""
    def explanation(f: Facts) -> str:
        transports = f["transports"]
        return (f"{f['op']} of about {_size(f['bytes'])} on the {f['group']} group [{','.join(map(str, f['ranks']))}] "
                f"reach {measured(f)} (transfer time after the last rank arrived)"
                + (f"; NCCL connects these ranks via {', '.join(transports)}." if transports else "."))
    return Words(explanation, _bandwidth_suggestion)


def _bandwidth_suggestion(f: Facts) -> str:
    if f["on_gpu"]:
        return ("Check this group's links: the transport in its NCCL log (NET/Socket instead of IB or P2P?), contention "
                "from other jobs or other traffic, and the placement of its ranks.")
    return ("On CPU (gloo) transfer times follow the host's load: compare against a baseline (diagtrain compare) before "
            "acting on this.")


WORDS = {
    "slow_collective/late_arrival": Words(_late_arrival, _late_suggestion),
    "slow_collective/twin_groups": _bandwidth(_twin_groups),
    "slow_collective/intermittent": _bandwidth(_intermittent),
}
