"""decode.frame: decoded records as batches of one fixed schema, the one Spark is given for the frame (declared
columns, then the Kafka coordinates), whatever each batch's decode found; dead letters handed over first."""
from __future__ import annotations

import json

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

from handoff_spark.config import AppConfig
from handoff_spark.decode.frame import conform, decoded_frames, frame_schema
from handoff_spark.kafka.source import ARROW_SCHEMA


def cfg(evolution: str = "compatible") -> AppConfig:
    return AppConfig.model_validate({
        "handoffId": "ns/x", "source": {"bootstrapServers": "b:9092", "topics": ["t"]},
        "sink": {"kind": "iceberg", "table": "db.t"}, "checkpointLocation": "/tmp/ck", "deadLetterTopic": "dlq",
        "schema": {"columns": [{"name": "id", "type": "long", "required": True}, {"name": "name", "type": "string"},
                               {"name": "ts", "type": "timestamp"}],
                   "evolution": evolution, "onIncompatible": "deadLetter"}})


def batch(values: list[bytes], first_offset: int = 0) -> pa.RecordBatch:
    n = len(values)
    return pa.RecordBatch.from_arrays([
        pa.array(["t"] * n, pa.string()), pa.array([0] * n, pa.int32()),
        pa.array(range(first_offset, first_offset + n), pa.int64()),
        pa.array([1_700_000_000_000_000] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        pa.array([None] * n, pa.binary()), pa.array(values, pa.binary()),
        pa.nulls(n, ARROW_SCHEMA.field("headers").type)], schema=ARROW_SCHEMA)


def test_the_frame_schema_is_what_spark_expects_back() -> None:
    schema = frame_schema(cfg())
    assert schema.names == ["id", "name", "ts", "_kafka_topic", "_kafka_partition", "_kafka_offset",
                            "_kafka_timestamp"]
    assert not schema.field("id").nullable and schema.field("name").nullable
    assert to_arrow_schema(from_arrow_schema(schema), timezone="UTC").equals(schema)


def test_batches_have_the_frame_schema_whatever_decode_found() -> None:
    # An undeclared field (evolution=compatible adds it to the decoded table) and a declared one absent from every
    # record: the frame drops the first and holds nulls for the second.
    values = [json.dumps({"id": i, "extra": i * 2}).encode() for i in range(3)]
    out = list(decoded_frames([batch(values)], cfg(), frame_schema(cfg()), lambda raw, dead: None))
    assert len(out) == 1 and out[0].schema.equals(frame_schema(cfg()))
    rows = out[0].to_pylist()
    assert [r["id"] for r in rows] == [0, 1, 2] and all(r["name"] is None and r["ts"] is None for r in rows)
    assert [r["_kafka_offset"] for r in rows] == [0, 1, 2]


def test_dead_letters_are_handed_over_before_the_rows_and_a_batch_of_them_alone_yields_nothing() -> None:
    seen: list[tuple[int, list[int]]] = []
    good, bad = json.dumps({"id": 1, "name": "a"}).encode(), b"not json"
    frames = decoded_frames([batch([bad, good, bad], 10), batch([bad], 13), batch([])], cfg(),
                            frame_schema(cfg()), lambda raw, dead: seen.append((raw.num_rows, [d.offset for d in dead])))
    first = next(frames)
    assert seen == [(3, [10, 12])] and first.to_pylist()[0]["id"] == 1 and first.num_rows == 1
    assert list(frames) == [] and seen[1] == (1, [13])


def test_conform_casts_to_the_schemas_types() -> None:
    schema = pa.schema([pa.field("a", pa.int64(), nullable=False), pa.field("b", pa.string())])
    out = conform(pa.table({"b": pa.array(["x"], pa.large_string()), "a": pa.array([7], pa.int32()),
                            "c": [1]}), schema)
    assert out.schema.equals(schema) and out.to_pylist() == [{"a": 7, "b": "x"}]
