"""The cost figures match what was produced and written (issue 35): a driver drains a topic of records of known
sizes into Iceberg (SQLite catalog) with `python -m handoff_spark run --available-now` (the command line the
operator renders), and the running totals in its last progress record — what the operator adds into
`status.cost` — are compared with the bytes the test produced into Kafka and the bytes of the data files the
table holds, read back from the table itself (its data files' sizes, and the Parquet files on disk)."""
from __future__ import annotations

import json
import random
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

MANIFEST = """\
apiVersion: handoff.io/v1alpha1
kind: StreamTableHandoff
metadata: {{name: costs, namespace: web}}
spec:
  source: {{bootstrapServers: "{bootstrap}", topics: [{topic}], maxRecordsPerBatch: 150}}
  sink:
    iceberg:
      catalog: {{name: costtest, properties: {{type: sql, uri: "sqlite:///{tmp}/catalog.db",
                                               warehouse: "file://{tmp}/warehouse"}}}}
      table: web.costs
  schema:
    columns:
      - {{name: id, type: long, required: true}}
      - {{name: page, type: string}}
  commitInterval: 1s
"""


def within(got: int, want: int, tolerance: float = 0.02) -> bool:
    return want > 0 and abs(got - want) <= tolerance * want


def test_the_drivers_totals_are_the_bytes_produced_and_the_bytes_the_table_holds(kafka, tmp_path: Path) -> None:
    from handoff_operator.cli import local_config
    from handoff_spark.iceberg import ledger

    topic = f"costs-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=2)
    rng = random.Random(35)
    produced = 0
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(600):
        key = f"k{i}".encode() if i % 3 else None
        value = json.dumps({"id": i, "page": "/" + "x" * rng.randrange(1, 400)}).encode()
        produced += len(key or b"") + len(value)
        p.produce(topic, value, key=key, partition=i % 2)
    assert p.flush(30) == 0
    manifest = yaml.safe_load(MANIFEST.format(bootstrap=kafka.bootstrap, topic=topic, tmp=tmp_path))
    config = json.loads(local_config(manifest, str(tmp_path / "ck"), "local[1]"))
    config.update(progressFile=str(tmp_path / "progress.json"), metricsPort=0)
    (tmp_path / "app.json").write_text(json.dumps(config))
    run = subprocess.run([sys.executable, "-m", "handoff_spark", "run", "--config", str(tmp_path / "app.json"),
                          "--available-now"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    totals = json.loads((tmp_path / "progress.json").read_text())["totals"]

    table = ledger.load_table("costtest", {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
                                           "warehouse": f"file://{tmp_path}/warehouse"}, "web.costs")
    assert table.scan().to_arrow().num_rows == 600
    data_files = [task.file for task in table.scan().plan_files()]  # what the table's current snapshot holds
    written = sum(int(f.file_size_in_bytes) for f in data_files)
    on_disk = sum(f.stat().st_size for f in (tmp_path / "warehouse").rglob("*.parquet"))
    assert totals["records"] == 600
    assert within(totals["kafkaBytes"], produced), (totals, produced)
    assert within(totals["tableBytes"], written) and within(totals["tableBytes"], on_disk), (totals, written, on_disk)
    assert totals["files"] == len(data_files) and totals["snapshots"] == len(ledger.list_commits(table, "web/costs")) >= 2
    assert totals["writeApiBytes"] == 0
