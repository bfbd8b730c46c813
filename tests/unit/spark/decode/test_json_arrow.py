"""The C JSON decoder (`_json_arrow`, decode.py's first try): the same rows, dead letters and errors as the
decoding it goes before (pyarrow's reader, then the per-record path), or it declines; and it closes the newline
framing's hole (a value with two objects beside one with none shifted fields into the wrong rows)."""
from __future__ import annotations

import json
from unittest import mock

import pyarrow as pa
import pytest

from handoff_spark.decode import records as decode
from handoff_spark.config import SchemaPolicy
from handoff_spark.decode.records import decode_batch
from handoff_spark.kafka.source import ARROW_SCHEMA

COLUMNS = [{"name": "id", "type": "long", "required": True}, {"name": "name", "type": "string"},
           {"name": "ts", "type": "timestamp"}, {"name": "amount", "type": "double"},
           {"name": "day", "type": "date"}, {"name": "ok", "type": "boolean"}]
IGNORE = SchemaPolicy.model_validate({"columns": COLUMNS, "evolution": "none", "onIncompatible": "deadLetter"})
COMPATIBLE = SchemaPolicy.model_validate({"columns": COLUMNS, "evolution": "compatible",
                                          "onIncompatible": "deadLetter"})


def raw(values: list[bytes]) -> pa.Table:
    n = len(values)
    return pa.Table.from_batches([pa.RecordBatch.from_arrays([
        pa.array(["t"] * n, pa.string()), pa.array([0] * n, pa.int32()), pa.array(range(100, 100 + n), pa.int64()),
        pa.array([1_700_000_000_000_000] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        pa.nulls(n, pa.binary()), pa.array(values, pa.binary()),
        pa.nulls(n, ARROW_SCHEMA.field("headers").type)], schema=ARROW_SCHEMA)])


#: Values the C decoder takes whole: its result must be the earlier decoding's, value for value.
TAKEN = [
    b'{"id": 1}',
    b'{"id": -0, "amount": -0}',
    b'{"id": 9223372036854775807, "amount": 1.5}',
    b'{"id": -9223372036854775808, "amount": -2}',
    rb'{"id": 2, "name": "caf\u00e9 \ud83d\ude00 \"q\" \\ \/ \b\f\n\r\t \u0000"}',
    '{"id": 3, "name": "café 😀 ñ 中"}'.encode(),
    b'{"id": 4, "ts": "2024-05-01T10:00:00+02:00", "day": "2024-05-01", "ok": true}',
    b'{"id": 5, "ts": "2024-05-01T10:00:00.123456Z", "ok": false}',
    b' \t{"id":6,"amount":123456789012345678901234567890}\r\n ',
    b'{"id": 7, "amount": 0.1}',
    b'{"id": 8, "amount": 2.675}',
    b'{"id": 9, "amount": 1e-7}',
    b'{"id": 10, "amount": 12345678901234567}',
    b'{"id": 11, "amount": -1.7976931348623157e308}',
    b'{"id": 12, "amount": 0.000000000000000000001}',
    b'{"id": 13, "amount": 4.35, "x": 1}',
    b'{"id": 14, "extra": {"a": [1, 2, {"b": null}], "c": "\\u0041"}, "more": [true, false, null, -1.5e3, []], '
    b'"e": {}}',
    b'{"id": 15, "name": null, "amount": null, "ok": null, "ts": null, "day": null}',
    b'{"name": "no id", "id": 16}',
    b'{"id": 17, "name": "' + b"x" * 300 + b'\\"' + b"y" * 9 + b'"}',
    b'{"id": 18, "ts": "2024-05-01 10:00:00"}',   # no zone: UTC, as pyarrow's reader has it
]

#: Values it hands on to pyarrow's reader (still exactly one object each).
DECLINED = [
    b'{"id": 1e2}',                               # an exponent in a long
    b'{"id": 1, "id": 2}',                        # a declared field twice
    b'{"id": "1"}',                               # another JSON type
    b'{"id": 1, "ts": 1700000000000}',            # epoch milliseconds: pyarrow's second try
    b'{"id": 1, "n\\u0061me": "x"}',              # an escaped field name
    b'{"id": 1, "amount": 1e400}',                # out of range
    b'{"id": 1, "name": 5}',
    b'{"id": 1, "ok": 1}',
    b'{"id": 1, "name": {"a": 1}}',
    b'{"id": 92233720368547758070}',
]

#: Values that are not exactly one well-formed JSON object: the per-record path, which names them.
INVALID = [
    b'{"id": 1}{"id": 2}', b"   ", b"[1, 2]", b'{"id": 1,}', b'{"id": 01}', b'{"id": 1, "name": "a\x01"}',
    b'{"id": 1, "name": "\xff"}', b'{"id": 1, "name": "\\ud800"}', b'{"id": NaN}', b'{"id": 1} x', b'{"id": 1',
    b'{"id": -}', b'{"id": 1.}', b'{"id": tru}',
    b'{"id": 1, "name": "\\x"}', b'"just a string"', b'{"id": 1, "name": "\xc0\xaf"}',
]


def earlier(batch: pa.Table, policy: SchemaPolicy) -> tuple[pa.Table, list]:
    """Decoding as it was before the C decoder: pyarrow's reader first, then the per-record path."""
    with mock.patch.object(decode, "_native_parse", return_value=None), \
            mock.patch.object(decode, "_one_object_each", return_value=True):
        return decode_batch(batch, policy)


def parsed_natively(batch: pa.Table, policy: SchemaPolicy) -> bool:
    return decode._native_parse(batch.column("value"), policy) is not None


@pytest.mark.parametrize("value", TAKEN, ids=range(len(TAKEN)))
@pytest.mark.parametrize("policy", [IGNORE, COMPATIBLE], ids=["ignore", "compatible"])
def test_taken_values_decode_as_before(value: bytes, policy: SchemaPolicy) -> None:
    batch = raw([value])
    if policy is COMPATIBLE and b'"x"' in value or b'"extra"' in value:
        assert not parsed_natively(batch, COMPATIBLE)  # undeclared fields: pyarrow infers their columns
        policy = IGNORE
    assert parsed_natively(batch, policy)
    table, dead = decode_batch(batch, policy)
    before, dead_before = earlier(batch, policy)
    assert dead == dead_before == []
    assert table.schema == before.schema
    assert table.to_pylist() == before.to_pylist()


def test_a_batch_of_taken_values_never_reaches_pyarrows_reader() -> None:
    batch = raw(TAKEN[:-1])  # the last one has no zone: see the next test
    with mock.patch.object(decode, "_arrow_parse", side_effect=AssertionError("pyarrow's reader was used")):
        table, dead = decode_batch(batch, IGNORE)
    assert dead == [] and table.equals(earlier(batch, IGNORE)[0])
    names = table.column("name").to_pylist()
    assert names[4] == 'café \U0001F600 "q" \\ / \b\f\n\r\t \x00'
    assert names[5] == "café 😀 ñ 中" and names[19] == "x" * 300 + '"' + "y" * 9
    assert table.column("amount").to_pylist()[8:15] == [1.2345678901234568e29, 0.1, 2.675, 1e-7,
                                                        12345678901234567.0, -1.7976931348623157e308, 1e-21]


def test_a_batch_mixing_zoned_and_unzoned_timestamps_decodes_as_before() -> None:
    """Their text converts apart, so such a batch goes to pyarrow's reader (which takes both) whole."""
    batch = raw(TAKEN)
    assert parsed_natively(batch, IGNORE)
    table, dead = decode_batch(batch, IGNORE)
    assert dead == [] and table.equals(earlier(batch, IGNORE)[0])


@pytest.mark.parametrize("value", DECLINED, ids=range(len(DECLINED)))
def test_declined_values_decode_as_before(value: bytes) -> None:
    batch = raw([b'{"id": 0}', value])
    assert not parsed_natively(batch, IGNORE)
    assert decode._one_object_each(batch.column("value"))
    table, dead = decode_batch(batch, IGNORE)
    before, dead_before = earlier(batch, IGNORE)
    assert dead == dead_before
    assert table.to_pylist() == before.to_pylist()


@pytest.mark.parametrize("value", INVALID, ids=range(len(INVALID)))
def test_values_that_are_not_one_object_become_dead_letters(value: bytes) -> None:
    batch = raw([b'{"id": 0}', value, b'{"id": 2}'])
    assert not decode._one_object_each(batch.column("value"))
    table, dead = decode_batch(batch, IGNORE)
    assert [d.offset for d in dead] == [101]
    assert table.column("id").to_pylist() == [0, 2]
    assert table.column("_kafka_offset").to_pylist() == [100, 102]


def test_nesting_past_the_limit_is_declined_by_the_c_tiers_and_a_dead_letter() -> None:
    """71 levels (the record's object and 70 arrays): past the default limit of 64 a dead letter in every tier;
    under a limit that allows it, a row, by the per-record path as by the C tiers."""
    deep = b'{"id": 1, "x": ' + b"[" * 70 + b"]" * 70 + b"}"
    batch = raw([b'{"id": 0}', deep])
    assert not decode._one_object_each(batch.column("value"))
    assert decode._one_object_each(batch.column("value"), 71)
    assert not decode._one_object_each(batch.column("value"), 70)
    table, dead = decode_batch(batch, IGNORE)
    assert [(d.offset, d.reason) for d in dead] == [(101, "too-deep")]
    assert "schema.limits.maxDepth=64" in dead[0].detail and table.column("id").to_pylist() == [0]
    roomy = IGNORE.model_copy(update={"limits": IGNORE.limits.model_copy(update={"max_depth": 71})})
    assert parsed_natively(batch, roomy)
    table, dead = decode_batch(batch, roomy)
    assert dead == [] and table.column("id").to_pylist() == [0, 1]
    assert decode._slow_path(batch, roomy)[0].column("id").to_pylist() == [0, 1]
    tight = IGNORE.model_copy(update={"limits": IGNORE.limits.model_copy(update={"max_depth": 70})})
    assert not parsed_natively(batch, tight)
    assert [d.reason for d in decode_batch(batch, tight)[1]] == ["too-deep"]


def test_an_unpaired_surrogate_escape_is_a_dead_letter_not_a_failed_batch() -> None:
    """`json.loads` keeps it in the str, which Arrow cannot encode: the whole batch used to fail."""
    batch = raw([b'{"id": 0, "name": "\\ud83d\\ude00"}', b'{"id": 1, "name": "\\ud800"}', b'{"id": 2, "\\udc00": 1}'])
    table, dead = decode_batch(batch, IGNORE)
    assert [(d.offset, d.reason) for d in dead] == [(101, "unparseable"), (102, "unparseable")]
    assert "surrogate" in dead[0].detail
    assert table.column("name").to_pylist() == ["\U0001F600"]


def test_two_objects_in_one_value_no_longer_shift_rows() -> None:
    """Newline framing alone: `{"id": 1}{"id": 2}` then `{"id": 3}` then a blank value made three rows from three
    values, so offset 101 got id 2 and offset 102 id 3. Each value must be exactly one object."""
    batch = raw([b'{"id": 1}{"id": 2}', b'{"id": 3}', b" "])
    shifted, _ = earlier(batch, IGNORE)
    assert shifted.column("id").to_pylist() == [1, 2, 3]  # the hole this closes, as it was
    table, dead = decode_batch(batch, IGNORE)
    assert [(d.offset, d.reason) for d in dead] == [(100, "unparseable"), (102, "unparseable")]
    assert table.column("id").to_pylist() == [3] and table.column("_kafka_offset").to_pylist() == [101]


def test_chunked_and_sliced_values_are_read_from_their_own_offsets() -> None:
    docs = [{"id": i, "name": f"n{i}", "amount": i / 4} for i in range(30)]
    whole = raw([json.dumps(d).encode() for d in docs])
    batches = whole.to_batches()[0]
    pieces = pa.Table.from_batches([batches.slice(3, 10), batches.slice(13, 17)])
    assert pieces.column("value").num_chunks == 2
    table, dead = decode_batch(pieces, IGNORE)
    assert dead == [] and parsed_natively(pieces, IGNORE)
    assert table.column("id").to_pylist() == list(range(3, 30))
    assert table.column("name").to_pylist() == [f"n{i}" for i in range(3, 30)]


def test_a_required_field_that_is_null_still_becomes_a_dead_letter() -> None:
    batch = raw([b'{"id": 1}', b'{"id": null, "name": "a"}', b'{"name": "b"}'])
    assert parsed_natively(batch, IGNORE)
    table, dead = decode_batch(batch, IGNORE)
    assert [(d.offset, d.reason) for d in dead] == [(101, "missing-required"), (102, "missing-required")]
    assert table.column("id").to_pylist() == [1]


def test_empty_chunks_are_skipped() -> None:
    good = raw([b'{"id": 1}', b'{"id": 2}']).to_batches()[0]
    batch = pa.Table.from_batches([good.slice(0, 0), good, good.slice(2, 0)])
    assert batch.column("value").num_chunks == 3
    assert parsed_natively(batch, IGNORE) and decode._one_object_each(batch.column("value"))
    table, dead = decode_batch(batch, IGNORE)
    assert dead == [] and table.column("id").to_pylist() == [1, 2]


def test_malformed_offsets_are_declined_never_read_past_the_data() -> None:
    """pyarrow does not validate `from_buffers`; the C side checks each row's offsets against the data."""
    from handoff_spark.decode import _json_arrow

    data = pa.py_buffer(b'{"id": 1}{"id": 2}')
    for offsets in ([0, 9, 4, 18], [0, 9, 1_000_000, 18], [0, 9, 18, 1_000_000]):
        buf = pa.py_buffer(pa.array(offsets, pa.int32()).buffers()[1])
        rows = len(offsets) - 1
        if offsets[-1] > len(data):
            with pytest.raises(ValueError, match="outside the data"):
                _json_arrow.decode(buf, data, 0, rows, (b"id",), (_json_arrow.LONG,), True, 64)
            continue
        assert _json_arrow.decode(buf, data, 0, rows, (b"id",), (_json_arrow.LONG,), True, 64) is None
        assert _json_arrow.one_object_each(buf, data, 0, rows, 64) is False
