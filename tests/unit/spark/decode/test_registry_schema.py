"""Pure parts of the Schema Registry formats: the Confluent wire format and schema → column mapping."""
from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, timestamp_pb2

from handoff_spark.decode import registry_schema as rs
from handoff_spark.decode.registry import FrameError, parse_frame, protobuf_message_indexes


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
    schema = {"type": "record", "name": "R", "namespace": "shop", "fields": [
        {"name": "i", "type": "int"}, {"name": "l", "type": "long"}, {"name": "s", "type": ["null", "string"]},
        {"name": "b", "type": "bytes"}, {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "lts", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "d", "type": {"type": "int", "logicalType": "date"}},
        {"name": "t", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "amt", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3}},
        {"name": "u", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A"]}},
        {"name": "h", "type": {"type": "fixed", "name": "H", "size": 16}},
        {"name": "arr", "type": {"type": "array", "items": ["null", "long"]}},
        {"name": "sub", "type": {"type": "record", "name": "S", "fields": [
            {"name": "zip", "type": "string"}, {"name": "tags", "type": {"type": "map", "values": "E"}}]}},
        {"name": "again", "type": ["null", "shop.S"]},                # a named type used twice
        {"name": "empty", "type": {"type": "record", "name": "Z", "fields": []}},
        {"name": "either", "type": ["int", "string"]},
        {"name": "deep", "type": {"type": "array", "items": {"type": "record", "name": "N", "fields": [
            {"name": "x", "type": ["int", "string"]}, {"name": "next", "type": ["null", "N"]}]}}}]}
    sub = "struct<zip:string,tags:map<string,string>>"
    assert [(f.name, f.type, f.json_paths) for f in rs.avro_fields(schema)] == [
        ("i", "int", ()), ("l", "long", ()), ("s", "string", ()), ("b", "binary", ()),
        ("ts", "timestamptz", ()), ("lts", "timestamp", ()), ("d", "date", ()), ("t", "time", ()),
        ("amt", "decimal(12,3)", ()), ("u", "uuid", ()), ("e", "string", ()), ("h", "fixed[16]", ()),
        ("arr", "list<long>", ()), ("sub", sub, ()), ("again", sub, ()),
        ("empty", "string", ((),)), ("either", "string", ((),)),
        # a multi-branch union and a recursive reference inside a list of records: JSON text at their paths
        ("deep", "list<struct<x:string,next:string>>", (("element", "x"), ("element", "next")))]
    with pytest.raises(ValueError, match="record"):
        rs.avro_fields('"string"')


def test_json_schema_fields() -> None:
    schema = {"type": "object", "properties": {
        "n": {"type": "integer"}, "x": {"type": ["number", "null"]}, "ok": {"type": "boolean"},
        "at": {"type": "string", "format": "date-time"}, "day": {"type": "string", "format": "date"},
        "id": {"type": "string", "format": "uuid"},
        "tags": {"type": "array", "items": {"type": "string"}}, "any": {"type": "array"}, "s": {"type": "string"},
        "addr": {"type": "object", "properties": {"zip": {"type": "string"}, "geo": {"type": "array", "items": {
            "type": "object", "properties": {"lat": {"type": "number"}}}}}},
        "attrs": {"type": "object", "additionalProperties": {"type": "integer"}},
        "odd": {"type": "object", "properties": {"not a name": {"type": "string"}}},
        "either": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}}
    assert [(f.name, f.type, f.json_paths) for f in rs.json_schema_fields(schema)] == [
        ("n", "long", ()), ("x", "double", ()), ("ok", "boolean", ()), ("at", "timestamptz", ()),
        ("day", "date", ()), ("id", "uuid", ()), ("tags", "list<string>", ()), ("any", "string", ((),)),
        ("s", "string", ()), ("addr", "struct<zip:string,geo:list<struct<lat:double>>>", ()),
        ("attrs", "map<string,long>", ()), ("odd", "string", ((),)), ("either", "string", ((),))]


def test_protobuf_fields() -> None:
    fdp = descriptor_pb2.FileDescriptorProto(name="t.proto", package="t", dependency=["google/protobuf/timestamp.proto"])
    T = descriptor_pb2.FieldDescriptorProto
    msg = fdp.message_type.add(name="M")
    entry = msg.nested_type.add(name="AttrsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=T.TYPE_INT32, label=T.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=T.TYPE_DOUBLE, label=T.LABEL_OPTIONAL)
    tree = fdp.message_type.add(name="Tree")
    tree.field.add(name="label", number=1, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    tree.field.add(name="kids", number=2, type=T.TYPE_MESSAGE, label=T.LABEL_REPEATED, type_name=".t.Tree")
    for n, (name, typ, label, type_name) in enumerate([
            ("a", T.TYPE_INT32, T.LABEL_OPTIONAL, None), ("b", T.TYPE_INT64, T.LABEL_OPTIONAL, None),
            ("c", T.TYPE_STRING, T.LABEL_OPTIONAL, None), ("d", T.TYPE_BYTES, T.LABEL_OPTIONAL, None),
            ("at", T.TYPE_MESSAGE, T.LABEL_OPTIONAL, ".google.protobuf.Timestamp"),
            ("xs", T.TYPE_INT64, T.LABEL_REPEATED, None),
            ("attrs", T.TYPE_MESSAGE, T.LABEL_REPEATED, ".t.M.AttrsEntry"),
            ("tree", T.TYPE_MESSAGE, T.LABEL_OPTIONAL, ".t.Tree")], start=1):
        f = msg.field.add(name=name, number=n, type=typ, label=label)
        if type_name:
            f.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.AddSerializedFile(fdp.SerializeToString())
    fields = rs.protobuf_fields(pool.FindMessageTypeByName("t.M"))
    assert [(f.name, f.type, f.json_paths) for f in fields] == [
        ("a", "int", ()), ("b", "long", ()), ("c", "string", ()), ("d", "binary", ()),
        ("at", "timestamptz", ()), ("xs", "list<long>", ()), ("attrs", "map<string,double>", ()),
        ("tree", "struct<label:string,kids:list<string>>", (("kids", "element"),))]  # recursion: JSON text


def test_writer_types_fit_only_lossless_promotions() -> None:
    assert rs.fits("int", "long") and rs.fits("float", "double") and rs.fits("decimal(9,2)", "decimal(12,2)")
    assert not rs.fits("long", "int") and not rs.fits("string", "long") and not rs.fits("decimal(9,2)", "decimal(12,3)")
    assert rs.fits("timestamptz", "timestamp") and rs.fits("uuid", "string") and rs.fits("fixed[4]", "binary")
    assert rs.fits("list<struct<a:int>>", "list<struct<a:long,b:string>>")
    assert not rs.fits("struct<a:long>", "struct<a:int>") and not rs.fits("list<long>", "string")


def test_a_struct_field_of_a_later_version_grows_the_column_only_under_compatible_evolution() -> None:
    v2 = "struct<zip:string,geo:struct<lat:double,lon:double>>"
    table = "struct<zip:string,geo:struct<lat:double>>"
    assert str(rs.merged(v2, table, True)) == v2
    assert str(rs.merged(v2, table, False)) == table  # evolution=none: the column stays as it is
    assert str(rs.merged("map<string,struct<a:int>>", "map<string,struct<b:int>>", True)) == \
        "map<string,struct<b:int,a:int>>"
    assert rs.widest("struct<a:long>", "struct<a:int,b:int>") == "struct<a:long,b:int>"
    assert rs.widest("struct<a:string>", "struct<a:int>") is None


def test_decoded_values_are_shaped_for_their_column() -> None:
    """JSON-text positions, UUIDs (bytes for a uuid column, text for a string one) and map keys (text)."""
    import uuid

    from handoff_spark.decode.column_types import parse_type
    from handoff_spark.decode.registry import _shaper

    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    writer = rs.Field("x", "struct<id:uuid,either:string,counts:map<string,long>>", (("either",),))
    shape = _shaper(parse_type(writer.type), writer, native=True)
    assert shape is not None
    assert shape({"id": u, "either": {"a": b"\x01"}, "counts": {3: 1, True: 2}}) == {
        "id": u.bytes, "either": '{"a":"AQ=="}', "counts": {"3": 1, "true": 2}}
    as_text = _shaper(parse_type("string"), rs.Field("u", "uuid"), native=True)
    assert as_text is not None and as_text(u) == str(u) and as_text(u.bytes) == str(u)
    assert _shaper(parse_type("list<long>"), rs.Field("l", "list<int>"), native=True) is None  # nothing to do
    # JSON Schema values go through decode.py's converter: ISO text → datetime, a bad one raises
    js = _shaper(parse_type("struct<at:timestamptz>"), rs.Field("s", "struct<at:timestamptz>"), native=False)
    assert js is not None and js({"at": "2026-01-02T03:04:05Z"})["at"].year == 2026
    with pytest.raises(Exception, match="ISO-8601"):
        js({"at": "yesterday"})
