"""A BigQuery sink's schema changes on the timeline (issue 35), against the emulator: columns the sink adds under
`schema.evolution` (a field the records bring, found by a write task; a declared column, added by `prepare` at a
driver's start) are recorded by the ledger-index row of the batch that committed with them, and `handoff timeline`
shows a `schema` row below that batch, as it does for an Iceberg table. The batches go through the sink's own
write and commit path; the timeline is the real CLI in a subprocess."""
from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from handoff_spark import ledger as ledger_face
from handoff_spark.bigquery import client as bigquery_client, ledger as bigquery_ledger, sink
from handoff_spark.bigquery.schema import column_types, fingerprint
from handoff_spark.bigquery.table import fields_of
from handoff_spark.config import AppConfig

from sink_support import raw_batch, write_offsets

pytestmark = [pytest.mark.bigquery, pytest.mark.kafka]

MANIFEST = """\
apiVersion: handoff.io/v1alpha1
kind: StreamTableHandoff
metadata: {{name: orders, namespace: shop}}
spec:
  source: {{bootstrapServers: "{bootstrap}", topics: [{topic}]}}
  sink:
    bigquery: {{project: {project}, dataset: {dataset}, table: orders, restEndpoint: "{rest}", grpcEndpoint: "{grpc}"}}
  schema: {{columns: [{{name: id, type: long, required: true}}], onIncompatible: halt}}
"""


def _config(tmp_path: Path, kafka: Any, bigquery: Any, topic: str, dataset: str,
            columns: list[dict[str, Any]]) -> AppConfig:
    """What `handoff run -f` gives the driver for MANIFEST (the same handoff id, sink and table)."""
    return AppConfig.model_validate({
        "handoffId": "shop/orders", "source": {"bootstrapServers": kafka.bootstrap, "topics": [topic]},
        "sink": {"kind": "bigquery", "project": bigquery.project, "dataset": dataset, "table": "orders",
                 "restEndpoint": bigquery.rest_endpoint, "grpcEndpoint": bigquery.grpc_endpoint},
        "schema": {"columns": columns, "onIncompatible": "halt"},
        "checkpointLocation": str(tmp_path / "checkpoint")})


def _commit(cfg: AppConfig, plan: sink.TablePlan, tmp_path: Path, topic: str, batch: int,
            values: list[bytes]) -> None:
    """Batch `batch` of `values` from offset 10 × batch, through the write task and the driver's commit."""
    start = 10 * batch
    write_offsets(tmp_path / "checkpoint", batch, {topic: {"0": start + len(values)}},
                  initial={topic: {"0": 0}} if batch == 0 else None)
    msgs = [sink.write_partition(cfg, plan, iter([raw_batch(topic, 0, start, values)]), batch)]
    assert not sink.commit_batch(cfg, msgs, batch).skipped


def _timeline(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "handoff_operator", "timeline", "-f", str(tmp_path / "sth.yaml"),
                           *args], capture_output=True, text=True, timeout=120)


def test_columns_the_sink_adds_are_schema_rows_below_their_batch(kafka, bigquery, tmp_path: Path) -> None:
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=1)
    dataset = f"schemarow_{uuid.uuid4().hex[:8]}"
    (tmp_path / "sth.yaml").write_text(MANIFEST.format(
        bootstrap=kafka.bootstrap, topic=topic, project=bigquery.project, dataset=dataset,
        rest=bigquery.rest_endpoint, grpc=bigquery.grpc_endpoint))
    cfg = _config(tmp_path, kafka, bigquery, topic, dataset, [{"name": "id", "type": "long", "required": True}])
    plan = sink.prepare(cfg)
    client = bigquery_client.rest_client(cfg.sink)

    def table_schema() -> str:
        return fingerprint(column_types(fields_of(client.get_table(bigquery_client.table_ref(cfg.sink)))))

    _commit(cfg, plan, tmp_path, topic, 0, [b'{"id": %d}' % i for i in range(3)])
    first = table_schema()
    # batch 1's records bring a field the table lacks: the write task adds it (evolution=compatible)
    _commit(cfg, plan, tmp_path, topic, 1, [b'{"id": 10, "note": "gift"}', b'{"id": 11}'])
    second = table_schema()
    assert second != first
    _commit(cfg, plan, tmp_path, topic, 2, [b'{"id": 20, "note": "x"}'])

    # a new driver process (nothing remembered) whose spec declares a column more: prepare adds it at start
    bigquery_ledger._recorded_schemas.clear()
    sink._known_committed.clear()
    wider = _config(tmp_path, kafka, bigquery, topic, dataset,
                    [{"name": "id", "type": "long", "required": True}, {"name": "region", "type": "string"}])
    plan = sink.prepare(wider)
    third = table_schema()
    _commit(wider, plan, tmp_path, topic, 3, [b'{"id": 30, "region": "eu"}'])

    entries = ledger_face.entries(cfg)
    assert [(e["batch"], e["schemaId"]) for e in entries] == [(3, third), (2, second), (1, second), (0, first)]
    assert [e["schemaChange"] for e in entries] == [
        {"from": second, "to": third, "added": ["region STRING"], "dropped": [], "changed": []},
        None,
        {"from": first, "to": second, "added": ["note STRING"], "dropped": [], "changed": []},
        None]
    # the columns are written once per schema and driver process, not on every row
    rows = list(client.query(f"SELECT batch_id AS b, table_columns AS c FROM "
                             f"`{bigquery_client.table_ref(cfg.sink, bigquery_ledger.ledger_table(cfg.sink))}` "
                             f"ORDER BY batch_id").result())
    assert [(r["b"], r["c"] is not None) for r in rows] == [(0, True), (1, True), (2, False), (3, True)]

    # `handoff timeline -f`: each schema row right below the batch that committed with it, naming its commit
    shown = _timeline(tmp_path, "-o", "json")
    assert shown.returncode == 0, shown.stderr
    timeline = json.loads(shown.stdout)
    assert [(r["kind"], r["what"].split(" (")[0]) for r in timeline] == [
        ("batch", "batch 3"), ("schema", f"schema {second} → {third}: added region STRING"), ("batch", "batch 2"),
        ("batch", "batch 1"), ("schema", f"schema {first} → {second}: added note STRING"), ("batch", "batch 0")]
    assert timeline[4]["snapshot"] == timeline[3]["snapshot"] == entries[2]["snapshot"]
    assert timeline[4]["asOf"] == f"FOR SYSTEM_TIME AS OF TIMESTAMP_MICROS({entries[2]['snapshot']})"
    text = _timeline(tmp_path)
    assert text.returncode == 0 and f"schema {first} → {second}: added note STRING" in text.stdout, text.stderr
