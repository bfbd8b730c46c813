"""Data files through PyIceberg's writer, without dictionary pages for columns a dictionary does not make smaller.

Why: Arrow's Parquet writer dictionary-encodes every column and falls back to plain encoding only when a column
chunk's dictionary outgrows `write.parquet.dict-size-bytes` (2 MiB by default). A column with a new value in every
row — `_kafka_offset` and `_kafka_timestamp` always, often an id or an event time too — never gets there in a write
task's file (167,000 int64s are 1.3 MiB), so it is stored as a dictionary of every value plus an index per row.
Measured on a write task's 167,000 rows of the throughput bench (docs/benchmarks.md, "Throughput"): 2.4× the CPU of
this writer for the whole file (156 vs 65 ms) and a 1.9× bigger file (2.96 vs 1.56 MB). Java's Parquet writer, which
the Iceberg reference implementation uses, does not pay this: after a column's first page it drops the dictionary
unless dictionary plus indices are smaller than the plain values. This writer applies that rule to the first
page's rows (`write.parquet.page-row-limit`, 20,000 by default) before it opens the file. Every Parquet reader
reads both encodings; the table's properties (compression, page and dictionary sizes, row groups) apply as before.
"""
from __future__ import annotations

import uuid
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import ParquetFormatModel, ParquetFormatWriter
from pyiceberg.manifest import DataFile
from pyiceberg.table import TableProperties
from pyiceberg.table.metadata import TableMetadata

from handoff_spark.iceberg.pyiceberg_private import dataframe_to_data_files, replace_file_format_model

#: Rows of the first page when the table does not say: PyIceberg's `write.parquet.page-row-limit` default.
FIRST_PAGE_ROWS = TableProperties.PARQUET_PAGE_ROW_LIMIT_DEFAULT


def _plain_bytes(values: pa.Array | pa.ChunkedArray) -> int | None:
    """Bytes of `values` (nulls left out) in Parquet's plain encoding; None for types this rule leaves alone."""
    t = values.type
    if pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t) or pa.types.is_large_string(t):
        return (pc.sum(pc.binary_length(values)).as_py() or 0) + 4 * (len(values) - values.null_count)
    if pa.types.is_boolean(t) or pa.types.is_nested(t) or pa.types.is_null(t) or pa.types.is_dictionary(t):
        return None
    try:
        return t.bit_width // 8 * (len(values) - values.null_count)
    except ValueError:  # not fixed width
        return None


def plain_columns(table: pa.Table, first_page_rows: int = FIRST_PAGE_ROWS) -> list[str]:
    """Top-level columns of `table` whose first page (`first_page_rows` rows) is no bigger in plain encoding than
    as a dictionary of its distinct values plus a bit-packed index per value (Java Parquet's fallback rule).
    Nested and boolean columns keep the writer's default."""
    sample = table.slice(0, first_page_rows)
    plain = []
    for field, column in zip(sample.schema, sample.columns):
        raw = _plain_bytes(column)
        if not raw:
            continue
        distinct = pc.unique(column).drop_null()
        indices = (len(column) - column.null_count) * max(1, (len(distinct) - 1).bit_length()) // 8
        if (_plain_bytes(distinct) or 0) + indices >= raw:
            plain.append(field.name)
    return plain


def leaf_paths(schema: pa.Schema) -> list[str]:
    """The Parquet leaf column paths Arrow writes `schema` as (`use_dictionary` names those): read back from an
    empty file, so nested types are named exactly as Arrow's writer names them."""
    sink = pa.BufferOutputStream()
    pq.write_table(schema.empty_table(), sink, store_decimal_as_integer=True)
    parquet_schema = pq.read_metadata(pa.BufferReader(sink.getvalue())).schema
    return [parquet_schema.column(i).path for i in range(len(parquet_schema))]


def dictionary_columns(table: pa.Table, first_page_rows: int = FIRST_PAGE_ROWS) -> bool | list[str]:
    """`use_dictionary` for the file `table` starts: True (every column) or the leaf paths to keep it for."""
    plain = set(plain_columns(table, first_page_rows))
    if not plain:
        return True
    return [p for p in leaf_paths(table.schema) if p not in plain]


class _Writer(ParquetFormatWriter):
    def write(self, table: pa.Table) -> None:
        if self._writer is None:  # the file opens on the first write: decide its columns' encodings here
            kwargs = self._parquet_writer_kwargs
            first_page = kwargs.get("write_batch_size") or FIRST_PAGE_ROWS
            self._parquet_writer_kwargs = {**kwargs, "use_dictionary": dictionary_columns(table, first_page)}
        super().write(table)


class _Model(ParquetFormatModel):
    def create_writer(self, output_file: Any, file_schema: Any, properties: Any) -> ParquetFormatWriter:
        return _Writer(output_file, file_schema, properties)


def data_files(metadata: TableMetadata, table: pa.Table, io: Any, write_uuid: uuid.UUID) -> Iterator[DataFile]:
    """PyIceberg's data files for `table` (partitioned per the table's spec, not committed), written by this
    module's Parquet writer. The writer stays registered for the process: PyIceberg's own writes in it (an
    `append`) use it too."""
    replace_file_format_model(_Model())
    return dataframe_to_data_files(metadata, table, io, write_uuid=write_uuid)
