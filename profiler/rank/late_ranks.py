"""Ranks that no launcher named: found when they call ``torch.distributed.init_process_group``.

``torch.multiprocessing.spawn`` and ``multiprocessing.Process`` start ranks with nothing in their
environment to say so: the script (PyTorch's DDP tutorial) sets MASTER_ADDR and MASTER_PORT itself
and passes ``rank=`` and ``world_size=`` to ``init_process_group``. In every Python process of the
job that may become a rank (no launcher, no helper of a rank), ``init_process_group`` is wrapped as
soon as torch.distributed is imported: called with a rank, the process becomes that rank before the
process group starts; called without one (a store or an init_method that carries it), it becomes the
rank the process group gives it, right after. A process with a fork start method inherits the
wrapper from its parent.

Every rank's call is also timed (launched ranks too, which do not join this way): when the process
group began and when it was ready go into rank.json, the start-up's "process-group set-up".
"""

from __future__ import annotations

import functools
import inspect
import sys
import time
from types import ModuleType
from typing import Any, Callable

from diagtrain.profiler.rank.after_import import call_after_import


def follow_init_process_group(join: bool) -> None:
    """Time this process's init_process_group and, with ``join``, become a rank when it calls it (wrapped once
    torch.distributed is imported)."""
    call_after_import("torch.distributed", functools.partial(_wrap, join=join))


def _wrap(dist: ModuleType, join: bool) -> None:
    original = getattr(dist, "init_process_group", None)
    if original is None or getattr(original, "_diagtrain_joins", False):
        return  # a torch built without distributed, or wrapped already
    joining = _joining(original, join)
    # Every module that imported it by name so far (distributed_c10d, device_mesh's init_device_mesh);
    # later imports take it from distributed_c10d, wrapped by then.
    for name, module in list(sys.modules.items()):
        if name.startswith("torch.distributed") and getattr(module, "init_process_group", None) is original:
            module.init_process_group = joining


def _joining(original: Callable[..., Any], join: bool) -> Callable[..., Any]:
    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        rank, world_size = _rank_arguments(original, args, kwargs) if join else (None, None)
        if rank is not None:
            _join(rank, world_size)
        began = time.time()
        result = original(*args, **kwargs)
        ready = time.time()
        if join and rank is None:
            _join_from_group()
        _note_times(began, ready)
        return result

    init_process_group._diagtrain_joins = True  # type: ignore[attr-defined]
    return init_process_group


def _rank_arguments(original: Callable[..., Any], args: tuple, kwargs: dict) -> tuple[int | None, int | None]:
    """The ``rank`` and ``world_size`` the call passes (None for torch's -1: from the environment or store)."""
    try:
        given = inspect.signature(original).bind(*args, **kwargs).arguments
    except (TypeError, ValueError):
        return None, None  # a call torch itself will refuse, with its own message
    rank, world_size = given.get("rank"), given.get("world_size")
    return (rank if isinstance(rank, int) and rank >= 0 else None,
            world_size if isinstance(world_size, int) and world_size > 0 else None)


def _join_from_group() -> None:
    dist = sys.modules["torch.distributed"]
    if dist.is_initialized():
        _join(dist.get_rank(), dist.get_world_size())


def _note_times(began: float, ready: float) -> None:
    """When the process group began and was ready, for the start-up's split; never reaches the job."""
    try:
        from diagtrain.profiler.rank import startup

        startup.note_process_group(began, ready)
    except Exception:  # noqa: BLE001 - a start-up time is not worth a failed init_process_group
        pass


def _join(rank: int, world_size: int | None) -> None:
    """Instrument this process as ``rank``; a failure is said in one line and never reaches the job."""
    try:
        from diagtrain.profiler.rank import startup

        startup.join(rank, world_size)
    except Exception as e:  # noqa: BLE001 - instrumentation must not take the job down
        print(f"diagtrain: could not instrument rank {rank}: {type(e).__name__}: {e}", file=sys.stderr)
