"""The BigQuery sink's DataFrame path (`rows=true`) without Spark, against the BigQuery emulator and the real Kafka
broker: what a rows write task and the commit do with rows a transform made (filtered, a row BigQuery would reject),
what the ledger index records (records, dead letters, late and dropped counts), a replay of the same batch, and the
start after a crash between the data commit and the index row of a batch whose last records were filtered out.
Spark's offset log and the frame source's counts are written by hand, as Spark and `sink.frames` would."""
from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from handoff_spark import checkpoint as ckpt, ledger as ledger_face
from handoff_spark.bigquery import ledger as bigquery_ledger
from handoff_spark.bigquery import sink
from handoff_spark.driver.resume import checkpoint_problems, prepare_start
from handoff_spark.sink import registry

from bq_common import read_dead_letters, table_counts
from bq_support import bq_config, old_ledger_table
from sink_support import write_offsets

pytestmark = [pytest.mark.bigquery, pytest.mark.kafka]

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)


def frame_rows(topic: str, partition: int, offsets: list[int], null_id: set[int] = frozenset()) -> pa.RecordBatch:
    """What the transform hands the sink: the declared columns and the Kafka coordinates (id null at `null_id`)."""
    n = len(offsets)
    return pa.RecordBatch.from_pydict({
        "id": pa.array([None if o in null_id else o for o in offsets], pa.int64()),
        "ts": pa.array([T0 + dt.timedelta(minutes=o) for o in offsets], pa.timestamp("us", tz="UTC")),
        "region": pa.array([["eu", "us", "ap"][o % 3] for o in offsets]),
        "amount": pa.array([float(o) for o in offsets], pa.float64()),
        "_kafka_topic": pa.array([topic] * n), "_kafka_partition": pa.array([partition] * n, pa.int32()),
        "_kafka_offset": pa.array(offsets, pa.int64()),
        "_kafka_timestamp": pa.array([T0] * n, pa.timestamp("us", tz="UTC"))})


def frame_counts(cp: Path, batch_id: int, topic: str, partition: int, start: int, end: int, *, dlq: int = 0,
                 late: int = 0) -> None:
    """The frame source's read task counts of one range (`sink.frames`)."""
    assert ckpt.write_frame_stats(str(cp), batch_id, f"{topic}-{partition}-{start}-{end}", {
        "records": end - start, "dlq_rows": dlq, "late_rows": late,
        "max_event_time_ms": int((T0 + dt.timedelta(minutes=end - 1)).timestamp() * 1000), "offsets": end - start})


def mark_done(cp: Path, batch_id: int) -> None:
    """Spark's commit log entry of a batch."""
    (cp / "commits").mkdir(parents=True, exist_ok=True)
    (cp / "commits" / str(batch_id)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def test_rows_path_commit_counts_dead_letters_and_replay(bigquery, kafka, tmp_path):
    topic, dlq = "bq-rows-1", "bq-rows-1-dlq"
    kafka.create_topic(topic, partitions=1)
    kafka.create_topic(dlq, partitions=1)
    cfg = bq_config(tmp_path, bigquery, kafka.bootstrap, topic, deadLetterTopic=dlq)
    plan = sink.prepare(cfg)
    cp = tmp_path / "checkpoint"
    write_offsets(cp, 0, {topic: {"0": 100}}, initial={topic: {"0": 0}})
    # Offsets 1-3 were dead letters at the source (2 late, 1 undecodable); the SQL filtered every 10th record and
    # the tail from 80 on; the row of offset 55 lost its required id in the transform: BigQuery would reject it.
    kept = [o for o in range(80) if o not in (1, 2, 3) and o % 10]
    assert len(kept) == 69

    def write() -> list[sink.BigQueryCommitMessage]:
        frame_counts(cp, 0, topic, 0, 0, 100, dlq=3, late=2)
        return [sink.write_rows_partition(cfg, plan, iter([frame_rows(topic, 0, kept[:30]),
                                                           frame_rows(topic, 0, kept[30:], null_id={55})]), 0)]

    msgs = write()
    assert msgs[0].rows == 68 and msgs[0].dlq_rows == 1 and msgs[0].records == 0
    r0 = sink.commit_batch(cfg, msgs, 0, frames=True)
    assert not r0.skipped and r0.rows == 68 and r0.dlq_rows == 4 and r0.records == 100
    assert r0.max_event_time_ms == int((T0 + dt.timedelta(minutes=99)).timestamp() * 1000)
    assert table_counts(cfg) == (68, 68)
    assert not ckpt.read_frame_stats(str(cp), 0)  # summed, then cleared
    (c0,) = bigquery_ledger.list_commits(cfg.sink, cfg.handoff_id)
    assert (c0.offsets, c0.rows, c0.dlq_rows, c0.late_rows, c0.dropped_rows) == ({topic: {0: (0, 100)}}, 68, 4, 2, 28)
    (shown,) = ledger_face.entries(cfg)  # `handoff ledger show -o json`
    assert (shown["rows"], shown["deadLetters"], shown["lateRows"], shown["droppedRows"]) == (68, 4, 2, 28)
    # the table's own end is 80 (the tail was filtered); the ledger index covers the batch to 100
    assert bigquery_ledger.table_offsets(cfg.sink) == {topic: {0: 80}}
    assert bigquery_ledger.resume_offsets(cfg.sink, cfg.handoff_id) == {topic: {0: 100}}

    # the rejected row is a dead letter whose value is the row as JSON, with the usual headers
    (dead,) = read_dead_letters(kafka.bootstrap, dlq, 1)
    headers = {k: v.decode() for k, v in dead.headers()}
    assert headers["handoff.reason"] == "missing-required" and headers["handoff.value"] == "row-json"
    assert (headers["handoff.source.topic"], headers["handoff.source.offset"]) == (topic, "55")
    assert headers["handoff.id"] == cfg.handoff_id and headers["handoff.source.timestamp"] == str(int(T0.timestamp() * 1000))
    value = json.loads(dead.value())
    assert value["id"] is None and value["_kafka_offset"] == 55 and value["region"] == "us" and dead.key() is None

    # a new driver replays batch 0 (same SQL, same state): the same rows, so the check finds them all and skips
    sink._known_committed.clear()
    r0b = sink.commit_batch(cfg, write(), 0, frames=True)
    assert r0b.skipped and table_counts(cfg) == (68, 68)
    assert len(bigquery_ledger.list_commits(cfg.sink, cfg.handoff_id)) == 1


def test_a_crash_between_the_data_commit_and_the_index_row_of_a_filtered_tail_resumes_exactly(
        bigquery, kafka, tmp_path, monkeypatch):
    """Batch 1's last records were filtered, so the data table ends inside it; its index row was never written.
    The start must keep the checkpoint (and the dedupe's state in it): Spark re-runs batch 1, the commit skips it
    and writes the index row, and the ledger ends exactly at the batch's end."""
    topic = "bq-rows-tail"
    kafka.create_topic(topic, partitions=2)
    cfg = bq_config(tmp_path, bigquery, kafka.bootstrap, topic)
    plan = sink.prepare(cfg)
    cp = tmp_path / "checkpoint"
    write_offsets(cp, 0, {topic: {"0": 100, "1": 50}}, initial={topic: {"0": 0, "1": 0}})
    frame_counts(cp, 0, topic, 0, 0, 100)
    frame_counts(cp, 0, topic, 1, 0, 50)
    sink.commit_batch(cfg, [sink.write_rows_partition(cfg, plan, iter([frame_rows(topic, 0, list(range(100))),
                                                                       frame_rows(topic, 1, list(range(50)))]), 0)],
                      0, frames=True)
    mark_done(cp, 0)

    # batch 1: [100, 150) keeps 100..139, [50, 80) keeps nothing; the driver dies before the index row
    write_offsets(cp, 1, {topic: {"0": 150, "1": 80}})

    def write_1() -> list[sink.BigQueryCommitMessage]:
        frame_counts(cp, 1, topic, 0, 100, 150)
        frame_counts(cp, 1, topic, 1, 50, 80)
        return [sink.write_rows_partition(cfg, plan, iter([frame_rows(topic, 0, list(range(100, 140)))]), 1)]

    with monkeypatch.context() as m:
        m.setattr(bigquery_ledger, "record_batch", lambda *a, **k: False)
        sink.commit_batch(cfg, write_1(), 1, frames=True)
    assert table_counts(cfg) == (190, 190)
    # BigQuery alone: the data table ends inside batch 1 (140; 50 on partition 1), the index at batch 0's end
    assert bigquery_ledger.resume_offsets(cfg.sink, cfg.handoff_id) == {topic: {0: 140, 1: 50}}
    point = ckpt.resume_point(cfg.checkpoint_location)
    assert point.pending_batch == 1
    table_only = sink._table_end(cfg)
    assert checkpoint_problems(point, table_only, {}), "without the pending batch's check the start would discard"

    # the start: the pending batch is in the table, so the table ends at its end and the checkpoint agrees
    assert sink.ledger_end(cfg) == {(topic, 0): 150, (topic, 1): 80}
    sink._known_committed.clear()
    start = prepare_start(cfg, registry.get("bigquery"), echo=lambda line: None)
    assert start.discarded is None and (cp / "offsets" / "1").exists()

    # Spark re-runs batch 1: the same rows, the commit skips it and writes the missing index row
    r1 = sink.commit_batch(cfg, write_1(), 1, frames=True)
    assert r1.skipped and table_counts(cfg) == (190, 190)
    commits = bigquery_ledger.list_commits(cfg.sink, cfg.handoff_id)
    assert [(c.batch_id, c.offsets[topic]) for c in commits] == [(1, {0: (100, 150), 1: (50, 80)}),
                                                                 (0, {0: (0, 100), 1: (0, 50)})]
    assert (commits[0].rows, commits[0].dropped_rows, commits[0].late_rows) == (40, 40, 0)
    assert bigquery_ledger.resume_offsets(cfg.sink, cfg.handoff_id) == {topic: {0: 150, 1: 80}}


def test_an_old_ledger_table_grows_the_late_and_dropped_columns(bigquery, tmp_path):
    cfg, ref = old_ledger_table(bigquery, tmp_path, without=("late_rows", "dropped_rows"))
    client = bigquery.bq_client()
    ms = int(time.time() * 1000)
    assert bigquery_ledger.record_batch(cfg, 0, {"orders": {"0": [0, 5]}}, 5, 0, ms, ms * 1000)
    assert bigquery_ledger.record_batch(cfg, 1, {"orders": {"0": [5, 20]}}, 4, 3, ms, ms * 1000 + 1,
                                        late_rows=3, dropped_rows=8)
    names = [f.name for f in client.get_table(ref).schema]
    assert names[-2:] == ["late_rows", "dropped_rows"]
    assert [f.mode for f in client.get_table(ref).schema][-2:] == ["NULLABLE", "NULLABLE"]
    commits = bigquery_ledger.list_commits(cfg.sink, "ns/orders")
    assert [(c.batch_id, c.late_rows, c.dropped_rows) for c in commits] == [(1, 3, 8), (0, None, None)]


def test_rows_bigquery_refuses_are_row_dead_letters_behind_rows_the_sink_refused(bigquery, kafka, tmp_path):
    """BigQuery's own row errors on the rows path (the test bed's fault proxy refuses a request holding a row whose
    region starts with REJECT, as BigQuery would): each refused row is one dead letter whose value is that row, found
    by position past the rows the sink itself dead-lettered earlier in the same chunk (null required ids)."""
    from handoff_testbed.bq_fault_proxy import BigQueryWriteFaultProxy, row_error_message

    topic, dlq = "bq-rows-row-errors", "bq-rows-row-errors-dlq"
    kafka.create_topic(topic, partitions=1)
    kafka.create_topic(dlq, partitions=1)
    proxy = BigQueryWriteFaultProxy(bigquery.grpc_endpoint).start()
    try:
        cfg = bq_config(tmp_path, bigquery, kafka.bootstrap, topic, deadLetterTopic=dlq,
                        sink={"grpcEndpoint": proxy.endpoint, "maxRowsPerRequest": 20})
        plan = sink.prepare(cfg)
        cp = tmp_path / "checkpoint"
        write_offsets(cp, 0, {topic: {"0": 120}}, initial={topic: {"0": 0}})
        frame_counts(cp, 0, topic, 0, 0, 120)
        offsets = list(range(120))
        rows = frame_rows(topic, 0, offsets, null_id={4, 9, 33})
        refused = {17, 50, 51, 118}
        region = rows.column(rows.schema.get_field_index("region")).to_pylist()
        rows = rows.set_column(rows.schema.get_field_index("region"), "region",
                               pa.array([f"REJECT-{o}" if o in refused else r for o, r in zip(offsets, region)]))
        (msg,) = [sink.write_rows_partition(cfg, plan, iter([rows]), 0)]
        assert (msg.rows, msg.dlq_rows) == (113, 7)
        r0 = sink.commit_batch(cfg, [msg], 0, frames=True)
        assert (r0.rows, r0.dlq_rows, r0.records) == (113, 7, 120) and table_counts(cfg) == (113, 113)
        (c0,) = bigquery_ledger.list_commits(cfg.sink, cfg.handoff_id)
        assert (c0.dlq_rows, c0.dropped_rows) == (7, 0)
        seen: dict[int, tuple[str, dict[str, Any]]] = {}
        for m in read_dead_letters(kafka.bootstrap, dlq, 7):
            h = {k: v.decode() for k, v in m.headers()}
            assert h["handoff.value"] == "row-json"
            row = json.loads(m.value())
            assert row["_kafka_offset"] == int(h["handoff.source.offset"])
            seen[row["_kafka_offset"]] = (h["handoff.reason"], row)
            if h["handoff.reason"] == "rejected-by-bigquery":
                assert row_error_message("region", row["region"]) in h["handoff.error"]
        assert {o: reason for o, (reason, _) in seen.items()} == {
            **{o: "missing-required" for o in (4, 9, 33)}, **{o: "rejected-by-bigquery" for o in refused}}
        assert all(seen[o][1]["region"] == f"REJECT-{o}" for o in refused)
    finally:
        proxy.stop()
