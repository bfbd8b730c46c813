"""Kafka records (raw Arrow from `handoff-kafka`) → rows of the declared schema, plus dead letters.

Why here and not in each sink: every sink must agree on what a valid record is, and "nothing dropped
silently" is easiest to guarantee in one place. Rules (docs/design/data-plane-contract.md, "Decoding"):

* `json` format: each value must be one UTF-8 JSON object. Declared columns are typed strictly — no
  string→number coercion, no float→int truncation, no silent narrowing. Accepted spellings: `timestamp`
  = ISO-8601 string (no zone ⇒ UTC) or integer epoch milliseconds; `date` = `YYYY-MM-DD`; `binary` =
  base64 string; `decimal(p,s)` = number or numeric string that fits; `float`/`double` accept integers.
* A bad record (null value/tombstone, unparseable, not an object, required column missing/null, type
  mismatch, over `schema.limits`: nested deeper than `maxDepth` or a value larger than `maxValueBytes`, a value
  Arrow refuses, or anything else that fails while decoding that one record) becomes a dead letter under
  `onIncompatible=deadLetter`, or raises `SchemaIncompatible` naming the column, topic/partition/offset and the
  fix under `halt`. One rule: whatever a single record does, it never fails the batch (docs/design/
  data-plane-contract.md, "One bad record").
* Fields not declared: with `evolution=compatible` they become extra columns of the decoded table (JSON
  types: boolean, long, double, string; nested objects/arrays as their JSON text; a field mixing types
  becomes a JSON-text string column) so the sink can add them as optional table columns; fields that
  are null in every record of the batch are left out until a typed value appears, and so is a field named like one
  of the `_kafka_*` columns. With `evolution=none`
  they are ignored (the table keeps the declared schema; the record itself is kept) — producers adding
  fields ahead of the table is normal forward-compatible evolution, not an error.
* `raw` format: `key`/`value` as binary columns, never a dead letter.

Speed: a JSON batch first goes through `_json_arrow` (C), which parses flat objects straight from the values'
buffers into Arrow columns (declared long/double/boolean/string/timestamp/date columns, and decimals as their text;
it declines anything else, and declines rather than differ); then through `pyarrow.json.read_json` over the
newline-joined values (C++; decimal columns still from `_json_arrow`'s text, never pyarrow's decimal conversion), but
only when every value is exactly one JSON object, since newline framing could otherwise put one record's fields in
another's row; only a batch in which both fail (some bad record, pretty-printed JSON, …) is decoded record by
record in Python, which also pinpoints the bad records.
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime as dt
import decimal
import json
import math
import re
import sys
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from handoff_spark.contract import (KAFKA_METADATA_COLUMNS, KAFKA_OFFSET, KAFKA_PARTITION, KAFKA_TIMESTAMP,
                                    KAFKA_TOPIC)
from handoff_spark.decode import _json_arrow
from handoff_spark.decode.column_types import ColumnType, ListOf, MapOf, Primitive, Struct, is_nested, parse_type
from handoff_spark.config import DEFAULT_MAX_DEPTH, Column, SchemaPolicy

KAFKA_COLUMNS = KAFKA_METADATA_COLUMNS
_KAFKA_SOURCE = {KAFKA_TOPIC: "topic", KAFKA_PARTITION: "partition", KAFKA_OFFSET: "offset",
                 KAFKA_TIMESTAMP: "timestamp"}

Reason = Literal["null-value", "unparseable", "not-an-object", "missing-required", "type-mismatch", "too-large",
                 "too-deep", "unconvertible", "record-error", "late", "transform-error"]
_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")
_INT32 = (-(2 ** 31), 2 ** 31 - 1)
_INT64 = (-(2 ** 63), 2 ** 63 - 1)
_FLOAT32_MAX = 3.4028234663852886e38
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


@dataclass(frozen=True)
class DeadLetter:
    """One record that did not make it into the table. `index` is its row in the raw batch."""

    index: int
    topic: str
    partition: int
    offset: int
    reason: Reason
    detail: str


class SchemaIncompatible(RuntimeError):
    """A record does not fit the declared schema and the policy is `halt`."""


def arrow_type(column_type: str | ColumnType) -> pa.DataType:
    """Declared column type → the Arrow type decoding produces (every sink maps from it)."""
    t = parse_type(column_type) if isinstance(column_type, str) else column_type
    if isinstance(t, Struct):
        return pa.struct([pa.field(f.name, arrow_type(f.type)) for f in t.fields])
    if isinstance(t, ListOf):
        return pa.list_(arrow_type(t.element))
    if isinstance(t, MapOf):
        return pa.map_(arrow_type(t.key), arrow_type(t.value))
    if t.name == "decimal":
        return (pa.decimal128 if t.precision <= 38 else pa.decimal256)(t.precision, t.scale)
    if t.name == "fixed":
        return pa.binary(t.length)
    return _ARROW_PRIMITIVES[t.name]


_ARROW_PRIMITIVES: dict[str, pa.DataType] = {
    "string": pa.string(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(), "double": pa.float64(),
    "boolean": pa.bool_(), "timestamp": pa.timestamp("us", tz="UTC"), "timestamptz": pa.timestamp("us", tz="UTC"),
    "date": pa.date32(), "time": pa.time64("us"), "uuid": pa.binary(16), "binary": pa.binary()}

_TIMESTAMPS = ("timestamp", "timestamptz")
#: Types `pyarrow.json` parses with the same strictness as the per-record converters (the fast path's domain).
_FAST_TYPES = ("string", "int", "long", "float", "double", "boolean", "timestamp", "timestamptz", "date", "decimal")


def declared_arrow_schema(policy: SchemaPolicy) -> pa.Schema:
    """Declared columns (required ones non-nullable, as Iceberg wants for required fields)."""
    return pa.schema([pa.field(c.name, arrow_type(c.type), nullable=not c.required) for c in policy.columns])


# ------------------------------------------------------------------------------------------------
# Per-value converters (the slow path; also the reference semantics the fast path must match)
# ------------------------------------------------------------------------------------------------
class _Mismatch(Exception):
    pass


class _JsonNumber(float):
    """A JSON number with a fraction or an exponent, as a float that keeps its spelling: a decimal column takes the
    number exactly as written (`0.1234567890123456789`), never the nearest double's digits (`…68`), which silently
    changed the value (the pyarrow tier reads it exactly). Only the decoder of a policy with a decimal column makes
    them."""

    __slots__ = ("text",)
    text: str

    def __new__(cls, text: str) -> _JsonNumber:
        number = super().__new__(cls, text)
        number.text = text
        return number


def _kind(v: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", _JsonNumber: "number", str: "string", dict: "object",
            list: "array"}.get(type(v), type(v).__name__)


def value_converter(column_type: str | ColumnType) -> Callable[[Any], Any]:
    """The per-record converter of a declared column type (a decoded value → the column's Python value; a value
    that does not fit raises). Public: the Schema Registry decoder (`registry`) converts with the same rules."""
    t = parse_type(column_type) if isinstance(column_type, str) else column_type
    if is_nested(t):
        return _nested_converter(t)
    column_type = str(t)
    def expect(ok: bool, v: Any, what: str) -> None:
        if not ok:
            raise _Mismatch(f"expected {what}, got {_kind(v)} {json.dumps(v)[:60]}")

    if column_type == "string":
        def conv(v: Any) -> Any:
            expect(isinstance(v, str), v, "string")
            return v
    elif column_type in ("int", "long"):
        lo, hi = _INT32 if column_type == "int" else _INT64

        def conv(v: Any) -> Any:
            expect(isinstance(v, int) and not isinstance(v, bool), v, f"integer ({column_type})")
            if not lo <= v <= hi:
                raise _Mismatch(f"{v} does not fit {column_type}")
            return v
    elif column_type in ("float", "double"):
        top = _FLOAT32_MAX if column_type == "float" else sys.float_info.max

        def conv(v: Any) -> Any:
            expect(isinstance(v, (int, float)) and not isinstance(v, bool), v, "number")
            try:
                out = float(v)
            except OverflowError:
                out = math.inf
            if not -top <= out <= top:  # also NaN
                raise _Mismatch(f"{str(v)[:60]} is out of range for {column_type}")
            return out
    elif column_type == "boolean":
        def conv(v: Any) -> Any:
            expect(isinstance(v, bool), v, "boolean")
            return v
    elif column_type in ("timestamp", "timestamptz"):
        def conv(v: Any) -> Any:
            if isinstance(v, int) and not isinstance(v, bool):
                try:
                    return _EPOCH + dt.timedelta(milliseconds=v)
                except OverflowError:
                    raise _Mismatch(f"{str(v)[:60]} epoch milliseconds is out of range (years 1-9999)") from None
            expect(isinstance(v, str), v, "ISO-8601 timestamp string or epoch milliseconds")
            try:
                ts = dt.datetime.fromisoformat(v)
            except ValueError:
                raise _Mismatch(f"not an ISO-8601 timestamp: {v[:60]!r}") from None
            if not ts.tzinfo:
                return ts.replace(tzinfo=dt.timezone.utc)
            try:  # a zone can move the instant out of years 1-9999 (0001-01-01T00:00+01:00), where no reader goes
                ts.astimezone(dt.timezone.utc)
            except OverflowError:
                raise _Mismatch(f"{v[:60]!r} is outside years 1-9999 in UTC") from None
            return ts
    elif column_type == "date":
        def conv(v: Any) -> Any:
            expect(isinstance(v, str), v, "date string YYYY-MM-DD")
            try:
                return dt.date.fromisoformat(v)
            except ValueError:
                raise _Mismatch(f"not a date: {v[:60]!r}") from None
    elif column_type == "time":
        def conv(v: Any) -> Any:
            expect(isinstance(v, str), v, "time string HH:MM:SS[.ffffff]")
            try:
                parsed = dt.time.fromisoformat(v)
            except ValueError:
                raise _Mismatch(f"not a time: {v[:60]!r}") from None
            if parsed.tzinfo is not None:
                raise _Mismatch(f"a time of day has no zone: {v[:60]!r}")
            return parsed
    elif column_type == "uuid":
        def conv(v: Any) -> Any:
            expect(isinstance(v, str), v, "UUID string")
            try:
                return uuid.UUID(v).bytes
            except ValueError:
                raise _Mismatch(f"not a UUID: {v[:60]!r}") from None
    elif column_type == "binary" or isinstance(t, Primitive) and t.name == "fixed":
        length = t.length if t.name == "fixed" else None

        def conv(v: Any) -> Any:
            expect(isinstance(v, str), v, "base64 string")
            try:
                out = base64.b64decode(v, validate=True)
            except (binascii.Error, ValueError):
                raise _Mismatch("not valid base64") from None
            if length is not None and len(out) != length:
                raise _Mismatch(f"{len(out)} bytes, {column_type} holds exactly {length}")
            return out
    else:
        m = _DECIMAL.match(column_type)
        if not m:
            raise ValueError(f"unsupported column type {column_type!r}")
        precision, scale = int(m.group(1)), int(m.group(2))
        quantum = decimal.Decimal(1).scaleb(-scale)
        # Quantizing in the default context (28 digits) raised InvalidOperation for any value of more digits, so a
        # valid decimal(38,10) value was a dead letter; in a context of the column's precision it is exactly the
        # values that do not fit that raise.
        context = decimal.Context(prec=precision)

        def conv(v: Any) -> Any:
            expect(isinstance(v, (int, float, str)) and not isinstance(v, bool), v, f"number ({column_type})")
            try:
                d = decimal.Decimal(v.text if isinstance(v, _JsonNumber) else str(v))
            except decimal.InvalidOperation:
                raise _Mismatch(f"not a decimal: {str(v)[:60]!r}") from None
            if not d.is_finite():
                raise _Mismatch(f"{v} is not finite")
            try:
                q = d.quantize(quantum, context=context)
            except decimal.InvalidOperation:
                raise _Mismatch(f"{str(v)[:60]} does not fit {column_type}") from None
            if q != d:
                raise _Mismatch(f"{v} has more than {scale} decimal places (would be rounded)")
            if len(q.as_tuple().digits) > precision and q != 0:
                raise _Mismatch(f"{v} does not fit {column_type}")
            return q
    return conv


def _nested_converter(t: ColumnType) -> Callable[[Any], Any]:
    """struct ← JSON object (fields by name, each optional, undeclared keys ignored), list ← JSON array, map ←
    JSON object (any keys). Nulls inside are kept as nulls; a bad value anywhere names its path."""
    if isinstance(t, Struct):
        fields = [(f.name, value_converter(f.type)) for f in t.fields]

        def conv(v: Any) -> Any:
            if not isinstance(v, dict):
                raise _Mismatch(f"expected object, got {_kind(v)} {json.dumps(v)[:60]}")
            out = {}
            for name, sub in fields:
                x = v.get(name)
                out[name] = None if x is None else _at(name, sub, x)
            return out
    elif isinstance(t, ListOf):
        element = value_converter(t.element)

        def conv(v: Any) -> Any:
            if not isinstance(v, list):
                raise _Mismatch(f"expected array, got {_kind(v)} {json.dumps(v)[:60]}")
            return [None if x is None else _at(f"[{i}]", element, x) for i, x in enumerate(v)]
    else:
        assert isinstance(t, MapOf)
        value = value_converter(t.value)

        def conv(v: Any) -> Any:
            if not isinstance(v, dict):
                raise _Mismatch(f"expected object (map), got {_kind(v)} {json.dumps(v)[:60]}")
            return [(k, None if x is None else _at(f"[{k!r}]", value, x)) for k, x in v.items()]
    return conv


def _at(where: str, conv: Callable[[Any], Any], v: Any) -> Any:
    """Run a nested converter; a mismatch names the path inside the column (`address.zip: expected …`)."""
    try:
        return conv(v)
    except _Mismatch as exc:
        raise _Mismatch(f"{where}: {exc}") from None


# ------------------------------------------------------------------------------------------------
# Decoding
# ------------------------------------------------------------------------------------------------
def _as_table(raw: pa.Table | pa.RecordBatch) -> pa.Table:
    return pa.Table.from_batches([raw]) if isinstance(raw, pa.RecordBatch) else raw


def _kafka_columns(raw: pa.Table, keep: pa.Array | None) -> dict[str, pa.ChunkedArray | pa.Array]:
    cols = {}
    for name, src in _KAFKA_SOURCE.items():
        col = raw.column(src)
        cols[name] = col if keep is None else col.take(keep)
    return cols


def decode_batch(raw: pa.Table | pa.RecordBatch, policy: SchemaPolicy,
                 fmt: Literal["json", "raw"] = "json") -> tuple[pa.Table, list[DeadLetter]]:
    """Decode one raw batch. Returns (table, dead letters); raises `SchemaIncompatible` under `halt`.

    The table has the declared columns (declared order), then discovered extra columns
    (`evolution=compatible` only), then `_kafka_topic`, `_kafka_partition`, `_kafka_offset`,
    `_kafka_timestamp`.
    """
    table = _as_table(raw)
    if fmt == "raw":
        cols = {"key": table.column("key"), "value": table.column("value"), **_kafka_columns(table, None)}
        return pa.table(cols), []
    if fmt != "json":
        raise ValueError(f"unknown format {fmt!r}")
    if table.num_rows == 0:
        return _empty(policy, table), []
    decoded = _fast_path(table, policy)
    if decoded is not None:
        dead: list[DeadLetter] = []
    elif table.num_rows > 2 * CHUNK_ROWS:
        decoded, dead = _chunked(table, policy)
    else:
        decoded, dead = _slow_path(table, policy)
    if dead and policy.on_incompatible == "halt":
        first = dead[0]
        column = f" column {first.detail.split(':', 1)[0]!r}" if first.reason in ("missing-required",
                                                                                  "type-mismatch") else ""
        raise SchemaIncompatible(
            f"record {first.topic}[{first.partition}]@{first.offset} does not fit the declared schema{column}: "
            f"{first.reason}: {first.detail} ({len(dead)} such record(s) in this batch). "
            f"schema.onIncompatible=halt stops the hand-off instead of skipping it. Fix: correct the producer "
            f"(or the declared type in spec.schema.columns), or set spec.schema.onIncompatible=deadLetter with "
            f"spec.deadLetter.topic to divert such records.")
    return decoded, dead


CHUNK_ROWS = 2048


def _chunked(raw: pa.Table, policy: SchemaPolicy) -> tuple[pa.Table, list[DeadLetter]]:
    """A big batch with a few bad records: fast path per chunk, per-record path only for failing chunks.
    Same result as `_slow_path` on the whole batch; if chunks disagree on a discovered column's type, the
    whole batch takes the per-record path (which resolves the type across all records)."""
    parts: list[pa.Table] = []
    dead: list[DeadLetter] = []
    slow: dict[int, tuple[pa.Table, list[DeadLetter]]] = {}  # part → its chunk and dead letters (per-record path)
    for start in range(0, raw.num_rows, CHUNK_ROWS):
        chunk = raw.slice(start, CHUNK_ROWS)
        decoded = _fast_path(chunk, policy)
        if decoded is None:
            decoded, chunk_dead = _slow_path(chunk, policy)
            dead += [dataclasses.replace(d, index=d.index + start) for d in chunk_dead]
            slow[len(parts)] = (chunk, chunk_dead)
        parts.append(decoded)
    declared = {c.name for c in policy.columns}
    extras: dict[str, pa.DataType] = {}
    in_parts: dict[str, list[int]] = {}
    for n, part in enumerate(parts):
        for f in part.schema:
            if f.name in declared or f.name in KAFKA_COLUMNS:
                continue
            if extras.setdefault(f.name, f.type) != f.type:
                return _slow_path(raw, policy)
            in_parts.setdefault(f.name, []).append(n)
    # A string column is the strings themselves, or JSON text where the field mixed types (or nested) in the
    # records decoded together; the whole batch spells all its values as JSON text if any part did.
    shared = {name for name, ns in in_parts.items() if len(ns) > 1 and extras[name] == pa.string()}
    if shared and any(n in slow for name in shared for n in in_parts[name]):
        texty = {n: _json_text_fields(*slow[n], policy, {name for name in shared if n in in_parts[name]})
                 for n in slow}
        if any(len({name in texty.get(n, ()) for n in in_parts[name]}) > 1 for name in shared):
            return _slow_path(raw, policy)
    schema_fields = [f for f in parts[0].schema if f.name in declared]
    schema_fields += [pa.field(n, t) for n, t in extras.items()]
    schema_fields += [parts[0].schema.field(n) for n in KAFKA_COLUMNS]
    schema = pa.schema(schema_fields)
    aligned = [pa.Table.from_arrays([p.column(f.name) if f.name in p.column_names else pa.nulls(p.num_rows, f.type)
                                     for f in schema], schema=schema) for p in parts]
    return pa.concat_tables(aligned), dead


def _json_text_fields(chunk: pa.Table, chunk_dead: list[DeadLetter], policy: SchemaPolicy,
                      names: set[str]) -> set[str]:
    """Which of `names` (string extra columns `_slow_path` made for the chunk) hold JSON text: some record it kept
    has a value of another type there (`_extra_array`)."""
    gone = {d.index for d in chunk_dead}
    decoder = _json_decoder(policy)
    texty: set[str] = set()
    for i, v in enumerate(chunk.column("value").to_pylist()):
        if i in gone or texty == names:
            continue
        doc, _, _ = _parse_record(v, policy, decoder)
        if doc is not None:
            texty.update(name for name in names if not isinstance(doc.get(name, ""), (str, type(None))))
    return texty


def _empty(policy: SchemaPolicy, raw: pa.Table) -> pa.Table:
    schema = declared_arrow_schema(policy)
    cols = {f.name: pa.array([], f.type) for f in schema}
    cols.update({name: raw.column(src) for name, src in _KAFKA_SOURCE.items()})
    return pa.table(cols)


def assemble_table(columns: dict[str, pa.Array], policy: SchemaPolicy, extras: dict[str, pa.Array],
                   raw: pa.Table, keep: pa.Array | None) -> pa.Table:
    """The decoded table: declared columns, extra columns, then the Kafka columns. An undeclared field named like
    a Kafka column (`_kafka_offset`, …) is not stored: those names are each row's coordinates, which the sinks'
    ledgers read by name, and a second column of the name made the table ambiguous (the chunked path failed the
    whole batch on it). Public: the Schema Registry decoder (`registry`) assembles its tables the same way."""
    schema = declared_arrow_schema(policy)
    arrays: list[Any] = []
    fields: list[pa.Field] = []
    for f in schema:
        arrays.append(columns[f.name])
        fields.append(f)
    for name, arr in extras.items():
        if name in _KAFKA_SOURCE:
            continue
        arrays.append(arr)
        fields.append(pa.field(name, arr.type))
    for name, col in _kafka_columns(raw, keep).items():
        arrays.append(col)
        fields.append(pa.field(name, col.type, nullable=name != KAFKA_TIMESTAMP))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


_FAST_EXTRA_TYPES = (pa.bool_(), pa.int64(), pa.float64(), pa.string())


def _newline_joined(values: pa.ChunkedArray | pa.Array) -> pa.Buffer:
    """The values joined by newlines, in Arrow: the JSON reader's input without turning every value into a
    Python bytes object first (`to_pylist` + `join` cost ~9× more)."""
    arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    one_list = pa.ListArray.from_arrays(pa.array([0, len(arr)], pa.int32()), arr)
    return pc.binary_join(one_list, pa.scalar(b"\n", arr.type))[0].as_buffer()


def _fast_path(raw: pa.Table, policy: SchemaPolicy) -> pa.Table | None:
    """The whole batch in C: first `_json_arrow` straight from the values' buffers, then pyarrow's JSON reader,
    which takes more (evolution's extra columns, epoch-millisecond timestamps, decimals); None when any record
    needs the per-record path."""
    values = raw.column("value")
    if values.null_count:
        return None
    if any(not isinstance(t, Primitive) or t.name not in _FAST_TYPES for t in (parse_type(c.type) for c in policy.columns)):
        return None  # base64/UUID/time decoding and nested values go value by value
    try:
        shortest, longest = pc.min_max(pc.binary_length(values)).values()
        if shortest.as_py() == 0 or longest.as_py() > policy.limits.max_value_bytes:
            return None
    except pa.ArrowNotImplementedError:
        return None
    parsed = _native_parse(values, policy)
    decoded = None if parsed is None else _finish(parsed, raw, policy)
    if decoded is not None:
        return decoded
    if parsed is None and not _one_object_each(values, policy.limits.max_depth):
        return None  # newline framing could shift one record's fields into another's row
    parsed = _arrow_parse(values, policy)
    return None if parsed is None else _finish(parsed, raw, policy)


#: Declared types `_json_arrow` reads, as the JSON type it takes: timestamps and dates as their text, converted
#: by `_finish` exactly as pyarrow's JSON reader does.
_NATIVE_KINDS = {"long": _json_arrow.LONG, "double": _json_arrow.DOUBLE, "boolean": _json_arrow.BOOL,
                 "string": _json_arrow.STRING, "timestamp": _json_arrow.STRING, "timestamptz": _json_arrow.STRING,
                 "date": _json_arrow.STRING}
_NATIVE_TYPES = {_json_arrow.LONG: pa.int64(), _json_arrow.DOUBLE: pa.float64(), _json_arrow.BOOL: pa.bool_(),
                 _json_arrow.STRING: pa.string(), _json_arrow.TEXT: pa.string()}


def _binary_chunks(values: pa.ChunkedArray | pa.Array) -> list[pa.Array] | None:
    """The values' non-empty chunks when they are binary or string (32-bit offsets, what `_json_arrow` reads);
    else None."""
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    if not all(c.type in (pa.binary(), pa.string()) for c in chunks):
        return None
    return [c for c in chunks if len(c)]


def _one_object_each(values: pa.ChunkedArray | pa.Array, max_depth: int = DEFAULT_MAX_DEPTH) -> bool:
    """Whether every value is exactly one well-formed JSON object nested no deeper than `max_depth`
    (`_json_arrow.one_object_each`)."""
    chunks = _binary_chunks(values)
    if chunks is None:
        return False
    for chunk in chunks:
        _, offsets, data = chunk.buffers()
        if not _json_arrow.one_object_each(offsets, data or b"", chunk.offset, len(chunk), max_depth):
            return False
    return True


def _native_parse(values: pa.ChunkedArray | pa.Array, policy: SchemaPolicy) -> pa.Table | None:
    """The declared columns parsed by `_json_arrow` from each chunk's own buffers (no joined copy); None when a
    column type or a value is outside what it takes. Undeclared fields: ignored under `evolution=none`; under
    `compatible` any makes it decline, as pyarrow's reader then finds the extra columns."""
    return _native_columns(values, policy.columns, policy.evolution != "compatible", policy.limits.max_depth)


def _native_columns(values: pa.ChunkedArray | pa.Array, declared: list[Column], ignore_unknown: bool,
                    max_depth: int) -> pa.Table | None:
    kinds = tuple(_json_arrow.TEXT if c.type.startswith("decimal(") else _NATIVE_KINDS.get(c.type, -1)
                  for c in declared)
    if -1 in kinds:
        return None
    names = tuple(c.name.encode() for c in declared)
    chunks = _binary_chunks(values)
    if chunks is None:
        return None
    columns: list[list[pa.Array]] = [[] for _ in kinds]
    for chunk in chunks:
        _, offsets, data = chunk.buffers()
        parts = _json_arrow.decode(offsets, data or b"", chunk.offset, len(chunk), names, kinds, ignore_unknown,
                                   max_depth)
        if parts is None:
            return None
        for out, kind, (valid, buf, text) in zip(columns, kinds, parts):
            buffers = [None if valid is None else pa.py_buffer(valid), pa.py_buffer(buf)]
            if text is not None:
                buffers.append(pa.py_buffer(text))
            out.append(pa.Array.from_buffers(_NATIVE_TYPES[kind], len(chunk), buffers))
    return pa.table({c.name: pa.chunked_array(parts, _NATIVE_TYPES[kind])
                     for c, kind, parts in zip(declared, kinds, columns)})


def _arrow_parse(values: pa.ChunkedArray | pa.Array, policy: SchemaPolicy) -> pa.Table | None:
    """pyarrow's JSON reader over the newline-joined values; None when it fails or the framing is not one value
    per line.

    Decimal columns never reach its decimal conversion (pyarrow 26.0.1), which crashes the process on
    `1e-2147483647` (SIGSEGV: one record would kill the executor on every retry), makes `1e-44` 0.00000 in a
    decimal(20,5) column, wraps integers past 128 bits into other values, and skips the precision check (`1` into
    decimal(3,3) was 1.000). `_json_arrow` reads them as their text instead (`_decimals_from_text` converts it), or
    the batch is the per-record path's."""
    decimals = [c for c in policy.columns if c.type.startswith("decimal(")]
    texts = _native_columns(values, decimals, True, policy.limits.max_depth) if decimals else None
    if decimals and texts is None:
        return None
    # Dates parse from strings after the fact (the JSON reader has no string→date32 conversion).
    # Timestamps: ISO-8601 strings first; a batch of epoch-millisecond integers gets a second try.
    has_ts = any(c.type in _TIMESTAMPS for c in policy.columns)
    blob = _newline_joined(values)
    # Exactly one newline between values and none inside them: pretty-printed JSON would break newline framing.
    # Counted in the joined buffer (memchr speed): `match_substring` over the values cost 5× more.
    if blob.to_pybytes().count(b"\n") != len(values) - 1:
        return None
    for ts_as_millis in ((False, True) if has_ts else (False,)):
        # `float` columns parse as doubles, range-checked and narrowed by `_finish_columns` as the per-record
        # converter does: the reader's own float32 parse rounds 3.4028235e38 to FLT_MAX, a value the converter
        # refuses, and rounds some literals directly where the converter rounds via the double.
        parse_schema = pa.schema([pa.field(c.name, pa.string() if c.type == "date" else
                                           pa.int64() if c.type in _TIMESTAMPS and ts_as_millis else
                                           pa.float64() if c.type == "float" else
                                           arrow_type(c.type)) for c in policy.columns if c not in decimals])
        try:
            parsed = pj.read_json(pa.BufferReader(blob),
                                  read_options=pj.ReadOptions(block_size=max(1 << 20, len(blob) + 1)),
                                  parse_options=pj.ParseOptions(
                                      explicit_schema=parse_schema,
                                      unexpected_field_behavior="infer" if policy.evolution == "compatible"
                                      else "ignore"))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
        if texts is not None:  # a decimal field it inferred (evolution=compatible) gives way to the text
            parsed = parsed.drop_columns([c.name for c in decimals if c.name in parsed.column_names])
            for c in decimals:
                parsed = parsed.append_column(c.name, texts.column(c.name))
        return parsed if parsed.num_rows == len(values) and not _negative_zero(parsed) else None
    return None


def _negative_zero(parsed: pa.Table) -> bool:
    """Whether a floating column holds -0.0. The reader reads the integer `-0` as -0.0, where JSON (and the
    per-record path) has the integer 0, so 0.0; a written `-0.0` is -0.0 in both. The two cannot be told apart
    after parsing, so a batch holding either is left to the per-record path (rare in data)."""
    for col in parsed.columns:
        if pa.types.is_floating(col.type) and \
                pc.any(pc.and_(pc.equal(col, 0), pc.less(pc.divide(1.0, col), 0))).as_py():
            return True
    return False


def _timestamps_from_text(arr: pa.ChunkedArray) -> pa.ChunkedArray | None:
    """ISO-8601 text → timestamp(us, UTC) as pyarrow's JSON reader converts it (no zone ⇒ UTC); None when any
    value does not parse (or the batch mixes zoned and unzoned values), which the JSON reader then decides."""
    target = arrow_type("timestamp")
    for via in (target, pa.timestamp("us")):
        try:
            return arr.cast(via).cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
    return None


def _finish(parsed: pa.Table, raw: pa.Table, policy: SchemaPolicy) -> pa.Table | None:
    """Parsed declared (and extra) columns → the decoded table; None when a required value is missing or a value
    does not convert, so that the per-record path finds and names the records."""
    try:
        return _finish_columns(parsed, raw, policy)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, OverflowError):
        return None  # e.g. epoch milliseconds beyond the microsecond range: the per-record path names the record


#: The instants and days every consumer of a row can hold (Python's datetime and date: years 1-9999); the
#: per-record converters refuse others, so the fast tiers leave a batch holding any to them.
_TS_RANGE = (pa.scalar(dt.datetime(1, 1, 1, tzinfo=dt.timezone.utc), pa.timestamp("us", tz="UTC")),
             pa.scalar(dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.timezone.utc),
                       pa.timestamp("us", tz="UTC")))
_DATE_RANGE = (pa.scalar(dt.date(1, 1, 1), pa.date32()), pa.scalar(dt.date(9999, 12, 31), pa.date32()))


def _within(arr: pa.ChunkedArray | pa.Array, bounds: tuple[pa.Scalar, pa.Scalar]) -> bool:
    low, high = pc.min_max(arr).values()
    return not low.is_valid or (pc.greater_equal(low, bounds[0]).as_py() and pc.less_equal(high, bounds[1]).as_py())


#: What a `float` column takes, as doubles (the per-record converter's range).
_FLOAT32_RANGE = (pa.scalar(-_FLOAT32_MAX, pa.float64()), pa.scalar(_FLOAT32_MAX, pa.float64()))


def _decimals_from_text(arr: pa.ChunkedArray | pa.Array, typ: pa.DataType) -> pa.ChunkedArray | pa.Array | None:
    """A decimal column's values as `_json_arrow` copied them (a number's spelling, a string's content) → decimals;
    None unless each is plainly within the type — an optional minus, integer digits without a leading zero that the
    precision holds, at most `scale` fraction digits — which the per-record converter takes as the same value.
    Exponents, whitespace, underscores and the rest are its to decide."""
    whole = typ.precision - typ.scale
    integer = "0" if whole == 0 else f"(0|[1-9][0-9]{{0,{whole - 1}}})"
    fraction = f"(\\.[0-9]{{1,{typ.scale}}})?" if typ.scale else ""
    if pc.all(pc.match_substring_regex(arr, f"^-?{integer}{fraction}$")).as_py() is False:
        return None
    return arr.cast(typ)


def _finish_columns(parsed: pa.Table, raw: pa.Table, policy: SchemaPolicy) -> pa.Table | None:
    declared = {c.name: c for c in policy.columns}
    columns: dict[str, Any] = {}
    for name, col in declared.items():
        arr = parsed.column(name)
        if col.required and arr.null_count:
            return None
        if col.type == "date":
            arr = arr.cast(pa.date32())
            if not _within(arr, _DATE_RANGE):
                return None
        elif col.type in _TIMESTAMPS and pa.types.is_integer(arr.type):
            arr = arr.cast(pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC"))
        elif col.type in _TIMESTAMPS and pa.types.is_string(arr.type):
            arr = _timestamps_from_text(arr)
            if arr is None:
                return None
        elif col.type in ("float", "double") and pc.all(pc.is_finite(arr)).as_py() is False:
            return None  # out of range (an overflowing literal): the per-record path names the record
        if col.type == "float" and arr.type == pa.float64():
            if not _within(arr, _FLOAT32_RANGE):
                return None
            arr = arr.cast(pa.float32())
        elif col.type.startswith("decimal(") and pa.types.is_string(arr.type):
            arr = _decimals_from_text(arr, arrow_type(col.type))
            if arr is None:
                return None
        if col.type in _TIMESTAMPS and not _within(arr, _TS_RANGE):
            return None
        columns[name] = arr
    extras: dict[str, Any] = {}
    for f in parsed.schema:
        if f.name in declared:
            continue
        if pa.types.is_null(f.type):
            continue
        if f.type not in _FAST_EXTRA_TYPES:
            return None  # nested or inferred timestamp: the slow path keeps JSON text / strings
        if f.type == pa.float64() and pc.all(pc.is_finite(parsed.column(f.name))).as_py() is False:
            return None  # a number beyond a double's range: the per-record path names the record
        extras[f.name] = parsed.column(f.name)
    ordered = _in_reference_order(extras, raw)
    return None if ordered is None else assemble_table(columns, policy, ordered, raw, None)


def _in_reference_order(extras: dict[str, Any], raw: pa.Table) -> dict[str, Any] | None:
    """Extra columns in the per-record path's order: by the first record holding a value for the field, then by
    that record's key order. pyarrow's reader orders them by the first record naming the field, a null too
    (`{"b": null}` then `{"a": 1, "b": 2}` gave b, a where the reference has a, b). The records several columns
    first have a value in are parsed for their key order; None when one does not parse as the reference would."""
    if len(extras) < 2:
        return extras
    first = {name: pc.index(pc.is_valid(col), True).as_py() for name, col in extras.items()}
    tied = {row for row in first.values() if list(first.values()).count(row) > 1}
    key_order: dict[int, dict[str, int]] = {}
    for row in tied:
        try:
            doc = _STRICT_JSON.decode(raw.column("value")[row].as_py().decode("utf-8"))
        except (ValueError, RecursionError):
            return None
        key_order[row] = {k: i for i, k in enumerate(doc)} if isinstance(doc, dict) else {}
    order = sorted(extras, key=lambda n: (first[n], key_order.get(first[n], {}).get(n, -1)))
    return {name: extras[name] for name in order}


#: A surrogate escape, paired or not; `json.loads` keeps an unpaired one in the str, and Arrow cannot encode it.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _utf8_text(doc: Any) -> bool:
    """Whether every string of a parsed document, field names included, encodes as UTF-8."""
    try:
        json.dumps(doc, ensure_ascii=False).encode()
        return True
    except UnicodeEncodeError:
        return False


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


#: RFC 8259 JSON: `json.loads` alone also takes NaN and Infinity, which neither C tier does.
_STRICT_JSON = json.JSONDecoder(parse_constant=_reject_constant)
#: The same, keeping each fractional number's spelling for decimal columns (`_JsonNumber`).
_STRICT_JSON_EXACT = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_JsonNumber)


def _depth(doc: Any) -> int:
    """Containers nested in one another (an object of scalars: 1), counted without recursion."""
    deepest = 0
    stack = [(doc, 1)]
    while stack:
        v, level = stack.pop()
        deepest = max(deepest, level)
        children = v.values() if isinstance(v, dict) else v
        stack.extend((c, level + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def _json_decoder(policy: SchemaPolicy) -> json.JSONDecoder:
    """The strict parser for a policy: the one that keeps numbers' spelling only where a decimal column needs it."""
    return _STRICT_JSON_EXACT if any("decimal" in c.type for c in policy.columns) else _STRICT_JSON


def _parse_record(v: bytes, policy: SchemaPolicy, decoder: json.JSONDecoder
                  ) -> tuple[dict[str, Any] | None, Reason, str]:
    """One value → its JSON object, or (None, reason, detail) saying why it is a dead letter. `decoder`:
    `_json_decoder(policy)`, chosen once per batch."""
    limits = policy.limits
    if len(v) > limits.max_value_bytes:
        return None, "too-large", (f"value is {len(v)} bytes, over schema.limits.maxValueBytes="
                                   f"{limits.max_value_bytes}")
    try:
        doc = decoder.decode(v.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return None, "unparseable", f"not JSON text (not UTF-8): {exc}"
    except RecursionError:
        return None, "too-deep", f"nested deeper than schema.limits.maxDepth={limits.max_depth}"
    except ValueError as exc:
        return None, "unparseable", f"not JSON: {exc}"
    if not isinstance(doc, dict):
        return None, "not-an-object", f"JSON {_kind(doc)}, expected an object"
    if _depth(doc) > limits.max_depth:
        return None, "too-deep", f"nested deeper than schema.limits.maxDepth={limits.max_depth}"
    if _SURROGATE_ESCAPE.search(v) and not _utf8_text(doc):
        return None, "unparseable", ("not JSON text: an unpaired UTF-16 surrogate escape (\\uD800-\\uDFFF), "
                                     "which no UTF-8 string can hold")
    return doc, "record-error", ""


def _slow_path(raw: pa.Table, policy: SchemaPolicy) -> tuple[pa.Table, list[DeadLetter]]:
    """Record by record: the reference semantics, and where each bad record is found and named. Whatever one
    record does here (an exception of any kind included) makes it a dead letter, never a failed batch."""
    values = raw.column("value").to_pylist()
    topics = raw.column("topic")
    partitions = raw.column("partition")
    offsets = raw.column("offset")
    converters = [(c, value_converter(c.type)) for c in policy.columns]
    decoder = _json_decoder(policy)
    declared = {c.name for c in policy.columns}
    compatible = policy.evolution == "compatible"
    rows: list[list[Any]] = []
    extras_of: list[dict[str, Any]] = []
    keep: list[int] = []
    dead: list[DeadLetter] = []

    def reject(i: int, reason: Reason, detail: str) -> None:
        dead.append(DeadLetter(i, topics[i].as_py(), partitions[i].as_py(), offsets[i].as_py(), reason, detail))

    for i, v in enumerate(values):
        if v is None:
            reject(i, "null-value", "record value is null (tombstone)")
            continue
        try:
            doc, reason, detail = _parse_record(v, policy, decoder)
            if doc is None:
                reject(i, reason, detail)
                continue
            row: list[Any] = []
            for col, conv in converters:
                x = doc.get(col.name)
                if x is None:
                    if col.required:
                        raise _Rejected("missing-required", f"{col.name}: required column is missing or null")
                    row.append(None)
                    continue
                try:
                    row.append(conv(x))
                except _Mismatch as exc:
                    raise _Rejected("type-mismatch", f"{col.name}: {exc}") from None
            extra = {k: x for k, x in doc.items() if k not in declared and x is not None} if compatible else {}
        except _Rejected as exc:
            reject(i, exc.reason, exc.detail)
            continue
        except Exception as exc:  # noqa: BLE001 - one rule: whatever one record does, it is that record's
            reject(i, "record-error", f"{type(exc).__name__}: {str(exc)[:300]}")
            continue
        keep.append(i)
        rows.append(row)
        extras_of.append(extra)
    while True:
        built = _build_columns(policy, rows, extras_of)
        if isinstance(built, tuple):
            columns, extras = built
            break
        for pos in sorted(built, reverse=True):  # rows Arrow refuses: dead letters, then the rest again
            reject(keep[pos], "unconvertible", built[pos])
            del keep[pos], rows[pos], extras_of[pos]
    dead.sort(key=lambda d: d.index)
    return assemble_table(columns, policy, extras, raw, pa.array(keep, pa.int64())), dead


class _Rejected(Exception):
    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def _build_columns(policy: SchemaPolicy, rows: list[list[Any]], extras_of: list[dict[str, Any]]
                   ) -> tuple[dict[str, pa.Array], dict[str, pa.Array]] | dict[int, str]:
    """The kept rows as Arrow columns; or, when Arrow refuses some values, {row position: why} for those rows."""
    columns: dict[str, pa.Array] = {}
    for j, c in enumerate(policy.columns):
        values = [r[j] for r in rows]
        arr = arrow_or_culprits(values, arrow_type(c.type), c.name)
        if isinstance(arr, dict):
            return arr
        columns[c.name] = arr
    extra_values: dict[str, dict[int, Any]] = {}
    for n, extra in enumerate(extras_of):
        for k, x in extra.items():
            extra_values.setdefault(k, {})[n] = x
    extras: dict[str, pa.Array] = {}
    for name, vals in extra_values.items():
        try:
            extras[name] = _extra_array(vals, len(rows))
        except Exception:  # noqa: BLE001 - find the rows whose value it is
            culprits = {}
            for n, x in vals.items():
                try:
                    _extra_array({0: x}, 1)
                except Exception as exc:  # noqa: BLE001
                    culprits[n] = f"{name}: {type(exc).__name__}: {str(exc)[:200]}"
            if not culprits:
                raise
            return culprits
    return columns, extras


def arrow_or_culprits(values: list[Any], typ: pa.DataType, name: str) -> pa.Array | dict[int, str]:
    """`pa.array(values, typ)`, or {position: why} for each value Arrow refuses on its own (one record's value
    must never fail a batch). Shared by every per-record decoder."""
    try:
        return pa.array(values, typ)
    except Exception:  # noqa: BLE001 - narrowed to the values below
        culprits: dict[int, str] = {}
        for n, x in enumerate(values):
            try:
                pa.array([x], typ)
            except Exception as exc:  # noqa: BLE001
                culprits[n] = f"{name}: Arrow cannot hold it as {typ}: {type(exc).__name__}: {str(exc)[:200]}"
        if not culprits:
            raise
        return culprits


def _finite(v: int | float) -> float:
    """A JSON number as a double; one beyond its range (1e400, a 400-digit integer) is refused, never infinity."""
    out = float(v)
    if not math.isfinite(out):
        raise OverflowError(f"{str(v)[:60]} is out of range for double")
    return out


def _extra_array(vals: dict[int, Any], n: int) -> pa.Array:
    """Typed column for an undeclared field: boolean/long/double/string, else JSON text."""
    kinds = {_kind(v) for v in vals.values()}
    dense: list[Any] = [None] * n
    if kinds == {"boolean"}:
        typ: pa.DataType = pa.bool_()
    elif kinds == {"integer"} and all(_INT64[0] <= v <= _INT64[1] for v in vals.values()):
        typ = pa.int64()
    elif kinds <= {"integer", "number"}:
        typ = pa.float64()
        vals = {i: _finite(v) for i, v in vals.items()}
    elif kinds == {"string"}:
        typ = pa.string()
    else:
        # JSON text, strictly: a number past a double's range (1e400) is refused here as in a numeric column, never
        # spelled `Infinity`; whether its record was a row must not depend on what other records put in the field.
        typ = pa.string()
        vals = {i: json.dumps(v, separators=(",", ":"), allow_nan=False) for i, v in vals.items()}
    for i, v in vals.items():
        dense[i] = v
    return pa.array(dense, typ)


def required_columns(policy: SchemaPolicy) -> list[Column]:
    return [c for c in policy.columns if c.required]
