"""The ranks' ledger of a live window, built again only for the steps that changed since the last window.

Live judgement judges the last steps every rank finished (run/live_tables.py): from one judgement to the
next the window moves on by a step or two and the steps it still holds are the same. The ledger
(run/ledger.py) of a step depends on that step's rows alone, and on what the window shares: its phases,
columns and peer groups (each row is compared with its peers in its own step, :func:`ledger.build`),
and the CPU floor, which weighs the hosts' CPUs over the whole window. So the rows of a step whose
rows did not change are kept, the new and changed steps are built by :func:`ledger.build` itself, and
the CPU floor is computed again over the whole window by the ledger's own function. The frame is the
one :func:`ledger.build` gives for the whole window (tests/test_live_ledger.py); at 8,192 ranks x 20
steps a judgement builds one step's ledger instead of twenty (0.23 s a judgement).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.run import job_time, ledger
from diagtrain.profiler.util.groups import merged_order, ranked, stable_order, strictly_ordered

if TYPE_CHECKING:  # built with the tables (tables.assemble)
    from diagtrain.profiler.analyzer.run.tables import Tables


class LiveLedger:
    """The ranks' and the job's ledger of each window in turn (call :meth:`build` where :func:`ledger.build` would
    be, then :meth:`job_steps` where :func:`job_time.build` would be)."""

    def __init__(self) -> None:
        self._steps: pd.DataFrame | None = None  # the last window's steps table
        self._ledger: pd.DataFrame | None = None  # ... and its ledger
        # The grids of the two (None: not one). Each is taken when its frame is kept, and stands for it while it is
        # kept: neither frame is changed in place once built (the live tables build a window's anew each time).
        self._steps_grid: _Grid | None = None
        self._layout: _Grid | None = None
        self._shared: Any = None  # ... and what its steps shared (:func:`_shared`)
        self._rebuilt: set[int] | None = None  # the steps the last build built again (None: all of them)
        self._common: tuple[np.ndarray, np.ndarray] | None = None  # the rows of steps both windows hold, in each
        self._overlap: _Overlap | None = None  # ... as one stretch of each column, where they are (None: not)
        self._parts: pd.DataFrame | None = None  # the job steps' parts of the window before (job_time.step_parts)
        self._gaps: pd.DataFrame | None = None  # ... and its steps' gaps (job_time.gaps)
        self._gapped: pd.DataFrame | None = None  # the steps table of those gaps
        self._before: pd.DataFrame | None = None  # the steps table of the window before the last build's

    def build(self, t: Tables) -> pd.DataFrame:
        """``ledger.build(t)``, reusing the rows of the last window's steps whose rows did not change."""
        steps_grid = _Grid.of(t.steps)
        shared = _shared(t, steps_grid)
        self._before = self._steps
        changed = self._changed(t.steps, steps_grid) if shared == self._shared else None
        # A grid's steps are the window's (a hash of every row's step cost 0.5 ms a time).
        now = steps_grid.steps if steps_grid is not None else pd.unique(t.steps["step"].to_numpy())
        if changed is None or changed >= set(now.tolist()):
            built = ledger.build(t)  # nothing to reuse (a window whose every step changed may have no ledger at all)
            changed, layout = None, _Grid.of(built)
        else:
            built, layout = self._updated(t, changed, now)
        self._steps, self._ledger, self._shared, self._rebuilt = t.steps, built, shared, changed
        self._steps_grid, self._layout = steps_grid, layout
        if changed is None:
            self._common = self._overlap = None
        return built

    def job_steps(self, t: Tables) -> pd.DataFrame:
        """``job_time.build(t)`` for the window :meth:`build` was last given: the parts of the steps whose ledger
        rows it kept and whose gaps are the last window's are kept too (one step built instead of twenty)."""
        if t.ledger.empty or t.steps.empty:
            self._parts = None
            return job_time.build(t)
        gaps = job_time.gaps(t.steps)
        redo = self._redo(t, gaps)
        if redo is None:
            parts = job_time.step_parts(t, gaps)
        else:
            kept = self._parts[self._parts.index.isin(pd.unique(t.ledger["step"].to_numpy())) & ~self._parts.index.isin(redo)]
            parts = pd.concat([kept, job_time.step_parts(t, gaps, redo)]) if len(redo) else kept
        self._parts, self._gaps, self._gapped = parts, gaps, t.steps
        return job_time.job_steps(parts)

    def _redo(self, t: Tables, gaps: pd.DataFrame) -> np.ndarray | None:
        """The steps whose job parts are built again: those the ledger built again, and those with a row whose gap
        changed (the window's first step: its ranks' steps before are no longer in it); None for all of them."""
        if t.steps is not self._steps or self._rebuilt is None or self._common is None or self._parts is None \
                or self._gapped is None or self._gapped is not self._before:
            return None
        old, new = self._common
        now = t.steps["step"].to_numpy()
        rebuilt = np.fromiter(self._rebuilt, dtype=np.int64, count=len(self._rebuilt))
        columns = [(self._gaps[c].to_numpy(), gaps[c].to_numpy()) for c in ("gap_ms", "exported")]
        if self._overlap is not None:  # each column compared as one stretch, not gathered by a mask (1.5 ms)
            found = [self._overlap.unlike(*pair) for pair in columns]
            if all(unlike is not None for unlike in found):
                return np.union1d(rebuilt, self._overlap.steps[np.logical_or.reduce(found)])
        unlike = np.zeros(int(new.sum()), dtype=bool)
        for was, gap in columns:
            unlike |= was[old] != gap[new]
        return np.union1d(rebuilt, now[new][unlike])

    def _changed(self, steps: pd.DataFrame, grid: _Grid | None) -> set[int] | None:
        """The steps of ``steps`` (its grid: ``grid``, None where not one) to build: new, or with a row unlike the last
        window's; None where the last window's ledger cannot be reused (none yet, none built, rows not in the order
        kept). Column by column as arrays: a frame cut from each window costs more than the comparison."""
        before, kept = self._steps, self._ledger
        if before is None or kept is None or kept.empty \
                or (grid is None and not strictly_ordered(steps["rank"].to_numpy(), steps["step"].to_numpy())):
            return None  # (a grid's rows are by rank, then step)
        if self._steps_grid is not None and grid is not None and self._steps_grid.shares_ranks(grid):
            return self._changed_cells(before, steps, self._steps_grid, grid)
        was, now = before["step"].to_numpy(), steps["step"].to_numpy()
        common = np.intersect1d(pd.unique(was), pd.unique(now))
        old, new = np.isin(was, common), np.isin(now, common)
        if not all(_same(before[c].to_numpy()[old], steps[c].to_numpy()[new]) for c in ("rank", "step")):
            return None  # a rank's row came to a step already judged (or left it): the steps' peers differ
        self._common, self._overlap = (old, new), None
        unlike = np.zeros(int(new.sum()), dtype=bool)
        for column in steps.columns:
            unlike |= ~_equal(before[column].to_numpy()[old], steps[column].to_numpy()[new])
        return set(np.setdiff1d(pd.unique(now), common).tolist()) | set(pd.unique(now[new][unlike]).tolist())

    def _changed_cells(self, before: pd.DataFrame, steps: pd.DataFrame, was: _Grid, now: _Grid) -> set[int]:
        """:meth:`_changed` of two windows whose every rank, the same in both, has a row of each of its steps: each
        column as a (ranks, steps) array, the steps both hold compared in place (a view where they are a run of
        steps, as a moving window's), not gathered from each window by a mask (10 of its 20 ms at 8,192 ranks)."""
        common = np.intersect1d(was.steps, now.steps)
        in_was, in_now = np.isin(was.steps, common), np.isin(now.steps, common)
        self._common = np.tile(in_was, len(was.ranks)), np.tile(in_now, len(now.ranks))
        unlike = np.zeros((len(now.ranks), len(common)), dtype=bool)
        self._overlap = overlap = _Overlap.of(was, in_was, now, in_now)
        for column in steps.columns:
            old, new = before[column].to_numpy(), steps[column].to_numpy()
            if overlap is not None and overlap.identical(old, new):  # the common case: as they were, bit for bit
                continue
            a, b = was.cells(old, in_was), now.cells(new, in_now)
            if not _identical(a, b):
                unlike |= ~_equal(a, b)
        return set(now.steps[~in_now].tolist()) | set(common[unlike.any(axis=0)].tolist())

    def _updated(self, t: Tables, changed: set[int], now: np.ndarray) -> tuple[pd.DataFrame, _Grid | None]:
        """The last ledger's rows of the steps that stay, with the changed steps built anew, in the order and with
        the CPU floor that one ledger of the whole window has; and the grid of its rows (None: not one). ``now``: the
        window's steps."""
        last, fresh = self._ledger, self._ledger.iloc[:0]
        if changed:  # by positions (a hash of each row's step cost 1 ms); no CPU floor of theirs (the window's, below)
            steps = t.steps.take(job_time.positions_of(t.steps["step"], np.array(list(changed))))
            fresh = ledger.build(replace(t, steps=steps, hosts=[]))
        if not len(fresh) or list(fresh.columns) != list(last.columns) or not fresh.dtypes.equals(last.dtypes):
            fresh = last.iloc[:0]  # no rows (or none like the last ledger's): the rows that stay, as they are
        rows = _GridRows.of(self._layout, now, changed, _Grid.of(fresh)) or _Rows.of(last, now, changed, fresh)
        # Column by column, each gathered once into its place: a concatenation then a cut in order copied the
        # window's 28 columns twice (30 ms at 8,192 ranks x 20 steps).
        columns = {c: rows.gathered(last[c].to_numpy(), fresh[c].to_numpy())
                   for c in last.columns if c != "cpu_floor_ms"}
        # Over the whole window, by the ledger's own function: the hosts' CPUs are weighed over all its steps.
        columns["cpu_floor_ms"] = ledger._cpu_floor(columns, t)  # noqa: SLF001 - the same computation, not a copy of it
        # Object columns as the ledger has them (None where none), not pandas' inferred string dtype; not copied (a
        # Series copies its array unless told not to: 2 ms a window).
        built = pd.DataFrame({c: pd.Series(columns[c], dtype=object, copy=False) if columns[c].dtype == object
                              else columns[c] for c in last.columns}, copy=False)
        return built, rows.layout if isinstance(rows, _GridRows) else _Grid.of(built)


def _merged(keys: np.ndarray, first: int) -> np.ndarray:
    """The stable order of ``keys`` (distinct), whose ``first`` ones and the rest are each in order already (the rows
    that stay and the fresh ones, each by rank, then step): the fresh rows' places found among the others, not a
    sort of them all (5 ms at 8,192 ranks x 20 steps); a sort where they are not in order."""
    a, b = keys[:first], keys[first:]
    if not (np.all(a[1:] > a[:-1]) and np.all(b[1:] > b[:-1])):
        return stable_order(keys)
    return merged_order(a, b)


class _Grid:
    """A steps table by rank, then step, with a row of every step for every rank: its rows a (ranks, steps) array."""

    def __init__(self, ranks: np.ndarray, steps: np.ndarray) -> None:
        self.ranks, self.steps = ranks, steps  # each sorted

    @classmethod
    def of(cls, table: pd.DataFrame) -> _Grid | None:
        """The grid of a steps table (or a ledger), or None where its rows are not one (a rank without some step, rows
        out of order): by rank, then step, each rank's steps those of the first."""
        if "rank" not in table or "step" not in table:
            return None
        rank, step = table["rank"].to_numpy(), table["step"].to_numpy()
        if rank.dtype.kind not in "iu" or step.dtype.kind not in "iu" or not strictly_ordered(rank, step):
            return None
        firsts = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1]]) if len(rank) else np.zeros(0, dtype=np.int64)
        if not len(firsts) or len(rank) % len(firsts):
            return None
        grid = step.reshape(len(firsts), -1)
        return cls(rank[firsts], grid[0].copy()) if bool((grid == grid[0]).all()) else None

    def shares_ranks(self, other: _Grid) -> bool:
        """Whether both grids hold the same ranks and some step in common."""
        return np.array_equal(self.ranks, other.ranks) and bool(np.isin(self.steps, other.steps).any())

    def cells(self, column: np.ndarray, chosen: np.ndarray) -> np.ndarray:
        """A column's values of the ``chosen`` steps (a mask over :attr:`steps`), as a (ranks, steps) array: a view
        where they are a run of steps."""
        grid, at = column.reshape(len(self.ranks), len(self.steps)), np.flatnonzero(chosen)
        return grid[:, at[0]:at[-1] + 1] if at[-1] - at[0] + 1 == len(at) else grid[:, at]


class _Overlap:
    """Where the steps two grids of the same ranks both hold lie in each grid's columns, where they are a run of steps
    in each and the grids are as wide (a window moved on): then a rank's cells of them are the same distance apart in
    both columns, and each column is compared as one stretch, not as (ranks, steps) views whose short rows numpy
    compares one at a time (9 of 11 ms a window at 8,192 ranks x 20 steps)."""

    def __init__(self, was_first: int, now_first: int, ranks: int, width: int, steps: np.ndarray) -> None:
        self.was_first, self.now_first = was_first, now_first  # the run's first step, in each grid
        self.ranks, self.width, self.run = ranks, width, len(steps)
        self.steps = steps  # the run's steps

    @classmethod
    def of(cls, was: _Grid, in_was: np.ndarray, now: _Grid, in_now: np.ndarray) -> _Overlap | None:
        """The overlap of the steps ``in_was`` of ``was`` and ``in_now`` of ``now`` (masks over their steps, the
        same number in each), or None where they are not one run in each of grids as wide."""
        held, holds = np.flatnonzero(in_was), np.flatnonzero(in_now)
        if len(was.steps) != len(now.steps) or not len(held) or not (_run(held) and _run(holds)):
            return None
        return cls(int(held[0]), int(holds[0]), len(now.ranks), len(now.steps), now.steps[holds])

    def identical(self, was: np.ndarray, now: np.ndarray) -> bool:
        """:func:`_identical` of two columns' cells of the common steps (``was``: a column of the grid before, ``now``:
        of the grid now): whether they hold the same bits, cell for cell."""
        same = self._matched(was, now, bits=True)
        return same is not None and bool(same.all())

    def unlike(self, was: np.ndarray, now: np.ndarray) -> np.ndarray | None:
        """Per step of the run, whether a rank's value in it differs in two columns (``!=``: NaN unlike NaN); None
        where they are not compared so (not numbers of one type)."""
        same = self._matched(was, now, bits=False)
        return None if same is None else ~same[:, :self.run].all(axis=0)

    def _matched(self, was: np.ndarray, now: np.ndarray, bits: bool) -> np.ndarray | None:
        """Per cell of the grid, whether the two columns' cells of the run hold the same bits (``bits``) or values
        (True past the run); None where the columns are not numbers of one type."""
        if was.dtype != now.dtype or was.dtype.kind not in "fiub" or was.ndim != 1 or now.ndim != 1 \
                or (was.dtype.kind == "f" and was.itemsize not in (2, 4, 8)):
            return None
        span = (self.ranks - 1) * self.width + self.run  # from the first rank's first common cell to the last's last
        a, b = was[self.was_first:self.was_first + span], now[self.now_first:self.now_first + span]
        if bits:
            a, b = _bits(a), _bits(b)
        same = np.ones((self.ranks, self.width), dtype=bool)
        np.equal(a, b, out=same.reshape(-1)[:span])
        same[:, self.run:] = True  # the stretch's cells of steps not both hold
        return same


def _run(at: np.ndarray) -> bool:
    """Whether sorted positions are a run of consecutive ones."""
    return int(at[-1]) - int(at[0]) + 1 == len(at)


class _Rows:
    """Where each row of a ledger put together from the last one's rows ``staying`` (positions) and a fresh one's
    ``fresh`` rows comes from: ``order``, positions in the two together (the last's first)."""

    def __init__(self, staying: np.ndarray, order: np.ndarray, fresh: int) -> None:
        from_last = order < len(staying)
        self.last = staying[np.where(from_last, order, 0)] if len(staying) else np.zeros(len(order), dtype=np.int64)
        self.fresh_at = np.flatnonzero(~from_last)
        self.fresh = order[self.fresh_at] - len(staying)

    @classmethod
    def of(cls, last: pd.DataFrame, now: np.ndarray, changed: set[int], fresh: pd.DataFrame) -> _Rows:
        """The rows of the ``last`` ledger's steps still in the window (``now``: its steps) and not ``changed``, and
        the ``fresh`` ledger's, by rank, then step."""
        numbers, codes = ranked(last["step"].to_numpy())  # each row's step by a count, not a hash of every row
        staying = np.flatnonzero((np.isin(numbers, now) & ~np.isin(numbers, list(changed)))[codes])
        # By rank, then step (each pair once): one radix order of the pairs, not a lexsort (10 ms at 8,192 ranks).
        rank = np.r_[last["rank"].to_numpy()[staying], fresh["rank"].to_numpy()]
        step = np.r_[last["step"].to_numpy()[staying], fresh["step"].to_numpy()]
        span = int(step.max()) - int(step.min()) + 1
        return cls(staying, _merged((rank - rank.min()) * span + (step - step.min()), len(staying)), len(fresh))

    def gathered(self, last: np.ndarray, fresh: np.ndarray) -> np.ndarray:
        """One column of the ledger put together, from the last ledger's column and the fresh one's."""
        out = last.take(self.last)  # the fresh rows' places hold a row of the last, then theirs
        out[self.fresh_at] = fresh[self.fresh]
        return out


class _GridRows:
    """The rows of a ledger put together as a grid (:class:`_Grid`) from a run of the last one's steps (a grid too)
    and a fresh one's grid of the same ranks, its steps after them: a window moved on. A column's each rank's rows
    are then copied as two blocks, not gathered row by row (3 of 14 ms a window at 8,192 ranks x 20 steps)."""

    def __init__(self, last: _Grid, first: int, staying: int, fresh: _Grid) -> None:
        self.shape = len(last.ranks), len(last.steps)  # the last ledger's grid
        self.first, self.staying, self.fresh = first, staying, len(fresh.steps)  # the run of the last's steps that stay
        self.layout = _Grid(last.ranks, np.r_[last.steps[first:first + staying], fresh.steps])  # the ledger's grid

    @classmethod
    def of(cls, last: _Grid | None, now: np.ndarray, changed: set[int], fresh: _Grid | None) -> _GridRows | None:
        """The rows of the steps of ``last`` (the last ledger's grid) still in the window (``now``: its steps) and not
        ``changed``, and those of ``fresh`` (the fresh ledger's grid); None where they are not two grids of the same
        ranks whose steps are a run of the last's, then the fresh ones after them."""
        if last is None or fresh is None or not np.array_equal(last.ranks, fresh.ranks):
            return None
        at = np.flatnonzero(np.isin(last.steps, now) & ~np.isin(last.steps, list(changed)))
        if not len(at) or not _run(at) or fresh.steps[0] <= last.steps[at[-1]]:
            return None
        return cls(last, int(at[0]), len(at), fresh)

    def gathered(self, last: np.ndarray, fresh: np.ndarray) -> np.ndarray:
        """One column of the ledger put together, from the last ledger's column and the fresh one's."""
        ranks = self.shape[0]
        out = np.empty(ranks * (self.staying + self.fresh), dtype=last.dtype)
        grid = out.reshape(ranks, -1)
        grid[:, :self.staying] = last.reshape(self.shape)[:, self.first:self.first + self.staying]
        grid[:, self.staying:] = fresh.reshape(ranks, self.fresh)
        return out


def _shared(t: Tables, grid: _Grid | None) -> tuple:
    """What every step's ledger rows depend on besides the step's own rows: the phases, the steps table's
    columns and their types, and the ranks' peer groups. ``grid``: the steps table's (None: not one)."""
    if grid is not None:
        ranks = grid.ranks.tolist()  # sorted, each once
    else:
        ranks = sorted(pd.unique(t.steps["rank"].to_numpy()).tolist()) if "rank" in t.steps else []
    return (tuple(t.phases), tuple(t.steps.columns), tuple(map(str, t.steps.dtypes)),
            tuple(map(tuple, t.structure.peer_groups(ranks))))


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two columns hold the same values, row for row."""
    return len(a) == len(b) and bool(np.all(_equal(a, b)))


def _identical(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays of numbers hold the same bits, element for element (then :func:`_equal` holds for each): one
    comparison, where :func:`_equal`'s of floats takes four passes."""
    if a.dtype != b.dtype or a.shape != b.shape or a.dtype.kind not in "fiub":
        return False
    return bool((_bits(a) == _bits(b)).all())


def _bits(a: np.ndarray) -> np.ndarray:
    """Floats as their bits (NaN is then the same as NaN, and one comparison does); other numbers as they are."""
    return a.view(f"u{a.itemsize}") if a.dtype.kind == "f" else a


def _equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per element, whether two columns (or arrays of one shape) hold the same value (NaN the same as NaN). Values
    that cannot be compared one by one (arrays in a column) are taken to differ: their step is built again."""
    if a.dtype != b.dtype:
        return np.zeros(a.shape, dtype=bool)
    if a.dtype.kind == "f":
        return (a == b) | (np.isnan(a) & np.isnan(b))
    try:
        same = np.asarray(a == b, dtype=bool)
    except (TypeError, ValueError):
        return np.zeros(a.shape, dtype=bool)
    if same.shape != a.shape:
        return np.zeros(a.shape, dtype=bool)
    if a.dtype == object and not same.all():  # NaN on both sides is the same missing value (None == None already)
        unlike = ~same
        same[unlike] = pd.isna(a[unlike]) & pd.isna(b[unlike])
    return same
