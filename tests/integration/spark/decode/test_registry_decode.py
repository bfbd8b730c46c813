"""The registry decoder against the test bed's real Schema Registry, values from confluent-kafka's own
serializers (no Spark: the decode step alone, so each format costs milliseconds)."""
from __future__ import annotations

import datetime as dt
import json
import uuid

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import timestamp_pb2

from handoff_spark.config import Column, SchemaPolicy, SchemaRegistry
from handoff_spark.decode.records import SchemaIncompatible
from handoff_spark.decode.registry import decode_registry_batch

pytestmark = [pytest.mark.kafka]


def _raw(topic: str, values: list[bytes | None]) -> pa.Table:
    n = len(values)
    return pa.table({"key": pa.array([None] * n, pa.binary()), "value": pa.array(values, pa.binary()),
                     "topic": [topic] * n, "partition": pa.array([0] * n, pa.int32()),
                     "offset": pa.array(range(n), pa.int64()),
                     "timestamp": pa.array([None] * n, pa.timestamp("us", tz="UTC"))})


def test_avro_new_field_of_a_later_version_becomes_a_typed_column_and_misfits_are_dead_letters(schema_registry) -> None:
    topic = f"t-{uuid.uuid4().hex[:6]}"
    ctx = SerializationContext(topic, MessageField.VALUE)
    client = schema_registry.client()
    v1 = {"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}]}
    v2 = {**v1, "fields": [*v1["fields"], {"name": "score", "type": ["null", "double"], "default": None}]}
    bad = {"type": "record", "name": "R", "fields": [{"name": "id", "type": "string"}]}
    values = [AvroSerializer(client, json.dumps(v1))({"id": 1}, ctx),
              AvroSerializer(client, json.dumps(v2))({"id": 2, "score": None}, ctx),
              AvroSerializer(client, json.dumps(bad), conf={"auto.register.schemas": True})({"id": "x"},
                                                                                             SerializationContext(f"{topic}-other", MessageField.VALUE))]
    policy = SchemaPolicy(columns=[Column(name="id", type="long", required=True)], on_incompatible="deadLetter")
    table, dead, uses = decode_registry_batch(_raw(topic, values), policy, "avro", SchemaRegistry(url=schema_registry.url))
    assert table.column("id").to_pylist() == [1, 2], dead
    assert table.schema.field("score").type == pa.float64()  # typed from the writer schema although all null
    assert [(d.offset, d.reason) for d in dead] == [(2, "type-mismatch")] and "id" in dead[0].detail
    assert [u.versions for u in uses] == [((f"{topic}-value", 1),), ((f"{topic}-value", 2),)]
    with pytest.raises(SchemaIncompatible, match="type-mismatch"):
        decode_registry_batch(_raw(topic, values), policy.model_copy(update={"on_incompatible": "halt"}), "avro",
                              SchemaRegistry(url=schema_registry.url))


def test_protobuf_values_decode_from_the_writer_descriptor(schema_registry) -> None:
    topic = f"t-{uuid.uuid4().hex[:6]}"
    ctx = SerializationContext(topic, MessageField.VALUE)
    ser = ProtobufSerializer(timestamp_pb2.Timestamp, schema_registry.client(), {"use.deprecated.format": False})
    values = [ser(timestamp_pb2.Timestamp(seconds=1_700_000_000, nanos=5), ctx), b"\x00\x00\x00\x00"]
    values.append(values[0][:6] + b"\xff\xff")  # a payload that is not a Timestamp message
    table, dead, _ = decode_registry_batch(_raw(topic, values), SchemaPolicy(
        columns=[Column(name="seconds", type="long"), Column(name="nanos", type="int")]),
        "protobuf", SchemaRegistry(url=schema_registry.url))
    assert table.select(["seconds", "nanos"]).to_pylist() == [{"seconds": 1_700_000_000, "nanos": 5}]
    assert [d.reason for d in dead] == ["no-schema-id", "undecodable"]


def test_json_schema_values_are_validated_against_the_writer_schema(schema_registry) -> None:
    topic = f"t-{uuid.uuid4().hex[:6]}"
    ctx = SerializationContext(topic, MessageField.VALUE)
    schema = {"type": "object", "properties": {
        "n": {"type": "integer"}, "at": {"type": "string", "format": "date-time"}, "tags": {"type": "array"},
        "addr": {"type": "object", "properties": {"zip": {"type": "string"},
                                                  "seen": {"type": "string", "format": "date-time"}}},
        "counts": {"type": "object", "additionalProperties": {"type": "integer"}}}, "required": ["n"]}
    ser = JSONSerializer(json.dumps(schema), schema_registry.client())
    good = ser({"n": 3, "at": "2026-01-02T03:04:05+00:00", "tags": ["a"],
                "addr": {"zip": "1000", "seen": "2026-01-02T03:04:05Z"}, "counts": {"x": 1}}, ctx)
    invalid = good[:5] + b'{"n": "three"}'  # right framing, fails the writer's schema
    bad_time = good[:5] + b'{"n": 4, "addr": {"seen": "yesterday"}}'  # valid JSON Schema, not a date-time
    table, dead, _ = decode_registry_batch(_raw(topic, [good, invalid, bad_time]), SchemaPolicy(),
                                           "jsonSchema", SchemaRegistry(url=schema_registry.url))
    assert table.column("n").to_pylist() == [3] and table.column("tags").to_pylist() == ['["a"]']
    assert table.column("at").to_pylist() == [dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)]
    assert table.column("addr").to_pylist() == [
        {"zip": "1000", "seen": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)}]
    assert table.schema.field("counts").type == pa.map_(pa.string(), pa.int64())
    assert [d.reason for d in dead] == ["undecodable", "undecodable"] and "addr" in dead[1].detail


def test_avro_nested_values_and_logical_types_decode_into_nested_arrow_and_v2_grows_a_struct(schema_registry) -> None:
    """Records, arrays, maps and logical types arrive as Arrow struct/list/map/timestamp/time/uuid/decimal;
    a multi-branch union stays JSON text; a field a v2 adds inside a record grows the batch's struct (what the
    Iceberg sink turns into a nested column add), and a v1 record in the same batch has it null."""
    import decimal

    topic = f"t-{uuid.uuid4().hex[:6]}"
    ctx = SerializationContext(topic, MessageField.VALUE)
    client = schema_registry.client()
    address = {"type": "record", "name": "Address", "fields": [{"name": "zip", "type": "string"}]}
    v1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "id", "type": "long"},
        {"name": "placed", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "at", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "address", "type": address},
        {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line", "fields": [
            {"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}]}}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {"name": "either", "type": ["null", "long", "string"], "default": None}]}
    v2_address = {**address, "fields": [*address["fields"], {"name": "city", "type": ["null", "string"],
                                                              "default": None}]}
    v2 = {**v1, "fields": [f if f["name"] != "address" else {"name": "address", "type": v2_address}
                           for f in v1["fields"]]}
    placed = dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.timezone.utc)
    ref = uuid.uuid4()
    one = {"id": 1, "placed": placed, "local": dt.datetime(2026, 1, 2, 3, 4, 5), "at": dt.time(12, 30, 1),
           "ref": ref, "amount": decimal.Decimal("12.34"), "address": {"zip": "1000"},
           "lines": [{"sku": "a", "qty": 2}], "attrs": {"k": 7}, "either": "x"}
    two = {**one, "id": 2, "address": {"zip": "2000", "city": "Brussels"}, "lines": [], "either": 5}
    values = [AvroSerializer(client, json.dumps(v1))(one, ctx), AvroSerializer(client, json.dumps(v2))(two, ctx)]
    registry = SchemaRegistry(url=schema_registry.url)
    # the declared columns are what the driver derives from the registry's v1 (registry_columns)
    from handoff_spark.decode import registry_schema as rs

    policy = SchemaPolicy(columns=[Column(name=f.name, type=f.type) for f in rs.avro_fields(v1)])
    table, dead, _ = decode_registry_batch(_raw(topic, values), policy, "avro", registry)
    assert dead == []
    types = {f.name: f.type for f in table.schema}
    assert types["placed"] == pa.timestamp("us", tz="UTC") and types["at"] == pa.time64("us")
    assert types["ref"] == pa.binary(16) and types["amount"] == pa.decimal128(9, 2)
    assert types["address"] == pa.struct([("zip", pa.string()), ("city", pa.string())])  # grown by v2
    assert types["lines"] == pa.list_(pa.struct([("sku", pa.string()), ("qty", pa.int32())]))
    assert types["attrs"] == pa.map_(pa.string(), pa.int64()) and types["either"] == pa.string()
    rows = table.to_pylist()
    assert rows[0]["placed"] == placed and rows[0]["at"] == dt.time(12, 30, 1) and rows[0]["ref"] == ref.bytes
    assert rows[0]["local"] == dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)  # wall clock as UTC
    assert [r["address"] for r in rows] == [{"zip": "1000", "city": None}, {"zip": "2000", "city": "Brussels"}]
    assert rows[0]["lines"] == [{"sku": "a", "qty": 2}] and rows[1]["lines"] == []
    assert rows[0]["attrs"] == [("k", 7)] and [r["either"] for r in rows] == ['"x"', "5"]
    # the Iceberg sink's planner (what prepare_batch runs) adds exactly the new nested field to a v1 table
    from pyiceberg.types import StringType

    from handoff_spark.iceberg.table import declared_schema, iceberg_type_of_arrow, plan_schema_changes

    plan = plan_schema_changes(declared_schema(policy.columns, "avro"),
                               [(f.name, iceberg_type_of_arrow(f.type)) for f in table.schema], "compatible")
    assert plan.add == ((("address", "city"), StringType()),) and not plan.widen and not plan.incompatible

    # evolution=none: the struct keeps its declared fields (the table is the contract)
    frozen, dead, _ = decode_registry_batch(_raw(topic, values), policy.model_copy(update={"evolution": "none"}),
                                            "avro", registry)
    assert dead == [] and frozen.schema.field("address").type == pa.struct([("zip", pa.string())])


def _order_proto() -> tuple[type, type]:
    """A Protobuf message class built from a descriptor here (no generated code): a nested message, a
    repeated message, a map with integer keys and a google.protobuf.Timestamp."""
    from google.protobuf import descriptor_pb2, descriptor_pool
    from google.protobuf.message_factory import GetMessageClass

    T = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name=f"order_{uuid.uuid4().hex[:6]}.proto", package="shop",
                                             syntax="proto3", dependency=["google/protobuf/timestamp.proto"])
    order = fdp.message_type.add(name="Order")  # the value message first: the columns are its fields
    line = fdp.message_type.add(name="Line")
    line.field.add(name="sku", number=1, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    line.field.add(name="qty", number=2, type=T.TYPE_INT32, label=T.LABEL_OPTIONAL)
    entry = order.nested_type.add(name="StockEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=T.TYPE_INT32, label=T.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=T.TYPE_INT64, label=T.LABEL_OPTIONAL)
    order.field.add(name="id", number=1, type=T.TYPE_INT64, label=T.LABEL_OPTIONAL)
    order.field.add(name="main", number=2, type=T.TYPE_MESSAGE, label=T.LABEL_OPTIONAL, type_name=".shop.Line")
    order.field.add(name="lines", number=3, type=T.TYPE_MESSAGE, label=T.LABEL_REPEATED, type_name=".shop.Line")
    order.field.add(name="stock", number=4, type=T.TYPE_MESSAGE, label=T.LABEL_REPEATED,
                    type_name=".shop.Order.StockEntry")
    order.field.add(name="at", number=5, type=T.TYPE_MESSAGE, label=T.LABEL_OPTIONAL,
                    type_name=".google.protobuf.Timestamp")
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.AddSerializedFile(fdp.SerializeToString())
    return GetMessageClass(pool.FindMessageTypeByName("shop.Order")), GetMessageClass(
        pool.FindMessageTypeByName("shop.Line"))


def test_protobuf_nested_messages_repeated_fields_and_maps_decode_into_nested_arrow(schema_registry) -> None:
    topic = f"t-{uuid.uuid4().hex[:6]}"
    order, line_message = _order_proto()
    ser = ProtobufSerializer(order, schema_registry.client(), {"use.deprecated.format": False})
    other = ProtobufSerializer(line_message, schema_registry.client(), {"use.deprecated.format": False,
                                                                       "auto.register.schemas": False,
                                                                       "use.latest.version": True})
    msg = order(id=7, main={"sku": "a", "qty": 1}, lines=[{"sku": "b", "qty": 2}], stock={3: 30},
                at=dt.datetime.fromtimestamp(1_700_000_000, dt.timezone.utc))
    value = ser(msg, SerializationContext(topic, MessageField.VALUE))
    ctx = SerializationContext(topic, MessageField.VALUE)
    wrong_message = other(line_message(sku="z"), ctx)  # the same schema id, its second message
    table, dead, _ = decode_registry_batch(_raw(topic, [value, ser(order(id=8), ctx), wrong_message]),
                                           SchemaPolicy(), "protobuf", SchemaRegistry(url=schema_registry.url))
    assert [(d.offset, d.reason) for d in dead] == [(2, "undecodable")] and "first message" in dead[0].detail
    line = pa.struct([("sku", pa.string()), ("qty", pa.int32())])
    assert [(f.name, f.type) for f in table.schema][:5] == [
        ("id", pa.int64()), ("main", line), ("lines", pa.list_(line)), ("stock", pa.map_(pa.string(), pa.int64())),
        ("at", pa.timestamp("us", tz="UTC"))]
    rows = table.select(["id", "main", "lines", "stock", "at"]).to_pylist()
    assert rows == [{"id": 7, "main": {"sku": "a", "qty": 1}, "lines": [{"sku": "b", "qty": 2}],
                     "stock": [("3", 30)], "at": dt.datetime.fromtimestamp(1_700_000_000, dt.timezone.utc)},
                    {"id": 8, "main": None, "lines": [], "stock": [], "at": None}]
