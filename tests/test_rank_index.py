"""The run's ranks as RankIndex finds them: the ranks folder listed again only when it changed, a rank whose record
is not written yet asked again until it is."""

from __future__ import annotations

import os
from pathlib import Path

from diagtrain.profiler.run_dir import RankIndex, write_json_atomic


def rank_folder(root: Path, rank: int, record: bool = True) -> Path:
    folder = root / "ranks" / str(rank)
    folder.mkdir(parents=True, exist_ok=True)
    if record:
        write_json_atomic(folder / "rank.json", {"rank": rank, "host": f"node-{rank // 2}"})
    return folder


def age(path: Path, seconds: float = 60.0) -> None:
    """Set a folder's modification time in the past, as a folder last changed a minute ago."""
    when = os.stat(path).st_mtime - seconds
    os.utime(path, (when, when))


def test_ranks_are_found_as_they_come(tmp_path: Path) -> None:
    rank_folder(tmp_path, 0)
    late = rank_folder(tmp_path, 1, record=False)  # its folder before its record
    age(tmp_path / "ranks")
    index = RankIndex(tmp_path)
    assert sorted(index.refresh()) == [0]
    write_json_atomic(late / "rank.json", {"rank": 1, "host": "node-0"})  # the ranks folder itself did not change
    assert sorted(index.refresh()) == [0, 1]
    rank_folder(tmp_path, 2)  # a new folder: the ranks folder changed
    assert sorted(index.refresh()) == [0, 1, 2] and index.info[2]["host"] == "node-1"


def test_an_unchanged_ranks_folder_is_not_listed_again(tmp_path: Path) -> None:
    rank_folder(tmp_path, 0)
    age(tmp_path / "ranks")
    index = RankIndex(tmp_path)
    assert sorted(index.refresh()) == [0]
    # A folder made with the ranks folder's time put back as it was: only a listing would find it.
    listed = os.stat(tmp_path / "ranks").st_mtime_ns
    rank_folder(tmp_path, 3)
    os.utime(tmp_path / "ranks", ns=(listed, listed))
    assert sorted(index.refresh()) == [0]
    age(tmp_path / "ranks", 1.0)  # its time moves: listed, and found
    assert sorted(index.refresh()) == [0, 3]


def test_a_recently_changed_ranks_folder_is_listed_again(tmp_path: Path) -> None:
    """Within its time's resolution a folder can change twice under one time: one changed just now is listed again."""
    rank_folder(tmp_path, 0)
    index = RankIndex(tmp_path)
    assert sorted(index.refresh()) == [0]
    listed = os.stat(tmp_path / "ranks").st_mtime_ns
    rank_folder(tmp_path, 1)
    os.utime(tmp_path / "ranks", ns=(listed, listed))  # the same time, as a coarse clock would give it
    assert sorted(index.refresh()) == [0, 1]


def test_what_live_judgement_makes_of_the_ranks_records_is_made_again_when_one_is_read(tmp_path: Path) -> None:
    """LiveSteps keeps rank_hosts and world_size until RankIndex reads a rank's record (its version), not longer."""
    from diagtrain.profiler.analyzer.run.live_tables import LiveSteps

    rank_folder(tmp_path, 0)
    live = LiveSteps(tmp_path, window_steps=5)
    version = live.ranks.version
    live.ranks.refresh()
    assert live.ranks.version == version + 1
    assert live.rank_hosts() == {0: "node-0"} and live.world_size() is None
    assert live.rank_hosts() is live.rank_hosts()  # kept: no record read since
    live.ranks.refresh()  # nothing new: the same version, the same maps
    assert live.ranks.version == version + 1 and live.rank_hosts() == {0: "node-0"}
    write_json_atomic(rank_folder(tmp_path, 3, record=False) / "rank.json",
                      {"rank": 3, "host": "node-9", "world_size": 4})
    live.ranks.refresh()
    assert live.rank_hosts() == {0: "node-0", 3: "node-9"} and live.world_size() == 4
