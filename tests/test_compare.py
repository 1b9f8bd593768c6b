"""`diagtrain compare` and `diagtrain baseline` on real runs of the reference trainer (recorded: tests/recorded.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from recorded import copy_run

from diagtrain.profiler.analyzer.analyze import analyze
from diagtrain.profiler.util.stats import bootstrap_ratio_of_medians, mann_whitney_greater

pytestmark = pytest.mark.jobs  # every test here starts processes (tests/conftest.py)

BASELINE_RUNS = ("clean1", "clean2", "clean3")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "diagtrain.profiler.cli", *args], capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Four clean runs and a straggler (rank 1's forward STRAGGLER_MS slower), recorded (tests/recorded.py)
    and analyzed afresh; the baseline of the first three."""
    root = tmp_path_factory.mktemp("compare")
    made = {}
    for name in ("clean1", "clean2", "clean3", "clean4", "straggler"):
        made[name] = copy_run(f"compare-{name}", root / name)
        analyze(made[name], made[name], ["json"], workers=1)
    made["baseline"] = root / "baseline.json"
    proc = cli("baseline", *(str(made[r]) for r in BASELINE_RUNS), "-o", str(made["baseline"]))
    assert proc.returncode == 0, proc.stderr
    return made


def compared(base: Path, new: Path) -> tuple[int, dict]:
    proc = cli("compare", str(base), str(new), "--format", "json")
    assert proc.returncode in (0, 1, 3), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def by_key(results: list[dict]) -> dict[tuple[str, str], dict]:
    return {(r["metric"], r["scope"]): r for r in results}


def test_a_straggler_against_three_runs_is_a_regression_its_rank_and_phase_first(runs):
    code, result = compared(runs["baseline"], runs["straggler"])
    assert result["base_runs"] == 3
    forward = by_key(result["results"])[("forward", "rank 1")]
    beyond = forward["new_value"] > forward["base_value"] * (1 + forward["noise_high_pct"] / 100)
    # Never "no regression": the forward change is beyond the band, or the band is too wide to decide.
    assert code != 0 and forward["verdict"] in ("regression", "inconclusive"), forward
    assert len(forward["base_runs"]) == 3 and forward["change_pct"] > 100
    if beyond and not result["machine"]["different"] + result["machine"]["contention"]:
        assert code == 1 and result["verdict"] == "regression"
        assert (result["regressions"][0]["metric"], result["regressions"][0]["scope"]) == ("forward", "rank 1")
        md = cli("compare", str(runs["baseline"]), str(runs["straggler"])).stdout
        assert md.startswith("## diagtrain compare: **regression**") and "**forward** (rank 1)" in md
    else:
        assert code == 3 and ("rerun the baseline" in forward["reason"] or "not a code change" in forward["reason"])
    # Run-level consequences come after the cause; the per-step evidence is shown beside the verdict.
    scopes = [r["scope"] for r in result["regressions"]]
    assert "run" not in scopes or scopes.index("run") > scopes.index("rank 1")
    assert forward["p_value"] < 0.01 and forward["ci_low"] > 1 and forward["new_p90"] > forward["base_p90"]
    assert any(f["kind"] == "straggler" and f["ranks"] == [1] and f["change"] in ("new", "worse")
               for f in result["findings"])


def test_one_baseline_run_never_calls_a_change_below_its_ceiling_and_says_how_many_runs_decide(runs):
    code, result = compared(runs["clean1"], runs["straggler"])
    assert code in (1, 3) and (code == 1) == bool(result["regressions"])
    # The straggler's cause is seen from one run too: called a regression beyond the ceiling, else undecided.
    forward = by_key(result["results"])[("forward", "rank 1")]
    assert forward["verdict"] in ("regression", "inconclusive") and forward["change_pct"] > 100, forward
    for r in result["results"]:
        if r["verdict"] == "regression":
            ratio = r["new_value"] / r["base_value"]  # throughput regresses downwards
            assert max(ratio, 1 / ratio) > 1.5, r  # the lowest one-run ceiling (memory)
    step = by_key(result["results"])[("step time", "run")]
    assert step["verdict"] != "regression" or step["change_pct"] > 150
    if result["inconclusive"]:
        assert any("keep 3 baseline runs: diagtrain baseline RUN1 RUN2 RUN3" in n for n in result["notes"]), result["notes"]


def test_compares_thresholds_are_settings_the_report_records(runs):
    # One baseline run: a change inside x2.5 is no verdict. With the ceiling set at x1.2 (the user's knowledge of
    # their machine), rank 1's forward (more than twice as long) is judged, and the report says what was changed.
    proc = cli("compare", str(runs["clean1"]), str(runs["straggler"]), "--format", "json",
               "--set", "compare.one_run_ceiling=1.2")
    result = json.loads(proc.stdout)
    assert result["settings"]["overridden"] == {"compare.one_run_ceiling": 1.2}
    assert result["settings"]["values"]["compare.between_runs_alpha"] == 0.025
    forward = by_key(result["results"])[("forward", "rank 1")]
    assert forward["noise_high_pct"] == pytest.approx(20.0)
    md = cli("compare", str(runs["clean1"]), str(runs["straggler"]), "--set", "compare.one_run_ceiling=1.2").stdout
    assert "Settings changed for this comparison: compare.one_run_ceiling=1.2" in md
    bad = cli("compare", str(runs["clean1"]), str(runs["straggler"]), "--set", "straggler.min_excess_ms=3")
    assert bad.returncode == 2 and "--set 'straggler.min_excess_ms'" in bad.stderr and "compare" in bad.stderr, bad.stderr


@pytest.mark.parametrize("base,new", [("clean1", "clean2"), ("clean3", "clean4"), ("baseline", "clean4")])
def test_clean_runs_are_never_a_regression(runs, base, new):
    # Independent pairs, one of them against three runs: the machine is noisy, the verdict must hold.
    code, result = compared(runs[base], runs[new])
    assert code in (0, 3), [(r["metric"], r["scope"], r["base_runs"], r["new_value"], r["reason"]) for r in result["regressions"]]
    assert result["regressions"] == [] and result["verdict"] == ("no regression", "inconclusive")[code == 3]
    for r in result["inconclusive"]:  # each undecided metric says why: noise it cannot rule out, or the machine
        assert r["reason"].startswith("the steps differ, but") or r["reason"].endswith("rerun on the same machine"), r
    step = by_key(result["results"])[("step time", "run")]
    assert step["n_new"] >= 20 and not np.isnan(step["p_value"])


def test_baseline_of_three_runs_round_trip_and_junit(runs, tmp_path):
    stored = json.loads(runs["baseline"].read_text())
    assert stored["kind"] == "diagtrain-baseline" and len(stored["runs"]) == 3
    for run in stored["runs"]:
        assert len(run["samples"]["step time"]) == len(run["steps_used"])
        assert run["machine"]["hosts"] and run["machine"]["versions"]["torch"]
    # Each of its own runs lies inside the baseline's band (one of k values never leaves their t interval).
    code, result = compared(runs["baseline"], runs["clean2"])
    assert code in (0, 3) and result["regressions"] == []
    step = by_key(result["results"])[("step time", "run")]
    assert step["verdict"] in ("unchanged", "inconclusive") and step["base_runs"][1] == pytest.approx(step["new_value"])
    # JUnit says what JSON says: a failure per regression, a skipped case per inconclusive metric.
    code, result = compared(runs["baseline"], runs["straggler"])
    junit = tmp_path / "compare.xml"
    proc = cli("compare", str(runs["baseline"]), str(runs["straggler"]), "--format", "junit", "--output", str(junit))
    assert proc.returncode == code and result["verdict"] in proc.stderr
    suite = ET.parse(junit).getroot()
    failures = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None]
    skipped = [c.get("name") for c in suite.iter("testcase") if c.find("skipped") is not None]
    assert failures == [f"{r['metric']} ({r['scope']})" for r in result["regressions"]]
    assert skipped == [f"{r['metric']} ({r['scope']})" for r in result["inconclusive"]]
    assert int(suite.get("failures")) == len(failures) and int(suite.get("skipped")) == len(skipped)
    # A baseline file from before several runs (one run's summary) still loads, as one run.
    old = tmp_path / "old.json"
    old.write_text(json.dumps({**stored["runs"][0], "kind": "diagtrain-baseline"}))
    code, result = compared(old, runs["clean1"])
    assert code == 0 and result["base_runs"] == 1


def test_bad_inputs(runs, tmp_path):
    assert cli("compare", str(tmp_path / "missing"), str(runs["clean1"])).returncode == 2
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    proc = cli("compare", str(bad), str(runs["clean1"]))
    assert proc.returncode == 2 and "not a readable baseline" in proc.stderr
    proc = cli("baseline", str(runs["clean1"]), str(tmp_path / "nope"), "-o", str(tmp_path / "b.json"))
    assert proc.returncode == 2 and "nope: no such run directory" in proc.stderr
    other = json.loads(runs["baseline"].read_text())
    other["runs"][1]["strategy"] = "fsdp"
    (tmp_path / "fsdp.json").write_text(json.dumps(other))
    proc = cli("compare", str(tmp_path / "fsdp.json"), str(runs["clean1"]))
    assert proc.returncode == 2 and "strategy differs" in proc.stderr
    assert cli("compare", str(tmp_path / "fsdp.json"), str(runs["clean1"]), "--allow-mismatch").returncode in (0, 3)
    proc = cli("compare", str(runs["clean1"]), str(runs["baseline"]))
    assert proc.returncode == 2 and "NEW must be one run" in proc.stderr
    assert cli("compare", str(runs["clean1"]), str(runs["clean2"]), "--threshold", "five").returncode == 2


def test_statistics_on_known_samples():
    rng = np.random.default_rng(1)
    base = rng.normal(100, 2, 40)
    assert mann_whitney_greater(base + 10, base) < 1e-6
    assert mann_whitney_greater(base, base) > 0.4
    low, high = bootstrap_ratio_of_medians(base * 1.3, base)
    assert low < 1.3 < high and high - low < 0.05


def test_an_unwritable_output_is_a_usage_error_not_a_regression(runs, tmp_path):
    target = tmp_path / "no-such-folder" / "compare.md"
    proc = cli("compare", str(runs["clean1"]), str(runs["clean2"]), "--output", str(target))
    assert proc.returncode == 2 and f"--output {target}: cannot write" in proc.stderr
