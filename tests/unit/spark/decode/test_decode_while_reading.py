"""decode_while_reading: a task decodes its records in chunks as they arrive, and the result is always the one
`decode_source` gives on the whole batch (clean chunks kept; a bad record or a schema change anywhere falls back
to decoding the whole batch, with dead letters indexed in it)."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest

from handoff_spark.decode import batch as source_decode
from handoff_spark.config import AppConfig
from handoff_spark.decode.batch import decode_source, decode_while_reading
from handoff_spark.kafka.source import ARROW_SCHEMA


def cfg(on_incompatible: str = "deadLetter", fmt: str = "json") -> AppConfig:
    return AppConfig.model_validate({
        "handoffId": "ns/x", "source": {"bootstrapServers": "b:9092", "topics": ["t"], "format": fmt},
        "sink": {"kind": "iceberg", "table": "db.t"}, "checkpointLocation": "/tmp/ck",
        **({"deadLetterTopic": "dlq"} if on_incompatible == "deadLetter" else {}),
        "schema": {"columns": [{"name": "id", "type": "long", "required": True}, {"name": "name", "type": "string"},
                               {"name": "ts", "type": "timestamp"}],
                   "evolution": "compatible", "onIncompatible": on_incompatible}})


def batch(values: list[bytes], first_offset: int) -> pa.RecordBatch:
    n = len(values)
    return pa.RecordBatch.from_arrays([
        pa.array(["t"] * n, pa.string()), pa.array([0] * n, pa.int32()),
        pa.array(range(first_offset, first_offset + n), pa.int64()),
        pa.array([1_700_000_000_000_000] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        pa.array([None] * n, pa.binary()), pa.array(values, pa.binary()),
        pa.nulls(n, ARROW_SCHEMA.field("headers").type)], schema=ARROW_SCHEMA)


def record(i: int, **extra: object) -> bytes:
    return json.dumps({"id": i, "name": f"n{i}", "ts": "2026-01-01T00:00:00.001Z", **extra}).encode()


def batches_of(values: list[bytes], size: int) -> list[pa.RecordBatch]:
    return [batch(values[i:i + size], i) for i in range(0, len(values), size)]


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(source_decode, "CHUNK_ROWS", 10)


def whole(values: list[bytes], c: AppConfig) -> tuple[pa.Table, list, dict]:
    return decode_source(pa.Table.from_batches(batches_of(values, 7)), c)


def test_clean_chunks_give_the_whole_batch_decode() -> None:
    values = [record(i) for i in range(45)]
    raw, decoded, dead, schemas, _ = decode_while_reading(batches_of(values, 7), cfg())
    expected, expected_dead, _ = whole(values, cfg())
    assert raw is not None and raw.num_rows == 45 and dead == [] == expected_dead and schemas == {}
    assert decoded.schema == expected.schema and decoded.to_pylist() == expected.to_pylist()


def test_a_bad_record_in_a_later_chunk_falls_back_with_dead_letters_indexed_in_the_whole_batch() -> None:
    values = [record(i) for i in range(45)]
    values[33] = b'{"id": "not a number"}'
    raw, decoded, dead, _, _ = decode_while_reading(batches_of(values, 7), cfg())
    expected, expected_dead, _ = whole(values, cfg())
    assert [(d.index, d.offset, d.reason) for d in dead] == [(d.index, d.offset, d.reason) for d in expected_dead]
    assert [d.offset for d in dead] == [33]
    assert decoded.to_pylist() == expected.to_pylist() and decoded.num_rows == 44


def test_a_column_that_appears_in_a_later_chunk_falls_back_to_one_schema() -> None:
    values = [record(i) for i in range(45)]
    values[40] = record(40, extra_field=5)
    _, decoded, dead, _, _ = decode_while_reading(batches_of(values, 7), cfg())
    expected, _, _ = whole(values, cfg())
    assert dead == [] and decoded.schema == expected.schema and "extra_field" in decoded.column_names
    assert decoded.to_pylist() == expected.to_pylist()


def test_halt_raises_the_whole_batch_error() -> None:
    values = [record(i) for i in range(25)]
    values[21] = b'{"name": "no id"}'
    with pytest.raises(Exception) as got:
        decode_while_reading(batches_of(values, 7), cfg("halt"))
    with pytest.raises(Exception) as want:
        whole(values, cfg("halt"))
    assert type(got.value) is type(want.value) and str(got.value) == str(want.value)


def test_no_records() -> None:
    raw, decoded, dead, _, _ = decode_while_reading(iter([batch([], 0)]), cfg())
    assert raw is None and dead == []
