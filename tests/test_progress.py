"""The progress view, rendered from a run directory's files."""

from __future__ import annotations

import os
import socket
import time

from rich.console import Console

from diagtrain.profiler.collect.progress import Progress
from diagtrain.profiler.run_dir import RankIndex, write_json_atomic


def _rank(run_dir, rank: int, step: int, pid: int, exit_code: int | None = None) -> None:
    folder = run_dir / "ranks" / str(rank)
    folder.mkdir(parents=True)
    write_json_atomic(folder / "rank.json", {"rank": rank, "host": "h", "hostname": socket.gethostname(), "pid": pid})
    write_json_atomic(folder / "heartbeat", {"step": step, "time": time.time() - 2})
    if exit_code is not None:
        write_json_atomic(folder / "exit.json", {"code": exit_code})


def test_live_table_shows_steps_and_who_is_alive(tmp_path):
    _rank(tmp_path, 0, 7, os.getpid())
    _rank(tmp_path, 1, 5, os.getpid(), exit_code=1)
    console = Console(record=True, force_terminal=True, width=100)
    with Progress(RankIndex(tmp_path), console) as progress:
        progress.update()
    text = console.export_text()
    assert "1/2 ranks alive, step 5-7" in text
    assert "exited 1" in text and "alive" in text and "2s ago" in text


def test_plain_lines_when_not_a_terminal(tmp_path):
    _rank(tmp_path, 0, 3, os.getpid())
    console = Console(record=True, force_terminal=False, width=100)
    with Progress(RankIndex(tmp_path), console) as progress:
        progress.update()
        progress.update()  # within LINE_EVERY_S: no second line
    lines = [line for line in console.export_text().splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("[diagtrain] 1/1 ranks alive, step 3,")


def test_live_findings_stand_above_the_table(tmp_path):
    _rank(tmp_path, 0, 7, os.getpid())
    console = Console(record=True, force_terminal=True, width=120)
    standing = ["ERROR straggler on rank 0 since step 2, 3.1 s lost so far"]
    with Progress(RankIndex(tmp_path), console, lambda: standing) as progress:
        progress.update()
    assert "live: ERROR straggler on rank 0 since step 2, 3.1 s lost so far" in console.export_text()
