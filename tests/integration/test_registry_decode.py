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
from handoff_spark.decode import SchemaIncompatible
from handoff_spark.registry_decode import decode_registry_batch

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
    assert table.column("id").to_pylist() == [1, 2]
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
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "at": {"type": "string", "format": "date-time"},
                                               "tags": {"type": "array"}}, "required": ["n"]}
    ser = JSONSerializer(json.dumps(schema), schema_registry.client())
    good = ser({"n": 3, "at": "2026-01-02T03:04:05+00:00", "tags": ["a"]}, ctx)
    invalid = good[:5] + b'{"n": "three"}'  # right framing, fails the writer's schema
    table, dead, _ = decode_registry_batch(_raw(topic, [good, invalid]), SchemaPolicy(),
                                           "jsonSchema", SchemaRegistry(url=schema_registry.url))
    assert table.column("n").to_pylist() == [3] and table.column("tags").to_pylist() == ['["a"]']
    assert table.column("at").to_pylist() == [dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)]
    assert [d.reason for d in dead] == ["undecodable"]
