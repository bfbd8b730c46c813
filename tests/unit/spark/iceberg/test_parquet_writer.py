"""Handoff's Parquet writer: columns a dictionary does not shrink are written plain, every other column keeps its
dictionary (nested leaves included), and the data and PyIceberg's file statistics are unchanged."""
from __future__ import annotations

import uuid

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog.sql import SqlCatalog

from handoff_spark.iceberg import parquet_writer
from handoff_spark.iceberg.sink import write_data_files

N = 50_000


def _rows() -> pa.Table:
    return pa.table({
        "id": pa.array(range(N), pa.int64()),  # every value new: plain
        "uuid": pa.array([f"{uuid.UUID(int=i)}" for i in range(N)], pa.string()),  # every value new: plain
        "customer": pa.array([f"c{i % 9973:05d}" for i in range(N)], pa.string()),  # half distinct, short: dictionary
        "region": pa.array([("eu", "us", "ap")[i % 3] for i in range(N)], pa.string()),
        "flag": pa.array([i % 2 == 0 for i in range(N)], pa.bool_()),
        "tags": pa.array([[("a", "b")[i % 2]] for i in range(N)], pa.list_(pa.string())),
        "where": pa.array([{"city": ("x", "y")[i % 2], "seq": i} for i in range(N)],
                          pa.struct([("city", pa.string()), ("seq", pa.int64())])),
        "sparse": pa.array([i if i % 100 == 0 else None for i in range(N)], pa.int64()),  # nulls are not values
    })


def test_plain_columns_are_the_ones_a_dictionary_does_not_make_smaller():
    assert parquet_writer.plain_columns(_rows()) == ["id", "uuid", "sparse"]
    # A repeating id within the first page is dictionary material: the rule judges the first page's rows.
    repeating = pa.table({"id": pa.array([i % 100 for i in range(N)], pa.int64())})
    assert parquet_writer.plain_columns(repeating) == []
    assert parquet_writer.plain_columns(pa.table({"id": pa.array([], pa.int64())})) == []


def test_files_keep_dictionaries_only_where_they_pay_and_read_back_the_same(tmp_path):
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("ns")
    rows = _rows()
    table = catalog.create_table("ns.t", schema=rows.schema)
    files = write_data_files(table.metadata, table.io, rows, uuid.uuid4())
    assert len(files) == 1 and files[0].record_count == N
    path = files[0].file_path.removeprefix("file://")
    meta = pq.read_metadata(path)
    dictionary = {meta.schema.column(i).path: "RLE_DICTIONARY" in meta.row_group(0).column(i).encodings
                  for i in range(meta.num_columns)}
    # Nested leaves keep the writer's default, unique or not (named as Arrow names them, or they would lose it).
    assert dictionary == {"id": False, "uuid": False, "customer": True, "region": True, "flag": False,
                          "tags.list.element": True, "where.city": True, "where.seq": True, "sparse": False}
    assert pq.read_table(path).cast(rows.schema).equals(rows)
    # PyIceberg's statistics come from the same writer: bounds and counts as before.
    assert files[0].value_counts[1] == N and files[0].null_value_counts[table.schema().find_field("sparse").field_id] \
        == N - N // 100


def test_a_table_where_every_column_pays_keeps_the_writers_default(tmp_path):
    low = pa.table({"region": pa.array([("eu", "us")[i % 2] for i in range(N)], pa.string())})
    assert parquet_writer.dictionary_columns(low) is True
