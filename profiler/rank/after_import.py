"""Run a callback right after a module is imported, without importing it ourselves.

The in-rank code must not change the program's import order or start-up time, so it never imports
torch (or a part of it) early: a finder on ``sys.meta_path`` waits for the program to import the
module and then calls back with it.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Any, Callable


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``callback(module)`` once the module ``name`` has been executed."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_call(module: ModuleType) -> None:
            exec_module(module)
            try:
                self.callback(module)
            except Exception as e:  # noqa: BLE001 - never break the user's import
                print(f"diagtrain: instrumentation after `import {fullname}` failed: {type(e).__name__}: {e}",
                      file=sys.stderr)

        spec.loader.exec_module = exec_then_call
        return spec


def call_after_import(name: str, callback: Callable[[ModuleType], None]) -> None:
    """``callback(module)`` as soon as ``name`` is imported, or at once if it already is."""
    if name in sys.modules:
        callback(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, callback))
