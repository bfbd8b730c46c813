"""The offset ledger read back from real SQLite-catalog tables whose snapshots are written directly with
PyIceberg (as the sink writes them), plus the pure pieces it rests on: Spark's offset log format, the schema
change planner, partition spec parsing and the expiry rule."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.transforms import BucketTransform, DayTransform, HourTransform, IdentityTransform, TruncateTransform
from pyiceberg.types import DoubleType, FloatType, IntegerType, LongType, NestedField, StringType

from handoff_spark import checkpoint as ckpt
from handoff_spark.iceberg import ledger, maintenance
from handoff_spark.iceberg.table import parse_partition_field, plan_schema_changes

SCHEMA = Schema(NestedField(1, "_kafka_partition", IntegerType()), NestedField(2, "_kafka_offset", LongType()))


def _table(tmp_path):
    cat = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    cat.create_namespace("ns")
    return cat.create_table("ns.t", SCHEMA)


def _commit(table, batch_id, ranges, handoff="ns/h", query="q", query_id="qid", rows=1):
    data = pa.table({"_kafka_partition": pa.array([0] * rows, pa.int32()),
                     "_kafka_offset": pa.array(range(rows), pa.int64())})
    table.append(data, snapshot_properties={
        ledger.ID: handoff, ledger.QUERY: query, ledger.QUERY_ID: query_id, ledger.BATCH_ID: str(batch_id),
        ledger.OFFSETS: json.dumps({t: {str(p): list(se) for p, se in parts.items()} for t, parts in ranges.items()}),
        ledger.ROWS: str(rows), ledger.DLQ_ROWS: "0", ledger.MAX_EVENT_TIME_MS: "1000"})
    return table.current_snapshot()


def test_list_find_resume_and_rollback(tmp_path):
    t = _table(tmp_path)
    s0 = _commit(t, 0, {"a": {0: (0, 10), 1: (0, 5)}})
    s1 = _commit(t, 1, {"a": {0: (10, 20), 1: (5, 5)}})
    t.append(pa.table({"_kafka_partition": pa.array([9], pa.int32()), "_kafka_offset": pa.array([9], pa.int64())}))
    s_manual = t.current_snapshot()  # a snapshot Handoff did not write (compaction/manual) is walked through
    s2 = _commit(t, 2, {"a": {0: (20, 25), 1: (5, 8)}})

    commits = ledger.list_commits(t, "ns/h")
    assert [c.batch_id for c in commits] == [2, 1, 0]
    assert commits[0].offsets == {"a": {0: (20, 25), 1: (5, 8)}} and commits[0].max_event_time_ms == 1000
    assert ledger.latest_commit(t, "ns/h").snapshot_id == s2.snapshot_id
    assert ledger.latest_commit(t, "other") is None
    assert ledger.find_batch(t, "ns/h", "q", 1, "qid").snapshot_id == s1.snapshot_id
    assert ledger.find_batch(t, "ns/h", "q", 3, "qid") is None
    assert ledger.find_batch(t, "ns/h", "other-query", 1, "qid") is None
    # a fresh checkpoint (new Spark query id) starts at batch 0 again: not confused with the old batch 0
    assert ledger.find_batch(t, "ns/h", "q", 0, "new-qid") is None
    assert ledger.snapshot_for_offset(t, "a", 0, 12).snapshot_id == s1.snapshot_id
    assert ledger.snapshot_for_offset(t, "a", 1, 7).snapshot_id == s2.snapshot_id
    assert ledger.snapshot_for_offset(t, "a", 0, 25) is None  # not committed yet
    assert ledger.resume_offsets(t) == {"a": {0: 25, 1: 8}}
    assert ledger.resume_offsets(t, s_manual.snapshot_id) == {"a": {0: 20, 1: 5}}
    assert ledger.resume_offsets(t, s0.snapshot_id) == {"a": {0: 10, 1: 5}}
    assert ledger.snapshot_at(t, s1.timestamp_ms).snapshot_id in (s1.snapshot_id, s0.snapshot_id)
    assert ledger.snapshot_at(t, s0.timestamp_ms - 1) is None
    assert ledger.commit_at(t, s2.timestamp_ms).snapshot_id == s2.snapshot_id

    # roll back to batch 0: batches 1 and 2 stay in the metadata but are no longer in the table
    t.manage_snapshots().rollback_to_snapshot(s0.snapshot_id).commit()
    assert [c.batch_id for c in ledger.list_commits(t)] == [0]
    assert ledger.find_batch(t, "ns/h", "q", 1, "qid") is None  # a replay of batch 1 must land again
    assert ledger.resume_offsets(t) == {"a": {0: 10, 1: 5}}
    assert ledger.snapshot_for_offset(t, "a", 0, 12) is None


def test_expiry_keeps_window_current_tags_and_resume_point(tmp_path):
    t = _table(tmp_path)
    snaps = [_commit(t, i, {"a": {0: (i, i + 1)}}) for i in range(5)]
    t.manage_snapshots().create_tag(snaps[1].snapshot_id, "keep").commit()
    newest = snaps[-1].timestamp_ms
    # window 0 relative to a "now" after the newest commit: everything is old, but the current snapshot
    # (= newest ledger commit) and the tagged one survive
    expired_lists = [snaps[i].manifest_list for i in (0, 2, 3)]
    expired = maintenance.expire_snapshots(t, 0, now_ms=newest + 1)
    assert not any(t.io.new_input(p).exists() for p in expired_lists)  # their metadata files are deleted
    left = {s.snapshot_id for s in t.metadata.snapshots}
    assert left == {snaps[1].snapshot_id, snaps[4].snapshot_id}
    assert set(expired) == {snaps[0].snapshot_id, snaps[2].snapshot_id, snaps[3].snapshot_id}
    assert ledger.resume_offsets(t) == {"a": {0: 5}}
    assert t.scan().to_arrow().num_rows == 5  # expiry removes history, never data


def test_expiry_rule_never_touches_the_window():
    snaps = [maintenance.SnapshotInfo(i, 1000 * i) for i in range(10)]
    assert maintenance.snapshots_to_expire(snaps, protected={9}, now_ms=9000, window_ms=5000) == [0, 1, 2, 3]
    assert maintenance.snapshots_to_expire(snaps, protected={0}, now_ms=9000, window_ms=5000) == [1, 2, 3]
    assert maintenance.snapshots_to_expire(snaps, protected=set(), now_ms=9000, window_ms=10_000) == []


def test_offset_log_reads_spark_files(tmp_path):
    cp = tmp_path / "cp"
    (cp / "offsets").mkdir(parents=True)
    (cp / "sources").mkdir()
    (cp / "sources" / "handoff-initial.json").write_text('{"t": {"0": 3}}')
    (cp / "offsets" / "0").write_text('v1\n{"batchWatermarkMs":0}\n{"t": {"0": 10, "1": 4}}')
    (cp / "offsets" / "1").write_text('v1\n{"batchWatermarkMs":0}\n{"t": {"0": 12, "1": 9}, "u": {"0": 50}}\n')
    # t[1] is not in the initial offsets: it enters batch 0 at 4 with an empty range (the source reads it from
    # batch 1 on), so the ledger never claims offsets 0..3 that no task read
    assert ckpt.batch_range(str(cp), 0) == {("t", 0): (3, 10), ("t", 1): (4, 4)}
    # topic u, added at its latest offset 50, likewise: its history stays out of the ledger (a Backfill's to fill)
    assert ckpt.batch_range(f"file://{cp}", 1) == {("t", 0): (10, 12), ("t", 1): (4, 9), ("u", 0): (50, 50)}
    assert ckpt.to_json_ranges(ckpt.batch_range(str(cp), 1)) == {"t": {"0": [10, 12], "1": [4, 9]},
                                                                 "u": {"0": [50, 50]}}
    with pytest.raises(ckpt.OffsetLogError):
        ckpt.batch_range(str(cp), 2)
    (cp / "sources" / "handoff-initial.json").unlink()
    with pytest.raises(ckpt.OffsetLogError, match="initial offsets"):
        ckpt.batch_range(str(cp), 0)


def test_schema_plan_evolves_widens_and_refuses_narrowing():
    current = Schema(NestedField(1, "id", IntegerType()), NestedField(2, "x", DoubleType()),
                     NestedField(3, "f", FloatType()))
    plan = plan_schema_changes(current, [("id", LongType()), ("new", StringType()), ("f", DoubleType())],
                               "compatible")
    assert plan.add == (("new", StringType()),)
    assert set(plan.widen) == {("id", LongType()), ("f", DoubleType())}
    assert not plan.incompatible
    assert plan_schema_changes(current, [("x", FloatType())], "compatible") == plan_schema_changes(current, [], "compatible")
    bad = plan_schema_changes(current, [("x", StringType())], "compatible")
    assert bad.incompatible and "x" in bad.incompatible[0]
    none = plan_schema_changes(current, [("id", LongType()), ("new", StringType())], "none")
    assert none.incompatible and none.ignored == ("new",) and not none.changes_table


def test_partition_transforms_parse():
    assert parse_partition_field("day(ts)") == ("ts", DayTransform())
    assert parse_partition_field("hour(ts)") == ("ts", HourTransform())
    assert parse_partition_field("bucket(16, id)") == ("id", BucketTransform(16))
    assert parse_partition_field("truncate(4, s)") == ("s", TruncateTransform(4))
    assert parse_partition_field("region") == ("region", IdentityTransform())
    with pytest.raises(ValueError):
        parse_partition_field("bucket(id)")


def _streaming_table(tmp_path):
    from handoff_spark.iceberg.table import STREAMING_TABLE_PROPERTIES
    cat = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    cat.create_namespace("ns")
    return cat, cat.create_table("ns.t", SCHEMA, properties=STREAMING_TABLE_PROPERTIES)


def test_compaction_keeps_rows_and_ledger_and_loses_races_safely(tmp_path):
    cat, t = _streaming_table(tmp_path)
    for i in range(10):
        _commit(t, i, {"a": {0: (i * 10, i * 10 + 10)}}, rows=10)
    before = sorted(t.scan().to_arrow()["_kafka_offset"].to_pylist())
    assert len(maintenance.live_data_files(t)) == 10
    small = maintenance.live_data_files(t)
    report = maintenance.MaintenanceReport()
    assert maintenance.compact(t, min_files=4, report=report) == 10
    t = cat.load_table("ns.t")
    assert len(maintenance.live_data_files(t)) == 1
    # what the rewrite cost (issue 35): the small files read, the one file written
    assert report.rewrite_read_bytes == sum(f.file_size_in_bytes for f in small)
    assert report.rewrite_written_bytes == maintenance.live_data_files(t)[0].file_size_in_bytes > 0
    assert sorted(t.scan().to_arrow()["_kafka_offset"].to_pylist()) == before
    assert t.current_snapshot().summary.additional_properties.get(maintenance.COMPACT_PROPERTY) == "true"
    # the ledger survives: batches behind the compaction snapshot are still found, resume point unchanged
    assert [c.batch_id for c in ledger.list_commits(t)] == list(range(9, -1, -1))
    assert ledger.find_batch(t, "ns/h", "q", 9, "qid") is not None
    assert ledger.resume_offsets(t) == {"a": {0: 100}}
    # replaced files are history now, not orphans (the snapshots before compaction still reference them)
    assert maintenance.orphan_files(t) == []

    # a compaction planned on a stale table loses to a concurrent append instead of clobbering it
    for i in range(10, 15):
        _commit(t, i, {"a": {0: (i * 10, i * 10 + 10)}}, rows=10)
    stale = cat.load_table("ns.t")
    _commit(cat.load_table("ns.t"), 15, {"a": {0: (150, 160)}}, rows=10)
    assert maintenance.compact(stale, min_files=4) == 0
    t = cat.load_table("ns.t")
    assert t.scan().to_arrow().num_rows == 160
    assert maintenance.orphan_files(t) == []  # the losing compaction removed its own files


def test_max_event_time_handles_sub_millisecond_timestamps():
    import datetime as dt
    from handoff_spark.sink.common import max_event_time_ms as _max_event_time_ms  # both sinks use it
    ts = [dt.datetime(2026, 1, 1, 0, 0, 0, 123456, tzinfo=dt.timezone.utc), None]
    tbl = pa.table({"ts": pa.array(ts, pa.timestamp("us", "UTC")),
                    "_kafka_timestamp": pa.array([None, None], pa.timestamp("ms", "UTC"))})
    assert _max_event_time_ms(tbl, "ts") == 1767225600123
    assert _max_event_time_ms(tbl, None) is None  # all-null Kafka timestamps
