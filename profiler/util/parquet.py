"""Tables written to Parquet a row group at a time.

``DataFrame.to_parquet()`` without a path builds the whole file in memory, beside an Arrow copy of
the whole table: writing a rank's timeline spans (millions of rows) that way took a worker 180 MiB
above the spans at 4M events (benchmarks/worker_memory.py's trace), 70 here. Each row group is
converted, encoded and written to the file before the next, and the file replaces the old one only
once it is whole.
"""

from __future__ import annotations

import os

import pandas as pd

from diagtrain.profiler.run_dir import replacing

# Rows converted to Arrow at a time: ~6 MiB of a spans table, and still few groups (one footer entry
# each) for the largest tables.
ROW_GROUP_ROWS = 1 << 18


def write_parquet(path: str | os.PathLike, frame: pd.DataFrame) -> None:
    """Replace ``path`` with ``frame`` (its index left out), one row group at a time."""
    import pyarrow as pa  # noqa: PLC0415 - the analysis' import, not its command line's
    import pyarrow.parquet as pq  # noqa: PLC0415

    # Typed from the whole table: a slice of only missing values alone would be typed null.
    schema = pa.Schema.from_pandas(frame, preserve_index=False)
    with replacing(path) as tmp, pq.ParquetWriter(tmp, schema) as writer:
        for at in range(0, len(frame), ROW_GROUP_ROWS):
            writer.write_table(pa.Table.from_pandas(frame.iloc[at:at + ROW_GROUP_ROWS], preserve_index=False)
                               .cast(schema))
