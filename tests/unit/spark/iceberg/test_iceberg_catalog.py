"""Handoff's SQL catalog (metadata cached by location, updates staged without a deep copy) and the table
properties that bound history, on real SQLite catalogs: the cache never hides another writer's commit from the
sink's ancestry check, a commit based on a stale table still fails, the staged metadata is what PyIceberg would
have produced, and old metadata files are deleted as the properties say."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Transaction
from pyiceberg.table.update import RemoveSnapshotsUpdate, update_table_metadata
from pyiceberg.types import StringType

from handoff_spark.iceberg import ledger
from handoff_spark.config import AppConfig
from handoff_spark.iceberg.catalog import HandoffSqlCatalog, apply_updates, wrap_sql_catalog
from handoff_spark.iceberg.sink import (IcebergCommitMessage, _MemoTransaction, commit_to_table, open_table,
                                        prepare_batch, write_data_files)
from handoff_spark.iceberg.table import (HISTORY_BOUNDING_PROPERTIES, STREAMING_TABLE_PROPERTIES, declared_schema,
                                         ensure_history_bounded, ensure_table, load_catalog_cached)

QUERY_ID = "11111111-2222-3333-4444-555555555555"


def _cfg(tmp_path: Path) -> AppConfig:
    return AppConfig.model_validate({
        "handoffId": "ns/h1", "source": {"bootstrapServers": "unused:9092", "topics": ["t"]},
        "sink": {"kind": "iceberg", "catalogName": "c", "table": "ns.t",
                 "catalogProperties": {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db",
                                       "warehouse": f"file://{tmp_path}/wh"}},
        "schema": {"columns": [{"name": "id", "type": "long"}], "onIncompatible": "halt"},
        "checkpointLocation": str(tmp_path / "cp"),
    })


def _rows(batch: int, n: int = 3) -> pa.Table:
    return pa.table({"id": pa.array(range(batch * n, batch * n + n), pa.int64()),
                     "_kafka_topic": ["t"] * n, "_kafka_partition": pa.array([0] * n, pa.int32()),
                     "_kafka_offset": pa.array(range(batch * n, batch * n + n), pa.int64())})


def _commit(cfg: AppConfig, batch: int):
    table = open_table(cfg)
    shaped, meta, _plan = prepare_batch(_rows(batch), table.metadata, "compatible")
    msg = IcebergCommitMessage(write_uuid="w", files=write_data_files(meta, table.io, shaped, uuid.uuid4()),
                               rows=shaped.num_rows)
    return commit_to_table(cfg, [msg], batch, {("t", 0): (batch * 3, batch * 3 + 3)}, QUERY_ID)


def _shaped(table, rows: pa.Table) -> pa.Table:
    schema = table.schema().as_arrow()
    return pa.table([rows.column(f.name).cast(f.type) if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
                     for f in schema], schema=schema)


def _plain(tmp_path: Path) -> SqlCatalog:
    return SqlCatalog("c", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")


def test_sql_catalogs_are_wrapped_and_others_left_alone(tmp_path):
    cat = load_catalog_cached("c", {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db",
                                    "warehouse": f"file://{tmp_path}/wh"})
    assert type(cat) is HandoffSqlCatalog
    assert wrap_sql_catalog(cat) is cat  # already Handoff's: unchanged


def test_tables_handoff_creates_carry_the_streaming_properties(tmp_path):
    cat = load_catalog_cached("c", {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db",
                                    "warehouse": f"file://{tmp_path}/wh"})
    t = ensure_table(cat, "ns.t", declared_schema(_cfg(tmp_path).schema_.columns), [])
    for key, value in STREAMING_TABLE_PROPERTIES.items():
        assert t.metadata.properties[key] == value


def test_existing_table_gets_missing_history_properties_but_keeps_explicit_ones(tmp_path):
    plain = _plain(tmp_path)
    plain.create_namespace("ns")
    plain.create_table("ns.t", declared_schema(_cfg(tmp_path).schema_.columns),
                       properties={"write.metadata.previous-versions-max": "7"})
    t = open_table(_cfg(tmp_path), create=False)
    ensure_history_bounded(t)
    props = _plain(tmp_path).load_table("ns.t").metadata.properties  # what any reader of the catalog sees
    assert props["write.metadata.previous-versions-max"] == "7"
    for key in HISTORY_BOUNDING_PROPERTIES:
        if key != "write.metadata.previous-versions-max":
            assert props[key] == STREAMING_TABLE_PROPERTIES[key]
    assert "commit.retry.num-retries" not in props  # other writers' retry behaviour is not Handoff's to change
    before = t.metadata_location
    ensure_history_bounded(t)
    assert open_table(_cfg(tmp_path)).metadata_location == before  # nothing missing: no commit


def test_old_metadata_files_are_deleted_as_the_properties_say(tmp_path):
    cfg = _cfg(tmp_path)
    t = open_table(cfg)
    with t.transaction() as tx:
        tx.set_properties({"write.metadata.previous-versions-max": "3"})
    for b in range(6):
        _commit(cfg, b)
    t = open_table(cfg)
    files = sorted((tmp_path / "wh" / "ns" / "t" / "metadata").glob("*.metadata.json"))
    assert len(t.metadata.metadata_log) == 3
    # the current file and the three the log names; everything older was deleted on commit
    expected = {t.metadata_location, *(e.metadata_file for e in t.metadata.metadata_log)}
    assert {f.as_uri() for f in files} == expected


def test_commits_reuse_parsed_metadata_and_it_matches_the_stored_file(tmp_path):
    cfg = _cfg(tmp_path)
    cat = load_catalog_cached(cfg.sink.catalog_name, cfg.sink.catalog_properties)
    _commit(cfg, 0)
    parses = cat.metadata_parses
    for b in range(1, 5):
        tc = _commit(cfg, b)
    assert cat.metadata_parses == parses  # each load found the file this process had just written
    cached = open_table(cfg)
    assert cached.metadata_location == tc.table.metadata_location
    stored = _plain(tmp_path).load_table("ns.t")  # parsed from storage by plain PyIceberg
    assert stored.metadata_location == cached.metadata_location
    assert stored.metadata == cached.metadata
    assert [c.batch_id for c in ledger.list_commits(stored)] == [4, 3, 2, 1, 0]


_OTHER_WRITER = textwrap.dedent("""
    import json, sys
    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog
    tmp, batch, query_id = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    t = SqlCatalog("c", uri=f"sqlite:///{tmp}/c.db", warehouse=f"file://{tmp}/wh").load_table("ns.t")
    values = {"id": batch, "_kafka_topic": "t", "_kafka_partition": 0, "_kafka_offset": batch * 3}
    schema = t.schema().as_arrow()
    rows = pa.table([pa.array([values.get(f.name)], f.type) for f in schema], schema=schema)
    t.append(rows, snapshot_properties={
        "handoff.id": "ns/h1", "handoff.query": "handoff", "handoff.query-id": query_id, "handoff.batch-id": str(batch),
        "handoff.offsets": json.dumps({"t": {"0": [batch * 3, batch * 3 + 3]}}), "handoff.rows": "1"})
    print(t.current_snapshot().snapshot_id)
""")


def test_a_commit_by_another_process_is_seen_by_the_ancestry_check(tmp_path):
    """A zombie driver (another process, plain PyIceberg) commits batch 1 behind the cached catalog's back:
    the sink must skip its own batch 1, and a commit planned on the stale table must fail."""
    cfg = _cfg(tmp_path)
    cat = load_catalog_cached(cfg.sink.catalog_name, cfg.sink.catalog_properties)
    first = _commit(cfg, 0)
    stale = open_table(cfg)
    parses = cat.metadata_parses
    out = subprocess.run([sys.executable, "-c", _OTHER_WRITER, str(tmp_path), "1", QUERY_ID],
                         check=True, capture_output=True, text=True)
    theirs = int(out.stdout.strip())

    replay = _commit(cfg, 1)
    assert replay.skipped and replay.snapshot_id == theirs
    assert cat.metadata_parses == parses + 1  # the moved pointer named a file this process had not read
    table = open_table(cfg)
    assert [c.batch_id for c in ledger.list_commits(table)] == [1, 0]
    assert table.scan().to_arrow().num_rows == 4  # 3 from batch 0, 1 from the other writer; no duplicate

    # the stale table object (based on batch 0's metadata) cannot commit over the other writer's snapshot
    assert stale.metadata.current_snapshot_id == first.snapshot_id
    with pytest.raises(CommitFailedException):
        stale.append(_shaped(stale, _rows(9)))
    assert open_table(cfg).metadata.current_snapshot_id == theirs


def test_apply_updates_matches_pyiceberg(tmp_path):
    cfg = _cfg(tmp_path)
    for b in range(3):
        _commit(cfg, b)
    table = open_table(cfg)
    base = table.metadata

    tx = Transaction(table)
    tx.set_properties({"a": "b"})
    with tx.update_schema() as us:
        us.add_column("extra", StringType())
    staged_schema = tx.table_metadata.schema().as_arrow()
    rows = _rows(7).append_column("extra", pa.array(["x"] * 3))
    tx.append(pa.table([rows.column(f.name).cast(f.type) if f.name in rows.column_names else pa.nulls(3, f.type)
                        for f in staged_schema], schema=staged_schema), snapshot_properties={ledger.BATCH_ID: "7"})
    expired = RemoveSnapshotsUpdate(snapshot_ids=[base.snapshots[0].snapshot_id])
    for updates in (tx._updates, (*tx._updates, expired), (expired,)):
        ours = apply_updates(base, updates, table.metadata_location)
        theirs = update_table_metadata(base, updates, metadata_location=table.metadata_location)
        # last_updated_ms is "now" when no update sets it: equal up to the clock
        assert ours.model_copy(update={"last_updated_ms": 0}) == theirs.model_copy(update={"last_updated_ms": 0})
        assert ours.last_updated_ms >= base.last_updated_ms
    assert table.metadata is base and len(base.snapshots) == 3  # the base is never modified

    memo = _MemoTransaction(table)
    assert memo.table_metadata is base  # nothing staged: the base itself, no copy
    memo.set_properties({"a": "b"})
    assert memo.table_metadata is memo.table_metadata
    assert memo.table_metadata.properties["a"] == "b"
    assert json.loads(base.model_dump_json())["properties"].get("a") is None
