"""dataloader_stall's words (judge/detectors/dataloader_stall.py; those of a stall the ledger names:
report/words/ledger_price.py)."""

from __future__ import annotations

from diagtrain.profiler.analyzer.report.words import Facts, Words
from diagtrain.profiler.util.text import ranges


def _explanation(f: Facts) -> str:
    """One rank's stalls, its peers waiting for it; or every rank's at once."""
    alone = len(f["ranks"]) == 1
    listed, every = ranges(f["steps"]), f["every"]
    said_every = every and "every" not in listed  # a long list, summarised, says its period itself
    who = f"rank {f['ranks'][0]} waits" if alone else "every rank waits, in the same steps,"
    after = ("the other ranks wait for it at the next collective" if alone else
             "the job waits for its input there, not one rank for another")
    return (f"{who} {f['stall_ms']:.0f} ms for data in steps {listed}" + (f" (every {every} steps)" if said_every else "")
            + f", against {f['typical_ms']:.1f} ms typically; {after}.")


WORDS = {"dataloader_stall": Words(
    _explanation,
    "Give the data loader more workers or prefetching (num_workers, prefetch_factor, pin_memory), and check that "
    "rank's storage or preprocessing for periodic slow reads.")}
