"""The offset ledger: which Kafka offsets each table snapshot holds, read from the table alone.

Every micro-batch commit carries, in its snapshot summary, the handoff id, query name, Spark query id, batch id
and the exact per-partition offset range it contains (see docs/design/data-plane-contract.md). This module
answers the operator's questions from that record with plain PyIceberg (no Spark): what was committed,
which snapshot holds a given offset or was current at a given time, and where a query restored to a snapshot
must resume reading.

Only the *current ancestry* counts: a rolled-back snapshot stays in the table metadata but its data is not in
the table, so its offsets are not either. Snapshots without ledger properties (compaction, manual writes) are
walked through, never treated as commits.

Besides micro-batches (`kind` batch) the ledger holds markers, snapshots without data that move a partition's
ledger end on purpose: a `gap` (offsets deliberately not in the table, e.g. a Rollback that must not bring
discarded data back) and an `epoch` (a recreated topic or cluster accepted by the user: its partitions start
again at the marker's offsets). The ledger end of a partition is the end of the newest entry that names it;
a batch may commit only if it starts there (`handoff_spark.ledger.record.contiguity_problems`).

Each entry also records the Kafka cluster id and the topic ids it read (`handoff.kafka`), so a topic or cluster
recreated under the same name is detected instead of silently re-read or skipped (`handoff_spark.ledger.record.identity_problems`).
"""
from __future__ import annotations

import json
from typing import Any, Iterator

from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot

from handoff_spark.iceberg.table import load_table as _load_table
# The record, the entry kinds and the pure rules are backend-neutral (`handoff_spark.ledger.record`); the kinds and
# `Commit` are re-exported so `ledger.BATCH` etc. read the same for Iceberg callers.
from handoff_spark.ledger.record import BATCH, EPOCH, GAP, Commit, Offsets, ledger_end as _ledger_end  # noqa: F401
from handoff_spark.ledger.record import column_change as _column_change, newest_identity as _newest_identity

# Snapshot summary keys (the contract).
ID = "handoff.id"
QUERY = "handoff.query"
QUERY_ID = "handoff.query-id"
BATCH_ID = "handoff.batch-id"
OFFSETS = "handoff.offsets"
ROWS = "handoff.rows"
DLQ_ROWS = "handoff.dlq-rows"
MAX_EVENT_TIME_MS = "handoff.max-event-time-ms"
KIND = "handoff.kind"  # batch (default) | gap | epoch
REASON = "handoff.reason"
KAFKA = "handoff.kafka"  # {"cluster": <cluster id>, "topics": {<topic>: <topic id>}}
SCHEMAS = "handoff.schemas"  # {"<schema id>": ["<subject>:<version>", ...]}: registry writer schemas of the rows
LATE_ROWS = "handoff.late-rows"  # records at or below the batch's watermark line (dead letters or kept: sink.frames)
DROPPED_ROWS = "handoff.dropped-rows"  # records the transform filtered out or the dedupe dropped (DataFrame path)
LOST = "handoff.lost"  # {"topic": {"partition": [from, to]}}: offsets of the range retention deleted unread

def load_table(catalog_name: str, catalog_properties: dict[str, str], identifier: str) -> Table:
    """Load a table through a (process-cached) PyIceberg catalog, e.g. `load_table("handoff",
    {"uri": "sqlite:///…", "warehouse": "file:///…"}, "ns.events")`."""
    return _load_table(catalog_name, catalog_properties, identifier)


def commit_of(snapshot: Snapshot) -> Commit | None:
    """The ledger record of a snapshot, None for snapshots Handoff did not write."""
    summary = snapshot.summary
    if summary is None:
        return None
    props = summary.additional_properties
    if ID not in props or BATCH_ID not in props or OFFSETS not in props:
        return None
    raw = json.loads(props[OFFSETS])
    offsets = {t: {int(p): (int(se[0]), int(se[1])) for p, se in parts.items()} for t, parts in raw.items()}
    met = props.get(MAX_EVENT_TIME_MS)
    kafka = json.loads(props[KAFKA]) if props.get(KAFKA) else {}
    return Commit(
        snapshot_id=snapshot.snapshot_id, parent_snapshot_id=snapshot.parent_snapshot_id,
        timestamp_ms=snapshot.timestamp_ms, handoff_id=props[ID], query=props.get(QUERY, ""),
        query_id=props.get(QUERY_ID), batch_id=int(props[BATCH_ID]), offsets=offsets,
        rows=int(props.get(ROWS, "0")), dlq_rows=int(props.get(DLQ_ROWS, "0")),
        max_event_time_ms=int(met) if met not in (None, "") else None,
        kind=props.get(KIND, BATCH), reason=props.get(REASON),
        kafka_cluster_id=kafka.get("cluster"), topic_ids=kafka.get("topics"),
        lost={t: {int(p): (int(se[0]), int(se[1])) for p, se in parts.items()}
              for t, parts in json.loads(props[LOST]).items()} if props.get(LOST) else None,
        schemas=json.loads(props[SCHEMAS]) if props.get(SCHEMAS) else None,
        late_rows=int(props[LATE_ROWS]) if props.get(LATE_ROWS) else None,
        dropped_rows=int(props[DROPPED_ROWS]) if props.get(DROPPED_ROWS) else None,
        schema_id=snapshot.schema_id,
    )


def schema_change(table: Table | TableMetadata, old_id: int, new_id: int) -> dict[str, Any] | None:
    """What changed in the table's columns between two of its schemas (the timeline's schema rows: issue 35):
    top-level columns added, dropped, and whose type changed (a nested change shows as its column's new type).
    None when a schema is no longer in the metadata."""
    schemas = {s.schema_id: s for s in _metadata(table).schemas}
    if old_id not in schemas or new_id not in schemas:
        return None
    return _column_change({f.name: str(f.field_type) for f in schemas[old_id].fields},
                          {f.name: str(f.field_type) for f in schemas[new_id].fields}, old_id, new_id)


def ancestry(metadata: TableMetadata, snapshot_id: int | None = None) -> Iterator[Snapshot]:
    """Snapshots from `snapshot_id` (default: current) back through parents, newest first; stops where
    history was expired."""
    by_id = {s.snapshot_id: s for s in metadata.snapshots}
    sid = metadata.current_snapshot_id if snapshot_id is None else snapshot_id
    seen: set[int] = set()
    while sid is not None and sid in by_id and sid not in seen:
        seen.add(sid)
        snap = by_id[sid]
        yield snap
        sid = snap.parent_snapshot_id


def _metadata(table: Table | TableMetadata) -> TableMetadata:
    return table.metadata if isinstance(table, Table) else table


def _entries(table: Table | TableMetadata, handoff_id: str | None, query: str | None,
             snapshot_id: int | None = None) -> Iterator[Commit]:
    for snap in ancestry(_metadata(table), snapshot_id):
        c = commit_of(snap)
        if c is not None and (handoff_id is None or c.handoff_id == handoff_id) and (query is None or c.query == query):
            yield c


def list_commits(table: Table | TableMetadata, handoff_id: str | None = None,
                 snapshot_id: int | None = None, query: str | None = None,
                 include_markers: bool = True) -> list[Commit]:
    """Ledger entries in the current ancestry (or that of `snapshot_id`), newest first."""
    return [c for c in _entries(table, handoff_id, query, snapshot_id) if include_markers or c.kind == BATCH]


def latest_commit(table: Table | TableMetadata, handoff_id: str | None = None,
                  query: str | None = None) -> Commit | None:
    """The newest micro-batch commit (markers are not commits of data)."""
    for c in _entries(table, handoff_id, query):
        if c.kind == BATCH:
            return c
    return None


def find_batch(table: Table | TableMetadata, handoff_id: str, query: str, batch_id: int,
               query_id: str | None = None) -> Commit | None:
    """The commit of this batch if it is in the current ancestry, else None (the sink's idempotency check).

    Batches of one query commit in order, so the walk stops at the first older batch of the same query: the
    check costs a few snapshots, not the whole history. `query_id` (Spark's checkpoint id) separates a query
    restarted from a fresh checkpoint, whose batch ids begin again at 0.
    """
    for snap in ancestry(_metadata(table)):
        c = commit_of(snap)
        if c is None or c.handoff_id != handoff_id or c.query != query or c.kind != BATCH:
            continue
        if query_id is not None and c.query_id is not None and c.query_id != query_id:
            return None  # an older checkpoint's commits: this checkpoint's batches would be newer
        if c.batch_id == batch_id:
            return c
        if c.batch_id < batch_id:
            return None
    return None


def snapshot_for_offset(table: Table | TableMetadata, topic: str, partition: int, offset: int,
                        handoff_id: str | None = None) -> Commit | None:
    """The commit (snapshot) whose range holds `offset` of `topic`/`partition`, None if none in the ancestry
    does (not yet committed, or expired)."""
    for c in list_commits(table, handoff_id, include_markers=False):
        if c.covers(topic, partition, offset):
            return c
    return None


def snapshot_at(table: Table | TableMetadata, timestamp_ms: int) -> Snapshot | None:
    """The snapshot that was current at `timestamp_ms`: the newest in the current ancestry committed at or
    before it (it may be a compaction snapshot; `resume_offsets` works for any snapshot)."""
    for snap in ancestry(_metadata(table)):
        if snap.timestamp_ms <= timestamp_ms:
            return snap
    return None


def commit_at(table: Table | TableMetadata, timestamp_ms: int, handoff_id: str | None = None) -> Commit | None:
    """The newest ledger commit made at or before `timestamp_ms`."""
    for c in list_commits(table, handoff_id, include_markers=False):
        if c.timestamp_ms <= timestamp_ms:
            return c
    return None


def resume_offsets(table: Table | TableMetadata, snapshot_id: int | None = None,
                   handoff_id: str | None = None, query: str | None = None) -> Offsets:
    """`{topic: {partition: next offset}}` a query must resume from if the table is restored to `snapshot_id`
    (default: current): the ledger end of every partition. For each partition the newest entry at or before the
    snapshot that names it wins (markers included), so compaction snapshots and commits that did not mention a
    partition are handled."""
    out: Offsets = {}
    for c in _entries(table, handoff_id, query, snapshot_id):
        for topic, parts in c.offsets.items():
            for p, (_start, end) in parts.items():
                out.setdefault(topic, {}).setdefault(p, end)
    return out


def ledger_end(table: Table | TableMetadata, handoff_id: str, query: str,
               partitions: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """The ledger end of just `partitions` (those the ledger never saw are absent). Walks the ancestry lazily,
    so the per-commit check costs a snapshot or two, not the history."""
    return _ledger_end(_entries(table, handoff_id, query), partitions)


def latest_identity(table: Table | TableMetadata, handoff_id: str, query: str) -> tuple[str | None, dict[str, str]]:
    """(Kafka cluster id, {topic: topic id}) as the newest entries that recorded them say
    (`ledger.record.newest_identity`, BigQuery's rule too)."""
    return _newest_identity(_entries(table, handoff_id, query))


def marker_properties(handoff_id: str, query: str, ranges: dict[str, dict[str, list[int]]], kind: str,
                      reason: str, kafka: dict | None = None) -> dict[str, str]:
    """Summary properties of a marker entry (no data): the ranges it covers on purpose and why."""
    if kind not in (GAP, EPOCH):
        raise ValueError(f"marker kind must be {GAP} or {EPOCH}, not {kind!r}")
    props = {ID: handoff_id, QUERY: query, BATCH_ID: "-1", KIND: kind, REASON: reason[:2000],
             OFFSETS: json.dumps(ranges, separators=(",", ":"), sort_keys=True), ROWS: "0", DLQ_ROWS: "0"}
    if kafka:
        props[KAFKA] = json.dumps(kafka, separators=(",", ":"), sort_keys=True)
    return props


def record_marker(table: Table, handoff_id: str, query: str, ranges: dict[str, dict[str, list[int]]], kind: str,
                  reason: str, kafka: dict | None = None) -> int:
    """Commit a snapshot without data that records `ranges` as a `gap` or an `epoch` (see the module docstring).
    Returns its snapshot id. The caller stops the handoff's driver first: a marker moves the ledger end."""
    tx = table.transaction()
    with tx.update_snapshot(snapshot_properties=marker_properties(handoff_id, query, ranges, kind, reason,
                                                                  kafka)).fast_append():
        pass
    committed = tx.commit_transaction()
    snap = committed.current_snapshot()
    assert snap is not None
    return snap.snapshot_id


def record_gap(table: Table, handoff_id: str, query: str, ranges: dict[str, dict[str, list[int]]],
               reason: str) -> int:
    """Record offsets deliberately left out of the table (`{"topic": {"partition": [start, end]}}`): the stream
    goes on at each `end`, and the range is never re-read by a restart."""
    return record_marker(table, handoff_id, query, ranges, GAP, reason)
