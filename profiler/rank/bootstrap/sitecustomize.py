"""Loaded by every Python process that `diagtrain run` starts (this folder is put on PYTHONPATH).

It instruments the process if it is a rank, then runs the user's own sitecustomize, if any, so
that wrapping a job never changes what it does. It must never break the process it runs in.
"""

import os
import sys


def _diagtrain_start() -> None:
    try:
        from diagtrain.profiler.rank import startup as inrank

        inrank.start()
    except KeyboardInterrupt:
        # Ctrl-C before the program even started: stop as it would have, without a traceback
        # through site.py (which would otherwise report it and run the program anyway).
        sys.stderr.write("diagtrain: interrupted while the process started\n")
        os._exit(130)
    except Exception as e:  # noqa: BLE001 - instrumentation must not take the job down
        print(f"diagtrain: could not instrument this process: {type(e).__name__}: {e}", file=sys.stderr)


def _chain_user_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        candidate = os.path.join(entry or os.getcwd(), "sitecustomize.py")
        if os.path.abspath(entry or os.getcwd()) != here and os.path.isfile(candidate):
            import importlib.util

            spec = importlib.util.spec_from_file_location("_user_sitecustomize", candidate)
            module = importlib.util.module_from_spec(spec)
            sys.modules["_user_sitecustomize"] = module
            spec.loader.exec_module(module)
            return


_diagtrain_start()
_chain_user_sitecustomize()
