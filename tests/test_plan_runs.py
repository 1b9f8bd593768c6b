"""The plan's model against real pipeline runs: exact state and collectives, the bubble as lived, what-ifs,
and a run whose configuration does not say how it was split."""

from __future__ import annotations

import json
import shutil

import pytest

from diagtrain.profiler.analyzer.analyze import analyze
from diagtrain.profiler.cli import main
from model_checks import assert_matches_the_model

pytestmark = pytest.mark.jobs  # every test here starts processes (tests/conftest.py)

BUBBLE_TOLERANCE = 0.12  # sends, receives and the schedule's own work on a shared 2-core host


@pytest.fixture(scope="module")
def pipeline_run(pipeline_job):
    return pipeline_job.out


def test_a_pipeline_run_matches_the_model_and_lives_its_bubble(pipeline_run):
    section = assert_matches_the_model(pipeline_run)
    sends = [r for r in section["collectives"] if r["op"] == "send"]
    assert sends and all(r["group"] == "pp" and r["bytes"] == 8 * 32 * 128 * 4 for r in sends)  # one microbatch of 8
    b = section["bubble"]
    assert b["formula"] == pytest.approx(0.5) and b["with_stage_times"] == pytest.approx(0.5)
    assert b["measured"] == pytest.approx(0.5, abs=BUBBLE_TOLERANCE)
    md = (pipeline_run / "report.md").read_text()
    assert "### Expected vs measured" in md and "formula 50%" in md


def test_plan_from_the_run_answers_what_ifs(pipeline_run, capsys):
    assert main(["plan", "--from", str(pipeline_run), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["current"]["layout"]["pp"] == 2 and doc["model"]["parameters"] > 0
    assert doc["measured"]["pipeline_bubble"] == pytest.approx(0.5, abs=BUBBLE_TOLERANCE)
    answers = {a["change"]: a for a in doc["what_if"]}
    more = answers["4 microbatches"]  # the fewest that bring the bubble to 20%
    assert "With 4 microbatches the bubble falls from 50% to 20%" in more["answer"]
    assert more["step_ms"] < doc["measured"]["step_s"] * 1e3
    assert answers["8 microbatches"]["estimate"]["bubble"] == pytest.approx(1 / 9)
    assert main(["plan", "--from", str(pipeline_run), "--gpus", "4", "--gpu", "a100-80gb"]) == 0
    text = capsys.readouterr().out
    assert "### What if" in text and "as the run measured" in text and "| 1 |" in text


def test_the_dashboard_shows_the_comparison(pipeline_run):
    from diagtrain.dashboard import expected
    from diagtrain.dashboard.data import load

    run = load(pipeline_run)
    state, _ = expected.state_table(run)
    calls, _ = expected.collectives_table(run)
    assert [r["match"] for r in state] == ["yes", "yes"]
    assert calls and {r["match"] for r in calls if r["purpose"]} == {"yes"}
    assert any("formula 50%" in line for line in expected.summary(run))
    assert len(expected.memory_figure(run)["data"]) == 4


def test_a_run_split_otherwise_than_its_configuration_says_is_a_finding(pipeline_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(pipeline_run, copy)
    trainer = json.loads((copy / "trainer.json").read_text())
    trainer["stage_layers"] = [3, 1]  # the run split its 4 layers 2 + 2
    (copy / "trainer.json").write_text(json.dumps(trainer))
    doc = analyze(copy, copy, ["json"], workers=1)
    [f] = [f for f in doc["findings"] if f["kind"] == "state_mismatch"]
    assert f["severity"] == "warning" and f["ranks"] == [0, 1]
    assert {e["file"] for e in f["evidence"]} == {"ranks/0/parameters.json", "ranks/1/parameters.json"}
