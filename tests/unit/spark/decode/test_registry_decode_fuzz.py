"""Fuzzing the Schema Registry decoders (issue 33): Avro, Protobuf and JSON Schema values in the Confluent wire format,
valid and mutated byte by byte (payload and frame), never raise out of `decode_registry_batch`: each record is a row
or a dead letter with a reason, and the table reads back.

No registry is needed: `decode_registry_batch` takes the writer-schema cache as an argument, and the cache here holds
writer schemas built by registry_decode's own builders (`_WRITERS`) from the schema text a registry returns (Avro
and JSON Schema as JSON, Protobuf as the base64 FileDescriptorProto of `format=serialized`); only the HTTP fetch is
left out, which tests/integration/spark/decode/test_registry_decode.py covers against the test bed's registry."""
from __future__ import annotations

import base64
import datetime as dt
import decimal
import functools
import io
import json
import random
import struct
import uuid
from typing import Any, Callable

import pyarrow as pa
import pytest
from fastavro import parse_schema, schemaless_writer
from google.protobuf import descriptor_pb2, descriptor_pool, timestamp_pb2
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from decode_fuzz_support import EDGES, INTERESTING_BYTES, mutate
from handoff_spark.decode import registry_schema as rs
from handoff_spark.config import Column, SchemaPolicy, SchemaRegistry
from handoff_spark.decode.records import SchemaIncompatible
from handoff_spark.decode.registry import _WRITERS, UnknownSchema, WriterSchema, decode_registry_batch

BATCH = 40
EXAMPLES = 500  # per format: 20,000 values each


class Writers:
    """The writer-schema cache `decode_registry_batch` asks by id, holding writer schemas built from schema text."""

    def __init__(self, fmt: str, schemas: dict[int, str]) -> None:
        self.by_id: dict[int, WriterSchema] = {i: _WRITERS[fmt](i, text) for i, text in schemas.items()}

    def get(self, schema_id: int) -> WriterSchema:
        if schema_id not in self.by_id:
            raise UnknownSchema(f"schema id {schema_id} is not in the registry")
        return self.by_id[schema_id]


def frame(schema_id: int, payload: bytes, message_indexes: bytes = b"") -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + message_indexes + payload


def raw(values: list[bytes | None]) -> pa.Table:
    n = len(values)
    return pa.table({"key": pa.array([None] * n, pa.binary()), "value": pa.array(values, pa.binary()),
                     "topic": ["t"] * n, "partition": pa.array([0] * n, pa.int32()),
                     "offset": pa.array(range(n), pa.int64()),
                     "timestamp": pa.array([None] * n, pa.timestamp("us", tz="UTC"))})


# ------------------------------------------------------------------------------------------------- Avro
AVRO_V1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "name", "type": ["null", "string"], "default": None},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    {"name": "placed", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "at", "type": {"type": "int", "logicalType": "time-millis"}},
    {"name": "ok", "type": "boolean"},
    {"name": "ratio", "type": "float"},
    {"name": "score", "type": "double"},
    {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
    {"name": "hash", "type": {"type": "fixed", "name": "Hash", "size": 4}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "attrs", "type": {"type": "map", "values": "long"}},
    {"name": "address", "type": {"type": "record", "name": "Address", "fields": [
        {"name": "zip", "type": "string"}, {"name": "n", "type": "int"}]}},
    {"name": "either", "type": ["null", "long", "string"], "default": None}]}
AVRO_V2 = {**AVRO_V1, "fields": [*AVRO_V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}]}

def _text(r: random.Random) -> str:
    """Text of any code point but a surrogate (which no UTF-8 writer can write)."""
    return "".join(chr(r.choice((r.randint(0x20, 0x7E), r.randint(0, 0xD7FF), r.randint(0xE000, 0x10FFFF))))
                   for _ in range(r.choice((0, 1, 3, 6))))


def _int(r: random.Random, bits: int) -> int:
    return r.choice((r.randint(-1000, 1000), r.randint(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1),
                     -(2 ** (bits - 1)), 2 ** (bits - 1) - 1))


def _float(r: random.Random, fmt: str = "<d") -> float:
    x = struct.unpack(fmt, r.getrandbits(struct.calcsize(fmt) * 8).to_bytes(struct.calcsize(fmt), "little"))[0]
    return r.choice((x if x == x else 0.5, r.uniform(-1e6, 1e6), float("inf"), -0.0))


def _instant(r: random.Random, low: dt.datetime = dt.datetime(1970, 1, 2)) -> dt.datetime:
    span = int((dt.datetime(9999, 12, 30) - low).total_seconds())
    return (low + dt.timedelta(seconds=r.randrange(span), milliseconds=r.randrange(1000))).replace(
        tzinfo=dt.timezone.utc)


def avro_record(r: random.Random) -> dict[str, Any]:
    """A record of AVRO_V1 (and V2: its new field is optional), every field in its range."""
    return {"id": _int(r, 64), "name": r.choice((None, _text(r))),
            "amount": decimal.Decimal(r.randint(-999999999, 999999999)).scaleb(-2), "placed": _instant(r),
            "day": dt.date.fromordinal(r.randint(1, dt.date.max.toordinal())),
            "at": dt.time(r.randrange(24), r.randrange(60), r.randrange(60), r.randrange(1000) * 1000),
            "ok": r.random() < 0.5, "ratio": _float(r, "<f"), "score": _float(r),
            "ref": uuid.UUID(int=r.getrandbits(128)),
            "kind": r.choice("AB"), "hash": r.randbytes(4), "tags": [_text(r) for _ in range(r.randint(0, 3))],
            "attrs": {_text(r): _int(r, 64) for _ in range(r.randint(0, 2))},
            "address": {"zip": _text(r), "n": _int(r, 32)}, "either": r.choice((None, _int(r, 64), _text(r)))}


_AVRO_PARSED = {1: parse_schema(AVRO_V1), 2: parse_schema(AVRO_V2)}


def avro_value(schema_id: int, record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, _AVRO_PARSED[schema_id], record)
    return frame(schema_id, out.getvalue())


# --------------------------------------------------------------------------------------------- Protobuf
def _proto(syntax: str) -> tuple[str, Any]:
    """(the registry's schema text: a base64 FileDescriptorProto, the message class)."""
    T = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name=f"fuzz_{syntax}.proto", package=f"fuzz{syntax}", syntax=syntax,
                                             dependency=["google/protobuf/timestamp.proto"])
    msg = fdp.message_type.add(name="Order")
    line = fdp.message_type.add(name="Line")
    line.field.add(name="sku", number=1, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    line.field.add(name="qty", number=2, type=T.TYPE_INT32, label=T.LABEL_OPTIONAL)
    entry = msg.nested_type.add(name="StockEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=T.TYPE_INT64, label=T.LABEL_OPTIONAL)
    kind = fdp.enum_type.add(name="Kind")
    kind.value.add(name="K_UNSET", number=0)
    kind.value.add(name="K_A", number=1)
    for number, (name, typ, label, type_name) in enumerate([
            ("id", T.TYPE_INT64, T.LABEL_OPTIONAL, None), ("n", T.TYPE_INT32, T.LABEL_OPTIONAL, None),
            ("u", T.TYPE_UINT64, T.LABEL_OPTIONAL, None), ("name", T.TYPE_STRING, T.LABEL_OPTIONAL, None),
            ("blob", T.TYPE_BYTES, T.LABEL_OPTIONAL, None), ("score", T.TYPE_DOUBLE, T.LABEL_OPTIONAL, None),
            ("ratio", T.TYPE_FLOAT, T.LABEL_OPTIONAL, None), ("ok", T.TYPE_BOOL, T.LABEL_OPTIONAL, None),
            ("kind", T.TYPE_ENUM, T.LABEL_OPTIONAL, f".fuzz{syntax}.Kind"),
            ("xs", T.TYPE_SINT64, T.LABEL_REPEATED, None),
            ("stock", T.TYPE_MESSAGE, T.LABEL_REPEATED, f".fuzz{syntax}.Order.StockEntry"),
            ("main", T.TYPE_MESSAGE, T.LABEL_OPTIONAL, f".fuzz{syntax}.Line"),
            ("lines", T.TYPE_MESSAGE, T.LABEL_REPEATED, f".fuzz{syntax}.Line"),
            ("at", T.TYPE_MESSAGE, T.LABEL_OPTIONAL, ".google.protobuf.Timestamp")], start=1):
        f = msg.field.add(name=name, number=number, type=typ, label=label)
        if type_name:
            f.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.AddSerializedFile(fdp.SerializeToString())
    return (base64.standard_b64encode(fdp.SerializeToString()).decode(),
            GetMessageClass(pool.FindMessageTypeByName(f"fuzz{syntax}.Order")))


PROTO3, PROTO3_CLASS = _proto("proto3")
PROTO2, PROTO2_CLASS = _proto("proto2")
def proto_message(r: random.Random) -> dict[str, Any]:
    """A message of the Order type, every field in its range (uint64 within int64: see the named test below)."""
    def line() -> dict[str, Any]:
        return {"sku": _text(r), "qty": _int(r, 32)}

    return {"id": _int(r, 64), "n": _int(r, 32), "u": r.randint(0, 2 ** 63 - 1), "name": _text(r),
            "blob": r.randbytes(r.randint(0, 6)), "score": _float(r), "ratio": _float(r, "<f"),
            "ok": r.random() < 0.5, "kind": r.choice((0, 1)), "xs": [_int(r, 64) for _ in range(r.randint(0, 3))],
            "stock": {_text(r): _int(r, 64) for _ in range(r.randint(0, 2))}, "main": line(),
            "lines": [line() for _ in range(r.randint(0, 2))], "at": _instant(r, dt.datetime(1, 1, 2))}


def proto_value(schema_id: int, message: dict[str, Any]) -> bytes:
    cls = PROTO2_CLASS if schema_id == 2 else PROTO3_CLASS
    return frame(schema_id, cls(**message).SerializeToString(), b"\x00")


# ------------------------------------------------------------------------------------------ JSON Schema
JSON_SCHEMA = {"type": "object", "properties": {
    "id": {"type": "integer"}, "name": {"type": ["string", "null"]}, "score": {"type": "number"},
    "ok": {"type": "boolean"}, "at": {"type": "string", "format": "date-time"},
    "day": {"type": "string", "format": "date"}, "ref": {"type": "string", "format": "uuid"},
    "tags": {"type": "array", "items": {"type": "string"}}, "any": {"type": "array"},
    "addr": {"type": "object", "properties": {"zip": {"type": "string"}, "n": {"type": "integer"}}},
    "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
    "either": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}, "required": ["id"]}
def json_doc(r: random.Random) -> dict[str, Any]:
    """A document JSON_SCHEMA validates, its optional properties present or not."""
    doc: dict[str, Any] = {"id": _int(r, 64)}
    optional: dict[str, Callable[[], Any]] = {
        "name": lambda: r.choice((None, _text(r))), "score": lambda: r.uniform(-1e9, 1e9), "ok": lambda: True,
        "at": lambda: _instant(r, dt.datetime(1, 1, 2)).isoformat(),
        "day": lambda: dt.date.fromordinal(r.randint(1, dt.date.max.toordinal())).isoformat(),
        "ref": lambda: str(uuid.UUID(int=r.getrandbits(128))), "tags": lambda: [_text(r)],
        "any": lambda: [None, 1, _text(r)][:r.randint(0, 3)], "addr": lambda: {"zip": _text(r), "n": _int(r, 64)},
        "counts": lambda: {_text(r): _int(r, 64)}, "either": lambda: r.choice((_text(r), _int(r, 64)))}
    for name, make in optional.items():
        if r.random() < 0.6:
            doc[name] = make()
    return doc


#: JSON text the writer's validator may take but the columns not (NaN, surrogates, huge numbers, deep nesting).
JSON_EDGES = st.sampled_from([b'{"id": NaN}', b'{"id": 1, "score": NaN}', b'{"id": 1, "score": Infinity}',
                              b'{"id": 1, "name": "\\ud800"}', b'{"id": 1, "tags": ["\\udc00"]}',
                              b'{"id": 1e400}', b'{"id": 1, "score": 1e400}', b'{"id": 9223372036854775808}',
                              b'{"id": 1, "counts": {"a": 9223372036854775808}}', b'{"id": 1, "at": "yesterday"}',
                              b'{"id": 1, "at": "0001-01-01T00:00:00+01:00"}', b'{"id": 1, "day": "2024-02-30"}',
                              b'{"id": 1, "ref": "not-a-uuid"}',
                              b'{"id": 1, "any": ' + b"[" * 5000 + b"]" * 5000 + b"}",
                              b'{"id": 1, "addr": ' + b'{"zip": ' * 600 + b'"1"' + b"}" * 600 + b"}",
                              b'{"id": 1, "either": 1.5}', b'{"id": 1}{"id": 2}', b"", b"\xff\xfe", b'"id"',
                              b'{"id": 1, "addr": {"n": 1e400}}', b'{"id": -0, "score": -0}',
                              *EDGES["number"][:12]])


def json_value(schema_id: int, doc: dict[str, Any]) -> bytes:
    return frame(schema_id, json.dumps(doc).encode())


# -------------------------------------------------------------------------------------------- the check
FORMATS: dict[str, tuple[dict[int, str], Callable[[random.Random], Any], Callable[[int, Any], bytes]]] = {
    "avro": ({1: json.dumps(AVRO_V1), 2: json.dumps(AVRO_V2)}, avro_record, avro_value),
    "protobuf": ({1: PROTO3, 2: PROTO2}, proto_message, proto_value),
    "jsonSchema": ({1: json.dumps(JSON_SCHEMA), 2: json.dumps({**JSON_SCHEMA, "required": []})}, json_doc,
                   json_value),
}


def policies(fmt: str) -> list[SchemaPolicy]:
    """The columns the driver derives from the writer schema (registry_columns), some required; both evolutions,
    halt, and a small value-size limit."""
    writers = Writers(fmt, FORMATS[fmt][0])
    fields = writers.get(1).fields
    columns = [Column(name=f.name, type=f.type, required=i % 5 == 0) for i, f in enumerate(fields)]
    return [SchemaPolicy(columns=columns, evolution="compatible"), SchemaPolicy(columns=columns[::2], evolution="none"),
            SchemaPolicy(columns=columns[:3], on_incompatible="halt"), SchemaPolicy.model_validate(
                {"columns": [c.model_dump() for c in columns[:4]], "limits": {"maxValueBytes": 60}})]


@functools.lru_cache(maxsize=None)
def _writers(fmt: str) -> Writers:
    return Writers(fmt, FORMATS[fmt][0])


def check_registry_batch(fmt: str, values: list[bytes | None], valid: set[int], policy: SchemaPolicy) -> None:
    """Never an exception but SchemaIncompatible under halt; every record a row or a dead letter, once; the table
    reads back; a value as its writer wrote it (unmutated, within the size limit) is a row."""
    writers: Any = _writers(fmt)
    registry = SchemaRegistry(url="http://registry.invalid")
    try:
        table, dead, _ = decode_registry_batch(raw(values), policy, fmt, registry, cache=writers)
    except SchemaIncompatible:
        assert policy.on_incompatible == "halt"
        deadletter = policy.model_copy(update={"on_incompatible": "deadLetter"})
        table, dead, _ = decode_registry_batch(raw(values), deadletter, fmt, registry, cache=writers)
        assert dead, "halted without a dead letter"
    kept = table.column("_kafka_offset").to_pylist()
    assert sorted(kept + [d.offset for d in dead]) == list(range(len(values))), (kept, dead)
    table.to_pylist()
    small = policy.limits.max_value_bytes
    unexplained = [(values[d.index], d.reason, d.detail) for d in dead
                   if d.index in valid and len(values[d.index] or b"") <= small and d.reason != "missing-required"]
    assert not unexplained, unexplained


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_mutated_framed_values_are_rows_or_dead_letters_never_an_exception(fmt: str) -> None:
    _, records, encode = FORMATS[fmt]
    policy_list = policies(fmt)
    count = 0

    @st.composite
    def batches(draw: Any) -> tuple[SchemaPolicy, list[bytes | None], set[int]]:
        rng = random.Random(draw(st.integers(0, 2 ** 32)))
        values: list[bytes | None] = []
        valid: set[int] = set()
        for i in range(BATCH):
            schema_id = draw(st.sampled_from([1, 1, 2]))
            kind = draw(st.sampled_from(["valid", "valid", "mutated", "mutated", "mutated", "frame", "edge"]))
            value = encode(schema_id, records(rng))
            if kind == "valid":
                valid.add(i)
            elif kind == "mutated":  # the payload
                value = value[:5] + mutate(value[5:], [(rng.choice(["flip", "set", "insert", "delete", "dup"]),
                                                        rng.randrange(1 << 16), rng.choice(INTERESTING_BYTES),
                                                        rng.randrange(8)) for _ in range(rng.randint(1, 3))])
            elif kind == "frame":  # magic byte, schema id, message indexes, truncation
                value = draw(st.sampled_from([value[:rng.randrange(len(value) + 1)], b"\x01" + value[1:],
                                              value[:1] + struct.pack(">I", rng.choice([0, 3, 2 ** 32 - 1]))
                                              + value[5:],
                                              value[:5] + b"\x02\x02" + value[5:], value[:5] + b"\xff" * 11, None]))
            else:
                value = frame(schema_id, draw(JSON_EDGES)) if fmt == "jsonSchema" else \
                    value[:5] + bytes(rng.choice(INTERESTING_BYTES) for _ in range(rng.randint(0, 40)))
            values.append(value)
        return draw(st.sampled_from(policy_list)), values, valid

    @seed(0)
    @settings(max_examples=EXAMPLES, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=batches())
    def run(case: tuple[SchemaPolicy, list[bytes | None], set[int]]) -> None:
        nonlocal count
        policy, values, valid = case
        check_registry_batch(fmt, values, valid, policy)
        count += len(values)

    run()
    assert count >= BATCH * EXAMPLES


def test_a_uint64_past_int64_is_an_unconvertible_dead_letter_not_a_failed_batch() -> None:
    """registry_schema maps Protobuf uint64 to a long column, so a valid 2^63 or larger is a record Arrow cannot
    hold (found by the fuzzer with valid messages): the record is a dead letter naming the field; the batch goes on."""
    message = {"id": 1, "u": 2 ** 64 - 1, "at": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)}
    values = [proto_value(1, {**message, "u": 5}), proto_value(1, message)]
    table, dead, _ = decode_registry_batch(raw(values), policies("protobuf")[0], "protobuf",
                                           SchemaRegistry(url="http://registry.invalid"),
                                           cache=Writers("protobuf", FORMATS["protobuf"][0]))  # type: ignore[arg-type]
    assert table.column("u").to_pylist() == [5]
    assert [(d.index, d.reason) for d in dead] == [(1, "unconvertible")] and dead[0].detail.startswith("u:")
