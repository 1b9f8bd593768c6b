"""The launchers diagtrain follows: the programs that start ranks, and the variables that tell a process its rank.

torchrun (also ``python -m torch.distributed.run``, ``accelerate launch`` and the deepspeed launcher,
which set torchrun's variables), SLURM's ``srun`` and the MPI launchers each tell every process they
start its global rank, the world size and its rank on the machine. Processes that no launcher named
(``torch.multiprocessing.spawn``, ``multiprocessing.Process``) are found when they call
``init_process_group`` instead (see :mod:`diagtrain.profiler.rank.late_ranks`).

Shared by the ranks (who am I) and the wrapper (what it looked for when no process became a rank).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# Programs that start ranks rather than being one: names of scripts, or of modules run with -m.
LAUNCHER_PROGRAMS = frozenset({
    "torchrun", "torch.distributed.run", "torch.distributed.launch",
    "accelerate", "accelerate.commands.launch",
    "deepspeed", "deepspeed.launcher.runner", "deepspeed.launcher.launch",
    "diagtrain", "diagtrain.profiler.cli",
})


@dataclass(frozen=True)
class RankVariables:
    """The variables one family of launchers sets in every process it starts."""

    launcher: str
    rank: str
    world_size: str
    local_rank: str
    node_rank: str | None = None
    # What tells one launch from another in the same allocation: a salloc or sbatch shell already has
    # SLURM_PROCID=0, and so does task 0 of every srun inside it.
    launch: str | None = None


# Most specific first: a process that mpirun started inside a SLURM allocation still carries the
# SLURM_PROCID of the daemon that started it, and RANK, where a launcher set it, always wins.
RANK_VARIABLES = (
    RankVariables("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", node_rank="GROUP_RANK"),
    RankVariables("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    RankVariables("MPICH / Intel MPI (PMI)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    RankVariables("SLURM srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", node_rank="SLURM_NODEID",
                  launch="SLURM_STEP_ID"),
)


@dataclass(frozen=True)
class LaunchedRank:
    """What a launcher told a process about its place in the job."""

    rank: int
    world_size: int | None
    local_rank: int | None
    node_rank: int | None
    variables: RankVariables
    launch: str | None  # the value of ``variables.launch``: equal records describe the same launched task


def rank_from_env(env: Mapping[str, str]) -> LaunchedRank | None:
    """The rank that the first launcher in RANK_VARIABLES whose rank variable is set gave, or None."""
    for v in RANK_VARIABLES:
        rank = _count(env.get(v.rank))
        if rank is not None:
            return LaunchedRank(rank, _count(env.get(v.world_size)), _count(env.get(v.local_rank)),
                                _count(env.get(v.node_rank)) if v.node_rank else None, v,
                                env.get(v.launch) if v.launch else None)
    return None


def rank_variable_names() -> str:
    """``RANK, OMPI_COMM_WORLD_RANK, ...``: the rank variables looked for, for messages."""
    return ", ".join(v.rank for v in RANK_VARIABLES)


def _count(value: str | None) -> int | None:
    """``value`` as a rank or a size (a non-negative integer), None if it is not one."""
    value = (value or "").strip()
    return int(value) if value.isdigit() else None
