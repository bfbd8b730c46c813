"""`handoff run -f manifest.yaml --available-now`: a StreamTableHandoff manifest run locally end to end —
Kafka → handoff-kafka → decode/DLQ → handoff-iceberg (SQLite catalog) — drains the topic and exits 0."""
from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

MANIFEST = """\
apiVersion: handoff.io/v1alpha1
kind: StreamTableHandoff
metadata:
  name: clicks
  namespace: web
spec:
  source:
    bootstrapServers: {bootstrap}
    topics: [{topic}]
    maxRecordsPerBatch: 40
  sink:
    iceberg:
      catalog:
        name: runtest
        properties:
          type: sql
          uri: sqlite:///{tmp}/catalog.db
          warehouse: file://{tmp}/warehouse
      table: web.clicks
  schema:
    columns:
      - {{name: id, type: long, required: true}}
      - {{name: page, type: string}}
    onIncompatible: deadLetter
  deadLetter:
    topic: {topic}.dlq
  commitInterval: 1s
"""


def test_handoff_run_available_now_drains_into_iceberg_and_exits_zero(kafka, tmp_path: Path) -> None:
    topic = f"clicks-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=2)
    kafka.create_topic(f"{topic}.dlq", partitions=1)
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(100):
        p.produce(topic, json.dumps({"id": i, "page": f"/p{i % 7}"}).encode(), partition=i % 2)
    p.produce(topic, b"not json", partition=0)
    p.produce(topic, b'{"page": "/no-id"}', partition=1)
    assert p.flush(30) == 0
    manifest = tmp_path / "clicks.yaml"
    manifest.write_text(MANIFEST.format(bootstrap=kafka.bootstrap, topic=topic, tmp=tmp_path))
    run = subprocess.run([sys.executable, "-m", "handoff_operator", "run", "-f", str(manifest), "--available-now",
                          "--checkpoint", str(tmp_path / "ck")], capture_output=True, text=True, timeout=600)
    out = run.stdout
    assert run.returncode == 0, (out + run.stderr)[-4000:]
    # the driver's bootstrap batch first (handoff_spark.bootstrap), then Spark's batches
    batch_lines = [line for line in out.splitlines() if line.startswith(("batch ", "bootstrap batch 0: "))]
    assert batch_lines[0].startswith("bootstrap batch 0: "), out
    assert len(batch_lines) >= 3 and all("snapshot " in line for line in batch_lines), out
    assert all(" freshness " in line for line in batch_lines), out  # newest committed event time, from the sink
    assert out.splitlines()[-1] == "done"

    from handoff_spark.iceberg import ledger

    table = ledger.load_table("runtest", {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
                                          "warehouse": f"file://{tmp_path}/warehouse"}, "web.clicks")
    rows = table.scan().to_arrow()
    assert sorted(rows.column("id").to_pylist()) == list(range(100))
    assert len({(r["_kafka_partition"], r["_kafka_offset"]) for r in rows.select(
        ["_kafka_partition", "_kafka_offset"]).to_pylist()}) == 100
    assert ledger.resume_offsets(table) == {topic: {0: 51, 1: 51}}
    commits = ledger.list_commits(table, "web/clicks")
    assert sum(c.rows for c in commits) == 100 and sum(c.dlq_rows for c in commits) == 2

    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": f"t-{uuid.uuid4().hex}",
                  "auto.offset.reset": "earliest"})
    c.subscribe([f"{topic}.dlq"])
    letters = []
    for _ in range(30):
        letters += [m for m in c.consume(10, timeout=1) if m.error() is None]
        if len(letters) >= 2:
            break
    c.close()
    reasons = sorted(dict(m.headers())["handoff.reason"].decode() for m in letters)
    assert reasons == ["missing-required", "unparseable"]
