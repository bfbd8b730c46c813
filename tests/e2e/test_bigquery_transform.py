"""Spark carries the records into BigQuery (issue 31): the SQL transform, the business-key dedupe and event time on
the DataFrame path (`sink.frames` → `driver.transform` → the BigQuery rows writer, `rows=true`), through the real
driver process, the real broker and the BigQuery emulator, kill -9 included.

Every drill ends exact, read from BigQuery alone: the table holds each produced order that passes the filter and is
not late exactly once (no business-key duplicate), the late ones are dead letters with reason `late`, the ledger
index covers the topic from its start to its end without a gap or an overlap, and its counts add up (rows + dead
letters + dropped == records produced)."""
from __future__ import annotations

from typing import Any

import pytest

from handoff_spark.bigquery import client as bigquery_client, ledger as bigquery_ledger

from bq_drill_support import bq_drill_config, run_bq_to_completion
from iceberg_drill_support import end_offsets
from transform_drill_support import (COLUMNS, POISON_IDS, POISON_SQL, SQL, dead_letters, first_phase, order,
                                     poisoned_orders, produce)

pytestmark = [pytest.mark.e2e, pytest.mark.kafka, pytest.mark.bigquery]


def config(tmp_path, bigquery, kafka, topic: str, max_records: int = 300, **over: Any):
    kafka.create_topic(topic + "-dlq", partitions=1)
    fields: dict[str, Any] = {"transform": {"sql": SQL}, "dedupe": {"keys": ["id"], "withinSeconds": 3600},
                              "eventTime": {"column": "ts", "watermarkSeconds": 3600}, **over}
    return bq_drill_config(tmp_path, bigquery, kafka.bootstrap, topic, max_records=max_records,
                           schema={"columns": COLUMNS, "onIncompatible": "halt"}, deadLetterTopic=topic + "-dlq",
                           **{k: v for k, v in fields.items() if v is not None})


def check_table(cfg, kafka, topic: str, expected_ids: set[int], produced: int) -> list[bigquery_ledger.Commit]:
    client = bigquery_client.rest_client(cfg.sink)
    ref = bigquery_client.table_ref(cfg.sink)
    data = list(client.query(f"SELECT id, customer FROM `{ref}`", retry=None).result())
    ids = [int(r["id"]) for r in data]
    assert len(ids) == len(set(ids)), "a business-key duplicate reached the table"
    assert set(ids) == expected_ids
    assert {r["customer"] for r in data} <= {f"C{k}" for k in range(7)}  # the SQL's derived column
    ends = end_offsets(kafka.bootstrap, topic)
    assert bigquery_ledger.resume_offsets(cfg.sink, cfg.handoff_id)[topic] == ends
    commits = bigquery_ledger.list_commits(cfg.sink, cfg.handoff_id)
    covered = {p: 0 for p in ends}
    for c in reversed(commits):  # oldest first: the index tiles the topic
        for p, (start, end) in c.offsets.get(topic, {}).items():
            assert start == covered[p], f"ledger index gap or overlap at partition {p}: {start} != {covered[p]}"
            covered[p] = end
    assert covered == ends
    rows = sum(c.rows for c in commits)
    dlq = sum(c.dlq_rows for c in commits)
    dropped = sum(c.dropped_rows or 0 for c in commits)
    assert all(c.dropped_rows is not None and c.late_rows is not None for c in commits), commits
    assert rows == len(ids)
    assert rows + dlq + dropped == produced, (rows, dlq, dropped, produced)
    return commits


def test_transform_dedupe_and_late_records_into_bigquery_with_a_kill9(kafka, bigquery, tmp_path):
    topic = "bqtx-orders"
    kafka.create_topic(topic, partitions=2)
    cfg = config(tmp_path, bigquery, kafka, topic)
    phase1 = first_phase(1200)
    produce(kafka.bootstrap, topic, phase1)
    runs = run_bq_to_completion(tmp_path, cfg, kill_after_commits=2)
    assert runs[0].returncode == -9 and runs[-1].returncode == 0
    # late: 40 new orders ten hours older than the newest; duplicates of recent orders, newer than the first copy
    late = [order(5000 + i, 1200 - 600 - i) for i in range(40)]
    fresh = [order(1200 + i, 1200 + i) for i in range(100)]
    again = [order(i, 1050 + i) for i in range(1150, 1200)]  # re-sent within the hour's window: dropped
    produce(kafka.bootstrap, topic, late + fresh + again)
    run_bq_to_completion(tmp_path, cfg, max_runs=1)
    produced = len(phase1) + len(late) + len(fresh) + len(again)
    expected = {i for i in range(1300) if i % 20 >= 5}
    commits = check_table(cfg, kafka, topic, expected, produced)
    assert sum(c.late_rows or 0 for c in commits) == 40
    dead = dead_letters(kafka.bootstrap, topic + "-dlq")
    assert sorted(o["id"] for o, _ in dead) == [5000 + i for i in range(40)]
    assert {reason for _, reason in dead} == {"late"}


def test_a_crash_after_the_data_commit_of_a_batch_whose_tail_was_filtered_resumes_exactly(kafka, bigquery, tmp_path):
    """Every batch's last records are filtered out, so the data table ends inside the batch and only the ledger
    index row says where it ended. kill -9 right after batch 1's BigQuery commit, before that row: the restart keeps
    the checkpoint (the table's pending batch is found in the data), Spark re-runs batch 1, the commit skips it and
    writes the index row, and the ledger index ends exactly at the topic's end, without a gap."""
    topic = "bqtx-filtered-tail"
    kafka.create_topic(topic, partitions=1)
    cfg = config(tmp_path, bigquery, kafka, topic, max_records=100, dedupe=None, eventTime=None)
    orders = [{**order(i, i), "amount": 0.0 if i % 100 >= 90 else 10.0} for i in range(500)]
    produce(kafka.bootstrap, topic, orders)
    marker = tmp_path / "fault-fired"
    runs = run_bq_to_completion(tmp_path, cfg,
                                env={"HANDOFF_FAULT": f"crash-after-table-commit:batch=1,once={marker}"})
    assert marker.exists() and runs[0].returncode == -9 and runs[-1].returncode == 0
    rerun = runs[1].log.read_text()
    assert "disagrees with the table's ledger" not in rerun, rerun[-3000:]
    assert "already committed (replay skipped)" in rerun
    commits = check_table(cfg, kafka, topic, {i for i in range(500) if i % 100 < 90}, len(orders))
    assert [c.offsets[topic][0] for c in reversed(commits)] == [(b * 100, b * 100 + 100) for b in range(5)]
    assert all(c.dropped_rows == 10 and c.rows == 90 for c in commits)


def test_a_lost_checkpoint_keeps_the_dedupe_window_in_bigquery(kafka, bigquery, tmp_path):
    """As on Iceberg (tests/e2e/test_transform.py): the checkpoint, and Spark's dedupe state in it, gone; the driver
    rebuilds the window from the records the ledger index says are within it (seed batches, nothing written), so a
    key re-sent within the window is still dropped and the index stays contiguous."""
    import shutil

    topic = "bqtx-lost-checkpoint"
    kafka.create_topic(topic, partitions=2)
    cfg = config(tmp_path, bigquery, kafka, topic)
    phase1 = first_phase(600)
    produce(kafka.bootstrap, topic, phase1)
    run_bq_to_completion(tmp_path, cfg, max_runs=1)
    shutil.rmtree(cfg.checkpoint_location)
    again = [order(i, 50 + i) for i in range(550, 600)]  # re-sent 50 minutes after the first copy: in the window
    fresh = [order(600 + i, 600 + i) for i in range(50)]
    produce(kafka.bootstrap, topic, again + fresh)
    runs = run_bq_to_completion(tmp_path, cfg, max_runs=1)
    check_table(cfg, kafka, topic, {i for i in range(650) if i % 20 >= 5}, len(phase1) + len(again) + len(fresh))
    assert "dedupe window rebuilt from Kafka" in runs[0].log.read_text()


def test_bad_sql_refuses_the_start_in_one_line_and_writes_nothing_to_bigquery(kafka, bigquery, tmp_path):
    """As on Iceberg: a SQL that does not plan is refused before any record is read, in one line naming the field
    (the operator's `TransformInvalid` condition carries it), and neither the table nor the ledger index changes."""
    from bq_drill_support import run_bq_app

    topic = "bqtx-bad-sql"
    kafka.create_topic(topic, partitions=1)
    cfg = config(tmp_path, bigquery, kafka, topic, transform={"sql": "SELECT id, nope FROM source"})
    produce(kafka.bootstrap, topic, [order(i, i) for i in range(50)])
    run = run_bq_app(tmp_path, cfg, timeout=180)
    assert run.returncode == 3
    text = run.log.read_text()
    lines = [line for line in text.splitlines() if line.startswith("TransformInvalid:")]
    assert len(lines) == 1 and lines[0].startswith("TransformInvalid: spec.transform.sql:") and "nope" in lines[0]
    assert "Traceback" not in text and "Py4JJavaError" not in text
    assert bigquery_ledger.list_commits(cfg.sink, cfg.handoff_id) == []
    client = bigquery_client.rest_client(cfg.sink)
    rows = list(client.query(f"SELECT COUNT(*) AS n FROM `{bigquery_client.table_ref(cfg.sink)}`", retry=None).result())
    assert rows[0]["n"] == 0


def test_a_record_the_sql_fails_on_is_a_dead_letter_in_bigquery_and_the_stream_goes_on(kafka, bigquery, tmp_path):
    """As on Iceberg: under ANSI SQL a malformed value fails the cast, so the batch; the driver finds the record,
    sends it to the dead letters with reason `transform-error`, starts the query again, and every other order is in
    BigQuery once, the ledger index contiguous and its counts adding up."""
    topic = "bqtx-poison"
    kafka.create_topic(topic, partitions=2)
    cfg = config(tmp_path, bigquery, kafka, topic, transform={"sql": POISON_SQL})
    orders = poisoned_orders(600)
    produce(kafka.bootstrap, topic, orders)
    runs = run_bq_to_completion(tmp_path, cfg, max_runs=1)
    log = runs[0].log.read_text()
    assert "the transform failed on" in log and "restarted after a quarantine" in log, log[-3000:]
    check_table(cfg, kafka, topic, {i for i in range(600) if i % 20 >= 5} - POISON_IDS, len(orders))
    dead = dead_letters(kafka.bootstrap, topic + "-dlq")
    assert sorted(o["id"] for o, _ in dead) == sorted(POISON_IDS)
    assert {reason for _, reason in dead} == {"transform-error"}
