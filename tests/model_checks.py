"""Hold a real run against the plan's model: what `diagtrain analyze` wrote in its expected-vs-measured section."""

from __future__ import annotations

import json
from pathlib import Path

from diagtrain.profiler.analyzer.judge.model_check.expected import Expected

MODEL_FINDINGS = {"state_mismatch", "unexpected_communication"}


def expected_section(run: Path) -> dict:
    """The run's expected-vs-measured section, analyzing it first when it has no report."""
    if not (run / "report.json").exists():
        from diagtrain.profiler.analyzer.analyze import analyze

        analyze(run, run, ["json"], workers=1)
    report = json.loads((run / "report.json").read_text())
    assert not [f for f in report["findings"] if f["kind"] in MODEL_FINDINGS], report["findings"]
    return report["expected"]


def assert_matches_the_model(run: Path) -> dict:
    """Every rank holds exactly the parameters its layout gives it, and every profiled step has exactly
    the collectives (op, bytes, calls) the layout implies; besides them only a job's own few bytes
    (the reference trainers' loss all-reduce, object broadcasts) that no layout has."""
    section = expected_section(run)
    assert section["available"] and section["exact_layout"]
    for row in section["state"]:
        assert row["held_parameters"] == row["expected_parameters"], row
        assert row["held_state_bytes"] == row["expected_state_bytes"], row
    modeled = [r for r in section["collectives"] if r["expected_calls"]]
    assert modeled, "no collective of the layout in the profiled steps"
    for row in section["collectives"]:
        if row["expected_calls"]:
            assert row["measured_calls"] == row["expected_calls"], row
        else:
            assert row["measured_calls"] * row["bytes"] < Expected.active().small_bytes, row
    return section
