"""Avro over a real Schema Registry, end to end: `handoff run -f manifest.yaml --available-now` reads values
produced by confluent-kafka's AvroSerializer against the test bed's registry (Apicurio's Confluent API), takes
its columns from the registry (an Avro array and record as Iceberg list and struct columns), evolves the table
when a compatible schema version adds a field (at the top level and inside the record), sends
undecodable records to the DLQ with a reason, and records the writer schema ids in each snapshot."""
from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from bq_common import read_dead_letters
from confluent_kafka import Producer
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

MANIFEST = """\
apiVersion: handoff.io/v1alpha1
kind: StreamTableHandoff
metadata:
  name: orders
  namespace: shop
spec:
  source:
    bootstrapServers: {bootstrap}
    topics: [{topic}]
    format: avro
    schemaRegistry:
      url: {registry}
  sink:
    iceberg:
      catalog:
        name: regtest
        properties:
          type: sql
          uri: sqlite:///{tmp}/catalog.db
          warehouse: file://{tmp}/warehouse
      table: shop.orders
  schema:
    onIncompatible: deadLetter
  deadLetter:
    topic: {topic}.dlq
  commitInterval: 1s
"""

V1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "item", "type": "string"},
    {"name": "placed", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "lines", "type": {"type": "array", "items": "string"}},
    {"name": "ship", "type": {"type": "record", "name": "Ship", "fields": [{"name": "zip", "type": "string"}]}},
]}
SHIP_V2 = {"type": "record", "name": "Ship", "fields": [{"name": "zip", "type": "string"},
                                                        {"name": "city", "type": ["null", "string"], "default": None}]}
V2 = {**V1, "fields": [*[f if f["name"] != "ship" else {"name": "ship", "type": SHIP_V2} for f in V1["fields"]],
                       {"name": "coupon", "type": ["null", "string"], "default": None}]}


def _run(manifest: Path, checkpoint: Path) -> str:
    run = subprocess.run([sys.executable, "-m", "handoff_operator", "run", "-f", str(manifest), "--available-now",
                          "--checkpoint", str(checkpoint)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert run.stdout.splitlines()[-1] == "done", run.stdout
    return run.stdout


def test_avro_from_registry_evolves_dead_letters_and_records_schema_ids(kafka, schema_registry,
                                                                        tmp_path: Path) -> None:
    import datetime as dt

    topic = f"orders-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=2)
    kafka.create_topic(f"{topic}.dlq", partitions=1)
    registry = schema_registry.client()
    ctx = SerializationContext(topic, MessageField.VALUE)
    now = dt.datetime.now(dt.timezone.utc)
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    v1 = AvroSerializer(registry, json.dumps(V1))
    for i in range(60):
        p.produce(topic, v1({"id": i, "item": f"sku{i % 5}", "placed": now, "lines": ["a"] * (i % 3),
                             "ship": {"zip": f"{1000 + i}"}}, ctx),
                  partition=i % 2)
    assert p.flush(30) == 0
    manifest = tmp_path / "orders.yaml"
    manifest.write_text(MANIFEST.format(bootstrap=kafka.bootstrap, topic=topic, tmp=tmp_path,
                                        registry=schema_registry.url))
    _run(manifest, tmp_path / "ck")

    from handoff_spark.iceberg import ledger

    table = ledger.load_table("regtest", {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
                                          "warehouse": f"file://{tmp_path}/warehouse"}, "shop.orders")
    names = [f.name for f in table.schema().fields]
    assert names[:5] == ["id", "item", "placed", "lines", "ship"] and "coupon" not in names  # from the registry
    assert str(table.schema().find_field("lines").field_type).startswith("list<string")
    assert [f.name for f in table.schema().find_field("ship").field_type.fields] == ["zip"]

    # Mid-stream: a compatible version adds an optional field; bad records arrive beside it.
    v2 = AvroSerializer(registry, json.dumps(V2))
    for i in range(60, 100):
        p.produce(topic, v2({"id": i, "item": "sku", "placed": now, "lines": [], "ship": {"zip": "1", "city": f"c{i}"},
                             "coupon": f"C{i}" if i % 2 else None}, ctx), partition=i % 2)
    good = v1({"id": 999, "item": "x", "placed": now, "lines": [], "ship": {"zip": "0"}}, ctx)
    p.produce(topic, b'{"id": 1}', partition=0)                     # plain JSON: no magic byte
    p.produce(topic, b"\x00\x00\x0f\x42\x40" + good[5:], partition=1)  # schema id 1000000: unknown
    p.produce(topic, good[:7], partition=0)                          # truncated payload
    assert p.flush(30) == 0
    _run(manifest, tmp_path / "ck")

    table = ledger.load_table("regtest", {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
                                          "warehouse": f"file://{tmp_path}/warehouse"}, "shop.orders")
    rows = table.scan().to_arrow()
    assert sorted(rows.column("id").to_pylist()) == list(range(100))  # produced minus dead letters
    assert len(set(zip(rows.column("_kafka_partition").to_pylist(),
                       rows.column("_kafka_offset").to_pylist()))) == 100
    by_id = {r["id"]: r for r in rows.to_pylist()}
    assert by_id[61]["coupon"] == "C61" and by_id[62]["coupon"] is None and by_id[5]["coupon"] is None
    assert by_id[5]["lines"] == ["a", "a"] and by_id[5]["ship"] == {"zip": "1005", "city": None}
    assert by_id[61]["ship"] == {"zip": "1", "city": "c61"}  # v2's field inside the record: a nested column add
    commits = ledger.list_commits(table, "shop/orders")
    assert sum(c.rows for c in commits) == 100 and sum(c.dlq_rows for c in commits) == 3
    v2_id = registry.get_latest_version(f"{topic}-value").schema_id
    seen: dict[str, list[str]] = {}
    for snap in table.snapshots():
        if snap.summary is not None and snap.summary.get(ledger.SCHEMAS):
            seen.update(json.loads(snap.summary[ledger.SCHEMAS]))
    assert seen[str(v2_id)] == [f"{topic}-value:2"]
    assert len(seen) == 2 and all(len(v) == 1 and v[0].startswith(f"{topic}-value:") for v in seen.values())

    letters = read_dead_letters(kafka.bootstrap, f"{topic}.dlq", expect=3)
    reasons = sorted(dict(m.headers())["handoff.reason"].decode() for m in letters)
    assert reasons == ["no-schema-id", "undecodable", "unknown-schema"]
