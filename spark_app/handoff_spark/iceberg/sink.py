"""The `handoff-iceberg` streaming sink: executors write Parquet data files, the driver commits exactly one
Iceberg snapshot per micro-batch carrying the batch's offset range (the ledger), then the Kafka group offsets.

Exactly-once rests on three rules:
1. The snapshot of batch N records (handoff id, query, Spark query id, N, offsets). Before committing, the
   driver walks the table's *current ancestry*; if batch N is already there (a crash between the table commit
   and Spark's own commit log), the batch is skipped — a replay never lands twice.
2. Data files of an attempt are unique to it (fresh write UUID per task attempt) and only become table data
   through the one snapshot commit, so failed attempts leave only unreferenced files, which `abort`, the
   task's own error path and the orphan sweep delete. A file referenced by any snapshot is never deleted.
3. Kafka consumer-group offsets are committed after the table commit is durable, never before.

Usage (the app does this):
    prepare(cfg)                                   # driver, before starting the query
    raw.writeStream.format("handoff-iceberg").option("config", cfg.to_json()) ...
Executors need the same catalog access as the driver (the catalog properties travel in the config).
The data source and writer classes Spark pickles live in `iceberg.stream`, whose writer imports this module
when it runs; this module does not import that one back.
"""
from __future__ import annotations

import dataclasses

import json
import logging
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import pyarrow as pa
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import Table, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.types import IcebergType

from handoff_spark import checkpoint as ckpt
from handoff_spark import faults
from handoff_spark.iceberg import ledger
from handoff_spark.config import AppConfig, IcebergSink
from handoff_spark.contract import DEGRADED_CATALOG_UNAVAILABLE
from handoff_spark.ledger.record import contiguity_problems, overlap_problems
from handoff_spark.iceberg.catalog import apply_updates
from handoff_spark.iceberg.parquet_writer import data_files
from handoff_spark.iceberg.pyiceberg_private import transaction_state
from handoff_spark.iceberg.table import (SchemaPlan, apply_plan_locally, declared_schema, ensure_history_bounded, ensure_table,
                            dotted, forget_catalog, iceberg_type, iceberg_type_of_arrow, load_catalog_cached,
                            plan_schema_changes)
from handoff_spark.kafka.offsets import commit_group_offsets
from handoff_spark.checkpoint import read_last_commit
from handoff_spark.sink.common import (CommitResult as SinkCommitResult, above_seed_line, SchemaIncompatibleError, configured_sink, max_event_time_ms,
                           record_bytes, task_batch_id, task_records, write_last_commit)

from handoff_spark.decode.records import DeadLetter
from handoff_spark.sink.dead_letters import send_row_dead_letters, split_missing_required
from handoff_spark.iceberg.misfits import misfits
from handoff_spark.decode.batch import decode_source, decode_while_reading

from handoff_spark.sink.datasource_api import WriterCommitMessage

log = logging.getLogger(__name__)


class CatalogUnavailableError(RuntimeError):
    """The catalog did not accept the commit within the bounded retries."""


# --------------------------------------------------------------------------------------------- config

def _sink(cfg: AppConfig) -> IcebergSink:
    return configured_sink(cfg, IcebergSink, "handoff-iceberg")


def open_table(cfg: AppConfig, create: bool = True) -> Table:
    sink = _sink(cfg)
    catalog = load_catalog_cached(sink.catalog_name, sink.catalog_properties)
    if not create:
        return catalog.load_table(sink.table)
    return ensure_table(catalog, sink.table, declared_schema(cfg.schema_.columns, cfg.source.format), sink.partition_by)


def read_table(cfg: AppConfig, identifier: str) -> pa.Table:
    """A table of the handoff's catalog, as of its current snapshot (a transform's lookup, `driver.transform`)."""
    sink = _sink(cfg)
    return load_catalog_cached(sink.catalog_name, sink.catalog_properties).load_table(identifier).scan().to_arrow()


def table_version(cfg: AppConfig, identifier: str) -> str | None:
    """The current snapshot of a table of the handoff's catalog (a lookup changed when this did)."""
    sink = _sink(cfg)
    catalog = load_catalog_cached(sink.catalog_name, sink.catalog_properties)
    snap = catalog.load_table(identifier).current_snapshot()
    return str(snap.snapshot_id) if snap is not None else None


def warm_up(cfg: AppConfig) -> None:
    """Executors: what a fresh Python worker sets up before its first write (the catalog and its connection,
    the table's metadata, the file system), done ahead on a new executor (executor_warmup). Writes nothing."""
    table = open_table(cfg, create=False)
    with table.io.new_input(table.metadata_location).open() as f:
        f.read(1)


def spark_query_id(checkpoint: str) -> str | None:
    """Spark's query id, stable across restarts of one checkpoint."""
    return ckpt.query_id(checkpoint)


def ledger_end(cfg: AppConfig) -> dict[tuple[str, int], int]:
    """Where the table's ledger ends for this handoff's stream query (current ancestry; markers included)."""
    offsets = ledger.resume_offsets(open_table(cfg, create=False), handoff_id=cfg.handoff_id, query=cfg.query_name)
    return {(t, p): off for t, parts in offsets.items() for p, off in parts.items()}


def ledger_identity(cfg: AppConfig) -> tuple[str | None, dict[str, str]]:
    return ledger.latest_identity(open_table(cfg, create=False), cfg.handoff_id, cfg.query_name)


def record_epoch(cfg: AppConfig, ranges: dict[str, dict[str, list[int]]], reason: str, kafka: dict[str, Any]) -> str:
    """`handoff ledger accept-kafka`: commit an `epoch` marker snapshot whose partitions start at `ranges`."""
    snapshot = ledger.record_marker(open_table(cfg, create=False), cfg.handoff_id, cfg.query_name, ranges,
                                    ledger.EPOCH, reason, kafka)
    return f"snapshot {snapshot}"


def backfill_overlap(cfg: AppConfig) -> list[str]:
    """Offsets of `cfg.backfill` the table already holds (batches of any other query of this handoff)."""
    assert cfg.backfill is not None
    held = [c for c in ledger.list_commits(open_table(cfg, create=False), handoff_id=cfg.handoff_id)
            if c.query != cfg.query_name]
    return overlap_problems(held, cfg.backfill.ranges())


class LedgerMismatchError(RuntimeError):
    """A batch does not start where the table's ledger ends: committing it would duplicate or skip records."""


# ------------------------------------------------------------------------------------------ executors

@dataclass
class IcebergCommitMessage(WriterCommitMessage):  # type: ignore[misc]
    """What a write task hands the driver. `added_ids` are the field ids the task gave new columns."""

    write_uuid: str
    files: list[DataFile] = field(default_factory=list)
    rows: int = 0
    dlq_rows: int = 0
    max_event_time_ms: int | None = None
    add: list[tuple[str, IcebergType]] = field(default_factory=list)
    widen: list[tuple[str, IcebergType]] = field(default_factory=list)
    added_ids: dict[str, int] = field(default_factory=dict)
    records: int = 0  # Kafka records read (rows + dead letters); the fused path's Spark row count is ranges
    kafka_bytes: int | None = 0  # their keys' and values' bytes (sink.common.record_bytes); None: not counted
    task_ms: dict[str, float] = field(default_factory=dict)  # where the task's time went (profiling)
    schemas: dict[str, list[str]] = field(default_factory=dict)  # registry writer schemas of the rows


def _provisional_metadata(metadata: TableMetadata, schema: Schema) -> TableMetadata:
    schema = schema.model_copy(update={"schema_id": max(s.schema_id for s in metadata.schemas) + 1})
    return metadata.model_copy(update={
        "schemas": [*metadata.schemas, schema], "current_schema_id": schema.schema_id,
        "last_column_id": max(metadata.last_column_id, schema.highest_field_id)})


def prepare_batch(decoded: pa.Table, metadata: TableMetadata, evolution: str) -> tuple[pa.Table, TableMetadata, SchemaPlan]:
    """Plan schema changes for a decoded batch and shape the batch for the (possibly provisional) table."""
    wanted: list[tuple[str, IcebergType]] = []
    unsupported: list[str] = []
    for f in decoded.schema:
        t = iceberg_type_of_arrow(f.type)
        if t is None:
            if pa.types.is_null(f.type):
                continue  # a discovered column that was null in every record: nothing to store yet
            unsupported.append(f"column {f.name!r} has unsupported type {f.type}")
        else:
            wanted.append((f.name, t))
    plan = plan_schema_changes(metadata.schema(), wanted, evolution)
    if unsupported:
        plan = SchemaPlan(add=plan.add, widen=plan.widen, incompatible=plan.incompatible + tuple(unsupported),
                          ignored=plan.ignored)
    if plan.incompatible:
        return decoded, metadata, plan
    target_meta = metadata
    if plan.changes_table:
        target_meta = _provisional_metadata(metadata, apply_plan_locally(metadata.schema(), plan,
                                                                         metadata.last_column_id))
    target = target_meta.schema()
    arrow_schema = schema_to_pyarrow(target, include_field_ids=False)
    arrays = []
    for af in arrow_schema:
        if af.name in decoded.column_names:
            arrays.append(decoded.column(af.name).cast(af.type))
        else:
            arrays.append(pa.nulls(decoded.num_rows, af.type))
    return pa.Table.from_arrays(arrays, schema=arrow_schema), target_meta, plan



def write_data_files(metadata: TableMetadata, io: Any, tbl: pa.Table, write_uuid: uuid.UUID) -> list[DataFile]:
    """Parquet files for `tbl` through PyIceberg's writer (partitioning via pyiceberg-core; `parquet_writer`'s
    encodings): one file per partition value (up to the table's target file size), named with the attempt's
    write UUID."""
    written: list[DataFile] = []
    try:
        for df in data_files(metadata, tbl, io, write_uuid):
            written.append(df)
    except BaseException:
        delete_files(io, [f.file_path for f in written])
        raise
    return written


def delete_files(io: Any, paths: list[str]) -> None:
    for p in paths:
        try:
            io.delete(p)
        except FileNotFoundError:
            pass
        except Exception:  # noqa: BLE001 - best effort; the orphan sweep retries later
            log.warning("could not delete %s", p, exc_info=True)


def _send_dead_letters(cfg: AppConfig, raw: pa.Table, dead: list[Any]) -> None:
    if not dead:
        return
    try:
        from handoff_spark.sink import dead_letters as dlq  # type: ignore[attr-defined]
    except ImportError as exc:
        raise RuntimeError(f"{len(dead)} dead letters but handoff_spark.sink.dead_letters is not available") from exc
    dlq.send_dead_letters(cfg, raw, dead)  # type: ignore[attr-defined]



def _dead_letter_misfits(cfg: AppConfig, raw: pa.Table, dead: list[DeadLetter], metadata: TableMetadata
                         ) -> tuple[pa.Table, list[DeadLetter]]:
    """The batch without the records whose values the table's columns cannot take (`misfits`), which join its
    dead letters; decoded again from the records that remain."""
    gone = {d.index for d in dead}
    kept = [i for i in range(raw.num_rows) if i not in gone]

    def conflict(rows: Sequence[int]) -> str | None:
        sub = decode_source(raw.take(pa.array(rows, pa.int64())), cfg)[0]
        plan = prepare_batch(sub, metadata, cfg.schema_.evolution)[2]
        return "; ".join(plan.incompatible) or None

    found = misfits(kept, conflict)
    topics, partitions, offsets = raw.column("topic"), raw.column("partition"), raw.column("offset")
    dead = sorted(dead + [DeadLetter(i, topics[i].as_py(), partitions[i].as_py(), offsets[i].as_py(),
                                     "type-mismatch", f"the table cannot take it: {why}")
                          for i, why in found.items()], key=lambda d: d.index)
    rest = [i for i in kept if i not in found]
    return decode_source(raw.take(pa.array(rest, pa.int64())), cfg)[0], dead


def write_task(cfg: AppConfig, iterator: Iterator[pa.RecordBatch]) -> IcebergCommitMessage:
    """A write task (executors): read/decode its records, write Parquet files for them (not yet table data)."""
    write_uuid = uuid.uuid4()
    t0 = time.perf_counter()
    msg = IcebergCommitMessage(write_uuid=str(write_uuid))
    batch_id = task_batch_id()
    # first, so that it holds the batch's first task whatever its ranges hold, empty ones too
    faults.maybe_stall("stall-task", batch_id)
    # Fused path (`handoff-kafka-ranges`): this task reads its ranges from Kafka itself, and decodes what it
    # read while the consumer fetches the rest.
    raw, decoded, dead, msg.schemas, decode_s = decode_while_reading(task_records(cfg, iterator), cfg)
    if raw is None:
        return msg
    msg.records = raw.num_rows
    msg.kafka_bytes = record_bytes(raw)
    t2 = time.perf_counter()
    t1 = t2 - decode_s
    msg.dlq_rows = len(dead)
    table = open_table(cfg)
    shaped, meta, plan = prepare_batch(decoded, table.metadata, cfg.schema_.evolution)
    if plan.incompatible and cfg.schema_.on_incompatible == "deadLetter":
        decoded, dead = _dead_letter_misfits(cfg, raw, dead, table.metadata)
        msg.dlq_rows = len(dead)
        shaped, meta, plan = prepare_batch(decoded, table.metadata, cfg.schema_.evolution)
    if plan.incompatible:
        # Column-level conflicts (the decoder already dead-lettered record-level ones): halt the query.
        raise SchemaIncompatibleError(
            f"handoff {cfg.handoff_id}: table {_sink(cfg).table} cannot take this batch: "
            + "; ".join(plan.incompatible)
            + ". Fix: declare a compatible type, or migrate the table (Handoff never narrows a column).")
    msg.add, msg.widen = list(plan.add), list(plan.widen)
    msg.added_ids = {dotted(name): meta.schema().find_field(dotted(name)).field_id for name, _ in plan.add}
    msg.rows = shaped.num_rows
    msg.max_event_time_ms = max_event_time_ms(shaped, cfg.schema_.event_time_column)
    try:
        t3 = time.perf_counter()
        if shaped.num_rows:
            msg.files = write_data_files(meta, table.io, shaped, write_uuid)
        t4 = time.perf_counter()
        if faults.armed("fail-task", batch_id):
            raise RuntimeError("HANDOFF_FAULT fail-task (test hook)")
        _send_dead_letters(cfg, raw, dead)
        msg.task_ms = {"read": (t1 - t0) * 1000, "decode": (t2 - t1) * 1000, "open_table": (t3 - t2) * 1000,
                       "write": (t4 - t3) * 1000, "dlq": (time.perf_counter() - t4) * 1000}
    except BaseException:
        # A failed attempt removes its own files; a killed one leaves them to the orphan sweep.
        delete_files(table.io, [f.file_path for f in msg.files])
        raise
    faults.maybe_crash("crash-mid-write", batch_id)
    return msg


def write_rows_task(cfg: AppConfig, iterator: Iterator[pa.RecordBatch],
                    seed_line: str | None = None) -> IcebergCommitMessage:
    """A write task whose input is rows already decoded (a `decode.frame` frame, or what Spark made of one: a SQL
    transform's output), not Kafka records: shaped to the table and written as Parquet files, like `write_task`'s
    rows after its decode. Nothing is decoded here (the frame source did it, sent the decode and late dead letters
    and counted the records: `commit_batch(frames=True)` takes them from there); a row whose required column the
    transform left null is a dead letter (its value the row as JSON), as on BigQuery.

    Why apart from `write_task`: on a DataFrame path the task's rows are no longer the batch's records (a filter
    or a dedupe dropped some), so `records` counts the rows received; the batch's Kafka ranges, and so the ledger,
    still come from Spark's offset log at commit (`commit_batch`), never from the rows. `seed_line`: rows below it
    only rebuilt the dedupe's window (`driver.seed`) and are already in the table: dropped."""
    write_uuid = uuid.uuid4()
    t0 = time.perf_counter()
    msg = IcebergCommitMessage(write_uuid=str(write_uuid))
    batch_id = task_batch_id()
    faults.maybe_stall("stall-task", batch_id)
    batches = [b for b in iterator if b.num_rows]
    t1 = time.perf_counter()
    if not batches:
        return msg
    rows = pa.Table.from_batches(batches)
    rows = above_seed_line(rows, ckpt.parse_seed_line(seed_line))
    # A required column the transform left null: a dead letter, not a failed batch (sink.dead_letters).
    kept, dead = split_missing_required(rows, [c.name for c in cfg.schema_.columns if c.required])
    if dead:
        send_row_dead_letters(cfg, rows, dead)
        msg.dlq_rows = len(dead)
    rows = kept
    if not rows.num_rows:
        return msg
    table = open_table(cfg)
    shaped, meta, plan = prepare_batch(rows, table.metadata, cfg.schema_.evolution)
    if plan.incompatible:
        raise SchemaIncompatibleError(
            f"handoff {cfg.handoff_id}: table {_sink(cfg).table} cannot take this batch: "
            + "; ".join(plan.incompatible) + ". Fix: make the transform's output fit the declared schema.")
    msg.add, msg.widen = list(plan.add), list(plan.widen)
    msg.added_ids = {dotted(name): meta.schema().find_field(dotted(name)).field_id for name, _ in plan.add}
    msg.rows = shaped.num_rows
    msg.max_event_time_ms = max_event_time_ms(shaped, cfg.schema_.event_time_column)
    t2 = time.perf_counter()
    msg.files = write_data_files(meta, table.io, shaped, write_uuid)
    if faults.armed("fail-task", batch_id):
        delete_files(table.io, [f.file_path for f in msg.files])
        raise RuntimeError("HANDOFF_FAULT fail-task (test hook)")
    msg.task_ms = {"read": (t1 - t0) * 1000, "decode": 0.0, "open_table": (t2 - t1) * 1000,
                   "write": (time.perf_counter() - t2) * 1000, "dlq": 0.0}
    faults.maybe_crash("crash-mid-write", batch_id)
    return msg



# ---------------------------------------------------------------------------------------- driver side

@dataclass(frozen=True)
class CommitResult(SinkCommitResult):
    """The common keys, and where the batch's write tasks spent their time."""

    task_ms: dict[str, float] = field(default_factory=dict)  # summed over the batch's write tasks


#: The degraded reason while the catalog does not answer at a driver's start (`driver.table_wait`).
OUTAGE_REASON = DEGRADED_CATALOG_UNAVAILABLE
#: Where the catalog's address is in the spec (named by the driver when its host does not resolve).
OUTAGE_FIELD = "spec.sink.iceberg.catalog.properties (uri)"
#: What in an SQL catalog's error says its server did not answer (psycopg2's refused or timed-out connection, a
#: server starting or stopping, SQLite's lock, a host name that does not resolve: a Service not made yet, or a wrong
#: host, which the driver's line names), not a wrong setting ("unable to open database file": a bad path).
_UNANSWERED = ("connection refused", "could not connect", "timeout expired", "timed out", "connection reset",
               "server closed the connection", "database is locked", "the database system is starting up",
               "the database system is shutting down", "terminating connection", "no route to host",
               "could not translate host name")


def is_outage(exc: BaseException) -> bool:
    """At a driver's start: the catalog (or the warehouse's store) did not answer, which the driver waits out
    (`driver.table_wait`), as opposed to a wrong setting, which fails the start with its message. Narrower than the
    commit path's `_is_catalog_outage`, which retries a table that answered a moment ago."""
    names = {c.__name__ for c in type(exc).__mro__}
    if names & {"ConnectionError", "TimeoutError", "ConnectTimeout", "ReadTimeout", "DisconnectionError",
                "EndpointConnectionError"}:
        return True
    if names & {"OperationalError", "InterfaceError"}:
        text = str(exc).lower()
        return any(s in text for s in _UNANSWERED)
    return False


def forget_clients(cfg: AppConfig) -> None:
    """Drop the cached catalog, so the next try connects afresh (a pool of dead connections is not reused)."""
    sink = _sink(cfg)
    forget_catalog(sink.catalog_name, sink.catalog_properties)


def _is_catalog_outage(exc: BaseException) -> bool:
    """Connection-level trouble with the catalog or storage (retry), as opposed to a logic error (raise)."""
    names = {c.__name__ for c in type(exc).__mro__}
    return bool(names & {"OperationalError", "InterfaceError", "DisconnectionError", "TimeoutError",
                         "ConnectionError", "PermissionError", "OSError"})


def _merge_plans(table: Table, msgs: list[IcebergCommitMessage], evolution: str) -> SchemaPlan:
    wanted = [*(a for m in msgs for a in m.add if isinstance(a[0], str)), *(w for m in msgs for w in m.widen)]
    plan = plan_schema_changes(table.schema(), wanted, evolution)
    # fields new inside a struct: added unless the table already has them (another task's, or a commit's)
    nested = {n: t for m in msgs for n, t in m.add if not isinstance(n, str) and not _has_field(table, n)}
    if not nested:
        return plan
    return SchemaPlan(add=tuple(sorted([*plan.add, *nested.items()], key=lambda kv: dotted(kv[0]))),
                      widen=plan.widen, incompatible=plan.incompatible, ignored=plan.ignored)


def apply_schema_plan(target: Any, plan: SchemaPlan) -> None:
    """Apply `plan` through PyIceberg's `update_schema` of a table or a transaction: new columns (a tuple path
    adds a field inside a struct), then widenings."""
    with target.update_schema() as us:
        for name, typ in plan.add:
            us.add_column(name, typ)
        for name, typ in plan.widen:
            us.update_column(name, field_type=typ)


def _has_field(table: Table, path: tuple[str, ...]) -> bool:
    try:
        table.schema().find_field(dotted(path))
        return True
    except ValueError:
        return False


def _rewrite_file(io: Any, metadata: TableMetadata, f: DataFile) -> list[DataFile]:
    """Re-write a provisional file whose new-column ids differ from the ones the commit assigned (two tasks
    discovered different new columns in one batch): read by name, write with the final schema."""
    import pyarrow.parquet as pq
    with io.new_input(f.file_path).open() as stream:
        tbl = pq.read_table(stream)
    arrow_schema = schema_to_pyarrow(metadata.schema(), include_field_ids=False)
    arrays = [tbl.column(af.name).cast(af.type) if af.name in tbl.column_names else pa.nulls(tbl.num_rows, af.type)
              for af in arrow_schema]
    return write_data_files(metadata, io, pa.Table.from_arrays(arrays, schema=arrow_schema), uuid.uuid4())


@dataclass(frozen=True)
class TableCommit:
    table: Table | None
    snapshot_id: int | None
    skipped: bool
    attempts: int


class _MemoTransaction(Transaction):
    """PyIceberg's Transaction with `table_metadata` memoised and computed without a deep copy.

    Why: `Transaction.table_metadata` re-applies the staged updates and returns a *deep copy* of the whole table
    metadata on every access, and one append reads it ~16 times. The copy costs O(snapshots in the metadata), so
    commit latency grew with history (profiled: ~80% of a commit at ~75 retained snapshots). The result is a pure
    function of (base metadata, staged updates) — both immutable objects that are replaced, never mutated — so it
    is cached on their identity, and computed with `iceberg_catalog.apply_updates` (the same updates, no final
    deep copy; with nothing staged it is the base itself). Nothing in the commit path mutates metadata in place.
    """

    _memo: tuple[Any, Any, TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        memo = self._memo
        base, updates = transaction_state(self)
        if memo is not None and memo[0] is base and memo[1] is updates:
            return memo[2]
        result = apply_updates(base, updates)
        self._memo = (base, updates, result)
        return result


def _drop_replay_files(table: Table, snapshot_id: int, msgs: list[IcebergCommitMessage]) -> None:
    """A skipped replay wrote files of its own; delete those the committed snapshot does not reference (if an
    earlier attempt of *this* commit landed despite reporting failure, its files are the committed ones)."""
    paths = [f.file_path for m in msgs for f in m.files]
    if not paths:
        return
    from handoff_spark.iceberg import maintenance
    committed = maintenance.files_in_snapshot(table, snapshot_id)
    delete_files(table.io, [p for p in paths if p not in committed])


def check_contiguous(table: Table, cfg: AppConfig, batch_id: int, ranges: ckpt.OffsetRange) -> None:
    """The one check that keeps duplicates out whatever happens to checkpoints or to a second (zombie) driver:
    every partition's range must start where the table's ledger ends (see `handoff_spark.ledger.record.contiguity_problems`)."""
    moving = {tp for tp, (start, end) in ranges.items() if end > start}
    problems = contiguity_problems(ranges, ledger.ledger_end(table, cfg.handoff_id, cfg.query_name, moving))
    if problems:
        raise LedgerMismatchError(
            f"batch {batch_id} of handoff {cfg.handoff_id} is not committed: " + "; ".join(problems)
            + ". Another writer moved the table or the checkpoint is stale; the driver restarts and resumes from "
              "the table's ledger.")


def entering(table: Table, cfg: AppConfig, ranges: ckpt.OffsetRange) -> list[tuple[str, int]]:
    """The partitions of a batch that reads nothing which the table's ledger has never named: a topic added to the
    handoff, or a new partition, entering at its entry offset (`checkpoint.batch_range`: an empty range there).

    Why such a batch is committed (a snapshot without data): the ledger is the truth, so it must know where the
    partition entered. Otherwise a driver that lost its checkpoint before the partition's first record would
    take it again at `startingOffsets` (a later `latest` skips what came in between), and the lag would count
    the history before the entry as waiting. Only an empty batch asks (a batch with data names every partition
    anyway); the lookup stops once the newest entries name them all."""
    named = ledger.ledger_end(table, cfg.handoff_id, cfg.query_name, set(ranges))
    return sorted(tp for tp in ranges if tp not in named)


def commit_to_table(cfg: AppConfig, msgs: list[IcebergCommitMessage], batch_id: int,
                    ranges: ckpt.OffsetRange, query_id: str | None,
                    extra_props: dict[str, str] | None = None) -> TableCommit:
    """The table half of a batch commit: skip if the batch is in the current ancestry, else one snapshot
    (schema evolution + append in ONE transaction) carrying the ledger properties. Bounded retries: a
    conflict or a catalog outage reloads the table and re-checks the ancestry before trying again (the
    previous attempt may have landed even if it reported failure)."""
    sink = _sink(cfg)
    offsets_json = ckpt.to_json_ranges(ranges)
    event_times = [m.max_event_time_ms for m in msgs if m.max_event_time_ms is not None]
    props = {
        ledger.ID: cfg.handoff_id, ledger.QUERY: cfg.query_name, ledger.BATCH_ID: str(batch_id),
        ledger.OFFSETS: json.dumps(offsets_json, separators=(",", ":")),
        ledger.ROWS: str(sum(m.rows for m in msgs)), ledger.DLQ_ROWS: str(sum(m.dlq_rows for m in msgs)),
        ledger.MAX_EVENT_TIME_MS: str(max(event_times)) if event_times else "",
    }
    if query_id:
        props[ledger.QUERY_ID] = query_id
    props.update(extra_props or {})
    schemas = {sid: versions for m in msgs for sid, versions in m.schemas.items()}
    if schemas:
        props[ledger.SCHEMAS] = json.dumps(schemas, separators=(",", ":"), sort_keys=True)
    lost = ckpt.gaps_in(cfg.checkpoint_location, ranges)
    if lost:
        props[ledger.LOST] = json.dumps(lost, separators=(",", ":"), sort_keys=True)
    identity = ckpt.read_kafka_identity(cfg.checkpoint_location)
    if identity:
        props[ledger.KAFKA] = json.dumps(identity, separators=(",", ":"), sort_keys=True)
    attempts = 0
    replaced: list[str] = []
    table: Table | None = None
    last_error: BaseException | None = None
    while attempts <= sink.commit_retries:
        attempts += 1
        try:
            table = open_table(cfg)
            done = ledger.find_batch(table, cfg.handoff_id, cfg.query_name, batch_id, query_id)
            if done is not None:
                log.info("batch %s already committed as snapshot %s: skipping", batch_id, done.snapshot_id)
                _drop_replay_files(table, done.snapshot_id, msgs)
                return TableCommit(table, done.snapshot_id, True, attempts)
            check_contiguous(table, cfg, batch_id, ranges)
            faults.maybe_crash("crash-before-table-commit", batch_id)
            if faults.armed("catalog-outage", batch_id):
                raise ConnectionError("HANDOFF_FAULT catalog-outage (test hook)")
            tx = _MemoTransaction(table)
            plan = _merge_plans(table, msgs, cfg.schema_.evolution)
            if plan.incompatible:
                raise SchemaIncompatibleError(f"batch {batch_id}: " + "; ".join(plan.incompatible))
            if plan.changes_table:
                apply_schema_plan(tx, plan)
            final_schema = tx.table_metadata.schema() if plan.changes_table else table.schema()
            files: list[DataFile] = []
            replaced = []
            for m in msgs:
                ids_ok = all(final_schema.find_field(n).field_id == i for n, i in m.added_ids.items())
                widen_ok = all(final_schema.find_field(n).field_type == t for n, t in m.widen)
                if ids_ok and widen_ok:
                    files.extend(m.files)
                else:
                    for f in m.files:
                        files.extend(_rewrite_file(table.io, tx.table_metadata, f))
                        replaced.append(f.file_path)
            if not files and not any(se[0] != se[1] for se in ranges.values()):
                entered = entering(table, cfg, ranges)
                if not entered:
                    log.info("batch %s is empty: nothing to commit", batch_id)
                    return TableCommit(table, None, False, attempts)
                log.info("batch %s reads no records; committed to record where %s entered", batch_id,
                         ", ".join(f"{t}[{p}] (at {ranges[(t, p)][1]})" for t, p in entered))
            # merge_append when the table asks for manifest merging (Handoff's tables do): keeps the manifest
            # list short so commit latency does not grow with history; fast_append otherwise.
            producer = tx.update_snapshot(snapshot_properties=props)
            merge = table.metadata.properties.get("commit.manifest-merge.enabled", "false").lower() == "true"
            with (producer.merge_append() if merge else producer.fast_append()) as fa:
                for f in files:
                    fa.append_data_file(f)
            table = tx.commit_transaction()
            snap = table.current_snapshot()
            if replaced:
                delete_files(table.io, replaced)
            return TableCommit(table, snap.snapshot_id if snap else None, False, attempts)
        except CommitFailedException as exc:
            last_error = exc
            log.warning("batch %s: commit conflict (attempt %s): %s", batch_id, attempts, exc)
        except (SchemaIncompatibleError, LedgerMismatchError):
            raise
        except Exception as exc:  # noqa: BLE001
            if not _is_catalog_outage(exc):
                raise
            last_error = exc
            forget_catalog(sink.catalog_name, sink.catalog_properties)
            log.warning("batch %s: catalog unavailable (attempt %s): %s", batch_id, attempts, exc)
        time.sleep(min(8.0, 0.25 * 2 ** (attempts - 1)) * random.uniform(0.8, 1.2))
    raise CatalogUnavailableError(
        f"batch {batch_id}: table {sink.table} did not accept the commit after {attempts} attempts "
        f"(commitRetries={sink.commit_retries}): {last_error}. The batch will be replayed exactly once on "
        f"restart.") from last_error


def commit_batch(cfg: AppConfig, msgs: list[IcebergCommitMessage], batch_id: int,
                 frames: bool = False) -> CommitResult:
    """Driver commit of one Spark micro-batch: its offsets from Spark's offset log, then `commit_ranges`.

    `frames`: the DataFrame path (`sink.frames`): the write tasks saw rows, not records; what the batch read,
    sent to dead letters and judged late comes from the read tasks' counts, and the ledger entry records how many
    records the transform filtered or the dedupe dropped (read − dead letters − late kept aside − rows)."""
    ranges = ckpt.batch_range(cfg.checkpoint_location, batch_id)
    extra: dict[str, str] = {}
    if frames:  # a seed batch's records are in the table already (driver.seed): the ledger starts at the line
        ranges = ckpt.clip_to_seed_line(ranges, ckpt.read_seed_line(cfg.checkpoint_location))
        from handoff_spark.sink.frames import frame_counts

        counts = frame_counts(cfg, batch_id, ranges)
        rows = sum(m.rows for m in msgs)
        rejected = sum(m.dlq_rows for m in msgs)  # rows the writers dead-lettered (sink.dead_letters)
        if counts.complete:
            msgs = [*msgs, IcebergCommitMessage(write_uuid="frame-counts", records=counts.records,
                                                dlq_rows=counts.dlq_rows, max_event_time_ms=counts.max_event_time_ms,
                                                kafka_bytes=counts.kafka_bytes)]
            extra[ledger.LATE_ROWS] = str(counts.late_rows)
            extra[ledger.DROPPED_ROWS] = str(max(0, counts.records - counts.dlq_rows - rejected - rows))
        else:
            log.warning("batch %s: the read tasks' counts are not all on this machine (executors without the "
                        "checkpoint's volume): the ledger entry records rows only", batch_id)
            for m in msgs:
                m.kafka_bytes = None  # the rows tasks read no Kafka records; what the read tasks read is unknown
    result = commit_ranges(cfg, msgs, batch_id, ranges, spark_query_id(cfg.checkpoint_location),
                           extra_props=extra)
    if frames:
        ckpt.clear_frame_stats(cfg.checkpoint_location, up_to=batch_id)
    return result


def commit_ranges(cfg: AppConfig, msgs: list[IcebergCommitMessage], batch_id: int, ranges: ckpt.OffsetRange,
                  query_id: str | None,
                  extra_props: dict[str, str] | None = None) -> CommitResult:
    """Commit one batch of `ranges` (the table commit with its ledger check, then — only after it is durable —
    the consumer-group offsets, the progress record and periodic upkeep), for Spark's commit (`commit_batch`)."""
    t0 = time.monotonic()
    offsets_json = ckpt.to_json_ranges(ranges)
    tc = commit_to_table(cfg, msgs, batch_id, ranges, query_id, extra_props)
    commit_ms = round((time.monotonic() - t0) * 1000, 1)
    faults.maybe_crash("crash-after-table-commit", batch_id)
    group_ok = False
    if tc.snapshot_id is not None and cfg.backfill is None:  # a backfill never moves the stream's group offsets
        end = {t: {int(p): se[1] for p, se in parts.items()} for t, parts in offsets_json.items()}
        group_ok = commit_group_offsets(cfg.source.bootstrap_servers, cfg.consumer_group, end,
                                        cfg.source.properties)
    result = CommitResult(batch_id=batch_id, snapshot_id=tc.snapshot_id, skipped=tc.skipped,
                          rows=sum(m.rows for m in msgs), dlq_rows=sum(m.dlq_rows for m in msgs),
                          offsets=offsets_json, commit_latency_ms=commit_ms, attempts=tc.attempts,
                          group_offsets_committed=group_ok, records=sum(m.records for m in msgs),
                          max_event_time_ms=max((m.max_event_time_ms for m in msgs
                                                 if m.max_event_time_ms is not None), default=None),
                          task_ms={k: round(sum(m.task_ms.get(k, 0.0) for m in msgs), 1)
                                   for k in ("read", "decode", "open_table", "write", "dlq")},
                          **cost_of(msgs, committed=tc.snapshot_id is not None and not tc.skipped))
    write_last_commit(cfg.checkpoint_location, result)
    if tc.table is not None and not tc.skipped and tc.snapshot_id is not None:
        from handoff_spark.iceberg import maintenance
        upkeep = maintenance.after_commit(tc.table, cfg, batch_id)
        if upkeep is not None and upkeep.compacted_files:
            # The rewrite's cost goes with this batch's record (written again: the first one is the commit's,
            # kept before upkeep so a crash in it still leaves the batch's record).
            result = dataclasses.replace(result, rewritten_files=upkeep.compacted_files,
                                         rewritten_bytes=upkeep.rewrite_written_bytes)
            write_last_commit(cfg.checkpoint_location, result)
    return result



def cost_of(msgs: list[IcebergCommitMessage], committed: bool) -> dict[str, int | None]:
    """What the batch cost: the Kafka bytes its tasks read (None when a task did not count them) and, when it
    made a snapshot, the data files it added and their bytes."""
    kafka = [m.kafka_bytes for m in msgs]
    files = [f for m in msgs for f in m.files] if committed else []
    return {"kafka_bytes": None if not msgs or any(b is None for b in kafka) else sum(b for b in kafka if b),
            "files_added": len(files), "file_bytes": sum(int(f.file_size_in_bytes) for f in files)}


def abort_batch(cfg: AppConfig, msgs: list[IcebergCommitMessage], batch_id: int) -> None:
    """Delete this attempt's files — unless the batch did commit (abort after a commit whose acknowledgement
    failed): then they are table data and stay."""
    paths = [f.file_path for m in msgs for f in m.files]
    if not paths:
        return
    table = open_table(cfg)
    if ledger.find_batch(table, cfg.handoff_id, cfg.query_name, batch_id,
                         spark_query_id(cfg.checkpoint_location)) is not None:
        log.warning("abort of batch %s after it committed: keeping its files", batch_id)
        return
    delete_files(table.io, paths)


# ------------------------------------------------------------------------------------- query start

def prepare(cfg: AppConfig) -> Table:
    """Driver, before the query starts: create the table if needed, reconcile the declared schema with it
    (widen/add under evolution=compatible, halt on anything incompatible), sweep orphan files."""
    sink = _sink(cfg)
    catalog = load_catalog_cached(sink.catalog_name, sink.catalog_properties)
    if sink.auto_create:
        table = ensure_table(catalog, sink.table, declared_schema(cfg.schema_.columns, cfg.source.format), sink.partition_by)
    else:
        table = catalog.load_table(sink.table)
    ensure_history_bounded(table)  # tables made before Handoff set these (or by someone else) keep growing
    wanted = [(c.name, iceberg_type(c.type)) for c in cfg.schema_.columns]
    plan = plan_schema_changes(table.schema(), wanted, cfg.schema_.evolution)
    if plan.incompatible:
        raise SchemaIncompatibleError(
            f"handoff {cfg.handoff_id}: declared schema does not fit table {sink.table}: "
            + "; ".join(plan.incompatible) + ". Handoff never narrows a column; declare a compatible type.")
    if plan.changes_table:
        apply_schema_plan(table, plan)
        table = catalog.load_table(sink.table)
    from handoff_spark.iceberg import maintenance
    maintenance.remove_orphan_files(table, older_than_seconds=cfg.maintenance.orphan_min_age_seconds)
    return table



__all__ = ["ledger_end", "ledger_identity", "record_epoch", "LedgerMismatchError", "IcebergCommitMessage", "CommitResult", "prepare", "write_task", "write_rows_task", "commit_ranges",
           "commit_batch", "abort_batch", "open_table", "read_last_commit", "SchemaIncompatibleError",
           "CatalogUnavailableError"]
