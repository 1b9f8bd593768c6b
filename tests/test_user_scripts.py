"""Plain user scripts (no diagtrain import) under `diagtrain run`: the analyzer infers their parallel
structure and reaches the right verdict from what the ranks did.

The scripts are the accuracy suite's (benchmarks/user_scripts/). Each runs for real on gloo, a few
steps profiled; the faults are made far larger than the noise of a shared 2-core machine. The two
pipelines whose verdicts are counted, not timed, are recorded runs of them (tests/recorded.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import diagtrain_run, on_training, torchrun
from recorded import copy_run
from diagtrain.dashboard import data as dashboard_data
from diagtrain.dashboard import expected as dashboard_expected
from diagtrain.profiler.analyzer.per_rank import load
from diagtrain.profiler.analyzer.read.discover import discover
from diagtrain.profiler.analyzer.run import tables
from diagtrain.profiler.analyzer.analyze import analyze

pytestmark = pytest.mark.jobs  # every test here starts processes (tests/conftest.py)

SCRIPTS = Path(__file__).resolve().parents[1] / "benchmarks" / "user_scripts"
STEPS = "6"
PROFILE = "3-5"
ACTIONABLE = ("warning", "error", "critical")
BLOCKS_2D_PARAMS = 4 * (256 * 1024 + 1024 + 1024 * 256 + 256)  # tp_fsdp_2d.py: four Blocks of width 256
DDP_LOADER_PARAMS = (256 + 1) * 1024 + (1024 + 1) * 1024 + (1024 + 1) * 256 + 256 + 1  # ddp_loader.py's MLP


def user_run(out: Path, nproc: int, script: str, *args: str, profile: str = PROFILE, steps: str = STEPS) -> dict:
    """Run the script under `diagtrain run` (profiling ``profile``) and analyze it; the report."""
    diagtrain_run(out, "--profile-steps", profile, "--no-analyze", "--", *torchrun(nproc), str(SCRIPTS / script), *args,
                  "--steps", steps)
    return analyze(out, out, ["json"], workers=1)


def findings(report: dict, kind: str, actionable: bool = True) -> list[dict]:
    return [f for f in on_training(report["findings"])
            if f["kind"] == kind and (f["severity"] in ACTIONABLE or not actionable)]


def warnings_of(report: dict) -> list[tuple[str, list[int]]]:
    return [(f["kind"], f["ranks"]) for f in on_training(report["findings"]) if f["severity"] in ACTIONABLE]


def without_counters(run: Path) -> None:
    """Rewrite the run's step records as a job without the always-on counters writes them (an older
    run, or counters that stood down): step times and the optimizer hooks' phase only."""
    for path in run.glob("ranks/*/steps.jsonl"):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        for r in records:
            for counter in ("comm_ms", "phase_comm_ms", "comm_calls", "cpu_ms", "runq_ms", "page_faults", "samples"):
                r.pop(counter, None)
            r["phases_ms"] = {k: v for k, v in r.get("phases_ms", {}).items() if k == "optimizer"}
        path.write_text("".join(json.dumps(r) + "\n" for r in records))


def build_tables(run: Path) -> tables.Tables:
    inputs, _ = discover(run)
    results, _ = load.load(inputs, run / "analysis" / "cache", workers=1)
    return tables.build(run, results)


def recorded(name: str, to: Path) -> dict:
    """A copy of the recorded run (tests/recorded.py) analyzed: the report."""
    run = copy_run(name, to)
    return analyze(run, run, ["json"], workers=1)


@pytest.fixture(scope="module")
def gpipe(tmp_path_factory) -> tuple[Path, dict]:
    """torch.distributed.pipelining, GPipe, 4 microbatches; stage 1 holds 6 blocks, stage 0 holds 2."""
    out = tmp_path_factory.mktemp("gpipe") / "run"
    return out, recorded("torch-pipelining-gpipe", out)


def test_stages_and_microbatches_of_a_torch_pipelining_schedule(gpipe):
    _, report = gpipe
    s = report["structure"]
    assert s["stages"] == {"0": 0, "1": 1} and s["stage_source"] == "point-to-point calls"
    assert s["microbatches"] == 4 and s["microbatch_source"] == "the schedule's annotations"


def test_the_bottleneck_stage_of_a_torch_pipelining_schedule(gpipe):
    _, report = gpipe
    [f] = findings(report, "pipeline_bubble")
    m = f["metrics"]
    assert f["ranks"] == [1] and m["bottleneck_stage"] == 1 and m["compared_by"] == "matrix-multiply FLOPs"
    # Three times the blocks, counted (not timed): the same ratio whatever the machine's load.
    assert m["observed_ratio"] == pytest.approx(3, rel=0.1) and m["expected_bubble"] == pytest.approx(1 / 5)
    # The lighter stage idles far more of the step than the bottleneck, which idles about the schedule's bubble.
    assert m["idle_share_per_stage"][0] > m["idle_share_per_stage"][1] + 0.2
    assert "stage 1 (ranks 1) is the bottleneck" in f["explanation"]
    # Different stages run different layers: they are never compared as peers.
    assert not findings(report, "straggler") and not findings(report, "memory_imbalance")


def test_a_pipeline_without_profiling_is_recognized_from_the_counted_sends(tmp_path):
    """No traces and, the job ending well, no flight-recorder dump: the always-on counters' sends and
    receives per peer (each step record's ``p2p``) are what show the stages."""
    out = tmp_path / "run"
    report = user_run(out, 2, "pipeline.py", "--schedule", "gpipe", "--split", "2,6", profile="none")
    assert not list(out.glob("ranks/*/trace-*")) and not list(out.glob("ranks/*/flight_recorder.json"))
    record = json.loads((out / "ranks/0/steps.jsonl").read_text().splitlines()[-1])
    assert record["p2p"]["first"] == ["send", 1] and record["p2p"]["send"] == {"1": 4}  # 4 microbatches forward
    s = report["structure"]
    assert s["stages"] == {"0": 0, "1": 1} and s["stage_source"] == "point-to-point calls counted in the ranks"
    assert s["microbatches"] == 4 and s["microbatch_source"] == "sends per step from the first stage"
    [f] = findings(report, "pipeline_bubble")
    assert f["ranks"] == [1] and f["metrics"]["bottleneck_stage"] == 1, f["explanation"]
    assert f["metrics"]["compared_by"] == "time outside communication (counters)"
    assert not findings(report, "straggler")  # the heavier stage is not a straggler among peers


def test_a_malformed_p2p_field_is_no_evidence_and_costs_no_step(tmp_path):
    from diagtrain.profiler.analyzer.read.step_cache import read_steps

    base = {"schema_version": 1, "rank": 0, "start": 1.0, "end": 1.1, "duration_ms": 100.0}
    fields = [{"first": ["send", 1], "send": {"1": 4}}, {"first": ["push", 1]}, {"first": ["send", -1]},
              {"first": ["recv", 0], "recv": {"x": 1}}, "p2p", None]
    path = tmp_path / "steps.jsonl"
    path.write_text("".join(json.dumps({**base, "step": i, "p2p": f}) + "\n" for i, f in enumerate(fields)))
    found = read_steps(path, 0)
    assert len(found.table) == len(fields) and not found.bad_lines
    assert found.p2p == {0: {"first": ["send", 1], "send": {1: 4}, "recv": {}}}


def test_a_hand_written_send_recv_pipeline(tmp_path):
    report = recorded("sendrecv-pipeline", tmp_path / "run")
    s = report["structure"]
    assert s["stages"] == {"0": 0, "1": 1} and s["stage_source"] == "point-to-point calls"
    assert s["microbatches"] == 4 and s["microbatch_source"] == "sends per step from the first stage"
    [f] = findings(report, "pipeline_bubble")
    assert f["ranks"] == [0] and f["metrics"]["bottleneck_stage"] == 0
    assert f["metrics"]["observed_ratio"] == pytest.approx(3, rel=0.1)
    assert warnings_of(report) == [("pipeline_bubble", [0])]


@pytest.fixture(scope="module")
def slow_rank_2d(tmp_path_factory) -> tuple[Path, dict]:
    """tp_fsdp_2d.py on 4 ranks (dp 2 x tp 2), rank 2 sleeping 100 ms before every forward, steps 3-4 profiled,
    analyzed: the 2D tests read its groups and its straggler off one job (4 ranks: as few steps as will do)."""
    out = tmp_path_factory.mktemp("2d") / "run"
    return out, user_run(out, 4, "tp_fsdp_2d.py", "--slow-rank", "2", "--slow-ms", "100", profile="3-4", steps="5")


def test_process_groups_and_mesh_of_a_2d_job(slow_rank_2d):
    run, report = slow_rank_2d
    s = report["structure"]
    assert s["mesh"] == {"dp": 2, "tp": 2} and s["mesh_source"] == "process groups"
    assert s["coords"]["3"] == {"dp": 1, "tp": 1} and s["coords"]["2"] == {"dp": 1, "tp": 0}
    groups = {(g["desc"], tuple(g["ranks"])): g for g in s["groups"]}
    assert set(groups) >= {("mesh_dp", (0, 2)), ("mesh_dp", (1, 3)), ("mesh_tp", (0, 1)), ("mesh_tp", (2, 3))}
    assert groups[("mesh_tp", (0, 1))]["ops"].get("all_reduce", 0) > 0  # TP's row-parallel all-reduces
    assert groups[("mesh_dp", (1, 3))]["ops"].get("all_gather", 0) > 0  # FSDP's parameter all-gathers
    assert s["stages"] == {}  # no pipeline: all four ranks are peers
    # Every collective is named by its group; bandwidth only where all its members were seen.
    t = build_tables(run)
    c = t.collectives
    assert (c["pg"] != "?").all()
    seen = c["ranks_seen"] == c["group_ranks"].map(len)
    assert c.loc[seen, "transfer_us"].notna().all() and c.loc[~seen, "transfer_us"].isna().all()
    # The sleep and nothing else: no bandwidth or lateness warnings on gloo, though its peers wait for rank 2.
    assert warnings_of(report) == [("straggler", [2])]


def test_a_rank_that_sleeps_before_an_fsdp_forward_is_a_straggler_not_a_slow_path(slow_rank_2d):
    # FSDP's all-gather is the first thing the forward does, so the sleep lies right before that call,
    # but outside the FSDP pre-forward op that issues it: the rank's own time, not its path to the call.
    run, report = slow_rank_2d
    c = build_tables(run).collectives
    gathers = c[(c["rank"] == 2) & (c["op"] == "all_gather") & c["issue_gap_us"].notna()]
    assert len(gathers) >= 8 and gathers["issue_gap_us"].max() < 20_000, gathers["issue_gap_us"].describe()
    [f] = findings(report, "straggler")
    # The sleep, give or take a busy host's pauses (94-130 ms beside two CPU hogs).
    assert f["ranks"] == [2] and 70 <= f["metrics"]["excess_ms"] <= 200
    assert not [f for f in findings(report, "slow_collective") if 2 in f["ranks"]]
    # The model check reads the layout off the run: the DeviceMesh from its process groups, FSDP from
    # the all-gathers, the size from one TP shard's gradients (TP's own all-reduces add a little).
    e = report["expected"]
    assert {k: e["model"]["dims"][k] for k in ("dp", "tp", "pp", "zero")} == {"dp": 2, "tp": 2, "pp": 1, "zero": 3}
    assert 1.0 <= e["model"]["parameters"] / BLOCKS_2D_PARAMS <= 1.15
    assert [r["expected_peak_bytes"] for r in e["state"]] == [None] * 4  # no activations from a guessed shape
    rows, _ = dashboard_expected.state_table(dashboard_data.load(run))  # the Expected tab shows the gap, not a crash
    assert [r["expected_peak_mib"] for r in rows] == [None] * 4 and all(r["peak_mib"] > 0 for r in rows)


def test_a_slow_rank_in_ddp_is_a_straggler(slow_rank_ddp):
    _, report = slow_rank_ddp
    [f] = findings(report, "straggler")
    assert f["ranks"] == [1] and f["metrics"]["source"] == "trace"
    assert f["metrics"]["excess_ms"] == pytest.approx(80, rel=0.35)
    # Late at every all-reduce, but from its own work before them: not a slow collective.
    assert not findings(report, "slow_collective")
    # Its traces put the 80 ms sleep outside any operator, in every profiled step (its operators can take
    # a little longer too where it computes while its peer's all-reduce spins on the other core).
    assert f["metrics"]["traced_steps"] == [3, 4, 5]
    assert f["metrics"]["traced_outside_ops_ms"] == pytest.approx(80, rel=0.35)
    assert f["metrics"]["traced_outside_ops_ms"] > sum(f["metrics"]["traced_ops_ms"].values())
    assert "the traces put its excess over its peers, per step, outside any operator (+" in f["explanation"]


def test_a_rank_with_more_work_is_told_by_the_operators_that_took_it(tmp_path):
    # Rank 1's batches are 24 times larger: its linear layers forward and backward take the extra time. At 8
    # times (+45 ms of CPU a step) a busy host's other process took as much from rank 0 (its run-queue wait),
    # and the ranks were rightly even.
    report = user_run(tmp_path / "run", 2, "ddp_loader.py", "--batch-rank", "1", "--batch-scale", "24")
    [f] = findings(report, "straggler")
    assert "traced_ops_ms" in f["metrics"], (f["explanation"], f["metrics"])
    ops = f["metrics"]["traced_ops_ms"]
    assert f["ranks"] == [1] and set(f["metrics"]["traced_steps"]) <= {3, 4, 5}, f["explanation"]
    top = max(ops, key=ops.get)
    assert "Addmm" in top or "linear" in top or "addmm" in top, ops
    assert sum(ops.values()) > f["metrics"]["traced_outside_ops_ms"]  # the work is in operators, not between them
    assert f"in {top} (+{ops[top]:.1f} ms)" in f["explanation"]


def test_the_model_check_of_a_plain_ddp_script(slow_rank_ddp):
    e = slow_rank_ddp[1]["expected"]
    assert e["model"]["layout"] == "DP-2, replicated (DDP)" and not e["exact_layout"]
    # Its gradient all-reduces, give or take the script's scalar all-reduce of the loss.
    assert 0 <= e["model"]["parameters"] - DDP_LOADER_PARAMS <= 4
    assert [r["expected_parameters"] for r in e["state"]] == pytest.approx([e["model"]["parameters"]] * 2)  # replicated


def test_transfer_time_excludes_waiting_for_the_last_rank(slow_rank_ddp):
    run, _ = slow_rank_ddp
    c = build_tables(run).collectives
    grads = c[(c["op"] == "all_reduce") & (c["bytes"] >= 2**20)]
    per_collective = grads.pivot_table(index="seq", columns="rank", values=["dur", "transfer_us", "wait_us"])
    assert len(per_collective) >= 3
    # Rank 0 waits for rank 1 (80 ms late each step) in the first buckets' all-reduces: its time in them is
    # mostly waiting. (The last bucket's comes once both are in step: either rank may take longer there.)
    assert per_collective[("dur", 0)].sum() > 3 * per_collective[("dur", 1)].sum()
    assert (per_collective[("dur", 0)] > per_collective[("dur", 1)]).mean() >= 0.6
    # ...and the transfer time is the last arrival's duration, the same for both ranks.
    assert (per_collective[("transfer_us", 0)] == per_collective[("transfer_us", 1)]).all()
    assert (per_collective[("transfer_us", 0)] == per_collective[[("dur", 0), ("dur", 1)]].min(axis=1)).all()
    waited = per_collective[("wait_us", 0)] + per_collective[("transfer_us", 0)] - per_collective[("dur", 0)]
    assert waited.abs().max() < 1e-6
    bus = grads["bytes"] * 2 * (2 - 1) / 2 / (grads["transfer_us"] * 1e3)
    assert (grads["busbw_gbps"] - bus).abs().max() < 1e-9


def test_without_profiling_or_counters_the_report_says_what_is_missing(slow_rank_ddp, tmp_path):
    run, _ = slow_rank_ddp
    bare = tmp_path / "no-traces"
    shutil.copytree(run, bare, ignore=shutil.ignore_patterns("trace-*", "analysis", "report.*"))
    # Without traces, the always-on counters still name the slow rank (its step without collective waits) ...
    [f] = findings(analyze(bare, bare, ["json"], workers=1), "straggler")
    assert f["ranks"] == [1] and f["metrics"]["source"] == "counters"
    # ... without them too, step times alone cannot: no guess, and the report says what is missing.
    without_counters(bare)
    report = analyze(bare, bare, ["json"], workers=1)
    assert warnings_of(report) == []  # step times alone cannot name the slow rank: no guess
    [f] = findings(report, "missing_evidence", actionable=False)
    assert f["metrics"]["check"] == "stragglers and data stalls" and "--profile-steps" in f["suggestion"]


def test_a_rank_whose_allocator_churns_memory_is_no_straggler(tmp_path):
    # Rank 1's malloc maps every buffer over 4 KiB afresh (the state glibc's moving threshold leaves one
    # rank of a clean job in now and then): the same work, more page faults, a little slower.
    run = tmp_path / "run"
    report = user_run(run, 2, "ddp_loader.py", "--churn-rank", "1", profile="none", steps="8")
    records = {rank: [json.loads(line) for line in (run / f"ranks/{rank}/steps.jsonl").read_text().splitlines()][2:]
               for rank in (0, 1)}
    # The counters saw the same work (the loader's batches of 32) and the faults: its buffers, 4 MiB or
    # more, faulted in again every step.
    assert all(r["samples"] == 32 for rank in (0, 1) for r in records[rank])
    assert min(r["page_faults"] for r in records[1]) >= 1_000
    assert warnings_of(report) == []


def test_a_delaying_comm_hook_is_a_slow_collective(late_hook_job):
    _, report = late_hook_job
    found = findings(report, "slow_collective")
    assert len(found) == 1, [(f["kind"], f["severity"], f["ranks"], f["metrics"]) for f in report["findings"]]
    [f] = found
    assert f["ranks"] == [0] and f["metrics"]["extra_gap_before_calls_ms"] == pytest.approx(40, rel=0.3)
    assert not findings(report, "straggler")


def test_a_slow_dataset_item_is_a_dataloader_stall_from_the_traces(tmp_path):
    run = tmp_path / "run"
    report = user_run(run, 2, "ddp_loader.py", "--slow-item-rank", "1", "--slow-item-every", "2",
                      "--slow-item-ms", "200")
    records = [json.loads(line) for line in (run / "ranks/1/steps.jsonl").read_text().splitlines()]
    # Batches 0, 2, 4 ... are slow on rank 1: steps 1, 3, 5 (the counters time the data phase).
    assert [r["step"] for r in records if r["phases_ms"]["data"] >= 100] == [1, 3, 5]

    def found_the_stall(report: dict) -> None:
        [f] = findings(report, "dataloader_stall")
        assert f["ranks"] == [1] and f["steps"] == [3, 5] and f["metrics"]["period_steps"] == 2
        assert f["metrics"]["observed_ms"] == pytest.approx(200, rel=0.3)
        assert not findings(report, "straggler") and not findings(report, "slow_collective")

    found_the_stall(report)
    # Without a recorded data phase the traces tell (steps 3-5 were profiled): the DataLoader's spans.
    bare = tmp_path / "no-counters"
    shutil.copytree(run, bare, ignore=shutil.ignore_patterns("analysis", "report.*"))
    without_counters(bare)
    found_the_stall(analyze(bare, bare, ["json"], workers=1))
