"""Table upkeep while the stream runs: expire old snapshots, compact small files, sweep orphan files.

Why these, and why safe with the running writer:
- Expiry keeps the metadata (and so every commit) small. Only snapshots older than the replay window go, never
  the current one, never a branch/tag head, never the newest ledger commit of a handoff (its resume point).
- Manifest merging is a table property (`commit.manifest-merge.enabled`, set on tables Handoff creates); the
  sink then appends with merge_append so the manifest list stays short.
- Compaction rewrites small files of one partition into one file in an *overwrite* snapshot planned against
  the current snapshot. PyIceberg commits it with "main is still at the snapshot I planned on"; a concurrent
  append fails it (CommitFailedException), the new files are deleted and compaction simply waits for the next
  round — it never clobbers an append. Compaction snapshots carry no `handoff.batch-id`, so the ledger and the
  sink's idempotency check walk through them to the batch commits behind.
- The orphan sweep deletes data files no snapshot references AND older than a safety age (in-flight writes are
  young). A file referenced by any snapshot still in the metadata is never deleted.
"""
from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable

import pyarrow as pa
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import SnapshotRefType

from handoff_spark.iceberg import ledger

log = logging.getLogger(__name__)

COMPACT_PROPERTY = "handoff.compaction"


# ------------------------------------------------------------------------------------------ planning

@dataclass(frozen=True)
class SnapshotInfo:
    snapshot_id: int
    timestamp_ms: int


def snapshots_to_expire(snapshots: Iterable[SnapshotInfo], protected: set[int], now_ms: int,
                        window_ms: int) -> list[int]:
    """Ids older than the replay window and not protected. Pure: the rule the tests pin down."""
    cutoff = now_ms - window_ms
    return sorted(s.snapshot_id for s in snapshots if s.timestamp_ms < cutoff and s.snapshot_id not in protected)


def protected_snapshots(metadata: TableMetadata) -> set[int]:
    """Current snapshot, branch and tag heads, and the newest ledger commit of every handoff in the ancestry."""
    keep = {ref.snapshot_id for ref in metadata.refs.values()
            if ref.snapshot_ref_type in (SnapshotRefType.TAG, SnapshotRefType.BRANCH)}
    if metadata.current_snapshot_id is not None:
        keep.add(metadata.current_snapshot_id)
    seen: set[str] = set()
    for snap in ledger.ancestry(metadata):
        c = ledger.commit_of(snap)
        if c is not None and c.handoff_id not in seen:
            seen.add(c.handoff_id)
            keep.add(c.snapshot_id)
    return keep


@dataclass
class CompactionGroup:
    spec_id: int
    partition: Any
    files: list[DataFile] = field(default_factory=list)


def plan_compaction(files: Iterable[DataFile], small_bytes: int, min_files: int,
                    max_files: int = 100) -> list[CompactionGroup]:
    """Groups of ≥ `min_files` small data files sharing a partition (at most `max_files` each)."""
    groups: dict[tuple[int, str], CompactionGroup] = {}
    for f in files:
        if f.content != DataFileContent.DATA or f.file_size_in_bytes >= small_bytes:
            continue
        key = (f.spec_id, repr(f.partition))
        groups.setdefault(key, CompactionGroup(f.spec_id, f.partition)).files.append(f)
    out = []
    for g in groups.values():
        if len(g.files) >= min_files:
            g.files = sorted(g.files, key=lambda f: f.file_path)[:max_files]
            out.append(g)
    return out


# ------------------------------------------------------------------------------------------- actions

def expire_snapshots(table: Table, window_seconds: int, now_ms: int | None = None) -> list[int]:
    """Expire snapshots older than the replay window (never newer, never protected). Returns expired ids."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    metadata = table.metadata
    ids = snapshots_to_expire((SnapshotInfo(s.snapshot_id, s.timestamp_ms) for s in metadata.snapshots),
                              protected_snapshots(metadata), now_ms, window_seconds * 1000)
    if ids:
        expired = [s for s in metadata.snapshots if s.snapshot_id in set(ids)]
        table.maintenance.expire_snapshots().by_ids(ids).commit()
        table.refresh()
        _delete_expired_metadata(table, expired)
    return ids


def _delete_expired_metadata(table: Table, expired: list[Any]) -> None:
    """PyIceberg's expiry only edits the metadata; delete the expired snapshots' manifest lists and the
    manifests no remaining snapshot lists (data files are left to the orphan sweep and its safety age)."""
    keep: set[str] = set()
    for snap in table.metadata.snapshots:
        keep.update(m.manifest_path for m in snap.manifests(table.io))
    doomed: set[str] = set()
    for snap in expired:
        try:
            doomed.update(m.manifest_path for m in snap.manifests(table.io) if m.manifest_path not in keep)
        except FileNotFoundError:
            pass
        doomed.add(snap.manifest_list)
    _delete(table, sorted(doomed - keep))


def files_in_snapshot(table: Table, snapshot_id: int) -> set[str]:
    """Paths of the data files live in one snapshot."""
    snap = table.metadata.snapshot_by_id(snapshot_id)
    if snap is None:
        return set()
    return {e.data_file.file_path for m in snap.manifests(table.io)
            for e in m.fetch_manifest_entry(table.io, discard_deleted=True)}


def live_data_files(table: Table) -> list[DataFile]:
    snap = table.current_snapshot()
    if snap is None:
        return []
    out = []
    for manifest in snap.manifests(table.io):
        if manifest.content != ManifestContent.DATA:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            out.append(entry.data_file)
    return out


def compact(table: Table, small_bytes: int = 8 * 1024 * 1024, min_files: int = 8,
            max_groups: int = 4, report: "MaintenanceReport | None" = None) -> int:
    """Rewrite small files partition by partition. Returns the number of files replaced (0 on conflict);
    `report` gets the bytes the committed rewrite read and wrote (issue 35's cost: maintenance rewrites)."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    from handoff_spark.iceberg.parquet_writer import data_files
    import pyarrow.parquet as pq

    groups = plan_compaction(live_data_files(table), small_bytes, min_files)[:max_groups]
    if not groups:
        return 0
    schema = table.schema()
    arrow_schema = schema_to_pyarrow(schema, include_field_ids=False)
    written: list[DataFile] = []
    replaced: list[DataFile] = []
    try:
        for g in groups:
            if g.spec_id != table.metadata.default_spec_id:
                continue  # files of an older spec: rewrite would move them to the new spec's layout; skip
            parts = []
            for f in g.files:
                with table.io.new_input(f.file_path).open() as stream:
                    t = pq.read_table(stream)
                parts.append(pa.Table.from_arrays(
                    [t.column(a.name).cast(a.type) if a.name in t.column_names else pa.nulls(t.num_rows, a.type)
                     for a in arrow_schema], schema=arrow_schema))
            merged = pa.concat_tables(parts)
            written.extend(data_files(table.metadata, merged, table.io, uuid.uuid4()))
            replaced.extend(g.files)
        if not replaced:
            return 0
        with table.transaction() as tx:
            with tx.update_snapshot(snapshot_properties={COMPACT_PROPERTY: "true"}).overwrite() as ow:
                for f in replaced:
                    ow.delete_data_file(f)
                for f in written:
                    ow.append_data_file(f)
        if report is not None:
            report.rewrite_read_bytes += sum(int(f.file_size_in_bytes) for f in replaced)
            report.rewrite_written_bytes += sum(int(f.file_size_in_bytes) for f in written)
    except CommitFailedException as exc:
        log.info("compaction lost a race with a concurrent commit (%s); retrying next round", exc)
        _delete(table, [f.file_path for f in written])
        return 0
    except BaseException:
        _delete(table, [f.file_path for f in written])
        raise
    return len(replaced)


def _delete(table: Table, paths: list[str]) -> None:
    for p in paths:
        try:
            table.io.delete(p)
        except FileNotFoundError:
            pass


def referenced_files(table: Table) -> set[str]:
    """Every data/delete file referenced by any snapshot still in the metadata (not only the ancestry:
    a rolled-back snapshot can be rolled forward again, its files must survive)."""
    out: set[str] = set()
    seen_manifests: set[str] = set()
    for snap in table.metadata.snapshots:
        for manifest in snap.manifests(table.io):
            if manifest.manifest_path in seen_manifests:
                continue
            seen_manifests.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                out.add(entry.data_file.file_path)
    return out


def _norm(table: Table, location: str) -> str:
    _scheme, _netloc, path = table.io.parse_location(location)
    return path.rstrip("/")


def data_files_on_storage(table: Table) -> list[tuple[str, float]]:
    """(path, mtime seconds) of every file under `<table location>/data`."""
    from pyarrow.fs import FileSelector, FileType

    scheme, netloc, path = table.io.parse_location(table.metadata.location.rstrip("/") + "/data")
    fs = table.io.fs_by_scheme(scheme, netloc)
    try:
        infos = fs.get_file_info(FileSelector(path, recursive=True, allow_not_found=True))
    except FileNotFoundError:
        return []
    return [(i.path, i.mtime.timestamp() if i.mtime else 0.0) for i in infos if i.type == FileType.File]


def orphan_files(table: Table, older_than_seconds: float = 0, now: float | None = None) -> list[str]:
    """Data files on storage that no snapshot references and that are older than the safety age."""
    now = time.time() if now is None else now
    # Manifest paths are URIs (file:///…, s3://bucket/…); the storage listing gives the filesystem's own paths
    # (/…, bucket/…). Normalise only the URIs: parsing a scheme-less `bucket/key` would make it a local path.
    refs = {_norm(table, p) for p in referenced_files(table)}
    return [p for p, mtime in data_files_on_storage(table)
            if p.rstrip("/") not in refs and now - mtime >= older_than_seconds]


def remove_orphan_files(table: Table, older_than_seconds: float) -> list[str]:
    table.refresh()
    orphans = orphan_files(table, older_than_seconds)
    if orphans:
        scheme, netloc, _ = table.io.parse_location(table.metadata.location)
        fs = table.io.fs_by_scheme(scheme, netloc)
        for p in orphans:
            try:
                fs.delete_file(p)
            except FileNotFoundError:
                pass
        log.info("removed %d orphan data files", len(orphans))
    return orphans


# ----------------------------------------------------------------------------------- driver schedule

@dataclass
class MaintenanceReport:
    expired: list[int] = field(default_factory=list)
    compacted_files: int = 0
    rewrite_read_bytes: int = 0  # the small files a committed compaction replaced
    rewrite_written_bytes: int = 0  # the files it wrote in their place
    orphans_removed: int = 0
    duration_ms: float = 0.0


def run(table: Table, cfg: Any) -> MaintenanceReport:
    """One round: expire (if a replay window is set), compact (if enabled), sweep orphans."""
    t0 = time.monotonic()
    report = MaintenanceReport()
    m = cfg.maintenance
    if m.expire_older_than_seconds is not None:
        report.expired = expire_snapshots(table, m.expire_older_than_seconds)
        table.refresh()
    if m.compact:
        report.compacted_files = compact(table, report=report)
        table.refresh()
    report.orphans_removed = len(remove_orphan_files(table, m.orphan_min_age_seconds))
    report.duration_ms = round((time.monotonic() - t0) * 1000, 1)
    log.info("maintenance: %s", report)
    return report


def after_commit(table: Table, cfg: Any, batch_id: int) -> MaintenanceReport | None:
    """Called by the sink after each committed batch; runs a round every `maintenance.everyBatches` batches.
    Upkeep failures are logged, never fail the batch (the data is already committed)."""
    if batch_id == 0 or batch_id % cfg.maintenance.every_batches != 0:
        return None
    try:
        table.refresh()
        return run(table, cfg)
    except Exception:  # noqa: BLE001
        log.warning("maintenance after batch %s failed; will retry next round", batch_id, exc_info=True)
        return None
