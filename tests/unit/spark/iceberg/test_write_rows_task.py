"""iceberg.sink.write_rows_task: a write task over rows already decoded (a transform's output, as Spark hands it:
its own Arrow types) writes them shaped to the table, and the batch's ledger entry keeps the Kafka ranges it is
given, however many rows the transform left."""
from __future__ import annotations

import pyarrow as pa
import pytest

from handoff_spark.config import AppConfig
from handoff_spark.iceberg import ledger
from handoff_spark.iceberg.sink import SchemaIncompatibleError, commit_to_table, open_table, prepare, write_rows_task


def cfg(tmp_path) -> AppConfig:
    return AppConfig.model_validate({
        "handoffId": "ns/x", "source": {"bootstrapServers": "b:9092", "topics": ["t"]},
        "sink": {"kind": "iceberg", "catalogName": "rows", "table": "db.t",
                 "catalogProperties": {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db",
                                       "warehouse": f"file://{tmp_path}/wh"}},
        "checkpointLocation": str(tmp_path / "ck"),
        "schema": {"columns": [{"name": "id", "type": "long", "required": True}, {"name": "name", "type": "string"},
                               {"name": "ts", "type": "timestamp"}],
                   "evolution": "none", "onIncompatible": "halt"}})


def spark_rows(ids: list[int]) -> pa.RecordBatch:
    """Rows as Spark's Arrow writer sends them: large strings, a session time zone, nullable everything."""
    n = len(ids)
    ts = pa.array([1_767_225_600_000_000 + i for i in ids], pa.int64()).cast(pa.timestamp("us", tz="Etc/UTC"))
    return pa.RecordBatch.from_arrays([
        pa.array(ids, pa.int64()), pa.array([f"n{i}" for i in ids], pa.large_string()), ts,
        pa.array(["t"] * n, pa.large_string()), pa.array([0] * n, pa.int32()), pa.array(ids, pa.int64()), ts,
    ], names=["id", "name", "ts", "_kafka_topic", "_kafka_partition", "_kafka_offset", "_kafka_timestamp"])


def test_rows_are_written_and_the_ledger_keeps_the_batchs_ranges(tmp_path) -> None:
    c = cfg(tmp_path)
    prepare(c)
    # Offsets 0..9 were the batch; the transform kept 3 rows of them.
    msg = write_rows_task(c, iter([spark_rows([1, 4]), spark_rows([]), spark_rows([8])]))
    assert msg.rows == 3 and msg.records == 0 and msg.dlq_rows == 0 and len(msg.files) == 1  # records: the frame source's counts
    assert msg.max_event_time_ms == (1_767_225_600_000_000 + 8) // 1000
    done = commit_to_table(c, [msg], 0, {("t", 0): (0, 10)}, "qid")
    assert done.snapshot_id is not None and not done.skipped
    table = open_table(c, create=False)
    commit = ledger.latest_commit(table, "ns/x", c.query_name)
    assert commit is not None and commit.offsets == {"t": {0: (0, 10)}} and commit.rows == 3
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == [1, 4, 8]


def test_no_rows_writes_no_file(tmp_path) -> None:
    c = cfg(tmp_path)
    prepare(c)
    msg = write_rows_task(c, iter([spark_rows([])]))
    assert msg.rows == 0 and msg.files == []


def test_a_column_the_table_cannot_take_stops_the_task(tmp_path) -> None:
    c = cfg(tmp_path)
    prepare(c)
    bad = pa.RecordBatch.from_arrays([pa.array(["x"]), pa.array([0], pa.int32()), pa.array([0], pa.int64())],
                                     names=["id", "_kafka_partition", "_kafka_offset"])
    with pytest.raises(SchemaIncompatibleError, match="transform's output"):
        write_rows_task(c, iter([bad]))
