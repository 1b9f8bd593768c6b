"""The analyzer on real runs with injected faults, on the shared real traces, and on bad input."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import diagtrain_run, on_training
from diagtrain.profiler.analyzer.report import summary
from diagtrain.profiler.util.text import ranges
from public_fixtures import HTA_TRACES as TRACES
from recorded import copy_run

pytestmark = pytest.mark.jobs  # every test here starts processes (tests/conftest.py)

USAGE = 2


def analyze(path: Path, *args: str, out: Path | None = None) -> tuple[subprocess.CompletedProcess, dict | None]:
    cmd = [sys.executable, "-m", "diagtrain.profiler.cli", "analyze", str(path), "--workers", "2", *args]
    if out is not None:
        cmd += ["--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    # where it says it wrote: "diagtrain: report DIR/report.md, DIR/report.json"
    written = re.search(r"^diagtrain: report (.+?)/report\.\w+(?:,|$)", proc.stderr, re.MULTILINE)
    report = Path(written.group(1)) / "report.json" if written else None
    return proc, json.loads(report.read_text()) if proc.returncode == 0 and report and report.exists() else None


def kinds(report: dict, severity_at_least: str = "warning") -> list[tuple[str, list[int]]]:
    order = ["info", "warning", "error", "critical"]
    return [(f["kind"], f["ranks"]) for f in on_training(report["findings"])
            if order.index(f["severity"]) >= order.index(severity_at_least)]


def train_run(out: Path, *args: str, profile: str = "none", telemetry_s: float = 1.0) -> Path:
    """A reference-trainer run, not analyzed yet. Without ``profile`` nothing is profiled (not the
    default, auto): these tests check the verdicts from the step records alone."""
    diagtrain_run(out, "--profile-steps", profile, "--telemetry-interval", str(telemetry_s), "--no-analyze", "--",
                  sys.executable, "-m", "diagtrain.profiler.cli", "train", *args)
    return out


@pytest.fixture(scope="module")
def faulty_ddp_analysis(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, dict]:
    out = train_run(tmp_path_factory.mktemp("faulty") / "run", "--strategy", "ddp", "--nproc", "4", "--steps", "9",
                    "--inject", "straggler:rank=1,ms=80,steps=3-6",
                    "--inject", "dataloader_stall:rank=2,ms=80,every=3",
                    "--inject", "mem_imbalance:rank=3,mb=300")
    proc, report = analyze(out)
    assert proc.returncode == 0, proc.stderr
    return out, proc, report


@pytest.fixture(scope="module")
def faulty_ddp(faulty_ddp_analysis) -> dict:
    return faulty_ddp_analysis[2]


def test_the_console_lists_what_to_act_on_in_one_screen(faulty_ddp_analysis):
    """`diagtrain analyze RUN` prints the summary: one line per finding worth acting on, top one first."""
    _, proc, report = faulty_ddp_analysis
    lines = proc.stdout.splitlines()
    assert 0 < len(lines) <= summary.MAX_SCREEN and "### Findings" not in proc.stdout
    listed = [f for f in report["findings"] if summary.matters(f)]
    shown = [line for line in lines if re.match(r"  \d+\. ", line)]
    # The data stall and the memory imbalance at least (on a busy host the straggler can be information).
    assert len(shown) == len(listed) >= 2
    for line, finding in zip(shown, listed):  # in the report's order: the top finding first
        assert f"{finding['severity'].upper()} {finding['kind']} · " in line
        assert f"rank{'s' if len(finding['ranks']) > 1 else ''} {finding['ranks'][0]}" in line
        assert ("ms/step" in line) == bool(finding["impact_ms"])
    [stall] = [line for line in shown if " dataloader_stall · " in line]
    assert " rank 2 · " in stall
    info = len(report["findings"]) - len(listed)
    assert (f"{info} informational" in lines[0]) == bool(info)  # counted, not listed


def test_format_md_prints_the_full_report(faulty_ddp_analysis, tmp_path):
    run, _, _ = faulty_ddp_analysis
    full, _ = analyze(run, "--format", "md", out=tmp_path)
    assert full.returncode == 0, full.stderr
    assert full.stdout.strip() == (tmp_path / "report.md").read_text().strip()
    assert full.stdout.count("\n") > summary.MAX_SCREEN  # the whole report, tables and all


def test_straggler_named_with_rank_steps_and_phase(faulty_ddp):
    [f] = [f for f in faulty_ddp["findings"] if f["kind"] == "straggler"]
    # Steps 3-6 exactly; a 2-core machine running 4 ranks may add one noisy step at most.
    assert f["ranks"] == [1] and {3, 4, 5, 6} <= set(f["steps"]) and len(set(f["steps"]) - {3, 4, 5, 6}) <= 1
    assert f["metrics"]["phase"] == "forward phase"
    assert f["metrics"]["excess_ms"] == pytest.approx(80, rel=0.25)
    assert f"rank 1 is a straggler in steps {ranges(f['steps'])}" in f["explanation"]
    # Steps 3 and 6 also hold rank 2's 80 ms data stall: removing either alone saves those steps nothing,
    # so the ledger shares them (tests/test_ledger.py checks the shares), and prices the straggler; the
    # steps it charges can differ from the detector's on a busy host.
    assert "Over the run it cost the job" in f["explanation"] and f["impact_ms"] > 0


def test_dataloader_stall_with_its_period(faulty_ddp):
    [f] = [f for f in faulty_ddp["findings"] if f["kind"] == "dataloader_stall"]
    assert f["ranks"] == [2] and f["steps"] == [3, 6, 9] and f["metrics"]["period_steps"] == 3
    assert "(every 3 steps)" in f["explanation"]


def test_memory_imbalance_on_the_rank_that_holds_memory(faulty_ddp):
    [f] = [f for f in faulty_ddp["findings"] if f["kind"] == "memory_imbalance"]
    assert f["ranks"] == [3]
    excess = f["metrics"]["observed_bytes"] - f["metrics"]["expected_bytes"]
    assert excess == pytest.approx(300 * 2**20, rel=0.2)


def test_report_files_and_contract_fields(faulty_ddp, tmp_path):
    assert set(faulty_ddp) >= {"schema_version", "ranks", "findings", "skipped"}
    assert [r["rank"] for r in faulty_ddp["ranks"]] == [0, 1, 2, 3]
    assert all(r["steps"] == 9 and r["step_time_median_us"] > 0 for r in faulty_ddp["ranks"])
    assert not [k for k in kinds(faulty_ddp) if k[0] not in ("straggler", "dataloader_stall", "memory_imbalance")]


@pytest.mark.parametrize("busy", [False, True], ids=["quiet host", "beside a cpu hog"])
def test_a_clean_run_has_no_warning(tmp_path, busy):
    # Beside a process that spins on a core: the ranks get less CPU, by turns; that is the host's
    # doing (host_contention, info), never a straggler or a late rank.
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        out = train_run(tmp_path / "run", "--strategy", "fsdp", "--nproc", "2", "--steps", "8", profile="3-4",
                        telemetry_s=0.5)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    proc, report = analyze(out)
    assert proc.returncode == 0, proc.stderr
    assert kinds(report) == []
    if busy:
        assert [f["severity"] for f in report["findings"] if f["kind"] == "host_contention"] == ["info"]
        # The hog is named while it competes (the finding names the five busiest over the run; on a
        # shared machine other jobs may outrank it there).
        telemetry = pd.read_parquet(out / "telemetry.parquet")
        assert hog.pid in set(telemetry.loc[telemetry["kind"] == "other", "pid"])
    assert all(r["compute_us"] > 0 and r["comm_comp_overlap_pct"] is not None for r in report["ranks"])
    for name in ("report.md", "report.html", "analysis/steps.parquet", "analysis/findings.json",
                 "analysis/collectives.parquet"):
        assert (out / name).exists(), name
    assert "<script" in (out / "report.html").read_text()  # plotly inlined: opens offline


def test_slow_comm_is_a_late_rank_at_collectives(tmp_path):
    out = train_run(tmp_path / "run", "--strategy", "ddp", "--nproc", "2", "--steps", "6",
                    "--inject", "slow_comm:rank=1,ms=30", profile="3-5")
    _, report = analyze(out)
    [f] = [f for f in report["findings"] if f["kind"] == "slow_collective"]
    assert f["ranks"] == [1] and f["metrics"]["lateness_ms"] >= 0.8 * 30  # at least the injected delay
    assert "straggler" not in [k for k, _ in kinds(report)]
    assert on_training(report["findings"])[0]["kind"] == "slow_collective"  # the first line names the cause


@pytest.mark.parametrize("recording,expected", [
    ("pp-one-microbatch", r"^1 microbatch for 2 pipeline stages"),
    # The stages' busy time from the always-on counters (stage 1 carries the output layer besides its one block).
    ("pp-imbalance", r"^pipeline stage 0 does \d+\.\dx the work of stage 1 \(by time outside communication \(counters\)\).*"
                     r"Layers per stage: \[9, 1\]\.$"),
], ids=["pp-one-microbatch", "pp-imbalance"])
def test_pipeline_bubbles(tmp_path, recording, expected):
    _, report = analyze(copy_run(recording, tmp_path / "run"))
    # The expected warning, once; beside it the stages as measured (from the counters) are a finding too.
    bubbles = [f for f in report["findings"] if f["kind"] == "pipeline_bubble"]
    matching = [f for f in bubbles if re.search(expected, f["explanation"], re.DOTALL)]
    assert len(matching) == 1, [f["explanation"] for f in bubbles]
    assert matching[0]["severity"] == "warning"


@pytest.mark.parametrize("name", ["nccl_2rank_rank0", "sampled_128rank_rank0", "cpu_only_gloo_rank34", "rocm_mi250_minitoy"])
def test_every_shared_trace_is_analyzed(tmp_path, name):
    folder = tmp_path / "traces"
    folder.mkdir()
    shutil.copy(TRACES / f"{name}.json.gz", folder)
    proc, report = analyze(folder)
    assert proc.returncode == 0, proc.stderr
    assert report["skipped"] == [] and len(report["ranks"]) == 1
    if name == "rocm_mi250_minitoy":  # no distributedInfo, no rank in the name
        assert any("no distributedInfo" in h["message"] for h in report["health"])
    if name == "sampled_128rank_rank0":
        assert any(h["check"] == "missing_ranks" for h in report["health"])


def test_a_folder_of_traces_is_left_as_it_was(tmp_path):
    folder = tmp_path / "my_traces"
    folder.mkdir()
    shutil.copy(TRACES / "rocm_mi250_minitoy.json.gz", folder / "rank0.json.gz")
    proc, report = analyze(folder, "--format", "md,json")
    assert proc.returncode == 0 and report["ranks"][0]["rank"] == 0
    assert sorted(p.name for p in folder.iterdir()) == ["rank0.json.gz"]  # nothing for HTA or a later run to trip on
    beside = tmp_path / "my_traces-diagtrain"
    assert f"the analysis goes beside it, to {beside}" in proc.stderr
    assert (beside / "report.md").exists() and (beside / "analysis" / "steps.parquet").exists()


def test_a_folder_mixing_jobs_is_refused_naming_the_files(tmp_path):
    """Traces of a 2-rank and a 128-rank job in one folder: never merged into one 128-rank run."""
    folder = tmp_path / "traces"
    folder.mkdir()
    for name in ("nccl_2rank_rank0", "sampled_128rank_rank0", "sampled_128rank_rank1"):
        shutil.copy(TRACES / f"{name}.json.gz", folder)
    proc, report = analyze(folder)
    assert proc.returncode == USAGE and report is None
    assert "holds traces of more than one job" in proc.stderr
    assert "world size 2: nccl_2rank_rank0.json.gz\n" in proc.stderr
    assert "world size 128: sampled_128rank_rank0.json.gz, sampled_128rank_rank1.json.gz" in proc.stderr
    assert "rank 0 claimed by nccl_2rank_rank0.json.gz, sampled_128rank_rank0.json.gz" in proc.stderr
    assert len(list(folder.iterdir())) == 3 and not (tmp_path / "traces-diagtrain").exists()  # nothing written


def test_two_different_traces_of_one_rank_are_refused_a_copy_is_not(tmp_path):
    """Same world size, rank 0 twice: another window (or job) unless it is a copy of the same trace."""
    folder = tmp_path / "traces"
    folder.mkdir()
    shutil.copy(TRACES / "sampled_128rank_rank0.json.gz", folder / "window1_rank0.json.gz")
    with gzip.open(TRACES / "sampled_128rank_rank0.json.gz") as f:
        doc = json.load(f)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("ts", 0) >= 0][: len(doc["traceEvents"]) // 2]
    with gzip.open(folder / "window2_rank0.json.gz", "wt") as f:
        json.dump(doc, f)
    proc, _ = analyze(folder, "--format", "json")
    assert proc.returncode == USAGE
    assert "rank 0 claimed by window1_rank0.json.gz, window2_rank0.json.gz" in proc.stderr
    assert "world size" not in proc.stderr
    (folder / "window2_rank0.json.gz").unlink()
    shutil.copy(TRACES / "sampled_128rank_rank0.json.gz", folder / "copy_rank0.json.gz")
    proc, report = analyze(folder, "--format", "json")
    assert proc.returncode == 0 and [r["rank"] for r in report["ranks"]] == [0]
    assert any("claims rank 0" in s["reason"] for s in report["skipped"])


def test_two_ranks_of_one_gpu_job_are_matched(tmp_path):
    for r in (0, 1):
        shutil.copy(TRACES / f"sampled_128rank_rank{r}.json.gz", tmp_path)
    proc, report = analyze(tmp_path, "--format", "json")
    assert proc.returncode == 0
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    assert all(r["idle_us"] > 0 and r["compute_us"] > 0 for r in report["ranks"])


def test_bad_inputs_are_skipped_by_name_and_the_rest_analyzed(tmp_path):
    good = TRACES / "nccl_2rank_rank0.json.gz"
    shutil.copy(good, tmp_path / "rank0.json.gz")
    (tmp_path / "rank1.json.gz").write_bytes(good.read_bytes()[:200])  # gzip cut before its first event
    (tmp_path / "rank2.json").write_text("profiler output, not JSON\n")
    (tmp_path / "rank3.json").write_text('{"traceEvents": []}')  # no events
    shutil.copy(good, tmp_path / "copy_of_rank0.json.gz")  # claims rank 0 too (distributedInfo)
    proc, report = analyze(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [r["rank"] for r in report["ranks"]] == [0]
    reasons = {Path(s["path"]).name: s["reason"] for s in report["skipped"]}
    assert "ends early" in reasons["rank1.json.gz"]
    assert "not a PyTorch Profiler trace" in reasons["rank2.json"]
    assert "no duration events" in reasons["rank3.json"]
    assert "claims rank 0" in reasons["rank0.json.gz"] or "claims rank 0" in reasons["copy_of_rank0.json.gz"]
    assert "### Skipped inputs" in (tmp_path.with_name(f"{tmp_path.name}-diagtrain") / "report.md").read_text()
    assert "  4 inputs skipped: see the report's \"Skipped inputs\"" in proc.stdout


def test_a_second_analysis_reuses_the_cache(tmp_path):
    shutil.copy(TRACES / "nccl_2rank_rank0.json.gz", tmp_path)
    analyze(tmp_path, "--format", "json")
    summary = next((tmp_path.with_name(f"{tmp_path.name}-diagtrain") / "analysis" / "cache").glob("*/summary.json"))
    before = summary.stat().st_mtime_ns
    _, report = analyze(tmp_path, "--format", "json")
    assert summary.stat().st_mtime_ns == before and len(report["ranks"]) == 1


@pytest.mark.parametrize("args,message", [
    (["/nonexistent/run"], "no such directory"),
    ([str(TRACES), "--format", "pdf"], "--format 'pdf'"),
    ([str(TRACES), "--out", "/proc/diagtrain-nope"], "cannot write the analysis there"),
])
def test_usage_errors(args, message):
    proc = subprocess.run([sys.executable, "-m", "diagtrain.profiler.cli", "analyze", *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == USAGE and message in proc.stderr


def test_a_rank_on_a_skewed_host_is_put_back_on_the_common_clock(tmp_path):
    skew_us = 5_000_000  # rank 1's host clock runs 5 s ahead
    shutil.copy(TRACES / "sampled_128rank_rank0.json.gz", tmp_path / "rank0.json.gz")
    with gzip.open(TRACES / "sampled_128rank_rank1.json.gz") as f:
        trace = json.load(f)
    for event in trace["traceEvents"]:
        if isinstance(event.get("ts"), (int, float)):
            event["ts"] += skew_us
    trace["host_name"] = "another-host"
    with gzip.open(tmp_path / "rank1.json.gz", "wt") as f:
        json.dump(trace, f)
    _, report = analyze(tmp_path, "--format", "json")
    [note] = [h for h in report["health"] if h["check"] == "clocks" and "moved by" in h["message"]]
    assert note["message"].startswith("host another-host: every time it recorded was moved by")
    shift_ms = float(note["message"].split("moved by ")[1].split(" ms")[0])
    assert shift_ms == pytest.approx(-skew_us / 1e3, abs=50)


def test_an_empty_folder_is_a_usage_error(tmp_path):
    proc, _ = analyze(tmp_path)
    assert proc.returncode == USAGE and "nothing to analyze" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written into it


def test_the_report_line_names_only_the_formats_written(tmp_path):
    traces, out = tmp_path / "traces", tmp_path / "out"
    traces.mkdir()
    shutil.copy(TRACES / "cpu_only_gloo_rank34.json.gz", traces)
    proc, _ = analyze(traces, "--format", "json", "--quiet", out=out)
    assert proc.returncode == 0
    assert f"report {out / 'report.json'}" in proc.stderr and "report.md" not in proc.stderr
    assert not (out / "report.md").exists()
