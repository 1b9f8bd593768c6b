"""diagtrain's own failures inside a rank: said once, recorded, never raised into the job.

The job must never fail because of diagtrain: a full disk while a trace is exported, a profiler
that will not start, a step record that cannot be written. Each such failure is printed once to
the rank's stderr (so it reaches stderr.log and the terminal) and appended to
``ranks/<r>/warnings.jsonl``; the exit record repeats them (the disk may have refused that line),
and the wrapper puts them in the manifest's ``warnings``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from diagtrain.profiler.run_dir import WARNING_PREFIX, WARNINGS_FILE

_said: set[str] = set()
_records: list[dict[str, Any]] = []


def warn(folder: Path | None, key: str, message: str) -> None:
    """Say ``message`` once per ``key`` in this process: on stderr and in the rank's warnings."""
    if key in _said:
        return
    _said.add(key)
    record = {"time": round(time.time(), 3), "message": message}
    _records.append(record)
    who = f"rank {folder.name}: " if folder is not None and folder.name.isdigit() else ""
    try:
        # The wrapper reads this line from the job's output too: it reaches the manifest even when
        # the disk took neither warnings.jsonl nor exit.json.
        print(f"{WARNING_PREFIX}{who}{message}", file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001 - stderr closed or full: the records below still hold it
        pass
    if folder is not None:
        try:
            with open(folder / WARNINGS_FILE, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        except OSError:
            pass  # the full disk itself: exit.json repeats the warnings


def recorded() -> list[dict[str, Any]]:
    """Every warning this process gave, for the exit record."""
    return list(_records)


def reason(error: BaseException) -> str:
    """A short cause: ``No space left on device`` rather than the errno tuple."""
    return getattr(error, "strerror", None) or f"{type(error).__name__}: {error}"
