"""Step rows as groups of value lists that share their column names: how a host's summary carries its ranks' rows
(host_summary.py: ``{"columns": [...], "rows": [[...], ...]}``, the names once a group, not once a row), and how
live judgement reads them back and makes tables of them without a dict per row (a read at 8,192 ranks is 8,192
rows: their dicts, and a table made from the dicts, were most of the cost of reading the summaries).

A row read back is a :class:`Row`: its group's column names and its own values, read as a dict would be.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import msgspec
import numpy as np
import pandas as pd


class Columns:
    """A group's column names, each once, and where each one's value is in its rows' lists (shared by its rows)."""

    __slots__ = ("names", "at")

    def __init__(self, names: tuple[Any, ...]) -> None:
        self.names = names
        self.at = {name: i for i, name in enumerate(names)}


class Row(msgspec.Struct, gc=False, eq=False):
    """One step row as its group carried it, read as the dict of its column names and values would be (a Mapping).

    Not followed by the garbage collector (``gc=False``; its cells a tuple, which it stops following once it holds
    numbers and strings only): live judgement holds 40 steps of every rank's rows, 330,000 at 8,192 ranks, and a
    full collection walked them all (~90 ms; the dicts they replace held numbers only, which it does not follow
    either). No reference cycle goes through a row: its columns are its group's, its cells what JSON decoded."""

    columns: Columns
    cells: tuple[Any, ...]

    def __getitem__(self, name: Any) -> Any:
        return self.cells[self.columns.at[name]]

    def get(self, name: Any, default: Any = None) -> Any:
        """The value of ``name``, ``default`` where the row has none (as a dict's: the reader asks for two a row)."""
        at = self.columns.at.get(name)
        return default if at is None else self.cells[at]

    def __contains__(self, name: object) -> bool:
        return name in self.columns.at

    def __iter__(self) -> Iterator[Any]:
        return iter(self.columns.names)

    def __len__(self) -> int:
        return len(self.columns.names)

    def keys(self) -> tuple[Any, ...]:
        """Its column names (each once: ``dict(row)`` and ``{**row}`` read them)."""
        return self.columns.names

    def values(self) -> tuple[Any, ...]:
        """Its values, in the order of :meth:`keys`."""
        return self.cells

    def items(self) -> Iterator[tuple[Any, Any]]:
        """Its (name, value) pairs."""
        return zip(self.columns.names, self.cells)

    def __eq__(self, other: object) -> bool:
        return dict(self.items()) == dict(other.items()) if isinstance(other, Mapping) else NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a mapping's contents, as a dict's: unhashable

    def __repr__(self) -> str:
        return f"Row({dict(self.items())!r})"


Mapping.register(Row)  # a msgspec Struct takes no ABC for a base: the Mapping it is, for isinstance (pandas asks)


def columns_of(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows as columns and values, one group per set of keys (a phase first seen adds a key): the names once a
    line, not once a row."""
    groups: dict[tuple[str, ...], list[list[Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row), []).append(list(row.values()))
    return [{"columns": list(keys), "rows": values} for keys, values in groups.items()]


def rows_of(groups: Any, known: dict[tuple[Any, ...], Columns]) -> list[Row]:
    """:func:`columns_of` read back: each row as its reader made it, in order (a group that is not one, and a row of
    another length than its names, are left out). ``known``: the groups' names read before and their columns, the
    caller's to keep (a reader's rows share them: the same few sets of names every read)."""
    return [Row(columns, cells) for columns, values in groups_of(groups, known) for cells in values]


def groups_of(groups: Any, known: dict[tuple[Any, ...], Columns]) -> list[tuple[Columns, list[tuple[Any, ...]]]]:
    """:func:`rows_of` as each group's columns and its rows' values (in the order of the columns' names): a reader
    finds a row's rank and step at their places in its group, not through a Row's lookup a row."""
    found = []
    for group in groups if isinstance(groups, list) else []:
        names = group.get("columns") if isinstance(group, dict) else None
        values = group.get("rows") if isinstance(names, list) else None
        # A name JSON gives as a list or an object cannot name a column (nor key one): a damaged group, left out.
        if isinstance(values, list) and not any(isinstance(name, (list, dict)) for name in names):
            width = len(names)
            found.append(_group(tuple(names), [tuple(v) for v in values if isinstance(v, list) and len(v) == width],
                                known))
    return found


class Group(msgspec.Struct):
    """A group as a summary line carries it, decoded as one (a line that is not, ``groups_of``'s to read): its rows'
    values made tuples by the decoder, not copied from the lists a plain decoding gives (the copies were a sixth of
    the CPU of reading the hosts' summaries at 8,192 ranks)."""

    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]


def groups_decoded(groups: list[Group],
                   known: dict[tuple[Any, ...], Columns]) -> list[tuple[Columns, list[tuple[Any, ...]]]]:
    """:func:`groups_of` of groups decoded as :class:`Group`: the same columns and values."""
    found = []
    for group in groups:
        width = len(group.columns)
        found.append(_group(group.columns, [v for v in group.rows if len(v) == width], known))
    return found


def _group(names: tuple[Any, ...], rows: list[tuple[Any, ...]],
           known: dict[tuple[Any, ...], Columns]) -> tuple[Columns, list[tuple[Any, ...]]]:
    """A group's columns (those ``known`` under its names, else made and kept there) and its rows' values (each as
    many as its names) in the order of the columns' names."""
    columns = known.get(names) or known.setdefault(names, _columns(names))
    if len(columns.names) == len(names):
        return columns, rows
    # A name given twice: its last value, as a dict made of the pairs holds.
    last = list({name: i for i, name in enumerate(names)}.values())
    return columns, [tuple(v[i] for i in last) for v in rows]


def _columns(names: tuple[Any, ...]) -> Columns:
    """The columns of a group of these names (a name given twice, once)."""
    return Columns(tuple(dict.fromkeys(names)))


def table_of(rows: list[Mapping[str, Any]]) -> pd.DataFrame:
    """``pd.DataFrame(rows)`` of rows read back (:class:`Row`) or as dicts, without a dict per row: the same
    columns (in the order the rows first name them), dtypes and values (NaN where a row has no such column)."""
    # A group's columns (or a dict's keys) -> their names, in the order first seen.
    kinds = {kind: kind.names if isinstance(kind, Columns) else kind for kind in dict.fromkeys(map(_kind, rows))}
    named = dict.fromkeys(kinds.values())  # each set of names once (many Columns can name one: of dicts, of hosts)
    names = list(dict.fromkeys(name for kind in named for name in kind))
    if len(named) == 1:  # every row has the same columns (steps alike, every host's): values as they are
        values = [row.cells if isinstance(row, Row) else list(row.values()) for row in rows]
    else:
        where = {kind: [found.index(n) if n in found else None for n in names] for kind, found in kinds.items()}
        values = [_spread(row, where[_kind(row)]) for row in rows]
    return pd.DataFrame(values, columns=names) if values else pd.DataFrame()


def _kind(row: Mapping[str, Any]) -> Any:
    """What says which columns ``row`` has: its group's, or its own keys."""
    return row.columns if isinstance(row, Row) else tuple(row)


def _spread(row: Mapping[str, Any], where: list[int | None]) -> list[Any]:
    """``row``'s values at the table's columns, NaN where it has none (as pandas fills a dict's missing keys)."""
    values = row.cells if isinstance(row, Row) else list(row.values())
    return [np.nan if at is None else values[at] for at in where]
