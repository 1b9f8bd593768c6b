"""The words of a cause the ledger charged that no detector named (judge/assessments/ledger_price.py): a straggler
or a data stall, case "ledger"."""

from __future__ import annotations

from diagtrain.profiler.analyzer.judge.assessments.ledger_price import EVERY_STEP, INTERMITTENT
from diagtrain.profiler.analyzer.report.words import Facts, Words
from diagtrain.profiler.analyzer.report.words.straggler import waiting
from diagtrain.profiler.analyzer.run.ledger import DEVICE_BUSY, DEVICE_IDLE, OUTSIDE
from diagtrain.profiler.util.text import ranges


def part_words(part: str) -> str:
    """A ledger part in a sentence ("rank 3's ..."): a phase, work outside them, or the device's time."""
    return {OUTSIDE: "work outside its recorded phases", DEVICE_BUSY: "time busy on the device (its GPU)",
            DEVICE_IDLE: "device idle time before its steps (its GPU waiting for its host)"}.get(part, f"{part} phase")


def _when(f: Facts) -> str:
    pattern, steps = f["pattern"], f["steps"]
    when = ("in every step" if pattern == EVERY_STEP else f"in steps {ranges(steps)}" if pattern == INTERMITTENT
            else f"{pattern} (steps {ranges(steps)})")
    return when + (f" since step {f['onset']}" if f["onset"] is not None else "")


def _explanation(f: Facts) -> str:
    return (f"rank {f['ranks'][0]}'s {part_words(f['part'])} takes {f['own_ms']:.1f} ms against its peers' "
            f"{f['peer_ms']:.1f} ms {_when(f)}; {waiting(f['others'])}"
            + (" (measured on the device: CUDA events and NCCL's collective timing)" if f["on_device"] else "") + ".")


WORDS = {
    "straggler/ledger": Words(
        _explanation,
        lambda f: (f"Look at what rank {f['ranks'][0]} does in its {part_words(f['part'])} {_when(f)} that its peers do "
                   "not: a checkpoint, an evaluation or logging on one rank, garbage collection, a slower device or "
                   "host.")),
    "dataloader_stall/ledger": Words(
        _explanation,
        lambda f: (f"Make rank {f['ranks'][0]}'s data loading keep up: more DataLoader workers, prefetching, or a faster "
                   "dataset (__getitem__) on that rank.")),
}
