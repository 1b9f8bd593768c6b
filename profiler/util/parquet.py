"""Tables written to Parquet a row group at a time.

``DataFrame.to_parquet()`` without a path builds the whole file in memory, beside an Arrow copy of
the whole table: writing a rank's timeline spans (millions of rows) that way took a worker 180 MiB
above the spans at 4M events (benchmarks/worker_memory.py's trace), 70 here. Each row group is
converted, encoded and written to the file before the next, and the file replaces the old one only
once it is whole. A table made a piece at a time (a rank's spans) is written as its pieces come
(:func:`write_parquet_pieces`), never whole.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

import pandas as pd

from diagtrain.profiler.run_dir import replacing

if TYPE_CHECKING:
    import pyarrow as pa

# Rows converted to Arrow at a time: ~6 MiB of a spans table, and still few groups (one footer entry
# each) for the largest tables.
ROW_GROUP_ROWS = 1 << 18


def write_parquet(path: str | os.PathLike, frame: pd.DataFrame) -> None:
    """Replace ``path`` with ``frame`` (its index left out), one row group at a time."""
    import pyarrow as pa  # noqa: PLC0415 - the analysis' import, not its command line's

    if len(frame) <= ROW_GROUP_ROWS:  # one row group, typed from itself: converted once, not twice
        write_parquet_pieces(path, [frame])
        return
    slices = (frame.iloc[at:at + ROW_GROUP_ROWS] for at in range(0, max(len(frame), 1), ROW_GROUP_ROWS))
    # Typed from the whole table: a slice of only missing values alone would be typed null.
    write_parquet_pieces(path, slices, pa.Schema.from_pandas(frame, preserve_index=False))


def write_parquet_pieces(path: str | os.PathLike, pieces: Iterable[pd.DataFrame], schema: pa.Schema | None = None) -> None:
    """Replace ``path`` with the rows of ``pieces`` (tables of the same columns), each piece written as it
    comes. Typed by ``schema`` (a pyarrow schema), else from the first piece; categorical columns' codes
    are widened to int32, as pieces (several windows of a rank) may have dictionaries of different sizes."""
    import pyarrow as pa  # noqa: PLC0415 - the analysis' import, not its command line's
    import pyarrow.parquet as pq  # noqa: PLC0415

    writer = None
    with replacing(path) as tmp:
        try:
            for piece in pieces:
                # One thread: pyarrow otherwise starts a pool of threads for each table of more than a few
                # hundred rows, which cost more than converting a rank's table (0.6 of 0.8 ms; columns are
                # numpy arrays and categories, converted without copying their values).
                table = pa.Table.from_pandas(piece, preserve_index=False, nthreads=1)
                if writer is None:
                    schema = pa.schema([pa.field(f.name, pa.dictionary(pa.int32(), f.type.value_type))
                                        if pa.types.is_dictionary(f.type) else f
                                        for f in (schema or table.schema)], metadata=(schema or table.schema).metadata)
                    # No dictionary for float columns: one is a hash table of the column's values, held
                    # per column while a row group is encoded, for values that hardly repeat.
                    writer = pq.ParquetWriter(tmp, schema, use_dictionary=[
                        f.name for f in schema if not pa.types.is_floating(f.type)])
                writer.write_table(table.cast(schema))
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            raise ValueError(f"{path}: no table to write")
