"""straggler's words (judge/detectors/straggler.py; a cause the ledger names and a rank doing more work than its
peers: report/words/ledger_price.py, report/words/contention.py)."""

from __future__ import annotations

from diagtrain.profiler.analyzer.judge.quantities import DeviceCause
from diagtrain.profiler.analyzer.report.words import Facts, Words
from diagtrain.profiler.util.text import ranges

DEVICE_WORDS = {
    DeviceCause.SLOW_DEVICE: " Measured on the device (CUDA events and NCCL's collective timing): its GPU is busy longer "
                             "than theirs for the same steps, and their collectives wait for it on the device.",
    DeviceCause.HOST_LATE: " Measured on the device (CUDA events and NCCL's collective timing): its GPU idled before "
                           "these steps waiting for its host, and the others' collectives wait for it on the device; its "
                           "GPU itself is not slower.",
}
DEVICE_SUGGESTIONS = {
    DeviceCause.SLOW_DEVICE: "Check rank {rank}'s GPU: its clocks and temperature (throttling), other processes on it, its "
                             "link to the others (PCIe, NVLink); or whether its share of the work is larger.",
    DeviceCause.HOST_LATE: "Look at what rank {rank}'s host does between its steps: data loading (workers, prefetching), "
                           "a checkpoint, logging or evaluation on that rank, Python work or garbage collection.",
}


def waiting(others: list[int]) -> str:
    """``ranks 0, 2 wait for it at the next collective``."""
    many = len(others) > 1
    return f"rank{'s' if many else ''} {ranges(others)} wait{'' if many else 's'} for it at the next collective"


def _when(f: Facts) -> str:
    """``in steps 3-5, 9`` or, for a cause with an onset, ``since step 100 (steps 100-200; ...)`` (the slow steps
    before it, left out, counted)."""
    if f["onset"] is None:
        return f"in steps {ranges(f['steps'])}"
    blips = f["blips"]
    before = f"; {blips} slow step{'s' if blips > 1 else ''} before it, now and then, left out" if blips else ""
    return f"since step {f['onset']} (steps {ranges(f['steps'])}{before})"


def _explanation(f: Facts) -> str:
    cause = DeviceCause(f["cause"]) if f["cause"] else None
    return (f"rank {f['ranks'][0]} is a straggler {_when(f)}: {f['phase']} {f['value_ms']:.1f} ms, {f['excess_ms']:.1f} ms "
            f"more than its peers' {f['peer_ms']:.1f} ms; {waiting(f['others'])}."
            + DEVICE_WORDS.get(cause, "")
            + (f" It does the same work as they do ({f['work_ratio']:.2f}x their matrix-multiply FLOPs): its compute is "
               "slower, not larger (other processes on its host, a slower or throttled device)." if f["same_work"] else ""))


def _suggestion(f: Facts) -> str:
    rank = f["ranks"][0]
    if f["cause"]:
        return DEVICE_SUGGESTIONS[DeviceCause(f["cause"])].format(rank=rank)
    return (f"Look at what rank {rank} does differently there ({f['phase']}): its host or GPU (throttling, other "
            "processes), its data (larger samples), or code that runs only on that rank.")


WORDS = {"straggler": Words(_explanation, _suggestion)}
