"""Run a callback when this process ends, however a Python program ends normally.

``atexit`` covers a program that returns or calls ``sys.exit``. A child that multiprocessing started
with the fork or forkserver method ends with ``os._exit`` once its target returns, which skips atexit:
there multiprocessing's own finalizers run instead, while the target's exception (if any) is still on
its way out.
"""

from __future__ import annotations

import atexit
import sys
from typing import Callable


def at_process_end(callback: Callable[[], None]) -> None:
    """Call ``callback`` when this process ends; it may be called twice, so it must do its work once."""
    atexit.register(callback)
    # Never imported here: a multiprocessing child has imported it long before it runs its target.
    mp = sys.modules.get("multiprocessing")
    if mp is not None and mp.parent_process() is not None:
        from multiprocessing.util import Finalize

        Finalize(None, callback, exitpriority=0)
