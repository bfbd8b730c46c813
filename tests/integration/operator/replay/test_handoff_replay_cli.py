"""`handoff replay -f handoff.yaml -r replay.yaml`: the operator's plan and table steps for a locally run handoff
(real Kafka; a real Iceberg table in a SQLite catalog, or a BigQuery table in the test bed's emulator; ledger
commits as the sink writes them)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

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
    _timeline_shows_the_ledger(tmp_path, table, topic, snapshots)


def _timeline(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "handoff_operator", "timeline", "-f", str(tmp_path / "sth.yaml"),
                           *args], capture_output=True, text=True, timeout=120)


def _timeline_shows_the_ledger(tmp_path: Path, table: Any, topic: str, snapshots: list[int]) -> None:
    """`handoff timeline -f`: the table's ledger as timeline rows, newest first: the Rollback's gap, then the two
    batches it kept (the ledger is the table's current lineage), each naming its snapshot and the clause that reads the table as of it; `--since`, `--limit` and
    `--watch` (a commit made while it watches is printed once)."""
    rows = json.loads(_timeline(tmp_path, "-o", "json").stdout)
    assert [r["kind"] for r in rows] == ["gap", "batch", "batch"]
    assert rows[0]["what"].startswith(f"gap (handoff): {topic}[0] 20→40")
    assert [r["snapshot"] for r in rows[1:]] == snapshots[1::-1]
    assert rows[1]["asOf"] == f"FOR VERSION AS OF {snapshots[1]}"
    text = _timeline(tmp_path, "--limit", "2")
    assert text.returncode == 0 and len(text.stdout.splitlines()) == 2, text.stdout + text.stderr
    assert f"[snapshot {snapshots[1]}]" in text.stdout.splitlines()[1]
    assert "batch 1 (handoff): 10 rows" in text.stdout
    assert len(json.loads(_timeline(tmp_path, "--since", "1h", "-o", "json").stdout)) == 3
    bad = _timeline(tmp_path, "--since", "soon")
    assert bad.returncode != 0 and "--since 'soon': use a duration such as 90s" in bad.stderr
    watch = subprocess.Popen([sys.executable, "-m", "handoff_operator", "timeline", "-f", str(tmp_path / "sth.yaml"),
                              "--watch", "--interval", "0.5", "-o", "json"], stdout=subprocess.PIPE, text=True)
    try:
        assert watch.stdout is not None
        first = json.loads("".join(iter(watch.stdout.readline, "]\n")) + "]")
        assert len(first) == 3
        table.refresh()
        table.append(pa.table({"id": pa.array(range(100, 105), pa.int64())}), snapshot_properties={
            "handoff.id": "shop/orders", "handoff.query": "handoff", "handoff.batch-id": "9",
            "handoff.offsets": json.dumps({topic: {"0": [40, 45]}}), "handoff.rows": "5", "handoff.dlq-rows": "0",
            "handoff.dropped-rows": "2", "handoff.late-rows": "1"})
        new = json.loads(watch.stdout.readline())
        assert new["kind"] == "batch" and new["snapshot"] == table.current_snapshot().snapshot_id
        assert new["what"].startswith("batch 9 (handoff): 5 rows, 2 dropped by the transform or dedupe, 1 late")
    finally:
        watch.terminate()
        watch.wait(30)


BQ_HANDOFF = """\
apiVersion: handoff.io/v1alpha1
kind: StreamTableHandoff
metadata: {{name: orders, namespace: shop}}
spec:
  source: {{bootstrapServers: "{bootstrap}", topics: [{topic}]}}
  sink:
    bigquery: {{project: {project}, dataset: {dataset}, table: orders, restEndpoint: "{rest}", grpcEndpoint: "{grpc}"}}
  schema: {{columns: [{{name: id, type: long, required: true}}], onIncompatible: halt}}
"""


@pytest.mark.bigquery
def test_a_bigquery_handoff_is_planned_priced_and_rolled_back_locally(kafka, bigquery, tmp_path: Path) -> None:
    """The same `handoff replay` on a BigQuery sink (the emulator): batches committed by the sink's own
    write/commit path, a dry run with what it costs, then a RollbackAndReplay's table steps."""
    from handoff_spark.bigquery import client as bigquery_client, ledger as bigquery_ledger, rollback
    from handoff_spark.bigquery import sink as bigquery_sink
    from handoff_spark.config import AppConfig
    from sink_support import raw_batch, record, write_offsets

    topic = f"orders-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=1)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(40):
        producer.produce(topic, json.dumps({"id": i}).encode(), partition=0)
    assert producer.flush(30) == 0
    dataset = f"cli_{uuid.uuid4().hex[:8]}"
    (tmp_path / "sth.yaml").write_text(BQ_HANDOFF.format(
        bootstrap=kafka.bootstrap, topic=topic, project=bigquery.project, dataset=dataset,
        rest=bigquery.rest_endpoint, grpc=bigquery.grpc_endpoint))
    cfg = AppConfig.model_validate({
        "handoffId": "shop/orders", "source": {"bootstrapServers": kafka.bootstrap, "topics": [topic]},
        "sink": {"kind": "bigquery", "project": bigquery.project, "dataset": dataset, "table": "orders",
                 "restEndpoint": bigquery.rest_endpoint, "grpcEndpoint": bigquery.grpc_endpoint},
        "schema": {"columns": [{"name": "id", "type": "long", "required": True}], "onIncompatible": "halt"},
        "checkpointLocation": str(tmp_path / "checkpoint")})
    plan = bigquery_sink.prepare(cfg)
    for b in range(4):
        write_offsets(tmp_path / "checkpoint", b, {topic: {"0": 10 * b + 10}}, initial={topic: {"0": 0}} if b == 0 else None)
        msgs = [bigquery_sink.write_partition(cfg, plan, iter([raw_batch(topic, 0, 10 * b, [record(i) for i in range(10)])]), b)]
        assert not bigquery_sink.commit_batch(cfg, msgs, b).skipped
    keys = [rollback.entry_key(c) for c in bigquery_ledger.list_commits(cfg.sink, "shop/orders")][::-1]

    dry = _replay(tmp_path, "look", "RollbackAndReplay", keys[1], dry=True)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "re-read 20 records" in dry.stdout and "dry run: nothing changed" in dry.stdout
    assert "cost: 20 rows" in dry.stdout and "Storage Write API" in dry.stdout and "USD" in dry.stdout
    refused = _replay(tmp_path, "nope", "Rollback", 424242)
    assert refused.returncode == 2 and "refused (SnapshotNotFound)" in refused.stdout

    done = _replay(tmp_path, "again", "RollbackAndReplay", keys[1])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "kept snapshot" in done.stdout and "start the driver again: it re-reads 20 records" in done.stdout
    client = bigquery_client.rest_client(cfg.sink)
    offsets = sorted(int(r["o"]) for r in client.query(
        f"SELECT _kafka_offset AS o FROM `{bigquery_client.table_ref(cfg.sink)}`").result())
    assert offsets == list(range(20))
    assert [c.batch_id for c in bigquery_ledger.list_commits(cfg.sink, "shop/orders")] == [1, 0]
    assert bigquery_ledger.resume_offsets(cfg.sink, "shop/orders") == {topic: {0: 20}}
    assert rollback.undo_point_exists(cfg.sink, "orders__handoff_undo_shop_again")
    # Run again: the table is at the target now, so there is nothing to roll back.
    twice = _replay(tmp_path, "again", "RollbackAndReplay", keys[1])
    assert twice.returncode == 2 and "NothingToRollBack" in twice.stdout
