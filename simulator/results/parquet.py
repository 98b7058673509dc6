"""Parquet files that say which stepsim wrote them.

Every Parquet file stepsim writes (``events.parquet`` of ``stepsim run``,
``results.parquet`` of a sweep or search) carries the file-level key-value
metadata ``stepsim_version`` (the version that wrote the file) beside pandas' own
``pandas`` key; ``docs/formats.md`` lists the files. Read it back with
:func:`read_metadata` or ``pyarrow.parquet.read_schema(path).metadata``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - pandas is imported by whoever hands in a frame
    import pandas as pd

from simulator.version import __version__

#: The key-value metadata key holding the version of stepsim that wrote the file.
VERSION_KEY = "stepsim_version"


def write_parquet(frame: pd.DataFrame, path: str | Path, **metadata: str) -> Path:
    """``frame.to_parquet(path, index=False)`` with ``stepsim_version`` and ``metadata``
    (strings) added to the file's key-value metadata. Reads back as the same frame."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(frame, preserve_index=False)
    extra = {VERSION_KEY: __version__, **metadata}
    table = table.replace_schema_metadata(
        {**(table.schema.metadata or {}), **{k.encode(): str(v).encode() for k, v in extra.items()}}
    )
    pq.write_table(table, path)
    return Path(path)


def read_metadata(path: str | Path) -> dict[str, str]:
    """A Parquet file's key-value metadata as text, pandas' own ``pandas`` key left out."""
    import pyarrow.parquet as pq

    meta = pq.read_schema(path).metadata or {}
    return {k.decode(): v.decode() for k, v in meta.items() if k != b"pandas"}
