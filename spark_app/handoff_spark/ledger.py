"""The offset ledger: which Kafka offsets each table snapshot holds, read from the table alone.

Every micro-batch commit carries, in its snapshot summary, the handoff id, query name, Spark query id, batch id
and the exact per-partition offset range it contains (see docs/design/data-plane-contract.md). This module
answers the operator's questions from that record with plain PyIceberg (no Spark): what was committed,
which snapshot holds a given offset or was current at a given time, and where a query restored to a snapshot
must resume reading.

Only the *current ancestry* counts: a rolled-back snapshot stays in the table metadata but its data is not in
the table, so its offsets are not either. Snapshots without ledger properties (compaction, manual writes) are
walked through, never treated as commits.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterator

from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot

from .iceberg_table import load_table as _load_table

# Snapshot summary keys (the contract).
ID = "handoff.id"
QUERY = "handoff.query"
QUERY_ID = "handoff.query-id"
BATCH_ID = "handoff.batch-id"
OFFSETS = "handoff.offsets"
ROWS = "handoff.rows"
DLQ_ROWS = "handoff.dlq-rows"
MAX_EVENT_TIME_MS = "handoff.max-event-time-ms"

Offsets = dict[str, dict[int, int]]  # {topic: {partition: next offset}}


@dataclass(frozen=True)
class Commit:
    """One micro-batch as recorded in the table. `offsets` ranges are [start, end) per topic partition."""

    snapshot_id: int
    parent_snapshot_id: int | None
    timestamp_ms: int
    handoff_id: str
    query: str
    query_id: str | None
    batch_id: int
    offsets: dict[str, dict[int, tuple[int, int]]]
    rows: int
    dlq_rows: int
    max_event_time_ms: int | None

    @property
    def end_offsets(self) -> Offsets:
        return {t: {p: se[1] for p, se in parts.items()} for t, parts in self.offsets.items()}

    def covers(self, topic: str, partition: int, offset: int) -> bool:
        se = self.offsets.get(topic, {}).get(partition)
        return se is not None and se[0] <= offset < se[1]


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
    return Commit(
        snapshot_id=snapshot.snapshot_id, parent_snapshot_id=snapshot.parent_snapshot_id,
        timestamp_ms=snapshot.timestamp_ms, handoff_id=props[ID], query=props.get(QUERY, ""),
        query_id=props.get(QUERY_ID), batch_id=int(props[BATCH_ID]), offsets=offsets,
        rows=int(props.get(ROWS, "0")), dlq_rows=int(props.get(DLQ_ROWS, "0")),
        max_event_time_ms=int(met) if met not in (None, "") else None,
    )


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


def list_commits(table: Table | TableMetadata, handoff_id: str | None = None,
                 snapshot_id: int | None = None) -> list[Commit]:
    """Ledger commits in the current ancestry (or that of `snapshot_id`), newest first."""
    out = []
    for snap in ancestry(_metadata(table), snapshot_id):
        c = commit_of(snap)
        if c is not None and (handoff_id is None or c.handoff_id == handoff_id):
            out.append(c)
    return out


def latest_commit(table: Table | TableMetadata, handoff_id: str | None = None) -> Commit | None:
    for snap in ancestry(_metadata(table)):
        c = commit_of(snap)
        if c is not None and (handoff_id is None or c.handoff_id == handoff_id):
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
        if c is None or c.handoff_id != handoff_id or c.query != query:
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
    for c in list_commits(table, handoff_id):
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
    for c in list_commits(table, handoff_id):
        if c.timestamp_ms <= timestamp_ms:
            return c
    return None


def resume_offsets(table: Table | TableMetadata, snapshot_id: int | None = None,
                   handoff_id: str | None = None) -> Offsets:
    """`{topic: {partition: next offset}}` a query must resume from if the table is restored to `snapshot_id`
    (default: current). For each partition the newest commit at or before the snapshot wins, so compaction
    snapshots and commits that did not mention a partition are handled."""
    out: Offsets = {}
    for c in list_commits(table, handoff_id, snapshot_id=snapshot_id):
        for topic, parts in c.offsets.items():
            for p, (_start, end) in parts.items():
                out.setdefault(topic, {}).setdefault(p, end)
    return out
