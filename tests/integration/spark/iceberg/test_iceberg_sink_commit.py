"""The Iceberg sink's write/commit/abort path without Spark, against a real SQLite catalog and the real Kafka
broker (for consumer-group offsets): what executors and the driver do for one micro-batch, and what a replay
of the same batch does."""
from __future__ import annotations

import dataclasses

import pytest
from pyiceberg.types import DoubleType, ListType, LongType, MapType, StringType

from handoff_spark.iceberg import ledger, maintenance
from handoff_spark.iceberg.sink import (LedgerMismatchError, SchemaIncompatibleError, abort_batch, commit_batch,
                                        open_table, prepare)
from handoff_spark.iceberg.stream import IcebergStreamWriter
from handoff_spark.kafka.offsets import committed_group_offsets

from sink_support import app_config, raw_batch, record, write_offsets

pytestmark = pytest.mark.kafka


def _write(cfg, *batches):
    w = IcebergStreamWriter(cfg.to_json())
    return [w.write(iter([b])) for b in batches]


def test_commit_records_ledger_skips_replay_and_commits_group_offsets(kafka, tmp_path):
    topic = "sink-commit-1"
    kafka.create_topic(topic, partitions=2)
    cfg = app_config(tmp_path, kafka.bootstrap, topic, partition_by=["day(ts)", "bucket(4, id)", "region"])
    prepare(cfg)
    cp = tmp_path / "checkpoint"
    write_offsets(cp, 0, {topic: {"0": 5, "1": 3}}, initial={topic: {"0": 0, "1": 0}})
    msgs = _write(cfg, raw_batch(topic, 0, 0, [record(i) for i in range(5)]),
                  raw_batch(topic, 1, 0, [record(i) for i in range(100, 103)]))
    r0 = commit_batch(cfg, msgs, 0)
    assert not r0.skipped and r0.rows == 8 and r0.group_offsets_committed
    table = open_table(cfg)
    c = ledger.latest_commit(table, "ns/h1")
    assert c is not None and c.batch_id == 0 and c.offsets == {topic: {0: (0, 5), 1: (0, 3)}}
    assert c.rows == 8 and c.query_id == "11111111-2222-3333-4444-555555555555"
    assert table.scan().to_arrow().num_rows == 8
    # every data file sits in one partition of the (day, bucket, identity) spec
    assert {len(f.file.partition) for f in table.scan().plan_files()} == {3}

    # replay of batch 0 (crash after the table commit, before Spark's commit log): skipped, no new rows
    replay = _write(cfg, raw_batch(topic, 0, 0, [record(i) for i in range(5)]))
    r0b = commit_batch(cfg, replay, 0)
    assert r0b.skipped and r0b.snapshot_id == r0.snapshot_id
    # the skipped replay removed its own files; the committed batch's files are untouched
    table = open_table(cfg)
    assert table.scan().to_arrow().num_rows == 8
    assert maintenance.orphan_files(table) == []
    # abort of a batch that did commit (commit acknowledged as failed) must keep the committed files
    abort_batch(cfg, msgs, 0)
    assert open_table(cfg).scan().to_arrow().num_rows == 8
    # files of a killed attempt are orphans: swept (age 0 here), never a committed file
    killed = _write(cfg, raw_batch(topic, 0, 0, [record(i) for i in range(5)]))
    table = open_table(cfg)
    assert sorted(maintenance.orphan_files(table)) == sorted(
        table.io.parse_location(f.file_path)[2] for m in killed for f in m.files)
    assert maintenance.orphan_files(table, older_than_seconds=3600) == []  # young files are never swept
    maintenance.remove_orphan_files(table, 0)
    assert maintenance.orphan_files(table) == []
    assert table.scan().to_arrow().num_rows == 8

    write_offsets(cp, 1, {topic: {"0": 7, "1": 3}})
    r1 = commit_batch(cfg, _write(cfg, raw_batch(topic, 0, 5, [record(i) for i in range(5, 7)])), 1)
    assert r1.rows == 2
    table = open_table(cfg)
    assert [c.batch_id for c in ledger.list_commits(table)] == [1, 0]
    assert ledger.resume_offsets(table) == {topic: {0: 7, 1: 3}}
    assert committed_group_offsets(kafka.bootstrap, cfg.consumer_group, [(topic, 0), (topic, 1)]) == \
        {topic: {0: 7, 1: 3}}


def test_abort_deletes_only_uncommitted_attempt_files(kafka, tmp_path):
    topic = "sink-abort-1"
    cfg = app_config(tmp_path, kafka.bootstrap, topic)
    prepare(cfg)
    write_offsets(tmp_path / "checkpoint", 0, {topic: {"0": 4}}, initial={topic: {"0": 0}})
    msgs = _write(cfg, raw_batch(topic, 0, 0, [record(i) for i in range(4)]))
    table = open_table(cfg)
    assert len(maintenance.orphan_files(table)) == 1
    abort_batch(cfg, msgs, 0)
    assert maintenance.orphan_files(open_table(cfg)) == []


def test_schema_evolution_adds_optional_column_and_widens(kafka, tmp_path):
    topic = "sink-evolve-1"
    cfg = app_config(tmp_path, kafka.bootstrap, topic, columns=[
        {"name": "id", "type": "int"}, {"name": "region", "type": "string"}])
    prepare(cfg)
    cp = tmp_path / "checkpoint"
    write_offsets(cp, 0, {topic: {"0": 2}}, initial={topic: {"0": 0}})
    commit_batch(cfg, _write(cfg, raw_batch(topic, 0, 0, [b'{"id": 1, "region": "eu"}', b'{"id": 2}'])), 0)
    # two tasks discover different new columns in one batch: the commit adds both, ids reconciled
    write_offsets(cp, 1, {topic: {"0": 4}})
    msgs = _write(cfg, raw_batch(topic, 0, 2, [b'{"id": 3, "note": "x"}']),
                  raw_batch(topic, 0, 3, [b'{"id": 4, "score": 2.5}']))
    commit_batch(cfg, msgs, 1)
    table = open_table(cfg)
    schema = table.schema()
    assert schema.find_field("note").field_type == StringType() and not schema.find_field("note").required
    assert schema.find_field("score").field_type == DoubleType()
    rows = {r["_kafka_offset"]: r for r in table.scan().to_arrow().to_pylist()}
    assert rows[2]["note"] == "x" and rows[3]["score"] == 2.5 and rows[0]["note"] is None
    assert len(rows) == 4
    # the ledger's entries (what `handoff timeline` and `kubectl handoff timeline` read) say what batch 1 changed
    from handoff_spark.ledger import entries
    newest, first = entries(cfg)
    assert newest["batch"] == 1 and first["schemaChange"] is None
    assert newest["schemaChange"] == {"from": first["schemaId"], "to": newest["schemaId"],
                                      "added": ["note string", "score double"], "dropped": [], "changed": []}
    # the declared type widens int → long on restart with a new declared schema
    wider = app_config(tmp_path, kafka.bootstrap, topic, columns=[
        {"name": "id", "type": "long"}, {"name": "region", "type": "string"}])
    prepare(wider)
    assert open_table(wider).schema().find_field("id").field_type == LongType()
    # narrowing back (or a type change) halts with a clear error, the table keeps its type
    narrow = app_config(tmp_path, kafka.bootstrap, topic, columns=[{"name": "region", "type": "long"}])
    with pytest.raises(SchemaIncompatibleError, match="region"):
        prepare(narrow)
    assert maintenance.orphan_files(open_table(cfg)) == []


def test_orphan_sweep_on_s3_keeps_committed_files(kafka, s3, tmp_path):
    """Regression: on S3 the storage listing is `bucket/key`, manifests hold `s3://bucket/key`; a sweep that
    compared them wrongly deleted committed files."""
    import uuid as _uuid
    topic = "sink-s3-sweep"
    bucket = f"sweep-{_uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    cfg = app_config(tmp_path, kafka.bootstrap, topic, warehouse=f"s3://{bucket}/warehouse",
                     extra_catalog=s3.iceberg_properties(), partition_by=["region"])
    prepare(cfg)
    write_offsets(tmp_path / "checkpoint", 0, {topic: {"0": 6}}, initial={topic: {"0": 0}})
    commit_batch(cfg, _write(cfg, raw_batch(topic, 0, 0, [record(i) for i in range(6)])), 0)
    killed = _write(cfg, raw_batch(topic, 0, 0, [record(i) for i in range(6)]))  # never committed
    table = open_table(cfg)
    orphans = maintenance.orphan_files(table)
    assert len(orphans) == len(killed[0].files) == 3
    assert sorted(maintenance.remove_orphan_files(table, 0)) == sorted(orphans)
    table = open_table(cfg)
    assert maintenance.orphan_files(table) == []
    assert table.scan().to_arrow().num_rows == 6  # every committed file is still there


def test_a_batch_commits_only_where_the_ledger_ends(kafka, tmp_path):
    """A zombie driver (its own, older checkpoint) must not commit over what the live one committed, and a
    deliberate gap recorded in the ledger moves where the next batch must start."""
    topic = "sink-contiguity-1"
    kafka.create_topic(topic, partitions=1)
    cfg = app_config(tmp_path, kafka.bootstrap, topic)
    prepare(cfg)
    cp = tmp_path / "checkpoint"
    write_offsets(cp, 0, {topic: {"0": 5}}, initial={topic: {"0": 0}})
    commit_batch(cfg, _write(cfg, raw_batch(topic, 0, 0, [record(i) for i in range(5)])), 0)

    # the zombie: another checkpoint that still thinks the stream is at 0 (new query id, so no replay skip)
    zombie = cfg.model_copy(update={"checkpoint_location": str(tmp_path / "zombie")})
    write_offsets(tmp_path / "zombie", 0, {topic: {"0": 8}}, initial={topic: {"0": 0}},
                  query_id="99999999-2222-3333-4444-555555555555")
    with pytest.raises(LedgerMismatchError, match=r"starts at 0 but the table already holds offsets up to 5"):
        commit_batch(zombie, _write(zombie, raw_batch(topic, 0, 0, [record(i) for i in range(8)])), 0)
    # and a batch that would skip records (starts past the ledger end) is refused too
    write_offsets(cp, 1, {topic: {"0": 12}})
    write_offsets(cp, 2, {topic: {"0": 15}})
    with pytest.raises(LedgerMismatchError, match=r"offsets 5\.\.11 would be skipped"):
        commit_batch(cfg, _write(cfg, raw_batch(topic, 0, 12, [record(i) for i in range(12, 15)])), 2)
    table = open_table(cfg)
    assert table.scan().to_arrow().num_rows == 5

    # unless the gap is recorded on purpose
    gap = ledger.record_gap(table, cfg.handoff_id, cfg.query_name, {topic: {"0": [5, 12]}}, "test: left out")
    r2 = commit_batch(cfg, _write(cfg, raw_batch(topic, 0, 12, [record(i) for i in range(12, 15)])), 2)
    table = open_table(cfg)
    assert not r2.skipped and table.scan().to_arrow().num_rows == 8
    entries = ledger.list_commits(table, cfg.handoff_id)
    assert [(c.kind, c.snapshot_id == gap) for c in entries] == [("batch", False), ("gap", True), ("batch", False)]
    assert ledger.resume_offsets(table, handoff_id=cfg.handoff_id, query=cfg.query_name) == {topic: {0: 15}}
    assert ledger.latest_commit(table, cfg.handoff_id).batch_id == 2
    assert ledger.latest_commit(table, cfg.handoff_id).lost is None

    # offsets retention deleted inside a batch's range (onOffsetOutOfRange=earliest) are named in its entry
    from handoff_spark import checkpoint as ckpt
    ckpt.append_gap(str(cp), {"topic": topic, "partition": 0, "from": 15, "to": 17, "detectedAtMs": 1})
    write_offsets(cp, 3, {topic: {"0": 19}})
    commit_batch(cfg, _write(cfg, raw_batch(topic, 0, 17, [record(i) for i in range(17, 19)])), 3)
    assert ledger.latest_commit(open_table(cfg), cfg.handoff_id).lost == {topic: {0: (15, 17)}}


def test_nested_columns_and_a_nested_field_added_mid_stream(kafka, tmp_path):
    """struct/list/map columns from nested JSON through the real write/commit path; then the declared struct
    gains a field between two batches: the commit adds it inside the struct (older rows read null there)."""
    topic = "sink-nested-1"
    kafka.create_topic(topic, partitions=1)
    columns = [{"name": "id", "type": "long"}, {"name": "addr", "type": "struct<city:string,geo:list<double>>"},
               {"name": "tags", "type": "map<string,long>"}, {"name": "seen", "type": "timestamptz"}]
    cfg = app_config(tmp_path, kafka.bootstrap, topic, columns=columns)
    prepare(cfg)
    cp = tmp_path / "checkpoint"
    write_offsets(cp, 0, {topic: {"0": 2}}, initial={topic: {"0": 0}})
    commit_batch(cfg, _write(cfg, raw_batch(topic, 0, 0, [
        b'{"id": 1, "addr": {"city": "Oslo", "geo": [59.9, 10.7]}, "tags": {"a": 1}, "seen": "2026-01-01T00:00:00Z"}',
        b'{"id": 2, "addr": {"city": "Bergen", "zip": "5003"}}'])), 0)
    schema = open_table(cfg).schema()
    assert isinstance(schema.find_type("addr.geo"), ListType) and isinstance(schema.find_type("tags"), MapType)
    wider = app_config(tmp_path, kafka.bootstrap, topic, columns=[
        columns[0], {"name": "addr", "type": "struct<city:string,geo:list<double>,zip:string>"}, *columns[2:]])
    write_offsets(cp, 1, {topic: {"0": 3}})
    # no prepare(): the write task meets the new nested field first and plans it; the commit adds it
    commit_batch(wider, _write(wider, raw_batch(topic, 0, 2, [b'{"id": 3, "addr": {"city": "Oslo", "zip": "0150"}}'])), 1)
    table = open_table(wider)
    zip_field = table.schema().find_field("addr.zip")
    assert zip_field.field_type == StringType() and not zip_field.required
    rows = {r["id"]: r for r in table.scan().to_arrow().to_pylist()}
    assert rows[1]["addr"] == {"city": "Oslo", "geo": [59.9, 10.7], "zip": None} and rows[1]["tags"] == [("a", 1)]
    assert rows[2]["addr"]["zip"] is None  # was not declared when batch 0 was written
    assert rows[3]["addr"] == {"city": "Oslo", "geo": None, "zip": "0150"}
    # a nested field whose type changes is refused naming the column
    changed = app_config(tmp_path, kafka.bootstrap, topic, columns=[
        columns[0], {"name": "addr", "type": "struct<city:long>"}])
    with pytest.raises(SchemaIncompatibleError, match="addr"):
        prepare(changed)


def test_a_record_the_tables_columns_cannot_take_is_a_dead_letter_not_a_halt(kafka, tmp_path):
    """`note` became a long column; one later record's string `note` used to make the whole batch's column a
    string and stop the query on every restart. Under deadLetter it is a dead letter and its batch commits."""
    topic = "sink-misfit-1"
    kafka.create_topic(f"{topic}-dlq", partitions=1)
    cfg = app_config(tmp_path, kafka.bootstrap, topic, columns=[{"name": "id", "type": "long", "required": True}],
                     schema={"columns": [{"name": "id", "type": "long", "required": True}],
                             "onIncompatible": "deadLetter"}, deadLetterTopic=f"{topic}-dlq")
    prepare(cfg)
    cp = tmp_path / "checkpoint"
    write_offsets(cp, 0, {topic: {"0": 2}}, initial={topic: {"0": 0}})
    commit_batch(cfg, _write(cfg, raw_batch(topic, 0, 0, [b'{"id": 0, "note": 5}', b'{"id": 1}'])), 0)
    assert open_table(cfg).schema().find_field("note").field_type == LongType()
    write_offsets(cp, 1, {topic: {"0": 8}})
    values = [b'{"id": 2, "note": 6}', b'{"id": 3, "note": "hi"}', b'{"id": 4}', b'{"id": 5, "note": 7}',
              b'{"id": 6, "note": 2.5}', b'{"id": 7, "note": 8}']
    msgs = _write(cfg, raw_batch(topic, 0, 2, values))
    assert msgs[0].dlq_rows == 2 and msgs[0].rows == 4
    commit_batch(cfg, msgs, 1)
    table = open_table(cfg)
    rows = {r["_kafka_offset"]: r["note"] for r in table.scan().to_arrow().to_pylist()}
    assert rows == {0: 5, 1: None, 2: 6, 4: None, 5: 7, 7: 8}
    assert table.schema().find_field("note").field_type == LongType()
    assert sorted(c.dlq_rows for c in ledger.list_commits(table)) == [0, 2]
    # under halt the same batch still stops the query, naming the column
    halt = cfg.model_copy(update={"schema_": cfg.schema_.model_copy(update={"on_incompatible": "halt"})})
    with pytest.raises(SchemaIncompatibleError, match="note"):
        _write(halt, raw_batch(topic, 0, 8, [b'{"id": 8, "note": "x"}']))


def test_accept_kafka_records_an_epoch_snapshot_for_a_changed_topic_id(kafka, tmp_path):
    """`handoff ledger accept-kafka`'s function on Iceberg (through the sink registry): a ledger whose newest commit
    recorded another topic id gets an epoch snapshot with Kafka's ids now, its partitions at startingOffsets; a
    second call records nothing."""
    from handoff_spark import checkpoint as ckpt
    from handoff_spark.entry import accept_kafka
    from handoff_spark.kafka.identity import kafka_identity

    topic = "sink-accept-kafka"
    kafka.create_topic(topic, partitions=2)
    cfg = app_config(tmp_path, kafka.bootstrap, topic)
    prepare(cfg)
    cluster, ids = kafka_identity(cfg)
    cp = tmp_path / "checkpoint"
    write_offsets(cp, 0, {topic: {"0": 5, "1": 0}}, initial={topic: {"0": 0, "1": 0}})
    ckpt.write_kafka_identity(str(cp), {"cluster": cluster, "topics": {topic: "Lh3qXc0xTbO9mBEAAAAAAQ"}})
    commit_batch(cfg, _write(cfg, raw_batch(topic, 0, 0, [record(i) for i in range(5)])), 0)
    assert accept_kafka(cfg.model_copy(update={"source": cfg.source.model_copy(
        update={"topics": ["absent-topic-never-created"]})}))["recorded"] is False  # no id for it: nothing to accept
    done = accept_kafka(cfg)
    table = open_table(cfg)
    epoch = ledger.list_commits(table, "ns/h1")[0]
    assert done["recorded"] and done["entry"] == f"snapshot {epoch.snapshot_id}" and done["topics"] == [topic]
    assert epoch.kind == ledger.EPOCH and epoch.topic_ids == ids and epoch.offsets == {topic: {0: (0, 0), 1: (0, 0)}}
    assert ledger.latest_identity(table, "ns/h1", cfg.query_name) == (cluster, ids)
    assert accept_kafka(cfg) == {"recorded": False, "topics": []}


def test_a_compaction_after_a_commit_is_counted_with_that_batch(kafka, tmp_path):
    """The upkeep round after batch 8 (maintenance.everyBatches 8) compacts the nine small files; the batch's
    CommitResult and its record in the checkpoint (what the driver's progress Totals add up: issue 35's
    maintenance rewrites) say how many files it replaced and the bytes it wrote, which are the new file's."""
    from handoff_spark import checkpoint as ckpt
    from handoff_spark.driver.progress import BatchReport, Totals

    topic = "sink-compaction-cost"
    kafka.create_topic(topic, partitions=1)
    cfg = app_config(tmp_path, kafka.bootstrap, topic, maintenance={"orphanMinAgeSeconds": 0, "everyBatches": 8})
    prepare(cfg)
    cp = tmp_path / "checkpoint"
    results = []
    for b in range(9):
        write_offsets(cp, b, {topic: {"0": 5 * b + 5}}, initial={topic: {"0": 0}} if b == 0 else None)
        results.append(commit_batch(cfg, _write(cfg, raw_batch(topic, 0, 5 * b, [record(5 * b + i)
                                                                                  for i in range(5)])), b))
    assert [r.rewritten_files for r in results] == [None] * 8 + [9]
    table = open_table(cfg)
    (merged,) = maintenance.live_data_files(table)
    assert results[8].rewritten_bytes == merged.file_size_in_bytes > 0
    assert table.scan().to_arrow().num_rows == 45
    recorded = ckpt.read_last_commit(str(cp))
    assert recorded["batch_id"] == 8 and recorded["rewritten_files"] == 9
    assert recorded["rewritten_bytes"] == merged.file_size_in_bytes
    totals = Totals()
    for r in results:
        totals.add(BatchReport(batch_id=r.batch_id, rows=r.rows, duration_ms=1, start={}, end={}, lag={},
                               commit=dataclasses.asdict(r), max_event_time_ms=None))
    assert totals.record()["rewrittenFiles"] == 9 and totals.record()["rewrittenBytes"] == merged.file_size_in_bytes
