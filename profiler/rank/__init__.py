"""Code that runs inside the user's training processes (the ranks).

A bug here breaks the user's job, so this package stays small, imports only itself, the
run-directory contract (:mod:`diagtrain.profiler.run_dir`), small shared utilities and torch, and
catches every failure of its own (logged to the rank's stderr.log), never raising into user code.

`diagtrain run` puts :data:`BOOTSTRAP_DIR` on the ranks' PYTHONPATH; its sitecustomize calls
:func:`diagtrain.profiler.rank.startup.start` before the user's code runs.
"""

from pathlib import Path

# The folder holding the bootstrap sitecustomize (a plain folder, not a package).
BOOTSTRAP_DIR = Path(__file__).resolve().parent / "bootstrap"
# diagtrain's profiler/ folder: frames there are diagtrain's (a signal handler, a step hook, the
# counters' wrappers around torch), never the user's code.
OWN_CODE = str(Path(__file__).resolve().parent.parent)
