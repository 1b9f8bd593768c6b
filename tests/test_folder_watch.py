"""run_dir.FolderWatch: a record created or replaced in the run directory's top or in a host's folder is seen;
an append and a heartbeat's rewrite in place are not; a folder changed within its clock's resolution is looked at
again."""

from __future__ import annotations

import os
import time

from diagtrain.profiler.run_dir import HOSTS_DIR, FolderWatch, Heartbeat, write_json_atomic

LONG_AGO_NS = time.time_ns() - 3600 * 10**9


def settle(*folders) -> None:
    """Date the folders an hour back: changed long before the next look."""
    for folder in folders:
        os.utime(folder, ns=(LONG_AGO_NS, LONG_AGO_NS))


def test_a_record_created_or_replaced_is_seen_and_an_append_is_not(tmp_path):
    host = tmp_path / HOSTS_DIR / "node-0"
    host.mkdir(parents=True)
    (host / "telemetry.jsonl").write_text("{}\n")
    beat = Heartbeat(host / "heartbeat")
    settle(tmp_path, tmp_path / HOSTS_DIR, host)
    watch = FolderWatch(tmp_path)
    assert watch.changed()  # the first look
    assert not watch.changed()
    with open(host / "telemetry.jsonl", "a") as f:
        f.write("{}\n")
    beat.write({"time": 1.0})
    assert not watch.changed()
    write_json_atomic(host / "clock.json", {"measurements": []})
    assert watch.changed()
    assert watch.changed()  # changed just now: within the folder time's resolution, looked at again
    settle(host)
    assert watch.changed() and not watch.changed()
    (tmp_path / HOSTS_DIR / "node-1").mkdir()
    write_json_atomic(tmp_path / "profile_windows.json", {"windows": []})
    settle(tmp_path, tmp_path / HOSTS_DIR, tmp_path / HOSTS_DIR / "node-1")
    assert watch.changed() and not watch.changed()
    beat.close()
