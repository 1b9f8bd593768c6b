"""The profiling windows `diagtrain run --profile-steps auto` decides while the job runs.

The wrapper writes them to ``profile_windows.json`` in the run directory (replaced atomically); a
rank looks at that file at each step boundary with one ``stat`` (microseconds) and reads it only
when it changed. Every rank reads the same windows, so all profile the same steps.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from diagtrain.profiler.run_dir import PROFILE_WINDOWS_FILE
from diagtrain.profiler.util.step_ranges import StepRange


class ProfileRequests:
    """Watches the run directory's requested windows."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / PROFILE_WINDOWS_FILE
        self._seen: tuple[int, int, int] | None = None

    def poll(self) -> list[StepRange] | None:
        """The requested windows if the file changed since the last call, else None."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        key = (st.st_mtime_ns, st.st_ino, st.st_size)
        if key == self._seen:
            return None
        self._seen = key
        try:
            windows = json.loads(self.path.read_text())["windows"]
            return [StepRange(int(w["first"]), int(w["last"])) for w in windows]
        except (OSError, ValueError, KeyError, TypeError):
            self._seen = None  # not readable (yet): look again at the next step
            return None
