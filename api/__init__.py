"""diagtrain: why a distributed PyTorch job is slow, stuck or out of memory, and on which rank, step, operation.

From Python (a notebook)::

    import diagtrain
    run = diagtrain.load("runs/20261128T101010Z-ddp")   # a run directory, a folder of traces or of dumps
    run.findings[0]                                      # the most worth fixing
    run.goodput, run.job_time                            # where the job's wall time went
    run.steps, run.ledger, run.collectives               # pandas DataFrames, on the run's clock
    run.timeline(ranks=[0, 3], steps=range(10, 13))      # the dashboard's figures, as plotly figures

``import diagtrain`` loads nothing heavy (no torch, pandas or dash): :func:`load` imports what it needs.
The command line is ``diagtrain run | analyze | dashboard | export | compare | plan | train``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from diagtrain.notebook import Run

__all__ = ["Run", "load"]


def load(path: Any, **options: Any) -> Run:
    """The analysis of ``path`` as a :class:`~diagtrain.notebook.Run` (analyzed first where it has none); options:
    ``workers``, ``settings`` ({"section.name": value}), ``scheduler``, ``out``, ``progress``."""
    from diagtrain.notebook import load as load_run

    return load_run(path, **options)


def __getattr__(name: str) -> Any:
    if name == "Run":  # on first use: its module imports pandas
        from diagtrain.notebook import Run

        return Run
    raise AttributeError(f"module 'diagtrain' has no attribute {name!r}")
