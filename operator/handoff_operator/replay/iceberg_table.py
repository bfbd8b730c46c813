"""The Iceberg side of the replay sink contract (`table.ReplayTable`): facts for the planner, and the steps that
change the table, all through PyIceberg's own snapshot management (`manage_snapshots()`: create_tag,
rollback_to_snapshot), each a single catalog commit.

Each step is idempotent on its own, checked against the table rather than remembered: a tag that already points
at the head is not created again, a table already at the target is not rolled back again, a gap already
recorded is not recorded twice (the caller passes only what the ledger lacks).
"""
from __future__ import annotations

from pyiceberg.table import Table
from pyiceberg.table.refs import SnapshotRefType

from handoff_spark.config import AppConfig, IcebergSink
from handoff_spark.ledger import (BATCH, Commit, iceberg_ancestry, iceberg_record_gap, iceberg_resume_offsets,
                                  iceberg_table)

from handoff_operator.replay.cost import TableCost
from handoff_operator.replay.plan import Failure, LedgerEntry, Offsets, Plan, Ranges, SnapshotInfo, TableFacts
from handoff_operator.replay.contract import RollbackStep, UndoPointTaken

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


class IcebergReplayTable:
    """One Iceberg table as loaded now (`open` again for a fresh view)."""

    kind = "iceberg"

    def __init__(self, table: Table) -> None:
        self.table = table

    @classmethod
    def open(cls, config: AppConfig) -> "IcebergReplayTable | None":
        table = load(config)
        return cls(table) if table is not None else None

    def facts(self) -> TableFacts:
        return table_facts(self.table)

    def refusal(self, plan: Plan) -> Failure | None:
        return None

    def undo_point_name(self, namespace: str, request: str) -> str:
        return undo_tag_name(namespace, request)

    def ensure_undo_point(self, name: str, head: int) -> bool:
        """Tag `head` as `name` unless it already is (True: created now). A tag of that name on another snapshot
        is an error: it is not ours to move."""
        ref = self.table.metadata.refs.get(name)
        if ref is not None:
            if ref.snapshot_id != head:
                raise UndoPointTaken(f"tag {name!r} already exists on snapshot {ref.snapshot_id}, not {head}")
            return False
        self.table.manage_snapshots().create_tag(head, name).commit()
        return True

    def current(self) -> int | None:
        return self.table.metadata.current_snapshot_id

    def rollback(self, step: RollbackStep) -> None:
        if self.current() != step.target:
            self.table.manage_snapshots().rollback_to_snapshot(step.target).commit()

    def stream_offsets(self, handoff_id: str, query: str) -> Offsets:
        """Where the handoff's ledger query stands now: next offset per partition."""
        return iceberg_resume_offsets(self.table, handoff_id, query)

    def record_gap(self, handoff_id: str, query: str, gap: Ranges, reason: str) -> str:
        """Record `gap` as deliberately skipped in the ledger (a marker snapshot without data), so the stream goes
        on after it and a restart never re-reads it. The marker's snapshot id."""
        ranges = {t: {str(p): [s, e] for p, (s, e) in parts.items()} for t, parts in gap.items()}
        return f"snapshot {iceberg_record_gap(self.table, handoff_id, query, ranges, reason)}"

    def cost(self, plan: Plan) -> TableCost:
        """Files, bytes and records the discarded snapshots added (their summaries: no data file is read)."""
        files = size = records = 0
        if plan.head_snapshot is not None and plan.target_snapshot is not None:
            for snapshot, _commit in iceberg_ancestry(self.table.metadata):
                if snapshot.snapshot_id == plan.target_snapshot:
                    break
                summary = snapshot.summary.additional_properties if snapshot.summary is not None else {}
                files += int(summary.get("added-data-files", 0))
                size += int(summary.get("added-files-size", 0))
                records += int(summary.get("added-records", 0))
        if not records:  # nothing discarded (a Backfill): the table's average row instead
            current = self.table.current_snapshot()
            summary = current.summary.additional_properties if current is not None and current.summary else {}
            return TableCost(files_to_rewrite=0, sample_rows=int(summary.get("total-records", 0)),
                             sample_bytes=int(summary.get("total-files-size", 0)))
        return TableCost(files_to_rewrite=files, sample_rows=records, sample_bytes=size)
