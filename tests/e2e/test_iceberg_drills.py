"""More Iceberg sink drills with real Kafka and the app process: PostgreSQL and S3-backed catalogs, broker restart,
catalog outage (mid-stream, and at the driver's start), dead letters, schema evolution, a partition added
mid-stream, transactional producers with aborted transactions. Each ends with the exactly-once invariants
(iceberg_drill_support)."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import NewPartitions

from handoff_spark.iceberg import ledger
from handoff_testbed.eventually import eventually
from handoff_testbed.process_tree import kill_tree, process_tree, running

from iceberg_drill_support import (answering_after, assert_exactly_once, drill_config, end_offsets, produce, run_app,
                                   run_to_completion, value)

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable


def test_postgres_catalog_with_kill9(kafka, postgres, tmp_path):
    topic = "ice-pg"
    kafka.create_topic(topic, partitions=2)
    cfg = drill_config(tmp_path, kafka.bootstrap, topic, catalog={
        "type": "sql", "uri": postgres.env["ICEBERG_PG_URI"], "warehouse": f"file://{tmp_path}/warehouse"})
    n = produce(kafka.bootstrap, topic, range(1200))
    marker = tmp_path / "fault-fired"
    runs = run_to_completion(tmp_path, env={"HANDOFF_FAULT": f"crash-after-table-commit:batch=1,once={marker}"})
    assert runs[0].returncode == -9
    assert_exactly_once(cfg, kafka.bootstrap, n, topic)


def test_s3_warehouse_with_kill9_mid_write(kafka, s3, tmp_path):
    topic = "ice-s3"
    kafka.create_topic(topic, partitions=2)
    bucket = f"drill-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    cfg = drill_config(tmp_path, kafka.bootstrap, topic, catalog={
        "type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"s3://{bucket}/warehouse",
        **s3.iceberg_properties()})
    n = produce(kafka.bootstrap, topic, range(1200))
    marker = tmp_path / "fault-fired"
    runs = run_to_completion(tmp_path, env={"HANDOFF_FAULT": f"crash-mid-write:batch=1,once={marker}"})
    assert runs[0].returncode == -9
    table = assert_exactly_once(cfg, kafka.bootstrap, n, topic)
    assert table.metadata.location.startswith("s3://")


def test_broker_restart_mid_stream(kafka, tmp_path):
    topic = "ice-broker-restart"
    kafka.create_topic(topic, partitions=2)
    cfg = drill_config(tmp_path, kafka.bootstrap, topic, max_records=300)
    n = produce(kafka.bootstrap, topic, range(1500))
    restarted = []
    first = run_app(tmp_path, cfg=cfg, on_commits=(1, lambda: (kafka.restart(), restarted.append(1))))
    assert restarted
    if first.returncode != 0:  # a clean failure is allowed; the restart must then resume exactly once
        run_to_completion(tmp_path)
    assert_exactly_once(cfg, kafka.bootstrap, n, topic)


def test_catalog_unavailable_for_a_while(kafka, tmp_path):
    """An exclusive lock on the SQLite catalog for 12 s: commits fail with 'database is locked', the driver
    retries (bounded) and recovers, or halts cleanly and the rerun resumes exactly once."""
    topic = "ice-catalog-outage"
    kafka.create_topic(topic, partitions=2)
    cfg = drill_config(tmp_path, kafka.bootstrap, topic, max_records=300)
    n = produce(kafka.bootstrap, topic, range(1500))
    released = threading.Event()

    def lock_catalog() -> None:
        def hold() -> None:
            conn = sqlite3.connect(tmp_path / "catalog.db", timeout=30, isolation_level=None)
            conn.execute("BEGIN EXCLUSIVE")
            time.sleep(12)
            conn.execute("COMMIT")
            conn.close()
            released.set()
        threading.Thread(target=hold, daemon=True).start()

    first = run_app(tmp_path, cfg=cfg, env={"HANDOFF_SPARK_MASTER": "local[2,4]"}, on_commits=(1, lock_catalog))
    assert released.wait(60)
    if first.returncode != 0:
        assert "did not accept the commit" in first.log.read_text() or "locked" in first.log.read_text()
        run_to_completion(tmp_path)
    assert_exactly_once(cfg, kafka.bootstrap, n, topic)


def test_a_catalog_down_at_the_drivers_start_is_waited_for(kafka, postgres, tmp_path):
    """The PostgreSQL catalog does not answer when the driver starts (nothing listens at its address yet): the driver
    waits for it and says so, instead of failing (a pod would crash-loop under the kubelet's back-off); 10 s later
    the address leads to the catalog (a relay to the test bed's PostgreSQL) and the same driver's start goes on, to
    every record once."""
    topic = "ice-catalog-late"
    kafka.create_topic(topic, partitions=2)
    with answering_after(10, f"127.0.0.1:{postgres.port}", tmp_path / "relay.log") as port:
        cfg = drill_config(tmp_path, kafka.bootstrap, topic, catalog={
            "type": "sql", "uri": f"postgresql+psycopg2://postgres@127.0.0.1:{port}/{postgres.database}",
            "warehouse": f"file://{tmp_path}/warehouse"})
        n = produce(kafka.bootstrap, topic, range(600))
        run = run_app(tmp_path, cfg=cfg)
        log = run.log.read_text()
        assert run.returncode == 0, log[-3000:]
        assert f"CatalogUnavailable: table {cfg.sink.table} did not answer at the driver's start" in log, log[-3000:]
        assert "Connection refused" in log and "answered again after" in log, log[-3000:]
        assert_exactly_once(cfg, kafka.bootstrap, n, topic)


def test_a_catalog_host_that_does_not_resolve_is_waited_for_named_and_a_stop_ends_it(kafka, tmp_path):
    """A catalog URI whose host does not resolve (a typo in the spec, or a Service not made yet): the driver waits,
    as for a catalog that is down, and its line names the spec's field to check (published as degradedDetail, the
    operator's condition message); a SIGTERM while it waits ends it at once, exit 0, its JVM and fork server with it.
    The host has a label over 63 characters: glibc refuses it without asking any DNS server."""
    topic = "ice-catalog-unresolved"
    kafka.create_topic(topic, partitions=1)
    host = "a" * 64 + ".invalid"
    cfg = drill_config(tmp_path, kafka.bootstrap, topic, catalog={
        "type": "sql", "uri": f"postgresql+psycopg2://postgres@{host}:5432/x",
        "warehouse": f"file://{tmp_path}/warehouse"})
    log = tmp_path / "app.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "spark_app"), str(REPO / "hack")]),
           "PYSPARK_PYTHON": PY, "PYSPARK_DRIVER_PYTHON": PY}
    with log.open("w") as fh:
        proc = subprocess.Popen([PY, "-m", "handoff_spark", "run", "--config", str(tmp_path / "app.json")],
                                stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=tmp_path)
    try:
        named = ("its host name does not resolve: check the host in spec.sink.iceberg.catalog.properties (uri), "
                 "or that its Service exists); waiting for it")
        eventually(lambda: named in log.read_text() or proc.poll() is not None, "the driver's line", timeout=120,
                   interval=0.5)
        text = log.read_text()
        assert proc.poll() is None and named in text, text[-3000:]
        said = (f"CatalogUnavailable: table {cfg.sink.table} did not answer at the driver's start (OperationalError: "
                f"(psycopg2.OperationalError) could not translate host name \"{host}\" to address")
        assert said in text, text[-3000:]
        # The stop once Spark's context is up in the JVM being launched (its own line): the JVM killed under py4j's
        # connection says nothing after "stopped", and no traceback.
        eventually(lambda: "Setting default log level" in log.read_text(), "Spark's context", timeout=120,
                   interval=0.2)
        tree = process_tree(proc.pid)
        assert len(tree) > 1, tree  # its JVM (and fork server) launched meanwhile
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-3000:]
        text = log.read_text()
        assert text.strip().splitlines()[-1] == "stopped" and "Traceback" not in text, text[-3000:]
        eventually(lambda: not running(tree), "the driver's JVM and fork server gone", timeout=60, interval=0.5)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait()


def test_bounded_commit_retries_then_recovery(kafka, tmp_path):
    """The commit path's own retries: two failed attempts (catalog-outage hook) then success, same run."""
    topic = "ice-commit-retry"
    kafka.create_topic(topic, partitions=1)
    cfg = drill_config(tmp_path, kafka.bootstrap, topic)
    n = produce(kafka.bootstrap, topic, range(900))
    runs = run_to_completion(tmp_path, max_runs=1, env={
        "HANDOFF_FAULT": f"catalog-outage:batch=1,once={tmp_path}/a;catalog-outage:batch=1,once={tmp_path}/b"})
    assert runs[0].returncode == 0 and (tmp_path / "a").exists() and (tmp_path / "b").exists()
    assert "catalog unavailable (attempt 2)" in runs[0].log.read_text()
    assert_exactly_once(cfg, kafka.bootstrap, n, topic)


def test_dead_letters(kafka, tmp_path):
    topic, dlq = "ice-dlq", "ice-dlq-dead"
    kafka.create_topic(topic, partitions=2)
    kafka.create_topic(dlq, partitions=1)
    cfg = drill_config(tmp_path, kafka.bootstrap, topic, schema={
        "columns": [{"name": "id", "type": "long", "required": True}, {"name": "ts", "type": "timestamp"},
                    {"name": "region", "type": "string"}], "onIncompatible": "deadLetter"},
        deadLetterTopic=dlq)
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    bad = 0
    for i in range(1000):
        if i % 97 == 0:
            p.produce(topic, value=b"{not json" if i % 2 else json.dumps({"id": "x", "region": "eu"}).encode())
            bad += 1
        else:
            p.produce(topic, value=value(i))
    assert p.flush(30) == 0
    run_to_completion(tmp_path, max_runs=1)
    table = assert_exactly_once(cfg, kafka.bootstrap, 1000 - bad, topic)
    assert sum(c.dlq_rows for c in ledger.list_commits(table)) == bad
    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "dlq-check", "auto.offset.reset": "earliest"})
    c.subscribe([dlq])
    keys = set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(keys) < bad:
        m = c.poll(1)
        if m is not None and m.error() is None:
            h = dict(m.headers())
            keys.add((h["handoff.source.partition"], h["handoff.source.offset"]))
    c.close()
    assert len(keys) == bad  # every dead letter is in the DLQ (at-least-once; dedup key from headers)


def test_schema_evolution_and_new_partition_mid_stream(kafka, tmp_path):
    topic = "ice-evolve"
    kafka.create_topic(topic, partitions=2)
    cfg = drill_config(tmp_path, kafka.bootstrap, topic)
    n = produce(kafka.bootstrap, topic, range(600))
    run_to_completion(tmp_path, max_runs=1)
    assert_exactly_once(cfg, kafka.bootstrap, n, topic)
    # the topic grows a partition and producers add a field: both land without a restart of the table
    admin = kafka.admin()  # keep the client alive until the future resolves
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result(timeout=30)
    time.sleep(1)
    n += produce(kafka.bootstrap, topic, range(600, 1200), score=2.5, note="new")
    run_to_completion(tmp_path, max_runs=1)
    table = assert_exactly_once(cfg, kafka.bootstrap, n, topic)
    assert set(end_offsets(kafka.bootstrap, topic)) == {0, 1, 2}
    assert set(ledger.latest_commit(table).offsets[topic]) == {0, 1, 2}
    schema = table.schema()
    assert not schema.find_field("score").required and not schema.find_field("note").required
    data = table.scan(selected_fields=("id", "score", "note")).to_arrow().to_pylist()
    assert all((r["score"] == 2.5 and r["note"] == "new") == (r["id"] >= 600) for r in data)


def test_transactional_producer_aborted_records_never_land(kafka, tmp_path):
    topic = "ice-txn"
    kafka.create_topic(topic, partitions=2)
    cfg = drill_config(tmp_path, kafka.bootstrap, topic)
    p = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"drill-{uuid.uuid4().hex[:6]}"})
    p.init_transactions(30)
    committed = 0
    for t in range(10):
        p.begin_transaction()
        for i in range(t * 100, t * 100 + 100):
            p.produce(topic, key=str(i).encode(), value=value(i))
        if t % 3 == 1:
            # Deliver the records before aborting (as test_kafka_source does): an abort racing in-flight
            # produce requests was refused once by the broker with INVALID_TXN_STATE, before the app ran.
            p.flush(30)
            p.abort_transaction(30)
        else:
            p.commit_transaction(30)
            committed += 100
    run_to_completion(tmp_path, max_runs=1)
    table = assert_exactly_once(cfg, kafka.bootstrap, committed, topic)
    ids = table.scan(selected_fields=("id",)).to_arrow()["id"].to_pylist()
    assert not any((i // 100) % 3 == 1 for i in ids)
