"""The recorded runs (tests/recorded.py) are judged as when they were recorded: their golden verdicts.

A change of judgement that changes one on purpose rewrites them (python tests/fixtures/recorded_runs/record.py
--golden) and says why in its commit; any other change of a verdict here is a regression.
"""

from __future__ import annotations

import json

import pytest
from recorded import GOLDEN, RECORDINGS, RUNS, copy_run, verdicts

from diagtrain.profiler.analyzer.analyze import analyze


@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_a_recorded_run_gives_its_golden_verdicts(tmp_path, name):
    run = copy_run(name, tmp_path / name)
    report = analyze(run, run, ["json"], workers=1)
    assert verdicts(report) == json.loads((RUNS / name / GOLDEN).read_text())


def test_every_recording_is_in_the_repository_with_its_golden_verdicts():
    assert sorted(p.name for p in RUNS.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(RECORDINGS)
    for name in RECORDINGS:
        assert (RUNS / name / GOLDEN).is_file() and (RUNS / name / "ranks").is_dir(), name
        assert not (RUNS / name / "analysis").exists(), f"{name}: recorded with its analysis"
