"""A long run's findings stay readable (issue 62): whatever the number of steps and however a fault comes and
goes, every explanation is bounded and its step lists are summarised, not listed."""

from __future__ import annotations

import re

from synthetic_runs import job_run

from diagtrain.profiler.analyzer.analyze import analyze

STEPS = 20_000
MAX_EXPLANATION_CHARS = 2000


def fault(rank: int, step: int) -> dict[str, float]:
    """Rank 1 slow in forward in 27 bursts of 25 steps (every 500 steps from step 1,000 to 14,000), and in every
    step from step 15,003 (not a 7th: there rank 0's stall comes first); rank 0's data loading slow every 7th step."""
    extra = {"data": 30.0} if rank == 0 and step % 7 == 0 else {}
    if rank == 1 and (step >= 15_003 or (1_000 <= step <= 14_100 and (step - 1_000) % 500 < 25)):
        extra["forward"] = 60.0
    return extra


def test_a_long_run_with_a_fault_that_comes_and_goes_is_said_in_bounded_words(tmp_path):
    run = job_run(tmp_path / "run", fault, steps=STEPS)
    report = analyze(run, tmp_path / "out", ["json"], workers=1)
    kinds = {f["kind"] for f in report["findings"]}
    assert {"straggler", "dataloader_stall"} <= kinds, kinds
    for f in report["findings"]:
        assert len(f["explanation"]) < MAX_EXPLANATION_CHARS, (f["kind"], len(f["explanation"]))
        # No list of steps of more than a dozen numbers: a list is summarised as its first, its last and its count.
        longest = max((len(m.split(", ")) for m in re.findall(r"\d+(?:, \d+)+", f["explanation"])), default=0)
        assert longest <= 12, (f["kind"], f["explanation"][:300])
    stall = next(f for f in report["findings"] if f["kind"] == "dataloader_stall")
    assert "7, 14, ..., 19999 (every 7, 2857 in all)," in stall["explanation"]  # the period said once
    straggler = next(f for f in report["findings"] if f["kind"] == "straggler")
    assert straggler["metrics"]["onset_step"] == 15_003 and "since step 15003" in straggler["explanation"]
