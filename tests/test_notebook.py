"""`diagtrain.load` (issue 52): a run's analysis from Python, on a run, a folder of foreign traces and a folder of
flight-recorder dumps; the notebook guide's worked example run as CI runs it; `import diagtrain` stays light."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import diagtrain
from diagtrain.profiler.analyzer.judge.findings import Finding
from public_fixtures import HTA_TRACES, NVRX_GPU_ERROR_1ST
from recorded import copy_run

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "notebook.py"


@pytest.fixture(scope="module")
def straggler(tmp_path_factory) -> diagtrain.Run:
    return diagtrain.load(copy_run("compare-straggler", tmp_path_factory.mktemp("nb") / "run"), workers=1)


def test_a_run_its_findings_and_tables(straggler):
    top = straggler.findings[0]
    assert isinstance(top, Finding) and (top.kind, top.ranks, top.severity) == ("straggler", [1], "error")
    assert top.impact_ms > 0 and top.explanation.startswith("rank 1")
    assert straggler.steps.shape == (60, straggler.steps.shape[1]) and {"rank", "step", "wall_ms", "start"} <= set(straggler.steps)
    # The ledger says the others waited for rank 1; the collectives carry who arrived last.
    assert straggler.ledger.loc[straggler.ledger["rank"] == 0, "waited_for"].mode()[0] == 1
    assert {"wait_us", "last_rank", "group", "seq"} <= set(straggler.collectives.columns)
    assert set(straggler.memory.columns) >= {"rank", "step", "rss_bytes"}
    assert straggler.status == "ok" and straggler.settings["values"]["straggler.min_excess_ms"] == 5.0


def test_spans_reports_figures_and_the_notebook_view(straggler):
    spans = straggler.spans(1, steps=[10])
    assert len(spans) and set(spans["kind"]) >= {"compute"} and spans["start_us"].min() >= straggler.steps["start"].min() * 1e6 - 1
    assert straggler.spans(1, steps=[3]).empty  # step 3 was not profiled
    assert straggler.report("md").startswith("#") and json.loads(straggler.report("json"))["findings"]
    with pytest.raises(ValueError, match="format 'pdf'"):
        straggler.report("pdf")
    timeline = straggler.timeline(ranks=[0, 1], steps=[10])
    assert type(timeline).__name__ == "Figure" and len(timeline.data) > 0
    assert type(straggler.heatmap("forward_ms")).__name__ == "Figure"
    assert len(straggler.ledger_figure().data[0].x) >= 1
    view = straggler._repr_html_()
    assert "<b>ERROR</b> straggler on rank 1" in view and "ok" in view


def test_settings_given_analyze_again_with_them(straggler):
    strict = diagtrain.load(straggler.path, settings={"cost.warning_share": 0.99, "cost.error_share": 0.999}, workers=1)
    assert strict.findings[0].kind == "straggler" and strict.findings[0].severity == "info"
    assert strict.settings["overridden"] == {"cost.error_share": 0.999, "cost.warning_share": 0.99}
    with pytest.raises(ValueError, match="nope"):
        diagtrain.load(straggler.path, settings={"cost.nope": 1})


def test_a_folder_of_foreign_traces_and_a_folder_of_dumps(tmp_path):
    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(HTA_TRACES / "nccl_2rank_rank0.json.gz", traces)
    run = diagtrain.load(traces, workers=1)
    assert run.path == tmp_path / "traces-diagtrain" and run.status == "traces" and run.steps.shape[0] > 0
    dumps = tmp_path / "dumps"
    shutil.copytree(NVRX_GPU_ERROR_1ST, dumps, ignore=shutil.ignore_patterns("*.md", "*.txt", "*.log"))
    hang = diagtrain.load(dumps, workers=1)
    assert hang.findings[0].kind == "hang" and hang.findings[0].severity == "critical"
    with pytest.raises(FileNotFoundError, match="no such directory"):
        diagtrain.load(tmp_path / "nowhere")


@pytest.mark.jobs
def test_import_diagtrain_is_light_and_the_guides_example_runs(tmp_path):
    probe = ("import sys, diagtrain; heavy = [m for m in ('torch', 'pandas', 'dash', 'plotly', 'pyarrow') if m in "
             "sys.modules]; print(heavy); print(callable(diagtrain.load))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["[]", "True"], proc.stdout + proc.stderr
    run = copy_run("compare-straggler", tmp_path / "run")
    proc = subprocess.run([sys.executable, str(EXAMPLE), str(run)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "straggler error [1]" in proc.stdout and "Figure" in proc.stdout
