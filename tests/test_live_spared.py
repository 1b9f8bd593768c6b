"""LiveJudge.spare_readers: what the wrapper's judge holds is left out of the collector's passes once per ranks read
first, not at every judgement (each freeze would also strand whatever cycles were alive then)."""

from __future__ import annotations

import gc
import json
from pathlib import Path

from live_helpers import append_step, two_ranks
from diagtrain.profiler.analyzer.judge.live_judge import LiveJudge
from diagtrain.profiler.run_dir import write_json_atomic


def test_objects_are_frozen_when_ranks_are_read_first_and_not_again_until_more_are(tmp_path: Path) -> None:
    start = two_ranks(tmp_path)
    for step in range(1, 4):
        for rank in (0, 1):
            append_step(tmp_path, rank, step, start, 0.0, 0.0)
    judge = LiveJudge(tmp_path)
    assert gc.get_freeze_count() == 0  # nothing else in the tests freezes and keeps it so
    try:
        judge.judge()
        judge.spare_readers()
        first = gc.get_freeze_count()
        assert first > 0 and judge.held_readers() == 2

        for rank in (0, 1):
            append_step(tmp_path, rank, 4, start, 0.0, 0.0)
        judge.judge()
        judge.spare_readers()
        again = gc.get_freeze_count()
        assert again <= first  # the same ranks: nothing frozen again (some frozen were freed since)

        folder = tmp_path / "ranks" / "2"  # a third rank starts late
        folder.mkdir()
        write_json_atomic(folder / "rank.json", {"rank": 2, "world_size": 3, "host": "h", "pid": 1})
        with open(folder / "steps.jsonl", "w") as f:
            f.write(json.dumps({"rank": 2, "step": 4, "start": start, "end": start + 0.1, "duration_ms": 100.0,
                                "phases_ms": {"forward": 40.0}}) + "\n")
        judge.judge()
        judge.spare_readers()
        assert judge.held_readers() == 3 and gc.get_freeze_count() > again
    finally:
        gc.unfreeze()
