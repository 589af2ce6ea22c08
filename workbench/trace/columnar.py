"""The native trace file: the Trace table as Parquet, its metadata in the schema metadata.

Parquet keeps the table columnar and typed (strings dictionary-encoded, times int64 ns, zstd),
so a million-event trace is a few tens of MB on disk and reads back in well under a second
with no parsing: the format for anything big (``workbench run --trace run.parquet``,
notebooks, the panel). ``Trace.meta`` rides in the schema metadata under ``workbench.meta``
(``workbench.trace.meta``: integer keys and tuples come back as written). Any Parquet file
whose table has the Trace's required columns loads too (with empty metadata).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .meta import decode_meta, encode_meta
from .table import COLUMNS, Trace, TraceError

MAGIC = b"PAR1"
META_KEY = b"workbench.meta"
FORMAT_KEY = b"workbench.format"
FORMAT_VERSION = b"1"
#: string columns Parquet stores (and we read) dictionary-encoded: few distinct values
DICTIONARY = ("row", "kind", "name", "node", "copy_kind")
COMPRESSION = "zstd"


def to_arrow(trace: Trace) -> pa.Table:
    """The Trace table with its metadata attached to the schema."""
    table = pa.Table.from_pandas(trace.events, preserve_index=False)
    # only our own keys: pandas' metadata would restore nothing the Arrow types do not
    return table.replace_schema_metadata({META_KEY: encode_meta(trace.meta).encode(), FORMAT_KEY: FORMAT_VERSION})


def write_parquet(trace: Trace, path: str | Path) -> Path:
    path = Path(path)
    pq.write_table(to_arrow(trace), path, compression=COMPRESSION, use_dictionary=list(DICTIONARY),
                   write_page_checksum=True)   # a damaged page is an error on reading, not wrong events
    return path


def read_parquet(path: str | Path) -> Trace:
    """A Trace from a Parquet file; TraceError naming the file and the fault when it is damaged,
    truncated or not a trace table."""
    path = Path(path)
    try:
        names = set(pq.read_schema(path).names)
        table = pq.read_table(path, read_dictionary=[c for c in DICTIONARY if c in names],
                              page_checksum_verification=True)
    except (pa.ArrowException, OSError) as e:
        what = "truncated or damaged" if "magic bytes" in str(e) or "footer" in str(e).lower() else "unreadable"
        raise TraceError(f"{path.name} is not a readable Parquet trace ({what}: {e}); write it again with "
                         "Trace.save / `workbench run --trace FILE.parquet`") from None
    meta = table.schema.metadata or {}
    info = decode_meta(meta[META_KEY], f"{path.name}: its workbench.meta") if META_KEY in meta else {}
    for i, field in enumerate(table.schema):   # the Trace holds plain strings, not categoricals
        if pa.types.is_dictionary(field.type):
            table = table.set_column(i, field.name, table.column(i).cast(field.type.value_type))
    df = table.to_pandas(self_destruct=True, split_blocks=True)
    del table
    try:
        return Trace(df, info)
    except TraceError as e:
        raise TraceError(f"{path.name}: {e} (expected the columns {list(COLUMNS)})") from None
