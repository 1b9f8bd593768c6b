"""Expected vs measured on a run that records no model shape: it says what it measured and what it does
not know, and never borrows a well-known model's layers or hidden size (issue 37); a reference trainer's
run, whose trainer.json gives the shape, still shows it."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from diagtrain.profiler.analyzer.analyze import analyze
from model_checks import expected_section

pytestmark = pytest.mark.jobs  # every test here starts processes (tests/conftest.py)

MODEL_FINDINGS = {"state_mismatch", "unexpected_communication", "bubble_above_model", "memory_above_model",
                  "slow_collective_group"}
USER_DDP_PARAMS = 32 * 64 + 64 + 64 + 1  # tests/scripts/user_ddp.py's two linear layers


def expected_md(run) -> str:
    """report.md's expected-vs-measured section."""
    md = (run / "report.md").read_text()
    return re.split(r"\n#{1,3} ", md[md.index("### Expected vs measured"):])[0]


@pytest.fixture(scope="module")
def plain(user_run, tmp_path_factory):
    """user_run (a 2-rank DDP script that knows nothing of diagtrain) analyzed in a copy."""
    copy = tmp_path_factory.mktemp("unknowns") / "run"
    shutil.copytree(user_run.out, copy, ignore=shutil.ignore_patterns("analysis", "report.*"))
    return copy, analyze(copy, copy, ["json", "md"], workers=1)


def test_a_plain_script_gets_no_borrowed_shape(plain):
    run, report = plain
    e = report["expected"]
    assert e["available"] and not e["exact_layout"]
    m = e["model"]
    # What it measured: the size its gradient all-reduces moved (give or take its own few bytes), the layout.
    assert m["parameters_from"] == "gradient reductions" and 0 <= m["parameters"] - USER_DDP_PARAMS <= 4
    assert m["layout"] == "DP-2, replicated (DDP)" and m["dims"] == {"dp": 2, "tp": 1, "pp": 1, "zero": 0}
    # What it does not know: no shape, batch or schedule of its own making.
    assert all(m[k] is None for k in ("layers", "hidden", "heads", "seq_len", "vocab"))
    assert {"layers", "hidden", "seq_len", "batch"} <= set(e["unknown"])
    assert not [n for n in e["notes"] if "layers" in n or "hidden" in n]
    # Numbers that would need a shape are absent; those that need none agree with what was measured.
    assert [r["expected_parameters"] for r in e["state"]] == [m["parameters"]] * 2
    assert all(r["expected_peak_bytes"] is None and r["expected_memory"] is None for r in e["state"])
    assert e["step"]["measured_ms"] > 0 and e["step"]["model_ms"] is None
    assert e["step"]["achieved_tflops_per_rank"] is None and e["step"]["components_ms"] is None
    assert not [f for f in report["findings"] if f["kind"] in MODEL_FINDINGS]
    text = expected_md(run)
    assert not re.search(r"\d+ layers|hidden \d+|sequence \d+|GFLOP/s", text), text
    assert "not known: layers, hidden size" in text and "sequence length" in text and "batch size" in text
    assert "shape not recorded" in text and "no model prediction" in text


def test_the_dashboard_says_the_same(plain):
    from diagtrain.dashboard import expected
    from diagtrain.dashboard.data import load

    lines = expected.summary(load(plain[0]))
    assert any(line.startswith("Not known: layers, hidden size") for line in lines)
    assert not [line for line in lines if re.search(r"\d+ layers|hidden \d+", line)]


def test_a_mesh_without_a_shape_splits_evenly_and_has_no_bubble_formula(plain, tmp_path):
    # The same run, its manifest claiming a 2-stage pipeline: the schedule and microbatches are not
    # known, so the bubble has no formula, and each stage's share is the even one, labelled so.
    copy = tmp_path / "run"
    shutil.copytree(plain[0], copy, ignore=shutil.ignore_patterns("analysis", "report.*"))
    manifest = json.loads((copy / "manifest.json").read_text())
    (copy / "manifest.json").write_text(json.dumps({**manifest, "mesh": {"pp": 2, "dp": 1, "tp": 1}}))
    report = analyze(copy, copy, ["json", "md"], workers=1)
    e = report["expected"]
    assert e["model"]["dims"]["pp"] == 2 and e["model"]["layout_from"] == "inferred"
    assert {"microbatches", "schedule"} <= set(e["unknown"])
    assert e["bubble"]["formula"] is None and e["bubble"]["schedule"] is None
    assert e["bubble"]["microbatches"] is None and e["bubble"]["with_stage_times"] is None
    assert [r["expected_parameters"] for r in e["state"]] == pytest.approx([e["model"]["parameters"] / 2] * 2)
    assert any("split the size evenly over 2 pipeline ranks" in n for n in e["notes"])
    assert not [f for f in report["findings"] if f["kind"] in MODEL_FINDINGS]
    text = expected_md(copy)
    assert "no formula: the schedule and its microbatches are not known" in text
    assert "pipeline schedule" in text and not re.search(r"\d+ layers|hidden \d+", text)


def test_a_reference_trainer_run_still_gives_its_shape(pipeline_job):
    run = pipeline_job.out
    trainer = json.loads((run / "trainer.json").read_text())
    e = expected_section(run)
    assert e["exact_layout"] and "unknown" not in e
    m = e["model"]
    assert (m["layers"], m["hidden"], m["heads"], m["seq_len"], m["vocab"]) == (
        trainer["n_layers"], trainer["dim"], trainer["heads"], trainer["seq_len"], trainer["vocab"])
    assert e["bubble"]["formula"] == pytest.approx(0.5) and e["bubble"]["schedule"] == "gpipe"
    assert f"{m['layers']} layers, hidden {m['hidden']}" in expected_md(run)
