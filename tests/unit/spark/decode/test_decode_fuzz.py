"""Differential fuzzing of the JSON decoder's three tiers (issue 33): `_json_arrow` (C), pyarrow's JSON reader and the
per-record reference must give the same rows and dead letters for every batch, and a value Python's strict JSON
parser rejects is never a row (decode_fuzz_support.py says what is generated and what is checked).

The fuzz run covers HANDOFF_FUZZ_VALUES generated values (default 100,000; the long run in docs/design/
data-plane-contract.md sets 10,000,000); the seed corpus (tests/data/json_fuzz_corpus) and every disagreement the
fuzzer found are checked by name below, each with what the tiers now do."""
from __future__ import annotations

import datetime as dt
import decimal
import time

import pyarrow as pa
import pytest

import decode_fuzz_support as fuzz
from decode_fuzz_support import check_values, policy_of, raw
from handoff_spark.decode import records as decode
from handoff_spark.decode.records import decode_batch


def test_the_three_tiers_agree_on_generated_and_mutated_values(record_property: pytest.RecordProperty) -> None:
    target = fuzz.fuzz_values()
    tally = fuzz.Tally()
    started = time.process_time()
    fuzz.run_rounds(target, tally, progress=lambda r, t: print(f"round {r}: {t}", flush=True))
    record_property("fuzz", f"{tally} in {time.process_time() - started:.0f} s of CPU")
    print(f"{tally} in {time.process_time() - started:.0f} s of CPU")
    assert tally.values >= target
    # The fast tiers took whole batches and kept records often enough for the comparison to mean something.
    assert min(tally.taken.values()) >= tally.batches // 50 and tally.sub_taken >= tally.batches // 50, tally


@pytest.mark.parametrize("name", sorted(fuzz.corpus()))
def test_corpus_values_alone_and_among_valid_records(name: str) -> None:
    value = fuzz.corpus()[name]
    for policy in fuzz.CORPUS_POLICIES:
        check_values([value], policy)
        check_values([b'{"id": 7, "name": "a"}', value, b'{"id": 8}'], policy)


def test_a_value_python_rejects_is_a_dead_letter_among_valid_records() -> None:
    """The issue's drill in one batch: each worst case among valid records is a dead letter with its reason, every
    valid record is a row."""
    policy = fuzz.CORPUS_POLICIES[0]
    corpus = fuzz.corpus()
    # Python 3.12+'s json parses a 5,000-deep array that 3.11's refuses: named here, so the batch holds them on every
    # Python (schema.limits.maxDepth makes them dead letters either way).
    deep = ("deep-arrays-5000.json", "deep-objects-5000.json")
    bad = {name: corpus[name] for name in deep} | {n: v for n, v in corpus.items() if fuzz.strict_json_rejects(v)}
    assert {"deep-arrays-5000.json", "invalid-utf8-ff.bin", "nul-byte-in-string.bin", "nan.json", "two-objects.json",
            "empty.bin", "unclosed-5000.json"} <= set(bad)
    values = [v for value in bad.values() for v in (b'{"id": 1}', value)] + [b'{"id": 1}']
    table, dead = decode_batch(raw(values), policy)
    assert table.column("_kafka_offset").to_pylist() == list(range(100, 100 + len(values), 2))
    assert [d.index for d in dead] == list(range(1, len(values), 2))
    reasons = dict(zip(bad, (d.reason for d in dead)))
    assert reasons["deep-arrays-5000.json"] == reasons["deep-objects-5000.json"] == "too-deep"
    assert {reasons[n] for n in ("invalid-utf8-ff.bin", "nul-byte-in-string.bin", "nan.json", "two-objects.json",
                                 "empty.bin")} == {"unparseable"}


def test_a_10_mb_string_is_too_large_by_default_and_a_row_under_a_larger_limit() -> None:
    value = b'{"id": 1, "name": "' + b"x" * (10 * 1024 * 1024) + b'"}'
    policy = fuzz.CORPUS_POLICIES[0]
    table, dead = decode_batch(raw([b'{"id": 0}', value]), policy)
    assert [(d.index, d.reason) for d in dead] == [(1, "too-large")] and "maxValueBytes=8388608" in dead[0].detail
    assert table.column("id").to_pylist() == [0]
    larger = policy.model_copy(update={"limits": policy.limits.model_copy(update={"max_value_bytes": 16 << 20})})
    check_values([b'{"id": 0}', value], larger)
    assert decode_batch(raw([value]), larger)[0].column("name")[0].as_py() == "x" * (10 * 1024 * 1024)


# --------------------------------------------------------------------------- what the fuzzer found, by name
def _bits(table: pa.Table, column: str) -> list[str | None]:
    return [None if x is None else x.hex() for x in table.column(column).to_pylist()]


def test_found_the_integer_minus_zero_is_plus_zero_in_every_tier() -> None:
    """JSON's `-0` is the integer 0: the reference has 0.0 in a double column. `_json_arrow` and pyarrow's reader
    made it -0.0 (a different float, 1/x = -inf). Now C writes +0.0 and pyarrow's tier declines any batch with a
    -0.0 (a written `-0.0` is -0.0 everywhere)."""
    policy = policy_of([("d", "double", False)])
    for values, want in (([b'{"d": -0}'], ["0x0.0p+0"]), ([b'{"d": -0.0}'], ["-0x0.0p+0"]),
                         ([b'{"d": -0}', b'{"d": -0.0}', b'{"d": 0}'], ["0x0.0p+0", "-0x0.0p+0", "0x0.0p+0"])):
        check_values(values, policy)
        assert _bits(decode_batch(raw(values), policy)[0], "d") == want
        native = decode._native_parse(raw(values).column("value"), policy)
        assert native is not None and _bits(native, "d") == want
        assert decode._arrow_parse(raw(values).column("value"), policy) is None
    check_values([b'{"f": -0}', b'{"f": -0.0}'], policy_of([("f", "float", False)]))


def test_found_a_float_column_refuses_what_only_rounds_to_float_max() -> None:
    """3.4028235e38 is above FLT_MAX as a double (the reference: out of range, a dead letter); pyarrow's reader parsed
    it straight to float32, rounding it to FLT_MAX, and took it. Float columns now parse as doubles, are
    range-checked like the reference, then narrowed."""
    policy = policy_of([("f", "float", False)])
    for value in (b'{"f": 3.4028235e38}', b'{"f": -3.4028235e38}', b'{"f": 3.40282356e38}'):
        check_values([b'{"f": 1.5}', value], policy)
        _, dead = decode_batch(raw([value]), policy)
        assert [d.reason for d in dead] == ["type-mismatch"] and "out of range for float" in dead[0].detail
    check_values([b'{"f": 3.4028234663852886e38}', b'{"f": 1.00000005960464477539062500000001}'], policy)
    table, dead = decode_batch(raw([b'{"f": 3.4028234663852886e38}']), policy)
    assert dead == [] and table.column("f").type == pa.float32()


@pytest.mark.parametrize("value,column,want", [
    (b"0.1234567890123456789", "decimal(20,19)", "0.1234567890123456789"),  # was ...68 (the nearest double's digits)
    (b"151575069351.79082", "decimal(40,5)", "151575069351.79082"),         # was ...83
    (b"1e20", "decimal(38,10)", "100000000000000000000.0000000000"),         # was a dead letter (InvalidOperation)
    (b'"9999999999999999999999999998.9999999999"', "decimal(38,10)", "9999999999999999999999999998.9999999999"),
    (b"123456789012345678901234567890", "decimal(38,0)", "123456789012345678901234567890"),
])
def test_found_decimal_columns_take_a_number_exactly_as_written(value: bytes, column: str, want: str) -> None:
    """The reference turned a JSON number into a double before the decimal (silently changing a value of more than
    15 digits) and quantized in a 28-digit context (any value of more digits raised InvalidOperation: a valid
    decimal(38,10) record was a dead letter). pyarrow's reader had them exact. Now the reference keeps the number's
    spelling and quantizes at the column's precision."""
    policy = policy_of([("m", column, False)])
    check_values([b'{"m": ' + value + b"}"], policy)
    table, dead = decode_batch(raw([b'{"m": ' + value + b"}"]), policy)
    assert dead == [] and table.column("m")[0].as_py() == decimal.Decimal(want)


@pytest.mark.parametrize("value,column,why", [
    (b"1", "decimal(3,3)", "does not fit"),                       # pyarrow's reader stored 1.000: four digits in (3,3)
    (b'"1.000"', "decimal(3,3)", "does not fit"),
    (b"0.30000000000000000001", "decimal(10,2)", "would be rounded"),  # the reference took it as 0.30
    (b"1e28", "decimal(38,10)", "does not fit"),
])
def test_found_decimal_values_beyond_the_column_are_dead_letters_in_every_tier(value: bytes, column: str,
                                                                               why: str) -> None:
    policy = policy_of([("m", column, False)])
    check_values([b'{"m": 0}', b'{"m": ' + value + b"}"], policy)
    _, dead = decode_batch(raw([b'{"m": ' + value + b"}"]), policy)
    assert [d.reason for d in dead] == ["type-mismatch"] and why in dead[0].detail


@pytest.mark.parametrize("value", [b"1e-2147483647", b'"1e-2147483647"', b"1e-44", b"1.1e-240",
                                   b"100000000000000000000000000000", b"1e2", b"1"])
def test_found_pyarrows_json_decimal_conversion_never_sees_a_record(value: bytes) -> None:
    """pyarrow 26.0.1's JSON reader, given a decimal column: `1e-2147483647` (number or string) kills the process
    with SIGSEGV, `1e-44` and `1.1e-240` become 0.00000 in decimal(20,5), a 30-digit integer wraps past 128 bits
    into another value in decimal(38,10), and `1` was stored as 1.000 in decimal(3,3). Decimal columns no longer
    reach it: `_json_arrow` reads them as their text (in either tier) and `_decimals_from_text` converts only plain
    spellings the type holds (the rest is the per-record path's)."""
    for column in ("decimal(20,5)", "decimal(38,10)", "decimal(3,3)"):
        for evolution in ("none", "compatible"):
            policy = policy_of([("m", column, False)], evolution)
            values = [b'{"m": 0, "x": 1}', b'{"m": ' + value + b"}"]
            parsed = decode._arrow_parse(raw(values).column("value"), policy)
            assert parsed is None or parsed.column("m").type == pa.string()  # the text, never pyarrow's decimal
            check_values(values, policy)
    table, dead = decode_batch(raw([b'{"m": 1e-2147483647}', b'{"m": "12.5"}']), policy_of([("m", "decimal(20,5)",
                                                                                                False)]))
    assert [d.reason for d in dead] == ["type-mismatch"] and table.column("m").to_pylist() == [decimal.Decimal("12.5")]


def test_found_a_zone_that_moves_an_instant_out_of_years_1_to_9999_is_a_dead_letter() -> None:
    """`0001-01-01T00:00:00+01:00` is year 0 in UTC: the reference made a row whose timestamp no reader can turn
    back into a datetime (`to_pylist` raised OverflowError); the fast tiers declined it. Now a dead letter."""
    policy = policy_of([("ts", "timestamp", False)])
    for text in (b'"0001-01-01T00:00:00+01:00"', b'"9999-12-31T23:59:59-01:00"'):
        check_values([b'{"ts": "2024-05-01T10:00:00Z"}', b'{"ts": ' + text + b"}"], policy)
        table, dead = decode_batch(raw([b'{"ts": ' + text + b"}"]), policy)
        assert [d.reason for d in dead] == ["type-mismatch"] and "outside years 1-9999" in dead[0].detail
    table, dead = decode_batch(raw([b'{"ts": "0001-01-01T01:00:00+01:00"}']), policy)
    assert dead == [] and table.column("ts").to_pylist() == [dt.datetime(1, 1, 1, tzinfo=dt.timezone.utc)]


def test_found_an_undeclared_field_named_like_a_kafka_column_is_not_a_second_column() -> None:
    """Under evolution=compatible `{"_kafka_offset": -1}` became a second `_kafka_offset` column (the sinks' ledgers
    read that name; the chunked path raised on it, failing the batch). It is not stored now."""
    policy = policy_of([("id", "long", False)], "compatible")
    values = [b'{"id": 1, "_kafka_offset": -1, "_kafka_topic": "x", "x": 2}', b'{"id": 2, "_kafka_offset": "s"}']
    check_values(values, policy)
    table, dead = decode_batch(raw(values), policy)
    assert dead == [] and table.column_names == ["id", "x", "_kafka_topic", "_kafka_partition", "_kafka_offset",
                                                 "_kafka_timestamp"]
    assert table.column("_kafka_offset").to_pylist() == [100, 101]


def test_found_a_big_batch_spells_a_mixed_field_as_json_text_in_every_chunk() -> None:
    """A big batch decodes chunk by chunk. A field holding an object in one chunk's kept records (JSON text) and
    plain strings in another's gave `"s"` as JSON text in one chunk and `s` in the other, where the reference (the
    whole batch) spells all as JSON text. Now the chunked path sees it and decodes the batch whole."""
    policy = policy_of([("id", "long", False)], "compatible")
    values = [b'{"id": 1, "x": {"a": 1}}', b'garbage', b'{"id": 3, "x": "s"}', b'{"id": 4, "x": "t"}']
    check_values(values, policy)  # with chunks of 25, 7 and 40 rows (the fuzzer's)
    fuzz.check(fuzz.Case(policy, values, chunk_rows=2))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decode, "CHUNK_ROWS", 2)
        table, _ = decode._chunked(raw(values), policy)
    assert table.column("x").to_pylist() == ['{"a":1}', '"s"', '"t"']


def test_found_extra_columns_are_ordered_by_the_first_record_with_a_value() -> None:
    """pyarrow's reader orders inferred columns by the first record naming the field, even as null; the reference
    by the first record with a value, then that record's key order. `{"b": null}` then `{"a": 1, "b": 2}` gave
    b, a against the reference's a, b. pyarrow's tier now puts them in the reference's order."""
    policy = policy_of([("id", "long", False)], "compatible")
    values = [b'{"id": 1, "b": null}', b'{"id": 2, "a": 1, "b": 2}', b'{"id": 3, "c": true}']
    check_values(values, policy)
    assert decode._arrow_parse(raw(values).column("value"), policy) is not None
    assert decode_batch(raw(values), policy)[0].column_names[:4] == ["id", "a", "b", "c"]


def test_found_by_ubsan_huge_rows_and_kinds_are_refused_not_wrapped() -> None:
    """`_json_arrow` checked its arguments with (first + n + 1) * 4, which overflowed for a huge first or n (signed
    overflow, UB: the optimized build wrapped it past the check and read far out of the buffer), and took a column
    kind through (int), so 2**40 became 0, long. Both are refused now (test_c_sanitizers.py runs these too)."""
    from handoff_spark.decode import _json_arrow

    offsets, data = pa.py_buffer(pa.array([0, 9, 18], pa.int32()).buffers()[1]), b'{"id": 1}{"id": 2}'
    for first, rows in ((2 ** 62, 2 ** 62), (2 ** 63 - 1, 1), (1, 2 ** 63 - 2), (0, 3)):
        with pytest.raises(ValueError, match="out of range"):
            _json_arrow.decode(offsets, data, first, rows, (b"id",), (_json_arrow.LONG,), True, 64)
        with pytest.raises(ValueError, match="out of range"):
            _json_arrow.one_object_each(offsets, data, first, rows, 64)
    with pytest.raises(ValueError, match="unknown column kind"):
        _json_arrow.decode(offsets, data, 0, 2, (b"id",), (2 ** 40,), True, 64)
    assert _json_arrow.decode(offsets, data, 0, 2, (b"id",), (_json_arrow.LONG,), True, 64) is not None


def test_found_by_the_long_run_a_number_past_a_double_in_a_mixed_field_is_a_dead_letter_too() -> None:
    """An undeclared field holding 1.7976931348623159e308 (a double's infinity): alone in its column the record was
    an unconvertible dead letter, but beside a string in the same field the column became JSON text and the record a
    row holding `Infinity` (not JSON). So the chunked path (the chunk without the string) and the reference (the
    whole batch) disagreed. The record is a dead letter either way now, and so is `[1e400]`."""
    policy = policy_of([("f", "long", False)], "compatible")
    values = [b'{"f": 1, "ID": ""}', b'{"f": 2, "ID": 1.7976931348623159e308}', b'{"f": 3, "ID": [1e400]}',
              b'{"f": 4, "ID": 5}']
    check_values(values, policy)
    fuzz.check(fuzz.Case(policy, values, chunk_rows=1))
    table, dead = decode_batch(raw(values), policy)
    assert [(d.index, d.reason) for d in dead] == [(1, "unconvertible"), (2, "unconvertible")]
    assert table.column("ID").to_pylist() == ['""', "5"]
