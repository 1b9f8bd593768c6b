"""Ranks that no launcher named: found when they call ``torch.distributed.init_process_group``.

``torch.multiprocessing.spawn`` and ``multiprocessing.Process`` start ranks with nothing in their
environment to say so: the script (PyTorch's DDP tutorial) sets MASTER_ADDR and MASTER_PORT itself
and passes ``rank=`` and ``world_size=`` to ``init_process_group``. In every Python process of the
job that may become a rank (no launcher, no helper of a rank), ``init_process_group`` is wrapped as
soon as torch.distributed is imported: called with a rank, the process becomes that rank before the
process group starts; called without one (a store or an init_method that carries it), it becomes the
rank the process group gives it, right after. A process with a fork start method inherits the
wrapper from its parent.
"""

from __future__ import annotations

import functools
import inspect
import sys
from types import ModuleType
from typing import Any, Callable

from diagtrain.profiler.rank.after_import import call_after_import


def follow_init_process_group() -> None:
    """Become a rank when this process calls init_process_group (wrapped once torch.distributed is imported)."""
    call_after_import("torch.distributed", _wrap)


def _wrap(dist: ModuleType) -> None:
    original = getattr(dist, "init_process_group", None)
    if original is None or getattr(original, "_diagtrain_joins", False):
        return  # a torch built without distributed, or wrapped already
    joining = _joining(original)
    # Every module that imported it by name so far (distributed_c10d, device_mesh's init_device_mesh);
    # later imports take it from distributed_c10d, wrapped by then.
    for name, module in list(sys.modules.items()):
        if name.startswith("torch.distributed") and getattr(module, "init_process_group", None) is original:
            module.init_process_group = joining


def _joining(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        rank, world_size = _rank_arguments(original, args, kwargs)
        if rank is not None:
            _join(rank, world_size)
        result = original(*args, **kwargs)
        if rank is None:
            _join_from_group()
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


def _join(rank: int, world_size: int | None) -> None:
    """Instrument this process as ``rank``; a failure is said in one line and never reaches the job."""
    try:
        from diagtrain.profiler.rank import startup

        startup.join(rank, world_size)
    except Exception as e:  # noqa: BLE001 - instrumentation must not take the job down
        print(f"diagtrain: could not instrument rank {rank}: {type(e).__name__}: {e}", file=sys.stderr)
