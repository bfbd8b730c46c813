"""The BigQuery ledger records the Kafka cluster id and topic ids, as Iceberg's does, through what a user types:
`handoff run` (the real driver), `handoff ledger show` and `handoff ledger accept-kafka`, against the test bed's
Kafka and BigQuery emulator (and, first, the sink's write/commit path after an epoch without Spark).

- a topic deleted and recreated under the same name: the driver refuses to start with one line (nothing read,
  nothing written); `handoff ledger accept-kafka` records an epoch; the driver then reads the new topic from its
  beginning, and its rows are told from the old topic's (same offsets) by `_kafka_topic_id`;
- a ledger written before the identity columns existed: the driver resumes from it, and its next row records the
  identity (the ledger table gains the columns in place).
"""
from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition

from handoff_spark.bigquery import client as bigquery_client, ledger as bigquery_ledger
from handoff_spark.config import AppConfig

from bq_common import table_counts
from bq_support import bq_config
from sink_support import raw_batch, record, write_offsets

pytestmark = [pytest.mark.kafka, pytest.mark.bigquery]

REPO = Path(__file__).resolve().parents[4]
OLD_ID, NEW_ID = "Lh3qXc0xTbO9mBEAAAAAAQ", "2F2jaSYuQaiua0Svu/jWBw"  # topic ids as Kafka prints them (base64)
COLUMNS = [{"name": "id", "type": "long", "required": True}, {"name": "ts", "type": "timestamp"},
           {"name": "region", "type": "string"}]


def _produce(bootstrap: str, topic: str, ids: range) -> int:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i in ids:
        ts = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(minutes=37 * i)
        p.produce(topic, key=str(i).encode(),
                  value=json.dumps({"id": i, "ts": ts.isoformat(), "region": "eu"}).encode())
    assert p.flush(30) == 0
    return len(ids)


def _end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "identity-probe"})
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in md.partitions}
    finally:
        c.close()


class Handoff:
    """One StreamTableHandoff manifest on the emulator, and the `handoff` command run on it as a person would."""

    def __init__(self, tmp_path: Path, bigquery: Any, bootstrap: str, topic: str) -> None:
        self.tmp_path = tmp_path
        self.checkpoint = str(tmp_path / "checkpoint")
        self.manifest = tmp_path / "handoff.yaml"
        self.manifest.write_text(yaml.safe_dump({
            "apiVersion": "handoff.io/v1alpha1", "kind": "StreamTableHandoff",
            "metadata": {"name": "ident", "namespace": "bq"},
            "spec": {"source": {"bootstrapServers": bootstrap, "topics": [topic], "maxRecordsPerBatch": 400},
                     "sink": {"bigquery": {"project": bigquery.project, "dataset": f"ident_{uuid.uuid4().hex[:8]}",
                                           "table": "events", "partitionBy": "ts",
                                           "restEndpoint": bigquery.rest_endpoint,
                                           "grpcEndpoint": bigquery.grpc_endpoint}},
                     "schema": {"columns": COLUMNS, "onIncompatible": "halt"}}}))
        printed = self.handoff("run", "--print-config")
        assert printed.returncode == 0, printed.stderr
        self.cfg = AppConfig.model_validate_json(printed.stdout)

    def handoff(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO / "spark_app")]),
               "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        return subprocess.run([sys.executable, "-m", "handoff_operator.cli", args[0], *args[1:], "-f",
                               str(self.manifest), "--checkpoint", self.checkpoint], capture_output=True, text=True,
                              env=env, cwd=self.tmp_path, timeout=timeout)

    def run(self) -> subprocess.CompletedProcess[str]:
        return self.handoff("run", "--available-now")

    def show(self) -> list[dict[str, Any]]:
        out = self.handoff("ledger", "show", "-o", "json", timeout=120)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def query(self, sql: str) -> list[Any]:
        client = bigquery_client.rest_client(self.cfg.sink)
        return list(client.query(sql.format(t=f"`{bigquery_client.table_ref(self.cfg.sink)}`"), retry=None).result())


def test_after_an_epoch_the_sink_keeps_to_the_new_topics_rows(bigquery, kafka, tmp_path):
    """The protocol, no Spark: ledger rows carry the checkpoint's Kafka identity; after an epoch the new topic's
    batch 0 is not taken for the old topic's rows at the same offsets (nor skipped as "already committed"), its
    rows are stamped, its replay is skipped, and a gap recorded then belongs to the new topic."""
    import shutil

    from handoff_spark import checkpoint as ckpt
    from handoff_spark.bigquery import sink

    topic = f"ident-sink-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=1)
    cfg = bq_config(tmp_path, bigquery, kafka.bootstrap, topic)
    cp = tmp_path / "checkpoint"
    plan = sink.prepare(cfg)
    assert plan.topic_ids == () and "_kafka_topic_id" not in {f.name for f in plan.fields}
    write_offsets(cp, 0, {topic: {"0": 50}}, initial={topic: {"0": 0}})
    ckpt.write_kafka_identity(str(cp), {"cluster": "cluster-1", "topics": {topic: OLD_ID}})
    old = [raw_batch(topic, 0, 0, [record(i) for i in range(50)])]
    assert sink.commit_batch(cfg, [sink.write_partition(cfg, plan, iter(old), 0)], 0).rows == 50
    assert sink.ledger_identity(cfg) == ("cluster-1", {topic: OLD_ID})

    bigquery_ledger.record_marker(cfg, {topic: {"0": [0, 0]}}, bigquery_ledger.EPOCH, "recreated",
                                  {"cluster": "cluster-1", "topics": {topic: NEW_ID}})
    assert sink.ledger_identity(cfg) == ("cluster-1", {topic: NEW_ID})
    assert sink.ledger_end(cfg) == {(topic, 0): 0}  # the old topic's rows 0..49 are of another incarnation
    shutil.rmtree(cp)  # the driver discards the old topic's checkpoint (it disagrees with the ledger)
    sink._known_committed.clear()
    plan = sink.prepare(cfg)
    assert plan.topic_ids == ((topic, NEW_ID),) and "_kafka_topic_id" in {f.name for f in plan.fields}
    write_offsets(cp, 0, {topic: {"0": 30}}, initial={topic: {"0": 0}})
    ckpt.write_kafka_identity(str(cp), {"cluster": "cluster-1", "topics": {topic: NEW_ID}})
    new = [raw_batch(topic, 0, 0, [record(i) for i in range(1000, 1030)])]
    first = sink.commit_batch(cfg, [sink.write_partition(cfg, plan, iter(new), 0)], 0)
    assert not first.skipped and first.rows == 30
    sink._known_committed.clear()  # a crash after the BigQuery commit: the replay finds the new topic's rows
    assert sink.commit_batch(cfg, [sink.write_partition(cfg, plan, iter(new), 0)], 0).skipped
    client = bigquery_client.rest_client(cfg.sink)
    rows = list(client.query(f"SELECT _kafka_topic_id AS i, COUNT(*) AS n FROM `{bigquery_client.table_ref(cfg.sink)}`"
                             " GROUP BY 1", retry=None).result())
    assert {r["i"]: r["n"] for r in rows} == {None: 50, NEW_ID: 30}
    assert bigquery_ledger.resume_offsets(cfg.sink, cfg.handoff_id) == {topic: {0: 30}}
    commits = bigquery_ledger.list_commits(cfg.sink, cfg.handoff_id)
    assert [(c.kind, c.batch_id, c.topic_ids) for c in commits] == [
        ("batch", 0, {topic: NEW_ID}), ("epoch", -1, {topic: NEW_ID}), ("batch", 0, {topic: OLD_ID})]

    # a gap recorded now (a Rollback's) carries the identity the ledger follows, so it moves the new topic's end
    assert bigquery_ledger.record_gap(cfg, {topic: {"0": [30, 40]}}, "rolled back")
    assert bigquery_ledger.list_commits(cfg.sink, cfg.handoff_id)[0].topic_ids == {topic: NEW_ID}
    assert bigquery_ledger.resume_offsets(cfg.sink, cfg.handoff_id) == {topic: {0: 40}}


def _ok(run: subprocess.CompletedProcess[str]) -> str:
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout


def test_recreated_topic_is_refused_until_accepted_then_read_from_its_beginning(kafka, bigquery, tmp_path):
    topic = f"ident-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=1)
    h = Handoff(tmp_path, bigquery, kafka.bootstrap, topic)
    old = _produce(kafka.bootstrap, topic, range(500))
    _ok(h.run())
    first = h.show()
    assert first[0]["kind"] == "batch" and first[0]["kafkaCluster"] and first[0]["topicIds"][topic]
    old_id = first[0]["topicIds"][topic]

    kafka.recreate_topic(topic, partitions=1)
    new = _produce(kafka.bootstrap, topic, range(1000, 1200))  # offsets 0..199 of the new topic

    refused = h.run()
    assert refused.returncode == 2, refused.stdout[-3000:] + refused.stderr[-3000:]
    lines = [line for line in refused.stderr.splitlines() if line.startswith("handoff: ")]
    assert len(lines) == 1, refused.stderr
    assert (f"topic {topic!r} has id" in lines[0] and f"the ledger's offsets belong to topic id {old_id} (the topic "
            "was deleted and recreated)" in lines[0] and "handoff ledger accept-kafka -f <manifest>" in lines[0])
    assert table_counts(h.cfg) == (old, old)  # nothing re-read, nothing skipped
    # A running driver handed these topics in place (spec.source.topics changed, driver.query_config) refuses them
    # with the same finding, read from the BigQuery ledger, and runs on with the topics before.
    from handoff_spark.driver.resume import source_problem
    from handoff_spark.sink import registry

    problem = source_problem(h.cfg, registry.get("bigquery"))
    assert problem is not None and problem.startswith(f"SourceInvalid: spec.source.topics: topic {topic!r} has id ")
    assert f"the ledger's offsets belong to topic id {old_id}" in problem and "accept-kafka" in problem, problem

    accepted = _ok(h.handoff("ledger", "accept-kafka", timeout=120))
    assert "recorded epoch ledger row in events__handoff_ledger: Kafka identity accepted" in accepted
    assert "new partitions start at startingOffsets=earliest" in accepted
    epoch = h.show()[0]
    new_id = epoch["topicIds"][topic]
    assert epoch["kind"] == "epoch" and epoch["offsets"] == {topic: {"0": [0, 0]}} and new_id != old_id
    again = h.handoff("ledger", "accept-kafka", timeout=120)
    assert "nothing recorded" in _ok(again)  # the ledger matches Kafka now

    log = _ok(h.run())
    assert "disagrees with the table's ledger and is discarded" in log  # the old topic's checkpoint
    _assert_incarnations(h, topic, {None: old, new_id: new})
    entries = h.show()
    assert [e["kind"] for e in entries[:2]] == ["batch", "epoch"]
    assert entries[0]["offsets"] == {topic: {"0": [0, 200]}} and entries[0]["topicIds"] == {topic: new_id}
    assert bigquery_ledger.resume_offsets(h.cfg.sink, h.cfg.handoff_id)[topic] == _end_offsets(kafka.bootstrap, topic)

    # and a restart after the epoch: the checkpoint agrees with the new topic's ledger, the next batch appends
    new += _produce(kafka.bootstrap, topic, range(1200, 1250))
    log = _ok(h.run())
    assert "discarded" not in log
    _assert_incarnations(h, topic, {None: old, new_id: new})
    assert bigquery_ledger.resume_offsets(h.cfg.sink, h.cfg.handoff_id)[topic] == {0: 250}


def _assert_incarnations(h: Handoff, topic: str, expected: dict[str | None, int]) -> None:
    """Per `_kafka_topic_id` (None: rows written before any epoch), rows == distinct offsets == produced."""
    rows = h.query("SELECT _kafka_topic_id AS i, COUNT(*) AS n, COUNT(DISTINCT _kafka_offset) AS d, "
                   "MIN(_kafka_offset) AS lo, MAX(_kafka_offset) AS hi FROM {t} GROUP BY 1")
    got = {r["i"]: (r["n"], r["d"], r["lo"], r["hi"]) for r in rows}
    assert got == {i: (n, n, 0, n - 1) for i, n in expected.items()}, got


def _downgrade_ledger(cfg: AppConfig) -> None:
    """The ledger table as a Handoff before the identity columns wrote it: same rows, without those columns."""
    import pyarrow as pa
    from google.cloud import bigquery as bq

    from handoff_spark.bigquery.append import RetryPolicy, StreamWriter

    old_fields = [f for f in bigquery_ledger._LEDGER_FIELDS
                  if f[0] not in ("kind", "reason", "kafka_cluster_id", "topic_ids")]
    names = [n for n, _, _ in old_fields]
    client = bigquery_client.rest_client(cfg.sink)
    ref = bigquery_client.table_ref(cfg.sink, bigquery_ledger.ledger_table(cfg.sink))
    rows = [dict(r.items()) for r in client.query(f"SELECT {', '.join(names)} FROM `{ref}`", retry=None).result()]
    assert rows
    client.delete_table(ref)
    client.create_table(bq.Table(ref, schema=[bq.SchemaField(n, t, mode=m) for n, t, m in old_fields]))
    schema = pa.schema([pa.field(n, {"STRING": pa.string(), "INT64": pa.int64()}.get(t, pa.timestamp("us", "UTC")),
                                 m != "REQUIRED") for n, t, m in old_fields])
    writer = StreamWriter(bigquery_client.write_client(cfg.sink),
                          bigquery_client.table_path(cfg.sink, bigquery_ledger.ledger_table(cfg.sink)), schema,
                          pending=False, retry=RetryPolicy())
    writer.write(pa.Table.from_pylist(rows, schema=schema))
    writer.close()


def test_a_ledger_without_identity_columns_resumes_and_records_identity_next(kafka, bigquery, tmp_path):
    topic = f"ident-old-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=1)
    h = Handoff(tmp_path, bigquery, kafka.bootstrap, topic)
    n = _produce(kafka.bootstrap, topic, range(300))
    _ok(h.run())
    _downgrade_ledger(h.cfg)
    before = h.show()
    assert before and all(e["kafkaCluster"] is None and e["topicIds"] is None for e in before)

    n += _produce(kafka.bootstrap, topic, range(300, 450))
    log = _ok(h.run())
    assert "discarded" not in log  # the checkpoint agrees with the old ledger: a plain restart
    assert table_counts(h.cfg) == (n, n)
    client = bigquery_client.rest_client(h.cfg.sink)
    ledger_ref = bigquery_client.table_ref(h.cfg.sink, bigquery_ledger.ledger_table(h.cfg.sink))
    assert {"kind", "reason", "kafka_cluster_id", "topic_ids"} <= {f.name for f in client.get_table(ledger_ref).schema}
    entries = h.show()
    assert entries[0]["offsets"] == {topic: {"0": [300, 450]}}
    assert entries[0]["kafkaCluster"] and entries[0]["topicIds"][topic]
    assert all(e["topicIds"] is None for e in entries[1:])
    assert bigquery_ledger.resume_offsets(h.cfg.sink, h.cfg.handoff_id)[topic] == {0: 450}
    # no epoch, so the data table did not gain `_kafka_topic_id`
    assert "_kafka_topic_id" not in {f.name for f in client.get_table(bigquery_client.table_ref(h.cfg.sink)).schema}
