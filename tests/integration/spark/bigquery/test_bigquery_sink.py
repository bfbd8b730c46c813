"""The BigQuery sink's write/commit path without Spark, against the BigQuery emulator and the real Kafka broker
(dead letters, consumer-group offsets): what executors and the driver do for one micro-batch, and what a
replay of the same batch does. Spark's offset log is written by hand, as Spark would."""
from __future__ import annotations

import pytest
from google.cloud import bigquery as bq

from handoff_spark import ledger as ledger_face
from handoff_spark.bigquery import client as bigquery_client, ledger as bigquery_ledger
from handoff_spark.bigquery import sink
from handoff_spark.bigquery.schema import canonical_type
from handoff_spark.kafka.offsets import committed_group_offsets

from bq_common import limited_emulator, read_dead_letters, table_counts
from bq_support import bq_config
from sink_support import raw_batch, record, write_offsets

pytestmark = [pytest.mark.bigquery, pytest.mark.kafka]


def _write(cfg, plan, batch_id, *batches):
    return [sink.write_partition(cfg, plan, iter([b]), batch_id) for b in batches]


def test_commit_is_atomic_replay_is_skipped_and_ledger_readable(bigquery, kafka, tmp_path):
    topic = "bq-commit-1"
    kafka.create_topic(topic, partitions=2)
    cfg = bq_config(tmp_path, bigquery, kafka.bootstrap, topic)
    plan = sink.prepare(cfg)
    client = bigquery_client.rest_client(cfg.sink)
    table = client.get_table(bigquery_client.table_ref(cfg.sink))
    assert table.time_partitioning.field == "ts" and table.time_partitioning.type_ == "DAY"
    assert table.clustering_fields == ["_kafka_topic", "_kafka_partition", "_kafka_offset"]

    cp = tmp_path / "checkpoint"
    write_offsets(cp, 0, {topic: {"0": 50, "1": 30}}, initial={topic: {"0": 0, "1": 0}})
    b0 = [raw_batch(topic, 0, 0, [record(i) for i in range(50)]),
          raw_batch(topic, 1, 0, [record(i) for i in range(100, 130)])]
    msgs = _write(cfg, plan, 0, *b0)
    assert all(len(m.streams) == 1 for m in msgs)  # one PENDING stream per task
    assert table_counts(cfg) == (0, 0)  # appended but not committed: invisible
    r0 = sink.commit_batch(cfg, msgs, 0)
    assert not r0.skipped and r0.rows == 80 and r0.snapshot_id and r0.group_offsets_committed
    assert table_counts(cfg) == (80, 80)

    # crash after the BigQuery commit, before Spark's: a new driver process replays batch 0 with fresh streams
    sink._known_committed.clear()
    r0b = sink.commit_batch(cfg, _write(cfg, plan, 0, *b0), 0)
    assert r0b.skipped and table_counts(cfg) == (80, 80)

    # the next batch: this process committed batch 0, so no replay query is needed, and the rows land
    write_offsets(cp, 1, {topic: {"0": 60, "1": 30}})
    r1 = sink.commit_batch(cfg, _write(cfg, plan, 1, raw_batch(topic, 0, 50, [record(i) for i in range(50, 60)])), 1)
    assert r1.rows == 10 and table_counts(cfg) == (90, 90)
    batch_ids = list(client.query(f"SELECT _handoff_batch_id AS b, COUNT(*) AS n FROM "
                                  f"`{bigquery_client.table_ref(cfg.sink)}` GROUP BY 1 ORDER BY 1").result())
    assert [(r["b"], r["n"]) for r in batch_ids] == [(0, 80), (1, 10)]

    # an aborted attempt (streams appended, never committed) leaves nothing visible
    write_offsets(cp, 2, {topic: {"0": 65, "1": 30}})
    _write(cfg, plan, 2, raw_batch(topic, 0, 60, [record(i) for i in range(60, 65)]))
    assert table_counts(cfg) == (90, 90)

    # what the operator reads, from BigQuery alone
    assert bigquery_ledger.table_offsets(cfg.sink) == {topic: {0: 60, 1: 30}}
    commits = bigquery_ledger.list_commits(cfg.sink, "ns/bq1")
    assert [c.batch_id for c in commits] == [1, 0]  # the skipped replay did not add a second row for batch 0
    assert commits[1].offsets == {topic: {0: (0, 50), 1: (0, 30)}} and commits[1].rows == 80
    assert bigquery_ledger.latest_commit(cfg.sink).batch_id == 1
    assert bigquery_ledger.resume_offsets(cfg.sink) == {topic: {0: 60, 1: 30}}
    # `handoff ledger show` / `kubectl handoff ledger`: the same timeline, newest first
    shown = ledger_face.entries(cfg)
    assert [(e["batch"], e["rows"]) for e in shown] == [(1, 10), (0, 80)]
    assert shown[0]["offsets"][topic]["0"] == [50, 60] and shown[1]["offsets"] == {topic: {"0": [0, 50], "1": [0, 30]}}
    assert "batch 1" in ledger_face.format_entries(shown).splitlines()[0]
    assert committed_group_offsets(kafka.bootstrap, cfg.consumer_group, [(topic, 0), (topic, 1)]) == {topic: {0: 60, 1: 30}}
    # the progress hand-over the app reads (same file and keys as the Iceberg sink)
    last = sink.read_last_commit(cfg.checkpoint_location)
    assert last["batch_id"] == 1 and last["rows"] == 10 and last["append_requests"] >= 1


def test_replay_over_foreign_rows_is_refused(bigquery, kafka, tmp_path):
    """Rows of the batch's range that a batch commit did not put there (a reset checkpoint replaying with other
    boundaries): the sink refuses rather than commit a half-duplicate batch."""
    topic = "bq-commit-2"
    kafka.create_topic(topic, partitions=1)
    cfg = bq_config(tmp_path, bigquery, kafka.bootstrap, topic)
    plan = sink.prepare(cfg)
    cp = tmp_path / "checkpoint"
    write_offsets(cp, 0, {topic: {"0": 10}}, initial={topic: {"0": 0}})
    sink.commit_batch(cfg, _write(cfg, plan, 0, raw_batch(topic, 0, 0, [record(i) for i in range(10)])), 0)
    sink._known_committed.clear()
    write_offsets(cp, 0, {topic: {"0": 20}}, initial={topic: {"0": 0}})  # same batch id, wider range
    msgs = _write(cfg, plan, 0, raw_batch(topic, 0, 0, [record(i) for i in range(20)]))
    with pytest.raises(sink.BatchCommitError, match="already holds 10 rows"):
        sink.commit_batch(cfg, msgs, 0)
    assert table_counts(cfg) == (10, 10)


def test_required_columns_enforced_by_the_sink_and_rejected_rows_go_to_the_dlq(bigquery, kafka, tmp_path):
    """The emulator accepts nulls in REQUIRED columns; BigQuery does not. The sink enforces it: those rows go to
    the DLQ with the reason, the rest of the batch commits."""
    topic, dlq = "bq-required", "bq-required-dlq"
    kafka.create_topic(topic, partitions=1)
    kafka.create_topic(dlq, partitions=1)
    cfg = bq_config(tmp_path, bigquery, kafka.bootstrap, topic, deadLetterTopic=dlq,
                    schema={"columns": [{"name": "id", "type": "long"}, {"name": "region", "type": "string"}],
                            "onIncompatible": "deadLetter"},
                    sink={"autoCreate": False, "partitionBy": None})
    client = bigquery_client.rest_client(cfg.sink)
    client.create_dataset(f"{cfg.sink.project}.{cfg.sink.dataset}")
    client.create_table(bq.Table(bigquery_client.table_ref(cfg.sink), schema=[
        bq.SchemaField("id", "INT64"), bq.SchemaField("region", "STRING", mode="REQUIRED"),
        bq.SchemaField("_kafka_topic", "STRING"), bq.SchemaField("_kafka_partition", "INT64"),
        bq.SchemaField("_kafka_offset", "INT64"), bq.SchemaField("_kafka_timestamp", "TIMESTAMP"),
        bq.SchemaField("_handoff_batch_id", "INT64")]))
    plan = sink.prepare(cfg)
    values = [record(i) if i % 4 else b'{"id": %d}' % i for i in range(20)]  # every 4th lacks region
    write_offsets(tmp_path / "checkpoint", 0, {topic: {"0": 20}}, initial={topic: {"0": 0}})
    msgs = _write(cfg, plan, 0, raw_batch(topic, 0, 0, values))
    r = sink.commit_batch(cfg, msgs, 0)
    assert (r.rows, r.dlq_rows) == (15, 5)
    assert table_counts(cfg) == (15, 15)
    dead = read_dead_letters(kafka.bootstrap, dlq, 5)
    assert sorted(int(dict(m.headers())["handoff.source.offset"]) for m in dead) == [0, 4, 8, 12, 16]
    h = dict(dead[0].headers())
    assert h["handoff.reason"] == b"missing-required" and b"REQUIRED" in h["handoff.error"]
    assert dead[0].value() == b'{"id": 0}'  # the original record, so a fixed one can be re-produced


def test_unknown_columns_are_never_appended_silently(bigquery, kafka, tmp_path):
    """A record field the table lacks: under evolution=compatible the column is added (NULLABLE) before the
    append; the emulator would silently drop it otherwise."""
    topic = "bq-extra"
    kafka.create_topic(topic, partitions=1)
    cfg = bq_config(tmp_path, bigquery, kafka.bootstrap, topic)
    plan = sink.prepare(cfg)
    write_offsets(tmp_path / "checkpoint", 0, {topic: {"0": 3}}, initial={topic: {"0": 0}})
    msgs = _write(cfg, plan, 0, raw_batch(topic, 0, 0, [record(i, coupon=f"c{i}") for i in range(3)]))
    assert msgs[0].new_columns == ["coupon"]
    sink.commit_batch(cfg, msgs, 0)
    client = bigquery_client.rest_client(cfg.sink)
    ref = bigquery_client.table_ref(cfg.sink)
    field = {f.name: f for f in client.get_table(ref).schema}["coupon"]
    assert field.mode == "NULLABLE" and field.field_type == "STRING"
    assert sorted(r["coupon"] for r in client.query(f"SELECT coupon FROM `{ref}`").result()) == ["c0", "c1", "c2"]


def test_schema_addition_adds_nullable_column_and_conflict_halts(bigquery, kafka, tmp_path):
    topic = "bq-schema"
    kafka.create_topic(topic, partitions=1)
    cfg = bq_config(tmp_path, bigquery, kafka.bootstrap, topic)
    plan = sink.prepare(cfg)
    cp = tmp_path / "checkpoint"
    write_offsets(cp, 0, {topic: {"0": 5}}, initial={topic: {"0": 0}})
    sink.commit_batch(cfg, _write(cfg, plan, 0, raw_batch(topic, 0, 0, [record(i) for i in range(5)])), 0)

    v2 = cfg.model_copy(update={"schema_": cfg.schema_.model_copy(update={"columns": [
        *cfg.schema_.columns, type(cfg.schema_.columns[0])(name="channel", type="string")]})})
    plan2 = sink.prepare(v2)
    assert "channel" in [f.name for f in plan2.fields]
    write_offsets(cp, 1, {topic: {"0": 8}})
    sink.commit_batch(v2, _write(v2, plan2, 1, raw_batch(topic, 0, 5, [record(i, channel="web") for i in range(5, 8)])), 1)
    client = bigquery_client.rest_client(cfg.sink)
    ref = bigquery_client.table_ref(cfg.sink)
    rows = {r["_kafka_offset"]: r["channel"] for r in client.query(f"SELECT _kafka_offset, channel FROM `{ref}`").result()}
    assert rows == {0: None, 1: None, 2: None, 3: None, 4: None, 5: "web", 6: "web", 7: "web"}

    breaking = cfg.model_copy(update={"schema_": cfg.schema_.model_copy(update={"columns": [
        type(cfg.schema_.columns[0])(name="region", type="long")]})})
    with pytest.raises(sink.SchemaIncompatibleError, match="'region' is declared INT64 but the table has STRING"):
        sink.prepare(breaking)


def test_resource_exhausted_splits_requests_and_rotates_full_streams(kafka, tmp_path):
    """The emulator's RESOURCE_EXHAUSTED answers: a request over its size cap (the sink halves it) and a PENDING
    stream over its row cap (the sink continues on a fresh stream; the driver commits all of them at once)."""
    emu = limited_emulator(tmp_path / "emu", max_request_bytes=16 * 1024, max_stream_rows=700)
    try:
        topic = "bq-limits"
        kafka.create_topic(topic, partitions=1)
        cfg = bq_config(tmp_path, emu, kafka.bootstrap, topic)
        plan = sink.prepare(cfg)
        write_offsets(tmp_path / "checkpoint", 0, {topic: {"0": 3000}}, initial={topic: {"0": 0}})
        msgs = _write(cfg, plan, 0, raw_batch(topic, 0, 0, [record(i) for i in range(3000)]))
        stats = msgs[0].stats
        assert stats.splits > 0 and stats.rotations > 0 and len(msgs[0].streams) >= 5
        assert sum(s.rows for s in msgs[0].streams) == 3000
        r = sink.commit_batch(cfg, msgs, 0)
        assert r.rows == 3000
        assert table_counts(cfg) == (3000, 3000)
    finally:
        emu.stop()
        bigquery_client.reset()


def test_at_least_once_uses_the_default_stream(bigquery, kafka, tmp_path):
    topic = "bq-alo"
    kafka.create_topic(topic, partitions=1)
    cfg = bq_config(tmp_path, bigquery, kafka.bootstrap, topic, sink={"writeMode": "atLeastOnce"})
    plan = sink.prepare(cfg)
    write_offsets(tmp_path / "checkpoint", 0, {topic: {"0": 7}}, initial={topic: {"0": 0}})
    msgs = _write(cfg, plan, 0, raw_batch(topic, 0, 0, [record(i) for i in range(7)]))
    assert msgs[0].streams == [] and table_counts(cfg) == (7, 7)  # visible on append, no commit needed
    r = sink.commit_batch(cfg, msgs, 0)
    assert r.rows == 7 and bigquery_ledger.latest_commit(cfg.sink).batch_id == 0



def test_nested_columns_create_record_and_repeated_fields(bigquery, kafka, tmp_path):
    """struct → RECORD, list → REPEATED, map → REPEATED RECORD<key, value> in the table the sink creates, the
    executors' plan carries the nested fields, and nested rows append, commit and read back as written.
    (bqemulator 1.4.0's write path drops a RECORD's sub-fields; hack/bqemu_launcher.py gives it the nested
    field list its REST path already uses.)"""
    topic = "bq-nested-1"
    cfg = bq_config(tmp_path, bigquery, kafka.bootstrap, topic, columns=[
        {"name": "id", "type": "long"}, {"name": "ts", "type": "timestamptz"},
        {"name": "addr", "type": "struct<city:string,geo:list<double>>"}, {"name": "tags", "type": "map<string,long>"}])
    plan = sink.prepare(cfg)
    client = bigquery_client.rest_client(cfg.sink)
    fields = {f.name: f for f in client.get_table(bigquery_client.table_ref(cfg.sink)).schema}
    assert (fields["addr"].field_type, [(s.name, canonical_type(s.field_type), s.mode) for s in fields["addr"].fields]) == (
        "RECORD", [("city", "STRING", "NULLABLE"), ("geo", "FLOAT64", "REPEATED")])
    assert (fields["tags"].field_type, fields["tags"].mode, [s.name for s in fields["tags"].fields]) == (
        "RECORD", "REPEATED", ["key", "value"])
    planned = {f.name: f for f in plan.fields}
    assert [s.name for s in planned["addr"].fields] == ["city", "geo"] and planned["tags"].mode == "REPEATED"
    kafka.create_topic(topic, partitions=1)
    write_offsets(tmp_path / "checkpoint", 0, {topic: {"0": 3}}, initial={topic: {"0": 0}})
    values = [record(0, addr={"city": "Oslo", "geo": [59.9, 10.7]}, tags={"a": 1, "b": 2}),
              record(1, addr={"city": "Lima", "geo": []}, tags={}),
              record(2, addr=None)]
    msgs = _write(cfg, plan, 0, raw_batch(topic, 0, 0, values))
    assert sink.commit_batch(cfg, msgs, 0).rows == 3
    ref = bigquery_client.table_ref(cfg.sink)
    got = {r["_kafka_offset"]: (r["addr"], sorted((t["key"], t["value"]) for t in r["tags"]))
           for r in client.query(f"SELECT _kafka_offset, addr, tags FROM `{ref}`").result()}
    assert got == {0: ({"city": "Oslo", "geo": [59.9, 10.7]}, [("a", 1), ("b", 2)]),
                   1: ({"city": "Lima", "geo": []}, []), 2: (None, [])}
    # a restart declaring a changed nested type is refused naming the column (onIncompatible=halt)
    changed = bq_config(tmp_path, bigquery, kafka.bootstrap, topic, dataset=cfg.sink.dataset, columns=[
        {"name": "addr", "type": "struct<city:long>"}])
    with pytest.raises(sink.SchemaIncompatibleError, match="addr"):
        sink.prepare(changed)
