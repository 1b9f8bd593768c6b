"""Each strategy is what it claims: real gloo jobs, checked against the single-process run."""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import DASHBOARD_STEPS, JOB_TIMEOUT_S, Run, diagtrain_run, load_trace, train
from model_checks import assert_matches_the_model

pytestmark = pytest.mark.jobs  # every test here starts processes (tests/conftest.py)

STEPS = 6
# Every strategy here computes the same math as one process (same init, same global batch, mean
# reductions); only the order of float additions differs.
LOSS_TOLERANCE = 1e-3


def assert_follows(run: Run, reference: Run, rank: int = 0) -> None:
    """The run's losses are the single process's, over the steps both ran."""
    expected = reference.losses(0)
    losses = run.losses(rank)[: len(expected)]
    assert losses == pytest.approx(expected[: len(losses)], abs=LOSS_TOLERANCE)


def trace_op_counts(path) -> collections.Counter:
    events = load_trace(path)["traceEvents"]
    return collections.Counter(e["name"] for e in events if e.get("ph") == "X")


def test_reference_run_learns_and_lands_in_the_default_directory(reference_run):
    losses = reference_run.losses()
    assert len(losses) == STEPS
    assert reference_run.out.parent.name == "runs"
    assert re.fullmatch(r"\d{8}T\d{6}Z-ddp", reference_run.out.name)
    assert losses[-1] < losses[0]


# -- DDP, through a bare torchrun with the run directory from the environment ------------------

@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory) -> Run:
    out = tmp_path_factory.mktemp("ddp")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "diagtrain.reference_trainers", "--strategy", "ddp", "--steps", str(STEPS), "--profile-steps", "2-3"]
    env = {**os.environ, "DIAGTRAIN_RUN_DIR": str(out), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=JOB_TIMEOUT_S, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return Run(out, proc.returncode, proc.stderr)


def test_ddp_follows_the_single_process_loss_curve(ddp_run, reference_run):
    assert_follows(ddp_run, reference_run, rank=0)
    assert_follows(ddp_run, reference_run, rank=1)


def test_every_rank_writes_steps_heartbeat_and_profiled_traces(ddp_run):
    for rank in (0, 1):
        records = ddp_run.steps(rank)
        assert [r["step"] for r in records] == list(range(1, STEPS + 1))
        for r in records:
            assert set(r["phases_ms"]) >= {"data", "forward", "backward", "optimizer"}
            assert r["peak_mem_bytes"] > 0 and r["samples"] == 8 and r["tokens"] == 8 * 32
        assert (ddp_run.out / f"ranks/{rank}/heartbeat").exists()
        [trace_path] = ddp_run.traces(rank)
        assert trace_path.name == f"trace-rank{rank}-steps2-3.json.gz"
        trace = load_trace(trace_path)
        assert trace["distributedInfo"]["rank"] == rank
        assert trace["distributedInfo"]["world_size"] == 2
        assert trace["record_shapes"] and trace["profile_memory"]
        ops = trace_op_counts(trace_path)
        assert ops["ProfilerStep#2"] == 1 and ops["ProfilerStep#3"] == 1 and ops["ProfilerStep#4"] == 0
        assert ops["gloo:all_reduce"] >= 2  # the gradient bucket and the loss, in each of 2 steps
    assert ddp_run.json("injected.json") == []
    assert ddp_run.json("trainer.json")["mesh"] == {"pp": 1, "dp": 2, "tp": 1}


# -- FSDP2 --------------------------------------------------------------------------------------

FSDP_STEPS = 4


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory) -> Run:
    """4 ranks under `diagtrain run`, checkpointing: the FSDP job every test here reads, including the
    every-strategy check below (one job where there were a 2-rank and a 4-rank one)."""
    # Step 3 profiled: the model check holds a step's collectives to the layout, and checkpoints add their own.
    return run_strategy(tmp_path_factory.mktemp("fsdp") / "run", "fsdp", nproc=4, steps=FSDP_STEPS, profile="3",
                        trainer=["--checkpoint-every", "2"])


def test_fsdp_follows_the_single_process_loss_curve(fsdp_run, reference_run):
    assert_follows(fsdp_run, reference_run)


def test_fsdp_holds_one_nth_of_the_parameters_per_rank(fsdp_run):
    for rank in range(4):
        params = fsdp_run.parameters(rank)["parameters"]
        total = sum(_numel(p["shape"]) for p in params)
        local = sum(p["local_numel"] for p in params)
        assert local / total == pytest.approx(0.25, abs=0.01)
        assert all(p["dtensor"] and p["placements"] == ["S(0)"] and p["mesh_dims"] == ["dp"] for p in params)


def test_fsdp_saves_a_distributed_checkpoint(fsdp_run):
    for step in (2, 4):
        folder = fsdp_run.out / "checkpoints" / f"step-{step}"
        assert (folder / ".metadata").exists()
        assert len(list(folder.glob("*.distcp"))) == 4  # one shard file per rank


def test_zero2_keeps_parameters_gathered_after_forward(fsdp_run, tmp_path):
    # 2 ranks against fsdp_run's 4: a rank's all-gathers per step are one per sharded module, whatever the world.
    zero2 = train(tmp_path, "--strategy", "fsdp", "--steps", "3", "--profile-steps", "3",
                  "--fsdp-reshard-after-forward", "false")
    gathers_zero3 = trace_op_counts(fsdp_run.traces(0)[0])["gloo:all_gather"]
    gathers_zero2 = trace_op_counts(zero2.traces(0)[0])["gloo:all_gather"]
    # ZeRO-3 gathers each block again for backward; ZeRO-2-like gathers once per step.
    assert gathers_zero2 > 0 and gathers_zero3 >= 2 * gathers_zero2 - 1
    assert_matches_the_model(zero2.out)


# -- Tensor parallel (its 4-rank run under `diagtrain run` is below) --------------------------

def assert_megatron_style_shards(run: Run) -> None:
    """Column-parallel attention projections, row-parallel feed-forward output, embeddings whole."""
    tp = run.json("trainer.json")["mesh"]["tp"]
    params = {p["name"]: p for p in run.parameters(1)["parameters"]}
    column = params["layers.0.attention.wq.weight"]
    row = params["layers.0.feed_forward.w2.weight"]
    assert column["dtensor"] and column["placements"] == ["S(0)"] and column["mesh_dims"] == ["tp"]
    assert column["shape"] == [64, 64] and column["local_shape"] == [64 // tp, 64]
    assert row["placements"] == ["S(1)"] and row["shape"] == [64, 256] and row["local_shape"] == [64, 256 // tp]
    assert not params["tok_embeddings.weight"]["dtensor"]


# -- Pipeline parallel --------------------------------------------------------------------------

def _layers_by_rank(run: Run, world: int) -> dict[int, set[int]]:
    found = {}
    for rank in range(world):
        names = [p["name"] for p in run.parameters(rank)["parameters"]]
        found[rank] = {int(m.group(1)) for n in names if (m := re.match(r"layers\.(\d+)\.", n))}
    return found


# stage_layers counts layers per stage, not per rank: interleaved 1F1B runs two stages on each rank.
@pytest.mark.parametrize("schedule,extra,expected_layers,stage_layers", [
    ("1f1b", ["--layers", "6", "--inject", "pp_imbalance:stage=0,layers=4"], {0: {0, 1, 2, 3}, 1: {4, 5}}, [4, 2]),
    ("gpipe", ["--inject", "few_microbatches:microbatches=1"], {0: {0, 1}, 1: {2, 3}}, [2, 2]),
    ("interleaved1f1b", [], {0: {0, 2}, 1: {1, 3}}, [1, 1, 1, 1]),
])
def test_pp_stages_hold_disjoint_layers(tmp_path, reference_run, schedule, extra, expected_layers, stage_layers):
    run = train(tmp_path, "--strategy", "pp", "--steps", "3", "--schedule", schedule, *extra)
    assert _layers_by_rank(run, 2) == expected_layers
    first = {p["name"] for p in run.parameters(0)["parameters"]}
    last = {p["name"] for p in run.parameters(1)["parameters"]}
    assert "tok_embeddings.weight" in first and "tok_embeddings.weight" not in last
    assert "output.weight" in last and "output.weight" not in first
    info = run.json("trainer.json")
    assert info["stage_layers"] == stage_layers
    if not extra:  # an unchanged layout computes the single-process math
        assert_follows(run, reference_run, rank=1)
    for rank in (0, 1):
        assert "forward_backward" in run.steps(rank)[0]["phases_ms"]
    if "few_microbatches:microbatches=1" in extra:
        assert info["n_microbatches"] == 1
        assert run.json("injected.json") == [{"kind": "few_microbatches", "rank": None, "step": None,
                                              "params": {"microbatches": 1}}]


# -- 3D -----------------------------------------------------------------------------------------

def test_3d_mesh_on_8_ranks_under_diagtrain_run(tmp_path, reference_run):
    """The README's main job, small: pp x dp x tp = 2 x 2 x 2 under `diagtrain run`, analyzed at the end."""
    run = run_strategy(tmp_path / "run", "3d", nproc=8, steps=2)
    assert_ran_under_diagtrain_run(run, "3d", world=8, steps=2, reference_run=reference_run)
    assert run.json("trainer.json")["mesh"] == {"pp": 2, "dp": 2, "tp": 2}
    # Mesh order pp, dp, tp: ranks 0-3 are stage 0, ranks 4-7 stage 1.
    layers = _layers_by_rank(run, 8)
    assert all(layers[r] == {0, 1} for r in range(4)) and all(layers[r] == {2, 3} for r in range(4, 8))
    wq = next(p for p in run.parameters(5)["parameters"] if p["name"] == "layers.2.attention.wq.weight")
    # FSDP over TP shards the TP shard again on dim 0: a strided shard on dp, a plain one on tp.
    assert wq["mesh_dims"] == ["dp", "tp"] and wq["placements"] == ["_S(0, 2)", "S(0)"]
    assert wq["local_shape"] == [16, 64]  # 64 rows / tp 2 / dp 2


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# -- Training options ---------------------------------------------------------------------------

LINEARS_PER_FORWARD = 4 * 6 + 1  # q, k, v, o, w1, w2 per layer, and the output projection
LINEARS_RECOMPUTED = 4 * 6  # activation checkpointing replays each block's forward in backward


def _linear_inputs(run: Run) -> list[list[str]]:
    events = load_trace(run.traces(0)[0])["traceEvents"]
    return [e["args"]["Input type"] for e in events if e.get("name") == "aten::linear"]


def test_grad_accumulation_and_activation_checkpointing(fsdp_run, tmp_path):
    run = train(tmp_path, "--strategy", "fsdp", "--steps", "2", "--profile-steps", "2",
                "--activation-checkpoint", "--grad-accum", "2")
    assert len(_linear_inputs(fsdp_run)) == LINEARS_PER_FORWARD
    assert len(_linear_inputs(run)) == 2 * (LINEARS_PER_FORWARD + LINEARS_RECOMPUTED)
    assert [r["samples"] for r in run.steps(0)] == [16, 16]
    assert_matches_the_model(run.out)


def test_bf16_autocast_runs_linears_in_bfloat16(fsdp_run, tmp_path):
    run = train(tmp_path, "--strategy", "ddp", "--steps", "2", "--profile-steps", "2", "--bf16")
    assert any("c10::BFloat16" in types for types in _linear_inputs(run))
    assert not any("c10::BFloat16" in types for types in _linear_inputs(fsdp_run))
    assert_matches_the_model(run.out)


def run_strategy(out: Path, strategy: str, nproc: int, steps: int, profile: str = "2", trainer: list[str] = ()) -> Run:
    """The reference trainer (with ``trainer``'s options) under `diagtrain run`, one step profiled, analyzed at the end."""
    return diagtrain_run(out, "--profile-steps", profile, "--telemetry-interval", "0.2", "--", sys.executable, "-m",
                         "diagtrain.profiler.cli", "train", "--strategy", strategy, "--nproc", str(nproc),
                         "--steps", str(steps), "--layers", "4", *trainer)


def assert_ran_under_diagtrain_run(run: Run, strategy: str, world: int, steps: int, reference_run: Run) -> None:
    """Every rank's records, trace, flight recorder, logs and telemetry; the loss of one process; the model's numbers."""
    manifest = run.manifest
    assert manifest["status"] == "ok" and manifest["strategy"] == strategy and manifest["world_size"] == world
    assert manifest["exit_codes"] == {str(r): 0 for r in range(world)}
    for rank in range(world):
        assert [r["step"] for r in run.steps(rank)] == list(range(1, steps + 1))
        [trace] = run.traces(rank)
        events = load_trace(trace)
        assert events["distributedInfo"]["rank"] == rank
        assert any(e.get("name", "").startswith("gloo:") for e in events["traceEvents"])
        assert json.loads(run.text(rank, "flight_recorder.json"))["entries"]
        assert (run.out / f"ranks/{rank}/stderr.log").exists()
    assert f"[diagtrain] step {steps}/{steps}" in run.text(0, "stdout.log")
    processes = pd.read_parquet(run.out / "telemetry.parquet").query("kind == 'process'")
    assert set(processes["rank"]) == set(range(world))
    assert_follows(run, reference_run, rank=world - 1)
    assert_matches_the_model(run.out)  # analyzed by `diagtrain run` at the end


def test_ddp_on_4_ranks_under_diagtrain_run(ddp_4_ranks, tmp_path, reference_run):
    run = Run(tmp_path / "run", 0, "")
    shutil.copytree(ddp_4_ranks, run.out)  # the model check analyzes it in place: not the dashboard's copy
    assert_ran_under_diagtrain_run(run, "ddp", world=4, steps=DASHBOARD_STEPS, reference_run=reference_run)


def test_fsdp_on_4_ranks_under_diagtrain_run(fsdp_run, reference_run):
    assert_ran_under_diagtrain_run(fsdp_run, "fsdp", world=4, steps=FSDP_STEPS, reference_run=reference_run)


# 3D runs on 8 ranks above: a 4-rank 3D mesh would be a second job of the same code. DDP and FSDP: just above.
@pytest.mark.parametrize("strategy", ["tp", "pp"])
def test_every_strategy_on_4_ranks_under_diagtrain_run(tmp_path, reference_run, strategy):
    run = run_strategy(tmp_path / "run", strategy, nproc=4, steps=2)
    assert_ran_under_diagtrain_run(run, strategy, world=4, steps=2, reference_run=reference_run)
    if strategy == "tp":
        assert run.json("trainer.json")["mesh"] == {"pp": 1, "dp": 1, "tp": 4}
        assert_megatron_style_shards(run)
