"""Spark carries the records (issue 31): a SQL transform, a business-key dedupe and event time, run by Spark on the
DataFrame path (`sink.frames` → `driver.transform` → the Iceberg rows writer), on the real broker and the real
driver process, kill -9 included.

Every drill ends exact: the table holds each produced order that passes the filter and is not late exactly once
(no business-key duplicate), the late ones are dead letters with reason `late`, the ledger's ranges end at the
topic's end, and its counts add up (rows + dead letters + dropped == records read)."""
from __future__ import annotations

from typing import Any

import pytest

from handoff_spark.iceberg import ledger
from handoff_spark.iceberg.sink import open_table

from iceberg_drill_support import drill_config, end_offsets, run_app, run_to_completion
from transform_drill_support import COLUMNS, SQL, dead_letters, first_phase, order, produce

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]


def config(tmp_path, kafka, topic: str, **over: Any):
    kafka.create_topic(topic + "-dlq", partitions=1)
    fields: dict[str, Any] = {"transform": {"sql": SQL}, "dedupe": {"keys": ["id"], "withinSeconds": 3600},
                              "eventTime": {"column": "ts", "watermarkSeconds": 3600}, **over}
    return drill_config(tmp_path, kafka.bootstrap, topic, columns=COLUMNS, max_records=300,
                        deadLetterTopic=topic + "-dlq", **fields)


def check_table(cfg, kafka, topic: str, expected_ids: set[int], produced: int) -> list[Any]:
    table = open_table(cfg, create=False)
    data = table.scan().to_arrow()
    ids = data["id"].to_pylist()
    assert len(ids) == len(set(ids)), "a business-key duplicate reached the table"
    assert set(ids) == expected_ids
    assert set(data["customer"].to_pylist()) <= {f"C{k}" for k in range(7)}  # the SQL's derived column
    commits = ledger.list_commits(table)
    assert commits[0].end_offsets[topic] == end_offsets(kafka.bootstrap, topic)
    props = [table.snapshot_by_id(c.snapshot_id).summary.additional_properties for c in commits]
    rows = sum(int(p["handoff.rows"]) for p in props)
    dlq = sum(int(p["handoff.dlq-rows"]) for p in props)
    dropped = sum(int(p["handoff.dropped-rows"]) for p in props)
    assert rows == len(ids)
    assert rows + dlq + dropped == produced, (rows, dlq, dropped, produced)
    return props


def test_transform_dedupe_and_late_records_through_spark_with_a_kill9(kafka, tmp_path):
    topic = "tx-orders"
    kafka.create_topic(topic, partitions=2)
    cfg = config(tmp_path, kafka, topic)
    phase1 = first_phase(1200)
    produce(kafka.bootstrap, topic, phase1)
    runs = run_to_completion(tmp_path, kill_after_commits=2, cfg=cfg)
    assert runs[0].returncode == -9 and runs[-1].returncode == 0
    log = "".join(r.log.read_text() for r in runs)
    assert "bootstrap" not in [line.split()[0] for line in log.splitlines() if line.strip()]  # Spark's batches only
    # late: 40 new orders ten hours older than the newest; duplicates of recent orders, newer than the first copy
    late = [order(5000 + i, 1200 - 600 - i) for i in range(40)]
    fresh = [order(1200 + i, 1200 + i) for i in range(100)]
    again = [order(i, 1050 + i) for i in range(1150, 1200)]  # re-sent within the hour's window: dropped
    produce(kafka.bootstrap, topic, late + fresh + again)
    run_to_completion(tmp_path, max_runs=1)
    produced = len(phase1) + len(late) + len(fresh) + len(again)
    expected = {i for i in range(1300) if i % 20 >= 5}
    check_table(cfg, kafka, topic, expected, produced)
    dead = dead_letters(kafka.bootstrap, topic + "-dlq")
    assert sorted(o["id"] for o, _ in dead) == [5000 + i for i in range(40)]
    assert {reason for _, reason in dead} == {"late"}


def test_bad_sql_refuses_the_start_in_one_line_and_writes_nothing(kafka, tmp_path):
    topic = "tx-bad-sql"
    kafka.create_topic(topic, partitions=1)
    cfg = config(tmp_path, kafka, topic, transform={"sql": "SELECT id, nope FROM source"})
    produce(kafka.bootstrap, topic, [order(i, i) for i in range(50)])
    run = run_app(tmp_path, cfg=cfg, timeout=180)
    assert run.returncode == 3
    text = run.log.read_text()
    lines = [line for line in text.splitlines() if line.startswith("TransformInvalid:")]
    assert len(lines) == 1 and lines[0].startswith("TransformInvalid: spec.transform.sql:") and "nope" in lines[0]
    assert "Traceback" not in text and "Py4JJavaError" not in text  # a user's mistake is one line
    table = open_table(cfg, create=False)
    assert table.current_snapshot() is None


def test_a_transform_missing_the_kafka_columns_is_refused_with_the_fix(kafka, tmp_path):
    topic = "tx-no-kafka-cols"
    kafka.create_topic(topic, partitions=1)
    cfg = config(tmp_path, kafka, topic, transform={"sql": "SELECT id, ts, customer, amount, region FROM source"})
    run = run_app(tmp_path, cfg=cfg, timeout=180)
    assert run.returncode == 3
    lines = [line for line in run.log.read_text().splitlines() if line.startswith("TransformInvalid:")]
    assert len(lines) == 1 and "lacks _kafka_topic" in lines[0] and "SELECT *" in lines[0], lines
