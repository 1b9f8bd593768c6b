"""Every common launcher under `diagtrain run`: ranks named by torchrun's, SLURM's or MPI's variables, ranks
started by torch.multiprocessing.spawn or multiprocessing.Process and found at init_process_group, and a
command in which no process became a rank.

The jobs run for real (gloo on CPU); the injected slow rank sleeps 80 ms a step, far above the noise of a
shared 2-core machine.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import Run, diagtrain_run
from diagtrain.profiler.util.launchers import rank_from_env

pytestmark = pytest.mark.jobs  # every test here starts processes (tests/conftest.py)

SPAWN_SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "user_scripts" / "ddp_spawn.py"
SOLO_SCRIPT = Path(__file__).parent / "scripts" / "user_ddp.py"


def rank_of(env: dict[str, str]) -> tuple | None:
    """(rank, world size, local rank, the variable it came from) as the launchers' table reads ``env``."""
    found = rank_from_env(env)
    return None if found is None else (found.rank, found.world_size, found.local_rank, found.variables.rank)


def test_each_launchers_variables_name_the_rank():
    assert rank_of({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}) == (3, 8, 1, "RANK")
    assert rank_of({"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1"}) == (5, 16, 1, "SLURM_PROCID")
    assert rank_of({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}) \
        == (2, 4, 0, "OMPI_COMM_WORLD_RANK")
    assert rank_of({"PMI_RANK": "7", "PMI_SIZE": "8"}) == (7, 8, None, "PMI_RANK")
    assert rank_of({"MASTER_ADDR": "node0", "LOCAL_RANK": "0"}) is None  # no launcher named a rank
    assert rank_of({"RANK": "", "SLURM_PROCID": "x1"}) is None  # not a rank: nothing is guessed


def test_torchruns_rank_wins_and_mpi_comes_before_slurm():
    # accelerate, deepspeed and torchrun all set RANK, also inside a SLURM allocation.
    inside_slurm = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "OMPI_COMM_WORLD_RANK": "1", "PMI_RANK": "1"}
    assert rank_of({**inside_slurm, "RANK": "6", "WORLD_SIZE": "8"}) == (6, 8, None, "RANK")
    # mpirun's processes keep the SLURM_PROCID of the daemon that started them: MPI's own rank counts.
    assert rank_of(inside_slurm)[3] == "OMPI_COMM_WORLD_RANK"
    assert rank_of({"PMI_RANK": "1", "SLURM_PROCID": "0"})[3] == "PMI_RANK"


def test_a_salloc_shells_slurm_rank_is_not_the_rank_of_an_srun_task_below_it():
    shell = {"SLURM_JOB_ID": "42", "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"}
    task = {**shell, "SLURM_STEP_ID": "0"}  # task 0 of `srun -n 2` inside it: the same numbers, another launch
    assert rank_from_env(shell) == rank_from_env(dict(shell))
    assert rank_from_env(task) != rank_from_env(shell)


@pytest.fixture(scope="module")
def spawn_run(tmp_path_factory) -> Run:
    """PyTorch's DDP-tutorial way: mp.spawn, 2 ranks, rank 1 sleeping 80 ms before each forward; analyzed."""
    out = tmp_path_factory.mktemp("spawn") / "run"
    return diagtrain_run(out, "--profile-steps", "none", "--", sys.executable, str(SPAWN_SCRIPT),
                         "--steps", "10", "--slow-rank", "1", "--slow-ms", "80")


def test_ranks_started_by_mp_spawn_are_instrumented_by_their_rank(spawn_run):
    ranks = sorted(p.name for p in (spawn_run.out / "ranks").iterdir())
    assert ranks == ["0", "1"]  # the spawning parent is no rank, and left nothing behind
    for rank in (0, 1):
        info = json.loads(spawn_run.text(rank, "rank.json"))
        assert (info["rank"], info["world_size"], info["rank_from"]) == (rank, 2, "init_process_group")
        assert [r["step"] for r in spawn_run.steps(rank)] == list(range(1, 11))
        assert json.loads(spawn_run.text(rank, "exit.json"))["code"] == 0
    m = spawn_run.manifest
    assert m["world_size"] == 2 and sorted(m["rank_exits"]) == ["0", "1"]
    assert "became a rank" not in spawn_run.stderr


def test_the_slow_mp_spawn_rank_is_the_straggler(spawn_run):
    report = spawn_run.json("report.json")
    # Warnings and worse: a busy host can add an info-level pause on rank 0 (information, not a verdict).
    [f] = [f for f in report["findings"] if f["kind"] == "straggler" and f["severity"] != "info"]
    assert f["ranks"] == [1] and f["metrics"]["impact_source"] == "ledger"
    assert 60.0 <= f["impact_ms"] <= 200.0  # the 80 ms sleep, give or take a busy host (as in test_ledger)


def test_ranks_started_by_multiprocessing_process_with_fork(tmp_path):
    run = diagtrain_run(tmp_path / "run", "--profile-steps", "none", "--no-analyze", "--", sys.executable,
                        str(SPAWN_SCRIPT), "--steps", "4", "--start-method", "fork")
    assert sorted(p.name for p in (run.out / "ranks").iterdir()) == ["0", "1"]
    for rank in (0, 1):
        records = run.steps(rank)
        assert [r["step"] for r in records] == [1, 2, 3, 4] and {r["rank"] for r in records} == {rank}
        # Counted in the child itself, not from its parent's totals: no negative CPU time in step 1.
        assert all(r["cpu_ms"] > 0 and r["comm_calls"] > 0 for r in records)
        assert json.loads(run.text(rank, "exit.json"))["reason"] == "returned"
        assert json.loads(run.text(rank, "rank.json"))["pid"] != json.loads(run.text(1 - rank, "rank.json"))["pid"]


def test_a_slurm_rank_set_below_the_wrapper_names_the_process_from_its_start(tmp_path):
    # As srun sets it in each task it starts; `env` stands in for srun (a program that is not Python).
    run = diagtrain_run(tmp_path / "run", "--profile-steps", "none", "--no-analyze", "--", "env",
                        "SLURM_PROCID=3", "SLURM_NTASKS=4", "SLURM_LOCALID=1", sys.executable, str(SOLO_SCRIPT),
                        env={"STEPS": "2"})
    info = json.loads(run.text(3, "rank.json"))
    assert (info["rank"], info["world_size"], info["local_rank"], info["rank_from"]) == (3, 4, 1, "SLURM_PROCID")
    assert len(run.steps(3)) == 2


def test_under_srun_each_wrappers_command_is_its_tasks_rank(tmp_path):
    # `srun -n 2 diagtrain run -- python train.py`: the wrapper of task 1 was started with SLURM_PROCID=1.
    task = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "STEPS": "2"}
    run = diagtrain_run(tmp_path / "run", "--profile-steps", "none", "--no-analyze", "--", sys.executable,
                        str(SOLO_SCRIPT), env=task)
    assert [p.name for p in (run.out / "ranks").iterdir()] == ["1"]
    assert json.loads(run.text(1, "rank.json"))["rank_from"] == "the command" and len(run.steps(1)) == 2


def test_a_slurm_rank_the_wrapper_was_started_with_does_not_hide_spawned_ranks(tmp_path):
    # Inside a salloc or sbatch shell every process has SLURM_PROCID=0: the spawning parent is still no rank.
    slurm_shell = {"SLURM_JOB_ID": "42", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0"}
    run = diagtrain_run(tmp_path / "run", "--profile-steps", "none", "--no-analyze", "--", sys.executable,
                        str(SPAWN_SCRIPT), "--steps", "3", env=slurm_shell)
    assert sorted(p.name for p in (run.out / "ranks").iterdir()) == ["0", "1"]
    assert {json.loads(run.text(r, "rank.json"))["rank_from"] for r in (0, 1)} == {"init_process_group"}


def test_a_command_in_which_no_process_became_a_rank_says_so(tmp_path):
    run = diagtrain_run(tmp_path / "run", "--no-analyze", "--", "sh", "-c", "echo not python")
    lines = [line for line in run.stderr.splitlines() if "no process of the command became a rank" in line]
    assert len(lines) == 1 and "SLURM_PROCID" in lines[0] and "init_process_group" in lines[0]
    assert run.returncode == 0 and "not python" in run.stdout
    assert any("became a rank" in w["message"] for w in run.manifest["warnings"])
