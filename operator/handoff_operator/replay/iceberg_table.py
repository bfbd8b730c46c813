"""The table side of a ReplayRequest (I/O): facts for the planner, and the steps that change the table.

Each step is idempotent on its own, checked against the table rather than remembered: a tag that already
points at the head is not created again, a table already at the target is not rolled back again, a gap
already recorded is not recorded twice. So an operator restarted between a step and the status write
that records it repeats nothing. Everything goes through PyIceberg's own snapshot management
(`manage_snapshots()`: create_tag, rollback_to_snapshot), each a single catalog commit.
"""
from __future__ import annotations

from pyiceberg.table import Table
from pyiceberg.table.refs import SnapshotRefType

from handoff_spark.config import AppConfig, IcebergSink
from handoff_spark.ledger import (BATCH, Commit, iceberg_ancestry, iceberg_record_gap, iceberg_resume_offsets,
                                  iceberg_table)

from handoff_operator.replay.plan import LedgerEntry, Offsets, Ranges, SnapshotInfo, TableFacts

UNDO_TAG_PREFIX = "handoff-undo-"


def undo_tag_name(namespace: str, request: str) -> str:
    """The tag on the head before a rollback; namespaced, since tables may be shared across namespaces."""
    return f"{UNDO_TAG_PREFIX}{namespace}-{request}"


def load(config: AppConfig) -> Table | None:
    """The handoff's Iceberg table, freshly loaded; None if it does not exist yet."""
    sink = config.sink
    assert isinstance(sink, IcebergSink)
    try:
        return iceberg_table(sink.catalog_name, dict(sink.catalog_properties), sink.table)
    except Exception as exc:
        if type(exc).__name__ == "NoSuchTableError":
            return None
        raise


def _entry(commit: Commit | None) -> LedgerEntry | None:
    if commit is None:
        return None
    return LedgerEntry(commit.handoff_id, commit.query, commit.offsets, gap=commit.kind != BATCH)


def table_facts(table: Table) -> TableFacts:
    metadata = table.metadata
    ancestry = tuple(SnapshotInfo(s.snapshot_id, s.timestamp_ms, _entry(commit))
                     for s, commit in iceberg_ancestry(metadata))
    tags = {name: ref.snapshot_id for name, ref in metadata.refs.items()
            if ref.snapshot_ref_type == SnapshotRefType.TAG}
    return TableFacts(ancestry, frozenset(s.snapshot_id for s in metadata.snapshots), tags)


def current_snapshot(table: Table) -> int | None:
    return table.metadata.current_snapshot_id


class TagTaken(RuntimeError):
    """The undo tag's name is already used for another snapshot."""


def ensure_tag(table: Table, name: str, snapshot_id: int) -> bool:
    """Tag `snapshot_id` as `name` unless it already is (True: created now). A tag of that name on
    another snapshot is an error: it is not ours to move."""
    ref = table.metadata.refs.get(name)
    if ref is not None:
        if ref.snapshot_id != snapshot_id:
            raise TagTaken(f"tag {name!r} already exists on snapshot {ref.snapshot_id}, not {snapshot_id}")
        return False
    table.manage_snapshots().create_tag(snapshot_id, name).commit()
    return True


def rollback(table: Table, target: int) -> None:
    table.manage_snapshots().rollback_to_snapshot(target).commit()


def stream_offsets(table: Table, handoff_id: str, query: str) -> Offsets:
    """Where the handoff's stream (its ledger query) stands now: next offset per partition."""
    return iceberg_resume_offsets(table, handoff_id, query)


def record_gap(table: Table, handoff_id: str, query: str, gap: Ranges, reason: str) -> int:
    """Record `gap` as deliberately skipped in the ledger (a marker snapshot without data), so the stream goes
    on after it and a restart never re-reads it."""
    ranges = {t: {str(p): [s, e] for p, (s, e) in parts.items()} for t, parts in gap.items()}
    return iceberg_record_gap(table, handoff_id, query, ranges, reason)
