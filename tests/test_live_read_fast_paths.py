"""The live read of the hosts' summaries takes shortcuts for its usual case; each gives what the plain form gives, on
randomized inputs full of odd ones:

- a rank's usual read (one step past every one held) is held as the general form holds any read (RankSteps.take);
- a regular file is read by its descriptor alone as a file object read it (step_files.JsonlTail), however it grows,
  is cut short or replaced, and a caller's descriptor (open_read) reads as the tail's own;
- a summary line decoded as one (host_summary._Line, its rows tuples from the decoder) gives the groups and extra
  that plain JSON gives through row_groups.groups_of, and a line that is not one is read as plain JSON;
- a table of the rows of many hosts' summaries (a Columns each, the same names) is pd.DataFrame of their dicts.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from diagtrain.profiler.analyzer.read.host_summary import _Line, _line_of
from diagtrain.profiler.analyzer.read.row_groups import Columns, Row, groups_decoded, groups_of, table_of
from diagtrain.profiler.analyzer.read.step_tail import RankSteps
from diagtrain.profiler.step_files import JsonlTail, _split, json_value, open_read


def random_read(rng: random.Random, last: int) -> dict[int, dict[str, int]]:
    """A read of one rank: mostly its next step; now and then none, several, an old step again, a step out of order."""
    odd = rng.random()
    if odd < 0.6:
        steps = [last + 1]
    elif odd < 0.7:
        steps = []
    elif odd < 0.8:
        steps = [last + rng.randint(2, 4)]  # steps skipped
    elif odd < 0.9:
        steps = [rng.randint(max(last - 8, 0), last + 1)]  # maybe a step held again, or one let go read late
    else:
        steps = rng.sample(range(max(last - 5, 0), last + 5), rng.randint(2, 4))
    return {s: {"step": s, "v": rng.random()} for s in steps}


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("keep", [None, 1, 3, 6])
def test_a_ranks_usual_read_is_held_as_the_general_form_holds_any_read(seed, keep):
    rng = random.Random(seed)
    fast, plain = RankSteps(0, keep), RankSteps(0, keep)
    every: dict[int, dict] = {}  # every row read, each step's last
    kept: dict[int, dict] = {}  # the rows held: every row's last ``keep`` steps
    again, last = 0, 0
    for _ in range(120):
        added = random_read(rng, last)
        last = max([last, *added])
        for held in (fast, plain):  # point-to-point calls counted for steps read: let go with their rows
            held.found.p2p.update({s: {"calls": s} for s in added})
        again += sum(s in kept for s in added)  # a step held, read again
        every.update(added)
        fast.take(dict(added))
        plain.added = dict(added)
        plain._hold(plain.added)  # the general form alone
        kept = {s: every[s] for s in sorted(every)[-keep:]} if keep else dict(every)
        assert fast.rows == kept and list(fast.rows) == list(plain.rows)  # the same rows, in the same order
        ends = (min(kept), max(every)) if kept else (None, None)
        assert (fast.first, fast.last_step) == (plain.first, plain.last_step) == ends
        assert sorted(fast._held) == sorted(plain._held) == sorted(kept)
        assert fast.found.p2p == plain.found.p2p and set(fast.found.p2p) == set(kept)
        assert fast.found.repeated == plain.found.repeated == again and fast.added == added


class PlainTail:
    """JsonlTail's read as a file object made it: the plain form of a read by a descriptor."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.lines = path, 0, 0

    def read(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                if f.seek(0, 2) < self.offset:
                    self.offset = self.lines = 0
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        complete = data[:data.rfind(b"\n") + 1]
        self.offset += len(complete)
        lines = _split(complete)
        self.lines += len(lines)
        return lines


def change(rng: random.Random, path: Path) -> None:
    """Append to ``path`` (whole lines, a line cut mid-way, bytes that are no UTF-8), or cut it short, replace it,
    rewrite it in place, remove it, or put a folder in its place."""
    odd = rng.random()
    pieces = [b'{"a": 1}\n', b"x" * rng.randint(0, 9), b"\n", b"\xff\xfe\n", b"\r\n", "é\u2028\n".encode()]
    text = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 5)))
    if path.is_dir():
        path.rmdir()
    elif odd < 0.7:
        with open(path, "ab") as f:
            f.write(text)
    elif odd < 0.8 and path.exists():
        os.truncate(path, rng.randint(0, path.stat().st_size))
    elif odd < 0.87:
        path.with_name("new").write_bytes(text)
        os.replace(path.with_name("new"), path)
    elif odd < 0.93 and path.exists():
        with open(path, "r+b") as f:  # the same size, other bytes
            f.write(bytes(rng.randrange(256) for _ in range(f.seek(0, 2))))
    elif odd < 0.97:
        path.unlink(missing_ok=True)
    else:
        path.unlink(missing_ok=True)
        path.mkdir()


@pytest.mark.parametrize("seed", range(6))
def test_a_file_read_by_its_descriptor_reads_as_a_file_object_read_it(tmp_path, seed):
    rng = random.Random(seed)
    path = tmp_path / "steps_summary.jsonl"
    tail, by_caller, plain = JsonlTail(path), JsonlTail(path), PlainTail(path)
    for _ in range(300):
        change(rng, path)
        expected = plain.read()
        assert tail.read() == expected and (tail.offset, tail.lines) == (plain.offset, plain.lines)
        opened = open_read(path)
        try:
            got = by_caller.read(opened)
        finally:
            if opened is not None:
                os.close(opened.fd)
        assert got == expected and (by_caller.offset, by_caller.lines) == (plain.offset, plain.lines)


NAMES = ["rank", "step", "start", "wall_ms", "peak_mem_bytes", "flag", "device_steps", "label"]


def odd_value(rng: random.Random) -> Any:
    """A value of a row: numbers of either kind, None, a bool, a string, a list, an object, a big integer."""
    return rng.choice([rng.randint(-3, 40), rng.random() * 100, None, True, False, "7", "", [1, {"s": 2.5}],
                       {"k": None}, 2**63 + 5, -(2**63), 1e300, 0.0, -0.0])


def odd_group(rng: random.Random) -> Any:
    """A group as a summary carries it, odd now and then: a name given twice or no string, rows of another length,
    a row that is no list, a group that is none."""
    names: list[Any] = rng.sample(NAMES, rng.randint(0, len(NAMES)))
    odd = rng.random()
    if odd < 0.15 and names:
        names.append(rng.choice(names))  # a name given twice
    elif odd < 0.2:
        names.append(rng.choice([3, True, None, 1.5]))  # a name that is no string
    rows: list[Any] = []
    for _ in range(rng.randint(0, 5)):
        row = [odd_value(rng) for _ in names]
        if rng.random() < 0.1:
            row = row + [1] if rng.random() < 0.5 else row[:-1]
        rows.append(row)
    if rng.random() < 0.05:
        rows.append(rng.choice(["no row", 5, {"rank": 1}, None]))
    group: Any = {"columns": names, "rows": rows}
    odd = rng.random()
    if odd < 0.04:
        group = rng.choice(["not a group", 3, None, [names, rows]])
    elif odd < 0.08:
        del group[rng.choice(["columns", "rows"])]
    elif odd < 0.1:
        group["columns"] = "rank"
    elif odd < 0.12:
        group["more"] = {"ignored": 1}
    return group


def odd_line(rng: random.Random) -> str:
    """A summary line: groups and extra, a beat, or something else, now and then damaged or with a NaN."""
    odd = rng.random()
    if odd < 0.1:
        value: Any = {"beat": 12.5}
    elif odd < 0.14:
        value = rng.choice([[1, 2], "text", 5, None, {}])
    else:
        value = {"groups": [odd_group(rng) for _ in range(rng.randint(0, 3))]}
        if rng.random() < 0.05:
            value["groups"] = rng.choice([None, "groups", {"columns": ["rank"]}])
        if rng.random() < 0.7:
            value["extra"] = rng.choice([{}, {"3": {"phases": ["forward"], "bad": 1}}, None, {"x": 1}])
    text = json.dumps(value)
    odd = rng.random()
    if odd < 0.04:
        return text.replace("0.0", "NaN", 1)  # json reads it, msgspec does not
    if odd < 0.06:
        return text[:len(text) // 2]  # cut mid-way: no JSON
    if odd < 0.08:
        return text.replace('"extra"', '"groups": null, "extra"', 1)  # a key given twice: its last value counts
    return text


def plain_groups(line: Any) -> tuple[list, Any]:
    """What HostSummary.read takes of a line decoded as plain JSON: its groups (columns' names, rows) and extra."""
    found = groups_of(line.get("groups"), {})
    return [(columns.names, rows) for columns, rows in found], line.get("extra")


@pytest.mark.parametrize("seed", range(6))
def test_a_summary_line_decoded_as_one_gives_what_plain_json_gives(seed):
    rng = random.Random(seed)
    decoded = 0
    for _ in range(600):
        text = odd_line(rng)
        try:
            plain = json_value(text)
        except ValueError:
            with pytest.raises(ValueError):
                _line_of(text)
            continue
        line = _line_of(text)
        if isinstance(line, _Line):
            decoded += 1
            assert isinstance(plain, dict)
            got = [(columns.names, rows) for columns, rows in groups_decoded(line.groups, {})]
            assert repr((got, line.extra)) == repr(plain_groups(plain))  # tuples and values of the same types
            assert all(type(row) is tuple for _, rows in got for row in rows)
        else:
            assert repr(line) == repr(plain)
    assert decoded > 100  # the usual lines took the decoder's way


def odd_rows(rng: random.Random) -> list[Any]:
    """Rows of many hosts' summaries (each host's own Columns of the same names), now and then a host naming other
    columns or in another order, and rows as dicts."""
    names = ["rank", "step", "wall_ms", "peak_mem_bytes", "label"]
    kinds = [rng.choice([lambda: rng.randint(0, 9), lambda: rng.random(), lambda: None, lambda: True, lambda: "s",
                         lambda: float("nan"), lambda: 2**63 + 1, lambda: rng.choice([1, 2.5, None, "x", False])])
             for _ in names]
    rows: list[Any] = []
    for _ in range(rng.randint(1, 12)):  # hosts
        host = names if rng.random() < 0.8 else rng.sample(names + ["extra_ms"], rng.randint(1, 6))
        columns = Columns(tuple(host))
        for _ in range(rng.randint(1, 4)):
            cells = tuple(kinds[names.index(n)]() if n in names else rng.random() for n in host)
            rows.append(Row(columns, cells) if rng.random() < 0.9 else dict(zip(host, cells)))
    return rows


@pytest.mark.parametrize("seed", range(40))
def test_a_table_of_many_hosts_rows_is_one_frame_of_their_dicts(seed):
    rows = odd_rows(random.Random(seed))
    with np.errstate(all="ignore"):
        pd.testing.assert_frame_equal(table_of(rows), pd.DataFrame([dict(r) for r in rows]), check_exact=True)
