"""Reading what ranks wrote about themselves (rank.json, heartbeat, exit.json) from outside."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json(path: Path) -> Any | None:
    """The JSON in ``path``, or None when it is missing or not (yet) valid."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class RankIndex:
    """The ranks of a run directory, re-scanned cheaply: each rank.json is parsed once."""

    def __init__(self, run_dir: Path) -> None:
        self.ranks_dir = Path(run_dir) / "ranks"
        self.info: dict[int, dict[str, Any]] = {}

    def refresh(self) -> dict[int, dict[str, Any]]:
        """Every rank that has written rank.json so far, by rank."""
        if self.ranks_dir.is_dir():
            for folder in self.ranks_dir.iterdir():
                if folder.name.isdigit() and int(folder.name) not in self.info:
                    info = read_json(folder / "rank.json")
                    if info is not None:
                        self.info[int(folder.name)] = info
        return self.info

    def on_host(self, host: str) -> dict[int, dict[str, Any]]:
        """The ranks started by the wrapper whose host folder is ``host``."""
        return {r: i for r, i in self.refresh().items() if i.get("host") == host}

    def heartbeat(self, rank: int) -> dict[str, Any] | None:
        return read_json(self.ranks_dir / str(rank) / "heartbeat")

    def exit_record(self, rank: int) -> dict[str, Any] | None:
        return read_json(self.ranks_dir / str(rank) / "exit.json")
