"""decode_batch: the record-validity rules every sink shares (fast C++ path and per-record path agree)."""
from __future__ import annotations

import datetime as dt
import decimal
import json

import pyarrow as pa
import pytest

from handoff_spark.config import SchemaPolicy
from handoff_spark.decode.records import SchemaIncompatible, decode_batch
from handoff_spark.kafka.source import ARROW_SCHEMA

POLICY = SchemaPolicy.model_validate({
    "columns": [{"name": "id", "type": "long", "required": True}, {"name": "name", "type": "string"},
                {"name": "ts", "type": "timestamp"}, {"name": "amount", "type": "decimal(10,2)"},
                {"name": "day", "type": "date"}, {"name": "ok", "type": "boolean"}, {"name": "n", "type": "int"}],
    "evolution": "compatible", "onIncompatible": "deadLetter"})


def raw(values: list[bytes | None], topic: str = "t") -> pa.RecordBatch:
    n = len(values)
    return pa.RecordBatch.from_arrays([
        pa.array([topic] * n, pa.string()), pa.array([0] * n, pa.int32()), pa.array(range(100, 100 + n), pa.int64()),
        pa.array([1_700_000_000_000_000] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        pa.array([None] * n, pa.binary()), pa.array(values, pa.binary()),
        pa.nulls(n, ARROW_SCHEMA.field("headers").type)], schema=ARROW_SCHEMA)


def j(doc: object) -> bytes:
    return json.dumps(doc).encode()


def test_good_batch_decodes_on_fast_path_with_declared_types_and_kafka_columns() -> None:
    batch = raw([j({"id": 1, "name": "a", "ts": "2024-01-01T00:00:00Z", "amount": "1.25", "day": "2024-01-02",
                    "ok": True, "n": 7}), j({"id": 2})])
    table, dead = decode_batch(batch, POLICY)
    assert dead == []
    assert table.column_names == ["id", "name", "ts", "amount", "day", "ok", "n", "_kafka_topic",
                                  "_kafka_partition", "_kafka_offset", "_kafka_timestamp"]
    assert table.schema.field("id").type == pa.int64() and not table.schema.field("id").nullable
    assert table.schema.field("n").type == pa.int32()
    row = table.to_pylist()[0]
    assert row["ts"] == dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    assert row["amount"] == decimal.Decimal("1.25") and row["day"] == dt.date(2024, 1, 2)
    assert table.column("_kafka_offset").to_pylist() == [100, 101]


@pytest.mark.parametrize("value,reason,needle", [
    (b"{not json", "unparseable", "not JSON"),
    (b"[1, 2]", "not-an-object", "array"),
    (None, "null-value", "tombstone"),
    (j({"name": "x"}), "missing-required", "id"),
    (j({"id": None}), "missing-required", "id"),
    (j({"id": "5"}), "type-mismatch", "id: expected integer"),
    (j({"id": 5.5}), "type-mismatch", "id"),
    (j({"id": 1, "n": 2 ** 40}), "type-mismatch", "does not fit int"),
    (j({"id": 1, "name": 5}), "type-mismatch", "name: expected string"),
    (j({"id": 1, "amount": "1.255"}), "type-mismatch", "decimal places"),
    (j({"id": 1, "ts": "yesterday"}), "type-mismatch", "ISO-8601"),
    (j({"id": 1, "ok": 1}), "type-mismatch", "boolean"),
    (b"\xff\xfe", "unparseable", "not JSON"),
    # Poison pills: each once failed the whole batch (and so every restart of the driver).
    (b'{"id": 1, "v": ' + b"[" * 5000 + b"]" * 5000 + b"}", "too-deep", "schema.limits.maxDepth=64"),
    (b'{"id": 1, "v": ' + b"[" * 64 + b"]" * 64 + b"}", "too-deep", "maxDepth"),
    (b'{"id": 1, "name": "' + b"x" * (8 * 1024 * 1024) + b'"}', "too-large", "schema.limits.maxValueBytes"),
    (b'{"id": 1, "ts": 99999999999999999}', "type-mismatch", "out of range"),
    (b'{"id": 1, "ts": -99999999999999999999999}', "type-mismatch", "out of range"),
    (b'{"id": NaN}', "unparseable", "NaN"),
    (b'{"id": 1, "f": Infinity}', "unparseable", "Infinity"),
    (b'{"id": 1}{"id": 2}', "unparseable", "Extra data"),
    (b"", "unparseable", "not JSON"),
    (b'{"id": 1, "name": "a\x00b"}', "unparseable", "control character"),
    (b'{"id": 1, "name": "\\ud800"}', "unparseable", "surrogate"),
    (b'{"id": 1, "big": ' + b"9" * 400 + b"}", "unconvertible", "big"),
])
def test_bad_records_become_dead_letters_and_good_ones_survive(value: bytes | None, reason: str, needle: str) -> None:
    batch = raw([j({"id": 1}), value, j({"id": 3})])
    table, dead = decode_batch(batch, POLICY)
    assert table.column("id").to_pylist() == [1, 3]
    assert table.column("_kafka_offset").to_pylist() == [100, 102]
    assert [(d.index, d.offset, d.reason) for d in dead] == [(1, 101, reason)]
    assert needle in dead[0].detail


def test_a_value_just_inside_the_limits_is_a_row() -> None:
    """The limits count as documented: the record's object is level 1; maxValueBytes is the value's length."""
    at_depth = b'{"id": 1, "v": ' + b"[" * 63 + b"]" * 63 + b"}"
    big = b'{"id": 2, "name": "' + b"x" * 1000 + b'"}'
    tight = POLICY.model_copy(update={"limits": POLICY.limits.model_copy(update={"max_value_bytes": len(big)})})
    table, dead = decode_batch(raw([at_depth, big, b'{"id": 3, "name": "' + b"x" * 1001 + b'"}']), tight)
    assert table.column("id").to_pylist() == [1, 2]
    assert [(d.offset, d.reason) for d in dead] == [(102, "too-large")]
    assert f"value is {len(big) + 1} bytes, over schema.limits.maxValueBytes={len(big)}" in dead[0].detail


def test_out_of_range_floats_are_dead_letters_on_every_tier() -> None:
    policy = SchemaPolicy.model_validate({"columns": [{"name": "x", "type": "double"}, {"name": "y", "type": "float"}],
                                          "evolution": "none", "onIncompatible": "deadLetter"})
    table, dead = decode_batch(raw([b'{"x": 1e400}', b'{"y": 1e39}', b'{"x": 1.5, "y": 2.5}', b'{"x": -1e308}']),
                               policy)
    assert [(d.offset, d.reason) for d in dead] == [(100, "type-mismatch"), (101, "type-mismatch")]
    assert table.column("x").to_pylist() == [1.5, -1e308] and table.column("y").to_pylist() == [2.5, None]


def test_halt_names_the_partition_and_offset_of_a_poison_pill() -> None:
    halt = POLICY.model_copy(update={"on_incompatible": "halt"})
    with pytest.raises(SchemaIncompatible, match=r"t\[0\]@101 .*too-deep"):
        decode_batch(raw([j({"id": 1}), b'{"id": 2, "v": ' + b"[" * 5000 + b"]" * 5000 + b"}"]), halt)


def test_halt_raises_naming_column_topic_partition_offset_and_fix() -> None:
    halt = POLICY.model_copy(update={"on_incompatible": "halt"})
    with pytest.raises(SchemaIncompatible) as err:
        decode_batch(raw([j({"id": 1}), j({"id": "x"})], topic="orders"), halt)
    msg = str(err.value)
    assert "orders[0]@101" in msg and "'id'" in msg and "onIncompatible" in msg and "Fix" in msg


def test_epoch_millis_timestamps_are_accepted() -> None:
    table, dead = decode_batch(raw([j({"id": 1, "ts": 1_700_000_000_123})]), POLICY)
    assert dead == []
    assert table.column("ts")[0].as_py() == dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=dt.timezone.utc)


def test_extra_fields_become_typed_columns_under_compatible_evolution() -> None:
    table, dead = decode_batch(raw([j({"id": 1, "color": "red", "score": 1}), j({"id": 2, "score": 2.5})]), POLICY)
    assert dead == []
    assert table.schema.field("color").type == pa.string()
    assert table.schema.field("score").type == pa.float64()
    assert table.column("score").to_pylist() == [1.0, 2.5]
    # nested / mixed fields: JSON text (slow path), and the all-null field is left out
    table, _ = decode_batch(raw([j({"id": 1, "meta": {"a": 1}, "mix": 1, "nil": None}), j({"id": 2, "mix": "x"})]),
                            POLICY)
    assert table.column("meta").to_pylist() == ['{"a":1}', None]
    assert table.column("mix").to_pylist() == ["1", '"x"']
    assert "nil" not in table.column_names


def test_extra_fields_are_ignored_without_evolution() -> None:
    none = POLICY.model_copy(update={"evolution": "none"})
    for docs in ([{"id": 1, "color": "red"}], [{"id": 1, "meta": {"a": [1]}}, {"id": "bad"}]):
        table, _ = decode_batch(raw([j(d) for d in docs]), none)
        assert "color" not in table.column_names and "meta" not in table.column_names


def test_fast_and_slow_paths_agree() -> None:
    docs = [{"id": i, "name": f"n{i}", "ts": "2024-05-01T10:00:00+02:00", "amount": 3.5, "day": "2024-05-01",
             "ok": i % 2 == 0, "n": i, "extra": i * 2} for i in range(50)]
    fast, _ = decode_batch(raw([j(d) for d in docs]), POLICY)
    slow, dead = decode_batch(raw([j(d) for d in docs] + [b"garbage"]), POLICY)
    assert len(dead) == 1
    assert fast.schema == slow.schema
    assert fast.to_pylist() == slow.to_pylist()


def test_raw_format_keeps_bytes() -> None:
    table, dead = decode_batch(raw([b"\x00\x01", None]), POLICY, fmt="raw")
    assert dead == [] and table.column("value").to_pylist() == [b"\x00\x01", None]
    assert table.column_names[:2] == ["key", "value"]


def test_epoch_millis_batches_take_the_fast_path_and_match_the_slow_one() -> None:
    from handoff_spark.decode.records import _fast_path

    docs = [{"id": i, "ts": 1_700_000_000_000 + i} for i in range(20)]
    batch = raw([j(d) for d in docs])
    assert _fast_path(pa.Table.from_batches([batch]), POLICY) is not None
    fast, _ = decode_batch(batch, POLICY)
    slow, dead = decode_batch(raw([j(d) for d in docs] + [b"x"]), POLICY)
    assert len(dead) == 1 and fast.to_pylist() == slow.to_pylist()


@pytest.mark.parametrize("mixed_types_across_chunks", [False, True])
def test_large_batch_with_a_few_bad_records_decodes_like_the_per_record_path(mixed_types_across_chunks: bool) -> None:
    from handoff_spark.decode.records import _slow_path

    def score(i: int) -> float:
        return i + 0.5 if mixed_types_across_chunks and i >= 3000 else i

    docs = [j({"id": i, "name": f"n{i}", "ts": "2024-05-01T10:00:00Z", "color": "red" if i % 3 else None,
               "score": score(i)}) for i in range(6000)]
    docs[10], docs[4500] = b"garbage", j({"id": "x"})
    batch = pa.Table.from_batches([raw(docs)])
    table, dead = decode_batch(batch, POLICY)
    ref_table, ref_dead = _slow_path(batch, POLICY)
    assert [(d.index, d.offset, d.reason) for d in dead] == [(d.index, d.offset, d.reason) for d in ref_dead]
    assert [d.index for d in dead] == [10, 4500]
    assert table.schema == ref_table.schema
    assert table.to_pylist() == ref_table.to_pylist()
