"""`diagtrain compare` and `diagtrain baseline` on real runs of the reference trainer."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from conftest import diagtrain_run
from diagtrain.profiler.stats import bootstrap_ratio_of_medians, mann_whitney_greater

TRAINER = ["--strategy", "ddp", "--nproc", "2", "--steps", "30", "--dim", "256", "--seq-len", "64"]
# Rank 1's forward gets this much slower: about 40% of a step on this machine.
STRAGGLER_MS = 45
# Two runs of one configuration on these shared 2-core machines differ by up to ~18% in median step
# time (seen in this suite); per-step statistics cannot see that, so CI here needs a threshold above it.
CLEAN_THRESHOLD = "25%"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "diagtrain.profiler.cli", *args], capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("compare")
    made = {}
    for name, extra in (("clean1", []), ("clean2", []), ("clean3", []), ("clean4", []),
                        ("straggler", ["--inject", f"straggler:rank=1,ms={STRAGGLER_MS}"])):
        made[name] = root / name
        diagtrain_run(made[name], "--", sys.executable, "-m", "diagtrain.profiler.cli", "train", *TRAINER, *extra)
    return made


def test_a_straggler_is_a_regression_naming_the_metric_and_the_rank(runs, tmp_path):
    proc = cli("compare", str(runs["clean1"]), str(runs["straggler"]), "--format", "json")
    assert proc.returncode == 1, proc.stderr
    result = json.loads(proc.stdout)
    by_key = {(r["metric"], r["scope"]): r for r in result["regressions"]}
    step = by_key[("step time", "run")]
    assert step["change_pct"] > 25 and step["ci_low"] > 1 and step["p_value"] < 0.01
    assert step["new_p90"] > step["base_p90"] >= step["base_median"]
    # Rank 1's own phase regressed; rank 0's backward did too (it waits there for rank 1), and the
    # new straggler finding says which of the two is the cause.
    assert by_key[("forward", "rank 1")]["change_pct"] > 50
    assert by_key[("forward", "rank 1")]["change_pct"] > by_key.get(("forward", "rank 0"), {"change_pct": 0})["change_pct"]
    assert any(f["kind"] == "straggler" and f["ranks"] == [1] for f in result["findings_new"])
    md = cli("compare", str(runs["clean1"]), str(runs["straggler"])).stdout
    assert md.startswith("## diagtrain compare: **regression**")
    assert "new finding, **straggler** on rank 1" in md and "**step time** (run)" in md


@pytest.mark.parametrize("base,new", [("clean1", "clean2"), ("clean3", "clean4")])
def test_two_clean_runs_are_not_a_regression(runs, base, new):
    # Two independent pairs: this machine is noisy, and the verdict must hold for both.
    proc = cli("compare", str(runs[base]), str(runs[new]), "--threshold", CLEAN_THRESHOLD, "--format", "json")
    assert proc.returncode == 0, proc.stdout
    result = json.loads(proc.stdout)
    assert result["regressions"] == []
    step = next(r for r in result["results"] if r["metric"] == "step time")
    assert step["n_base"] >= 25 and not np.isnan(step["p_value"])


def test_baseline_round_trip_and_junit(runs, tmp_path):
    baseline = tmp_path / "baseline.json"
    assert cli("baseline", str(runs["clean1"]), "-o", str(baseline)).returncode == 0
    stored = json.loads(baseline.read_text())
    assert stored["kind"] == "diagtrain-baseline" and len(stored["samples"]["step time"]) == len(stored["steps_used"])
    same = json.loads(cli("compare", str(baseline), str(runs["clean1"]), "--format", "json").stdout)
    step = next(r for r in same["results"] if r["metric"] == "step time")
    assert step["change_pct"] == 0 and step["verdict"] == "unchanged"
    junit = tmp_path / "compare.xml"
    proc = cli("compare", str(baseline), str(runs["straggler"]), "--format", "junit", "--output", str(junit))
    assert proc.returncode == 1
    suite = ET.parse(junit).getroot()
    failures = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None]
    assert "step time (run)" in failures and int(suite.get("failures")) == len(failures)


def test_bad_inputs(runs, tmp_path):
    assert cli("compare", str(tmp_path / "missing"), str(runs["clean1"])).returncode == 2
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    proc = cli("compare", str(bad), str(runs["clean1"]))
    assert proc.returncode == 2 and "not a readable baseline" in proc.stderr
    assert cli("baseline", str(runs["clean1"]), "-o", str(tmp_path / "b.json")).returncode == 0
    other = json.loads((tmp_path / "b.json").read_text())
    other["strategy"] = "fsdp"
    (tmp_path / "fsdp.json").write_text(json.dumps(other))
    proc = cli("compare", str(tmp_path / "fsdp.json"), str(runs["clean1"]))
    assert proc.returncode == 2 and "strategy differs" in proc.stderr
    assert cli("compare", str(tmp_path / "fsdp.json"), str(runs["clean1"]), "--allow-mismatch").returncode == 0
    assert cli("compare", str(runs["clean1"]), str(runs["clean2"]), "--threshold", "five").returncode == 2


def test_statistics_on_known_samples():
    rng = np.random.default_rng(1)
    base = rng.normal(100, 2, 40)
    assert mann_whitney_greater(base + 10, base) < 1e-6
    assert mann_whitney_greater(base, base) > 0.4
    low, high = bootstrap_ratio_of_medians(base * 1.3, base)
    assert low < 1.3 < high and high - low < 0.05
