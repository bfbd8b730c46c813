"""The table's ledger is the truth, the checkpoint a cache: drills with real Kafka, a real SQLite Iceberg catalog
and the real app process. Each ends with rows == distinct (partition, offset) == produced.

Before the ledger decided where a query starts, every one of these duplicated or lost data: a new, empty
checkpoint re-read the topic from `startingOffsets` (20,000 rows for 10,000 records), a checkpoint of another
table skipped everything it had seen, and a checkpoint ahead of a rolled-back table skipped the discarded range.
"""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from handoff_spark import checkpoint as ckpt
from handoff_spark.iceberg import ledger
from handoff_spark.iceberg.sink import open_table

from iceberg_drill_support import (REPO, assert_exactly_once, drill_config, end_offsets, produce, run_app,
                                   run_to_completion)

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]


def _log(run) -> str:
    return run.log.read_text()


def test_checkpoint_lost_mid_stream_resumes_from_the_ledger(kafka, tmp_path):
    topic = "resume-lost"
    kafka.create_topic(topic, partitions=3)
    cfg = drill_config(tmp_path, kafka.bootstrap, topic)
    n = produce(kafka.bootstrap, topic, range(2400))
    first = run_app(tmp_path, kill_after_commits=2, cfg=cfg)
    assert first.returncode == -9
    committed = ledger.resume_offsets(open_table(cfg, create=False), handoff_id=cfg.handoff_id)
    assert committed  # something landed before the kill
    shutil.rmtree(tmp_path / "checkpoint")  # a lost PVC
    n += produce(kafka.bootstrap, topic, range(2400, 2700))
    run_to_completion(tmp_path, max_runs=1)
    # the restarted driver's fresh checkpoint started where the table's ledger ended, not at startingOffsets: its
    # query's first batch (batch 0 of a new query id) starts there
    table = open_table(cfg, create=False)
    commits = ledger.list_commits(table, cfg.handoff_id)
    first_query = commits[-1].query_id
    restarted = [c for c in commits if c.query_id != first_query]
    assert restarted and restarted[-1].batch_id == 0
    assert {t: {p: se[0] for p, se in parts.items()} for t, parts in restarted[-1].offsets.items()} == committed
    assert ckpt.initial_offsets(cfg.checkpoint_location) == {
        (t, p): off for t, parts in committed.items() for p, off in parts.items()}
    assert_exactly_once(cfg, kafka.bootstrap, n, topic)


def test_checkpoint_location_changed_by_a_spec_change(kafka, tmp_path):
    topic = "resume-moved"
    kafka.create_topic(topic, partitions=2)
    cfg = drill_config(tmp_path, kafka.bootstrap, topic)
    n = produce(kafka.bootstrap, topic, range(1000))
    run_to_completion(tmp_path, max_runs=1)
    # the new generation of the spec points at another checkpoint location (empty)
    cfg = drill_config(tmp_path, kafka.bootstrap, topic, checkpointLocation=str(tmp_path / "checkpoint-v2"))
    n += produce(kafka.bootstrap, topic, range(1000, 1600))
    run_to_completion(tmp_path, max_runs=1)
    table = assert_exactly_once(cfg, kafka.bootstrap, n, topic)
    # two checkpoints, two Spark query ids, one unbroken ledger
    assert len({c.query_id for c in ledger.list_commits(table)}) == 2


def test_checkpoint_of_another_table_is_discarded(kafka, tmp_path):
    topic = "resume-other-table"
    kafka.create_topic(topic, partitions=2)
    drill_config(tmp_path, kafka.bootstrap, topic)
    n = produce(kafka.bootstrap, topic, range(900))
    run_to_completion(tmp_path, max_runs=1)
    # same checkpoint, a new (empty) table: the checkpoint says "all read", the new table's ledger says "nothing"
    cfg = drill_config(tmp_path, kafka.bootstrap, topic,
                       sink={"kind": "iceberg", "catalogName": "drill",
                             "catalogProperties": {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
                                                   "warehouse": f"file://{tmp_path}/warehouse"},
                             "table": "drills.other_table", "commitRetries": 3})
    runs = run_to_completion(tmp_path, max_runs=1)
    assert "disagrees with the table's ledger and is discarded" in _log(runs[0])
    assert_exactly_once(cfg, kafka.bootstrap, n, topic)


def test_rolled_back_table_wins_over_the_checkpoint(kafka, tmp_path):
    topic = "resume-rollback"
    kafka.create_topic(topic, partitions=2)
    cfg = drill_config(tmp_path, kafka.bootstrap, topic, max_records=300)
    n = produce(kafka.bootstrap, topic, range(1500))
    run_to_completion(tmp_path, max_runs=1)
    table = open_table(cfg, create=False)
    commits = ledger.list_commits(table, cfg.handoff_id)
    assert len(commits) >= 4
    target = commits[2]  # drop the newest two batches
    table.manage_snapshots().rollback_to_snapshot(target.snapshot_id).commit()
    runs = run_to_completion(tmp_path, max_runs=1)
    log = _log(runs[0])
    assert "disagrees with the table's ledger and is discarded" in log
    assert "the table's ledger ends at" in log
    assert_exactly_once(cfg, kafka.bootstrap, n, topic)


def test_recreated_topic_is_refused_until_accepted(kafka, tmp_path):
    topic = "resume-recreated"
    kafka.create_topic(topic, partitions=1)
    cfg = drill_config(tmp_path, kafka.bootstrap, topic)
    produce(kafka.bootstrap, topic, range(500))
    run_to_completion(tmp_path, max_runs=1)
    table = open_table(cfg, create=False)
    old = ledger.latest_commit(table, cfg.handoff_id)
    assert old.kafka_cluster_id and old.topic_ids and old.topic_ids.get(topic)
    kafka.recreate_topic(topic, partitions=1)
    produce(kafka.bootstrap, topic, range(500, 700))  # offsets 0..199 of the new topic
    refused = run_app(tmp_path, cfg=cfg)
    assert refused.returncode != 0
    assert "the topic was deleted and recreated" in _log(refused)
    assert len(open_table(cfg, create=False).scan().to_arrow()) == 500  # nothing re-read, nothing skipped

    manifest = tmp_path / "sth.yaml"
    manifest.write_text(_manifest_for(cfg))
    accept = subprocess.run([sys.executable, "-m", "handoff_operator.cli", "ledger", "accept-kafka", "-f",
                             str(manifest), "--checkpoint", cfg.checkpoint_location],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert accept.returncode == 0, accept.stderr
    assert "recorded epoch snapshot" in accept.stdout
    run_to_completion(tmp_path, max_runs=1)
    table = open_table(cfg, create=False)
    assert len(table.scan().to_arrow()) == 700
    newest = ledger.list_commits(table, cfg.handoff_id)
    assert [c.kind for c in newest[:2]] == [ledger.BATCH, ledger.EPOCH]
    assert newest[0].offsets[topic][0] == (0, 200)
    assert ledger.resume_offsets(table)[topic] == end_offsets(kafka.bootstrap, topic)


def _manifest_for(cfg) -> str:
    """A StreamTableHandoff manifest whose rendered app config reads the same topic into the same table."""
    import yaml

    sink = cfg.sink
    ns, name = cfg.handoff_id.split("/")
    return yaml.safe_dump({
        "apiVersion": "handoff.io/v1alpha1", "kind": "StreamTableHandoff",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"source": {"bootstrapServers": cfg.source.bootstrap_servers, "topics": list(cfg.source.topics)},
                 "sink": {"iceberg": {"catalog": {"name": sink.catalog_name, "properties": sink.catalog_properties},
                                      "table": sink.table}},
                 "schema": {"columns": [c.model_dump(by_alias=True, exclude_none=True)
                                        for c in cfg.schema_.columns]}}})


def _backfill(tmp_path, query, start, end):
    import json
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "spark_app"), str(REPO / "hack")]),
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    return subprocess.run([sys.executable, "-m", "handoff_spark", "backfill", "--config", str(tmp_path / "app.json"),
                           "--query", query, "--from", json.dumps(start), "--to", json.dumps(end)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)


def test_gap_keeps_the_stream_going_and_backfill_fills_it_once(kafka, tmp_path):
    """A rollback that must not bring the data back records a gap; the stream goes on where it was (its
    checkpoint agrees with the ledger again); a Backfill of the gap writes it once, under its own query, and
    the stream's position and consumer group do not move. A backfill over what the table holds is refused."""
    from handoff_spark.kafka.offsets import committed_group_offsets

    topic = "resume-gap-backfill"
    kafka.create_topic(topic, partitions=1)
    cfg = drill_config(tmp_path, kafka.bootstrap, topic, max_records=250)
    n = produce(kafka.bootstrap, topic, range(1000))
    run_to_completion(tmp_path, max_runs=1)
    table = open_table(cfg, create=False)
    commits = ledger.list_commits(table, cfg.handoff_id)
    target = commits[2]
    lo, hi = target.end_offsets[topic][0], commits[0].end_offsets[topic][0]
    table.manage_snapshots().rollback_to_snapshot(target.snapshot_id).commit()
    ledger.record_gap(open_table(cfg, create=False), cfg.handoff_id, cfg.query_name, {topic: {"0": [lo, hi]}},
                      "test: bad data discarded")
    n += produce(kafka.bootstrap, topic, range(1000, 1100))
    runs = run_to_completion(tmp_path, max_runs=1)
    assert "discarded" not in _log(runs[0])  # the gap made the ledger agree with the checkpoint
    rows = open_table(cfg, create=False).scan().to_arrow()
    assert rows.num_rows == n - (hi - lo)
    assert not set(rows["_kafka_offset"].to_pylist()) & set(range(lo, hi))

    refused = _backfill(tmp_path, "backfill-overlap", {topic: {"0": 0}}, {topic: {"0": hi}})
    assert refused.returncode == 2 and "are already in the table" in refused.stderr, refused.stderr[-2000:]
    done = _backfill(tmp_path, "backfill-gap", {topic: {"0": lo}}, {topic: {"0": hi}})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = assert_exactly_once_rows(cfg, n)
    newest = ledger.list_commits(table, cfg.handoff_id)[0]
    assert newest.query == "backfill-gap"
    stream_end = ledger.resume_offsets(table, handoff_id=cfg.handoff_id, query=cfg.query_name)
    assert stream_end[topic] == end_offsets(kafka.bootstrap, topic)
    assert committed_group_offsets(kafka.bootstrap, cfg.consumer_group, [(topic, 0)]) == \
        {topic: end_offsets(kafka.bootstrap, topic)}


def assert_exactly_once_rows(cfg, produced):
    table = open_table(cfg, create=False)
    data = table.scan(selected_fields=("_kafka_partition", "_kafka_offset")).to_arrow()
    assert data.num_rows == produced
    assert len(set(zip(data["_kafka_partition"].to_pylist(), data["_kafka_offset"].to_pylist()))) == produced
    return table


def test_a_handoff_started_at_latest_records_its_start_and_its_history_backfills_once(kafka, tmp_path):
    """`startingOffsets: latest` on a topic with history: the driver's first batch reads nothing, and the table's
    ledger (the truth) records where each partition started without claiming the history (a snapshot without
    data). A driver that then loses its checkpoint resumes there, not at a later end: the records produced in
    between are read. The history then backfills once (what examples/replay-backfill.yaml describes)."""
    topic = "resume-latest-start"
    kafka.create_topic(topic, partitions=2)
    cfg = drill_config(tmp_path, kafka.bootstrap, topic, source={
        "bootstrapServers": kafka.bootstrap, "topics": [topic], "maxRecordsPerBatch": 400,
        "startingOffsets": "latest"})
    history = produce(kafka.bootstrap, topic, range(600))
    start = end_offsets(kafka.bootstrap, topic)
    run_to_completion(tmp_path, max_runs=1)
    table = open_table(cfg, create=False)
    assert table.scan().to_arrow().num_rows == 0
    assert ledger.resume_offsets(table, handoff_id=cfg.handoff_id)[topic] == start
    assert not [c for c in ledger.list_commits(table, cfg.handoff_id) for se in c.offsets.get(topic, {}).values()
                if se[1] > se[0]], "no entry claims the history"

    shutil.rmtree(tmp_path / "checkpoint")  # a lost PVC: the next driver starts from the ledger
    n = produce(kafka.bootstrap, topic, range(600, 700))
    run_to_completion(tmp_path, max_runs=1)
    rows = open_table(cfg, create=False).scan(selected_fields=("id",)).to_arrow()["id"].to_pylist()
    assert sorted(rows) == list(range(600, 700)), "read from the recorded start, not from a later latest"

    done = _backfill(tmp_path, "backfill-history", {topic: {str(p): 0 for p in start}},
                     {topic: {str(p): o for p, o in start.items()}})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert_exactly_once_rows(cfg, history + n)
