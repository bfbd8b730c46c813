"""`handoff replay -f handoff.yaml -r replay.yaml`: the operator's plan and table steps for a locally run handoff
(real Kafka, a real Iceberg table in a SQLite catalog, ledger commits as the sink writes them)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from handoff_spark.iceberg import ledger

pytestmark = [pytest.mark.kafka]

HANDOFF = """\
apiVersion: handoff.io/v1alpha1
kind: StreamTableHandoff
metadata: {{name: orders, namespace: shop}}
spec:
  source: {{bootstrapServers: "{bootstrap}", topics: [{topic}]}}
  sink:
    iceberg:
      catalog: {{name: cli, properties: {{type: sql, uri: "sqlite:///{tmp}/catalog.db", warehouse: "file://{tmp}/wh"}}}}
      table: shop.orders
  schema: {{columns: [{{name: id, type: long}}]}}
"""
REQUEST = """\
apiVersion: handoff.io/v1alpha1
kind: ReplayRequest
metadata: {{name: {name}, namespace: shop}}
spec: {{handoffRef: {{name: orders}}, mode: {mode}, target: {{snapshotId: {snapshot}}}, dryRun: {dry}}}
"""


def _replay(tmp_path: Path, name: str, mode: str, snapshot: int, dry: bool = False) -> subprocess.CompletedProcess[str]:
    request = tmp_path / f"{name}.yaml"
    request.write_text(REQUEST.format(name=name, mode=mode, snapshot=snapshot, dry=str(dry).lower()))
    return subprocess.run([sys.executable, "-m", "handoff_operator", "replay", "-f", str(tmp_path / "sth.yaml"),
                           "-r", str(request)], capture_output=True, text=True, timeout=120)


def test_plan_refuse_and_roll_back_with_a_gap(kafka, tmp_path: Path) -> None:
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=1)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(40):
        producer.produce(topic, json.dumps({"id": i}).encode(), partition=0)
    assert producer.flush(30) == 0
    (tmp_path / "sth.yaml").write_text(HANDOFF.format(bootstrap=kafka.bootstrap, topic=topic, tmp=tmp_path))
    catalog = SqlCatalog("cli", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("shop")
    table = catalog.create_table("shop.orders", Schema(NestedField(1, "id", LongType(), required=False)))
    snapshots = []
    for batch in range(4):
        table.append(pa.table({"id": pa.array(range(10 * batch, 10 * batch + 10), pa.int64())}), snapshot_properties={
            "handoff.id": "shop/orders", "handoff.query": "handoff", "handoff.batch-id": str(batch),
            "handoff.offsets": json.dumps({topic: {"0": [10 * batch, 10 * batch + 10]}}), "handoff.rows": "10",
            "handoff.dlq-rows": "0", "handoff.max-event-time-ms": str(int(time.time() * 1000))})
        snapshots.append(table.current_snapshot().snapshot_id)

    dry = _replay(tmp_path, "look", "RollbackAndReplay", snapshots[1], dry=True)
    assert dry.returncode == 0, dry.stderr
    assert "re-read 20 records" in dry.stdout and "dry run: nothing changed" in dry.stdout
    assert "cost: 2 data files to rewrite; 20 records" in dry.stdout

    refused = _replay(tmp_path, "nope", "Rollback", 424242)
    assert refused.returncode == 2 and "refused (SnapshotNotFound)" in refused.stdout

    table.refresh()
    assert table.current_snapshot().snapshot_id == snapshots[3]
    done = _replay(tmp_path, "drop", "Rollback", snapshots[1])
    assert done.returncode == 0, done.stdout + done.stderr
    table.refresh()
    assert table.scan().to_arrow().num_rows == 20
    assert table.metadata.refs["handoff-undo-shop-drop"].snapshot_id == snapshots[3]
    gap = ledger.list_commits(table, "shop/orders")[0]
    assert gap.kind == ledger.GAP and gap.offsets == {topic: {0: (20, 40)}}
    assert ledger.resume_offsets(table, handoff_id="shop/orders", query="handoff") == {topic: {0: 40}}
