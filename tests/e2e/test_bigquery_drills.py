"""The BigQuery sink's exactly-once drills through the real app (a subprocess: `python -m handoff_spark run
--available-now`), real Kafka and the BigQuery emulator: kill -9 mid-append, kill -9 after the BigQuery commit but
before Spark's, BigQuery not answering at the driver's start, an emulator restart mid-stream, RESOURCE_EXHAUSTED
from the emulator's request-size and stream-row limits, rejected rows to the DLQ, a column added between runs, and
BigQuery's own row errors (through the test bed's fault proxy, the emulator never sends them).
Each ends with rows == records produced and distinct (topic, partition, offset) == rows, read from BigQuery."""
from __future__ import annotations

import json
import urllib.parse

import pytest
from confluent_kafka import Producer
from google.cloud import bigquery as bq

from handoff_spark.bigquery import client as bigquery_client, ledger as bigquery_ledger
from handoff_spark.bigquery.sink import read_last_commit
from handoff_testbed.bq_fault_proxy import BigQueryWriteFaultProxy, row_error_message

from bq_common import limited_emulator, read_dead_letters
from bq_drill_support import assert_exactly_once, bq_drill_config, run_bq_app, run_bq_to_completion
from iceberg_drill_support import answering_after, end_offsets, produce, value

pytestmark = [pytest.mark.e2e, pytest.mark.kafka, pytest.mark.bigquery]


def test_kill9_mid_append(kafka, bigquery, tmp_path):
    topic = "bq-kill-mid-append"
    kafka.create_topic(topic, partitions=2)
    # 50-row requests: each task of batch 1 sends several, and the whole app dies after the second one
    cfg = bq_drill_config(tmp_path, bigquery, kafka.bootstrap, topic, sink={"maxRowsPerRequest": 50})
    n = produce(kafka.bootstrap, topic, range(800))
    marker = tmp_path / "fault-fired"
    runs = run_bq_to_completion(tmp_path, cfg, env={"HANDOFF_FAULT": f"crash-mid-write:batch=1,once={marker}"})
    assert marker.exists() and runs[0].returncode == -9 and len(runs) == 2
    assert_exactly_once(cfg, kafka.bootstrap, n, topic)


def test_kill9_after_bigquery_commit_before_spark_commit(kafka, bigquery, tmp_path):
    topic = "bq-kill-after-commit"
    kafka.create_topic(topic, partitions=2)
    cfg = bq_drill_config(tmp_path, bigquery, kafka.bootstrap, topic)
    n = produce(kafka.bootstrap, topic, range(800))
    marker = tmp_path / "fault-fired"
    runs = run_bq_to_completion(tmp_path, cfg, env={"HANDOFF_FAULT": f"crash-after-table-commit:batch=1,once={marker}"})
    assert marker.exists() and runs[0].returncode == -9
    assert "already committed (replay skipped)" in runs[1].log.read_text()
    assert_exactly_once(cfg, kafka.bootstrap, n, topic)


def test_bigquery_down_at_the_drivers_start_is_waited_for(kafka, bigquery, tmp_path):
    """BigQuery's REST endpoint does not answer when the driver starts (nothing listens at its address yet): the
    driver waits for it and says so (BigQueryUnavailable) instead of failing; 10 s later the address leads to the
    emulator (a relay) and the same driver's start goes on, to every record once."""
    topic = "bq-down-at-start"
    kafka.create_topic(topic, partitions=2)
    target = urllib.parse.urlsplit(bigquery.rest_endpoint).netloc
    with answering_after(10, target, tmp_path / "relay.log") as port:
        cfg = bq_drill_config(tmp_path, bigquery, kafka.bootstrap, topic,
                              sink={"restEndpoint": f"http://127.0.0.1:{port}"})
        n = produce(kafka.bootstrap, topic, range(600))
        run = run_bq_app(tmp_path, cfg)
        log = run.log.read_text()
        assert run.returncode == 0, log[-3000:]
        assert f"BigQueryUnavailable: table {cfg.sink.table} did not answer at the driver's start" in log, log[-3000:]
        assert "answered again after" in log, log[-3000:]
        assert_exactly_once(cfg, kafka.bootstrap, n, topic)


def test_emulator_restart_mid_stream(kafka, bigquery, tmp_path):
    """Open PENDING streams die with the emulator; the batch fails or is retried, and the rerun replays it
    exactly once (tables survive: persistent emulator)."""
    topic = "bq-emulator-restart"
    kafka.create_topic(topic, partitions=2)
    cfg = bq_drill_config(tmp_path, bigquery, kafka.bootstrap, topic, max_records=200)
    n = produce(kafka.bootstrap, topic, range(1000))
    restarted: list[int] = []
    first = run_bq_app(tmp_path, cfg, on_commits=(1, lambda: (bigquery.restart(), restarted.append(1))))
    assert restarted
    if first.returncode != 0:  # a clean failure is allowed; the rerun must resume exactly once
        run_bq_to_completion(tmp_path, cfg)
    assert_exactly_once(cfg, kafka.bootstrap, n, topic)


def test_resource_exhausted_from_request_and_stream_limits(kafka, tmp_path):
    """An emulator that refuses requests over 16 KiB and PENDING streams over 300 rows with RESOURCE_EXHAUSTED:
    the sink splits requests and moves to fresh streams, the driver commits each batch's streams at once, and
    the progress hand-over reports the condition (Degraded reason)."""
    emu = limited_emulator(tmp_path / "emu", max_request_bytes=16 * 1024, max_stream_rows=300)
    try:
        topic = "bq-resource-exhausted"
        kafka.create_topic(topic, partitions=1)
        cfg = bq_drill_config(tmp_path, emu, kafka.bootstrap, topic, max_records=1000)
        n = produce(kafka.bootstrap, topic, range(2000))
        run_bq_to_completion(tmp_path, cfg, max_runs=1)
        last = read_last_commit(cfg.checkpoint_location)
        assert last["append_errors"].get("RESOURCE_EXHAUSTED", 0) > 0
        assert last["degraded_reason"] == "BigQueryResourceExhausted"
        assert_exactly_once(cfg, kafka.bootstrap, n, topic)
    finally:
        emu.stop()


def test_rejected_rows_to_the_dlq_and_column_added_between_runs(kafka, bigquery, tmp_path):
    """Run 1: undecodable records (decode) and rows the BigQuery table would reject (its REQUIRED column left
    null — enforced by the sink, the emulator would take them) go to the DLQ with the reason; the rest commits.
    Run 2: a column declared since (schema.evolution=compatible) is added to the table as NULLABLE; older
    rows read NULL, newer ones carry it. Exactly once across both runs."""
    topic, dlq = "bq-dlq-evolve", "bq-dlq-evolve-dead"
    kafka.create_topic(topic, partitions=2)
    kafka.create_topic(dlq, partitions=1)
    cfg = bq_drill_config(tmp_path, bigquery, kafka.bootstrap, topic, deadLetterTopic=dlq,
                          schema={"columns": [{"name": "id", "type": "long", "required": True},
                                              {"name": "ts", "type": "timestamp"}, {"name": "region", "type": "string"}],
                                  "onIncompatible": "deadLetter"}, sink={"autoCreate": False, "partitionBy": None})
    client = bigquery_client.rest_client(cfg.sink)
    ref = bigquery_client.table_ref(cfg.sink)
    client.create_dataset(f"{cfg.sink.project}.{cfg.sink.dataset}")
    client.create_table(bq.Table(ref, schema=[
        bq.SchemaField("id", "INT64"), bq.SchemaField("ts", "TIMESTAMP"),
        bq.SchemaField("region", "STRING", mode="REQUIRED"),
        bq.SchemaField("_kafka_topic", "STRING"), bq.SchemaField("_kafka_partition", "INT64"),
        bq.SchemaField("_kafka_offset", "INT64"), bq.SchemaField("_kafka_timestamp", "TIMESTAMP"),
        bq.SchemaField("_handoff_batch_id", "INT64")]))
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    undecodable = no_region = 0
    for i in range(600):
        if i % 97 == 0:
            p.produce(topic, value=b"{not json")
            undecodable += 1
        elif i % 50 == 0:
            p.produce(topic, value=json.dumps({"id": i}).encode())
            no_region += 1
        else:
            p.produce(topic, value=value(i))
    assert p.flush(30) == 0
    run_bq_to_completion(tmp_path, cfg, max_runs=1)
    bad = undecodable + no_region
    assert_exactly_once(cfg, kafka.bootstrap, 600, topic, dead_letters=bad)
    assert sum(c.dlq_rows for c in bigquery_ledger.list_commits(cfg.sink, cfg.handoff_id)) == bad
    reasons: dict[str, set[tuple[bytes, bytes]]] = {}
    for m in read_dead_letters(kafka.bootstrap, dlq, bad):
        h = dict(m.headers())
        reasons.setdefault(h["handoff.reason"].decode(), set()).add(
            (h["handoff.source.partition"], h["handoff.source.offset"]))
        if h["handoff.reason"] == b"missing-required":
            assert b"REQUIRED" in h["handoff.error"]
    assert len(reasons["missing-required"]) == no_region
    assert sum(len(v) for v in reasons.values()) == bad

    doc = json.loads((tmp_path / "app.json").read_text())
    doc["schema"]["columns"].append({"name": "channel", "type": "string"})
    (tmp_path / "app.json").write_text(json.dumps(doc))
    produce(kafka.bootstrap, topic, range(1000, 1200), channel="web")
    run_bq_to_completion(tmp_path, cfg, max_runs=1)
    assert {f.name: f.mode for f in client.get_table(ref).schema}["channel"] == "NULLABLE"
    rows = list(client.query(f"SELECT id >= 1000 AS new, channel, COUNT(*) AS n FROM `{ref}` "
                             f"GROUP BY 1, 2 ORDER BY 1").result())
    assert [(r["new"], r["channel"], r["n"]) for r in rows] == [(False, None, 600 - bad), (True, "web", 200)]
    assert_exactly_once(cfg, kafka.bootstrap, 800, topic, dead_letters=bad)


def test_bigquery_row_errors_to_the_dlq_the_rest_committed(kafka, bigquery, tmp_path):
    """BigQuery refuses an append holding rows it cannot take (row_errors, nothing applied). The sink's gRPC
    endpoint is the test bed's fault proxy in front of the emulator, which refuses every request holding a
    row whose region starts with "REJECT", as BigQuery would. Each such record lands in the DLQ once, with
    the row error's text; every other record is committed exactly once; the ledger covers every offset."""
    topic, dlq = "bq-row-errors", "bq-row-errors-dead"
    kafka.create_topic(topic, partitions=2)
    kafka.create_topic(dlq, partitions=1)
    proxy = BigQueryWriteFaultProxy(bigquery.grpc_endpoint).start()
    try:
        # small requests, several in flight: appends behind a refused one come back OUT_OF_RANGE and are resent
        cfg = bq_drill_config(tmp_path, bigquery, kafka.bootstrap, topic, max_records=250, deadLetterTopic=dlq,
                              sink={"grpcEndpoint": proxy.endpoint, "maxRowsPerRequest": 40})
        n = 700
        marked: dict[tuple[int, int], str] = {}  # (partition, offset) → the refused value
        p = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True, "linger.ms": 5})
        for i in range(n):
            region = f"REJECT-{i}" if i % 41 == 7 else None
            extra = {"region": region} if region else {}

            def delivered(err, msg, region=region):
                assert err is None
                if region:
                    marked[(msg.partition(), msg.offset())] = region

            p.produce(topic, key=str(i).encode(), value=value(i, **extra), on_delivery=delivered)
        assert p.flush(30) == 0
        k = len(marked)
        assert k == len([i for i in range(n) if i % 41 == 7])

        run_bq_to_completion(tmp_path, cfg, max_runs=1)

        assert proxy.stats.refused_rows >= k  # a refused row is refused on every try, never applied
        assert_exactly_once(cfg, kafka.bootstrap, n, topic, dead_letters=k)
        client = bigquery_client.rest_client(cfg.sink)
        left = list(client.query(f"SELECT COUNT(*) AS n FROM `{bigquery_client.table_ref(cfg.sink)}` "
                                 f"WHERE STARTS_WITH(region, 'REJECT')").result())
        assert left[0]["n"] == 0
        assert sum(c.dlq_rows for c in bigquery_ledger.list_commits(cfg.sink, cfg.handoff_id)) == k
        assert end_offsets(kafka.bootstrap, dlq) == {0: k}  # exactly k dead letters, none twice
        seen = {}
        for m in read_dead_letters(kafka.bootstrap, dlq, k):
            h = dict(m.headers())
            assert h["handoff.reason"] == b"rejected-by-bigquery"
            assert h["handoff.source.topic"] == topic.encode()
            where = (int(h["handoff.source.partition"]), int(h["handoff.source.offset"]))
            seen[where] = h["handoff.error"].decode()
            assert json.loads(m.value())["region"] == marked[where]  # the original record, unchanged
        assert set(seen) == set(marked)
        for where, error in seen.items():
            assert row_error_message("region", marked[where]) in error
    finally:
        proxy.stop()


def test_checkpoint_lost_after_a_crash_resumes_from_the_table(kafka, bigquery, tmp_path):
    """The checkpoint is a cache: after a kill -9 and a lost checkpoint, the new query starts where BigQuery's
    table ends (not at startingOffsets), so nothing is written twice."""
    import shutil

    topic = "bq-lost-checkpoint"
    kafka.create_topic(topic, partitions=2)
    cfg = bq_drill_config(tmp_path, bigquery, kafka.bootstrap, topic)
    n = produce(kafka.bootstrap, topic, range(900))
    marker = tmp_path / "fault-fired"
    first = run_bq_app(tmp_path, cfg, env={"HANDOFF_FAULT": f"crash-after-table-commit:batch=1,once={marker}"})
    assert marker.exists() and first.returncode == -9
    shutil.rmtree(tmp_path / "checkpoint")
    n += produce(kafka.bootstrap, topic, range(900, 1100))
    run_bq_to_completion(tmp_path, cfg, max_runs=1)
    # batch 1's index row was never written (its replay went with the checkpoint); the rows are the truth
    assert_exactly_once(cfg, kafka.bootstrap, n, topic, index_complete=False)
