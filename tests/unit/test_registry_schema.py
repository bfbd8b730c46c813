"""Pure parts of the Schema Registry formats: the Confluent wire format and schema → column mapping."""
from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, timestamp_pb2

from handoff_spark import registry_schema as rs
from handoff_spark.registry_decode import FrameError, parse_frame, protobuf_message_indexes


def test_frame_gives_schema_id_and_payload_start() -> None:
    assert parse_frame(b"\x00\x00\x00\x01\x2c\xff") == (300, 5)


@pytest.mark.parametrize("value", [b"", b"\x00\x00\x00\x01", b'{"id": 1}', b"\x01\x00\x00\x00\x01x"])
def test_values_without_the_magic_byte_and_id_are_refused(value: bytes) -> None:
    with pytest.raises(FrameError, match="magic byte"):
        parse_frame(value)


def test_protobuf_message_indexes() -> None:
    assert protobuf_message_indexes(b"\x00\x00\x00\x00\x07\x00rest", 5) == ([0], 6)  # the [0] shortcut
    assert protobuf_message_indexes(b"\x00\x00\x00\x00\x07\x04\x02\x06rest", 5) == ([1, 3], 8)  # zigzag varints
    with pytest.raises(FrameError):
        protobuf_message_indexes(b"\x00\x00\x00\x00\x07\x04\x02", 5)


def test_avro_fields_map_scalars_logical_types_and_nesting() -> None:
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "i", "type": "int"}, {"name": "l", "type": "long"}, {"name": "s", "type": ["null", "string"]},
        {"name": "b", "type": "bytes"}, {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "d", "type": {"type": "int", "logicalType": "date"}},
        {"name": "amt", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3}},
        {"name": "u", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A"]}},
        {"name": "arr", "type": {"type": "array", "items": "long"}},
        {"name": "sub", "type": {"type": "record", "name": "S", "fields": []}},
        {"name": "either", "type": ["int", "string"]}]}
    assert [(f.name, f.type, f.json) for f in rs.avro_fields(schema)] == [
        ("i", "int", False), ("l", "long", False), ("s", "string", False), ("b", "binary", False),
        ("ts", "timestamp", False), ("d", "date", False), ("amt", "decimal(12,3)", False), ("u", "string", False),
        ("e", "string", False), ("arr", "string", True), ("sub", "string", True), ("either", "string", True)]
    with pytest.raises(ValueError, match="record"):
        rs.avro_fields('"string"')


def test_json_schema_fields() -> None:
    schema = {"type": "object", "properties": {
        "n": {"type": "integer"}, "x": {"type": ["number", "null"]}, "ok": {"type": "boolean"},
        "at": {"type": "string", "format": "date-time"}, "day": {"type": "string", "format": "date"},
        "tags": {"type": "array"}, "s": {"type": "string"}}}
    assert [(f.name, f.type, f.json) for f in rs.json_schema_fields(schema)] == [
        ("n", "long", False), ("x", "double", False), ("ok", "boolean", False), ("at", "timestamp", False),
        ("day", "date", False), ("tags", "string", True), ("s", "string", False)]


def test_protobuf_fields() -> None:
    fdp = descriptor_pb2.FileDescriptorProto(name="t.proto", package="t", dependency=["google/protobuf/timestamp.proto"])
    msg = fdp.message_type.add(name="M")
    T = descriptor_pb2.FieldDescriptorProto
    for n, (name, typ, label, type_name) in enumerate([
            ("a", T.TYPE_INT32, T.LABEL_OPTIONAL, None), ("b", T.TYPE_INT64, T.LABEL_OPTIONAL, None),
            ("c", T.TYPE_STRING, T.LABEL_OPTIONAL, None), ("d", T.TYPE_BYTES, T.LABEL_OPTIONAL, None),
            ("at", T.TYPE_MESSAGE, T.LABEL_OPTIONAL, ".google.protobuf.Timestamp"),
            ("xs", T.TYPE_INT64, T.LABEL_REPEATED, None)], start=1):
        f = msg.field.add(name=name, number=n, type=typ, label=label)
        if type_name:
            f.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.AddSerializedFile(fdp.SerializeToString())
    fields = rs.protobuf_fields(pool.FindMessageTypeByName("t.M"))
    assert [(f.name, f.type, f.json) for f in fields] == [
        ("a", "int", False), ("b", "long", False), ("c", "string", False), ("d", "binary", False),
        ("at", "timestamp", False), ("xs", "string", True)]


def test_writer_types_fit_only_lossless_promotions() -> None:
    assert rs.fits("int", "long") and rs.fits("float", "double") and rs.fits("decimal(9,2)", "decimal(12,2)")
    assert not rs.fits("long", "int") and not rs.fits("string", "long") and not rs.fits("decimal(9,2)", "decimal(12,3)")
