"""Exactly-once drills of the Iceberg sink with real Kafka and the real app process (kill -9 included).

Each drill ends with the same invariants (iceberg_drill_support.assert_exactly_once): row count == records
produced, distinct (topic, partition, offset) == row count, the last ledger commit ends at the topic's end
offsets, no orphan data files.
"""
from __future__ import annotations

import pytest

from handoff_spark.iceberg import ledger
from handoff_spark.kafka.offsets import committed_group_offsets

from iceberg_drill_support import (assert_exactly_once, drill_config, end_offsets, produce, run_app,
                                   run_to_completion)

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]


def test_clean_run_then_incremental_run(kafka, tmp_path):
    topic = "ice-clean"
    kafka.create_topic(topic, partitions=3)
    cfg = drill_config(tmp_path, kafka.bootstrap, topic)
    n = produce(kafka.bootstrap, topic, range(1500))
    run_to_completion(tmp_path, max_runs=1)
    table = assert_exactly_once(cfg, kafka.bootstrap, n, topic)
    commits = ledger.list_commits(table)
    # Spark's batches 0, 1, … in order, all of one query: every batch is Spark's
    assert [c.batch_id for c in commits] == list(range(len(commits) - 1, -1, -1))
    assert len({c.query_id for c in commits}) == 1
    n += produce(kafka.bootstrap, topic, range(1500, 1800))
    run_to_completion(tmp_path, max_runs=1)
    assert_exactly_once(cfg, kafka.bootstrap, n, topic)
    # lag tools see the true position: the group offsets equal the table's
    ends = end_offsets(kafka.bootstrap, topic)
    assert committed_group_offsets(kafka.bootstrap, cfg.consumer_group, [(topic, p) for p in ends]) == {topic: ends}


def test_kill9_after_table_commit_before_spark_commit(kafka, tmp_path):
    topic = "ice-crash-after-commit"
    kafka.create_topic(topic, partitions=2)
    # Spark's replay of a landed batch is what this drill is about
    cfg = drill_config(tmp_path, kafka.bootstrap, topic)
    n = produce(kafka.bootstrap, topic, range(1600))
    marker = tmp_path / "fault-fired"
    runs = run_to_completion(tmp_path, env={"HANDOFF_FAULT": f"crash-after-table-commit:batch=2,once={marker}"})
    assert marker.exists() and runs[0].returncode == -9 and len(runs) == 2
    table = assert_exactly_once(cfg, kafka.bootstrap, n, topic)
    # batch 2 was in the table before Spark knew: the replay was skipped, so it appears exactly once
    assert [c.batch_id for c in ledger.list_commits(table)].count(2) == 1


def test_kill9_mid_write(kafka, tmp_path):
    topic = "ice-crash-mid-write"
    kafka.create_topic(topic, partitions=2)
    cfg = drill_config(tmp_path, kafka.bootstrap, topic)
    n = produce(kafka.bootstrap, topic, range(1600))
    marker = tmp_path / "fault-fired"
    # an executor dies right after writing its Parquet files for batch 1: files exist, no commit
    runs = run_to_completion(tmp_path, env={"HANDOFF_FAULT": f"crash-mid-write:batch=1,once={marker}"})
    assert marker.exists() and runs[0].returncode == -9
    assert_exactly_once(cfg, kafka.bootstrap, n, topic)


def test_kill9_at_an_arbitrary_point(kafka, tmp_path):
    topic = "ice-kill9-anywhere"
    kafka.create_topic(topic, partitions=3)
    cfg = drill_config(tmp_path, kafka.bootstrap, topic, max_records=300)
    n = produce(kafka.bootstrap, topic, range(2400))
    first = run_app(tmp_path, kill_after_commits=2, cfg=cfg)
    assert first.returncode == -9
    run_to_completion(tmp_path)
    assert_exactly_once(cfg, kafka.bootstrap, n, topic)


def test_task_failures_are_retried(kafka, tmp_path):
    topic = "ice-task-retry"
    kafka.create_topic(topic, partitions=3)
    cfg = drill_config(tmp_path, kafka.bootstrap, topic)
    n = produce(kafka.bootstrap, topic, range(1200))
    marker = tmp_path / "fault-fired"
    runs = run_to_completion(tmp_path, max_runs=1, env={"HANDOFF_SPARK_MASTER": "local[2,3]",
                                                        "HANDOFF_FAULT": f"fail-task:batch=1,once={marker}"})
    assert marker.exists() and runs[0].returncode == 0  # the retry succeeded inside the same run
    assert_exactly_once(cfg, kafka.bootstrap, n, topic)
