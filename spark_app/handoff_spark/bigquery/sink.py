"""The `handoff-bigquery` streaming sink: executors append Arrow record batches to PENDING write streams they
create; the driver finalizes them and commits all of a micro-batch's streams with one BatchCommitWriteStreams
— atomic because they all target one table. The protocol and why it is exactly-once are in
docs/bigquery-exactly-once.md; in short:

1. The data table is its own ledger: every row carries `_kafka_topic/_kafka_partition/_kafka_offset` (and
   `_handoff_batch_id`). BatchCommitWriteStreams is atomic only within one table, so nothing that must be
   atomic with the data may live in another table.
2. Before committing batch N, the driver asks the table whether any row of batch N's offset range (from
   Spark's offset log) is already there. One batch commit is all-or-nothing, so "any" means "all": the batch
   was committed before Spark recorded it (crash between the two) and is skipped. Streams of a skipped or
   failed attempt are never committed, so their rows never become visible.
3. The check costs one query, so it runs only when this process cannot know the answer: the first commit
   after start, or after any failed commit. A process that itself committed batch N-1 knows batch N is new.
4. A separate `<table>__handoff_ledger` table (batch, offsets, rows, Kafka identity) is written after the data
   commit as an index for the operator: best effort, never consulted for correctness, rebuildable from the data
   table. Its markers (gap, epoch) are the exception: written on purpose, with the driver stopped.
5. After an `epoch` marker accepted a recreated topic (`handoff ledger accept-kafka`), its new offsets start
   again where the old topic's rows still are: the sink stamps the new rows with the topic id
   (`_kafka_topic_id`), and every read of the table above keeps to that incarnation's rows.

Usage (the app does this):
    prepare(cfg)                 # driver, before the query: create/evolve the table
    raw.writeStream.format("handoff-bigquery").option("config", cfg.to_json()) ...
"""
from __future__ import annotations

import concurrent.futures
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import pyarrow as pa

from handoff_spark import checkpoint as ckpt
from handoff_spark.bigquery import client as bigquery_client, ledger as bigquery_ledger
from handoff_spark import faults
from handoff_spark.contract import DEGRADED_BIGQUERY_RESOURCE_EXHAUSTED, DEGRADED_BIGQUERY_UNAVAILABLE
from handoff_spark.bigquery.append import AppendStats, RetryPolicy, StreamResult, StreamWriter, percentile
from handoff_spark.bigquery.table import add_columns, fields_of, schema_fields
from handoff_spark.bigquery.schema import (BATCH_ID, KAFKA_OFFSET, KAFKA_PARTITION, KAFKA_TOPIC, KAFKA_TOPIC_ID,
                                           TOPIC_ID_FIELD, Field, UnknownColumns, arrow_schema, conform,
                                           declared_fields, plan_schema)
from handoff_spark.ledger.record import EPOCH, contiguity_problems, incarnations, of_incarnation
from handoff_spark.ledger.record import overlap_problems as held_overlaps
from handoff_spark.config import AppConfig, BigQuerySink
from handoff_spark.errors import HandoffConfigError
from handoff_spark.decode.records import DeadLetter
from handoff_spark.decode.batch import decode_source
from handoff_spark.kafka.offsets import commit_group_offsets
from handoff_spark.checkpoint import read_last_commit
from handoff_spark.sink.common import (CommitResult as SinkCommitResult, ConfigOnDemand, above_seed_line, SchemaIncompatibleError, configured_sink, max_event_time_ms,
                           record_bytes, task_batch_id, task_records, write_last_commit)

from handoff_spark.sink.datasource_api import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

log = logging.getLogger(__name__)


class BatchCommitError(RuntimeError):
    """BigQuery refused the batch commit, or the batch's rows do not add up; the batch is not applied."""


def _sink(cfg: AppConfig) -> BigQuerySink:
    return configured_sink(cfg, BigQuerySink, "handoff-bigquery")


def warm_up(cfg: AppConfig) -> None:
    """Executors: the Storage Write API client a fresh Python worker creates before its first append, done
    ahead on a new executor (executor_warmup). Opens no stream, appends nothing."""
    bigquery_client.write_client(_sink(cfg))


# ------------------------------------------------------------------------------------------ table setup

@dataclass(frozen=True)
class TablePlan:
    """What executors need to know about the table: its columns, columns to leave out (conflicts under
    onIncompatible=deadLetter), and the topic id to stamp on the rows of each topic an `epoch` marker named
    (`_kafka_topic_id`, see the module docstring)."""

    fields: tuple[Field, ...]
    dropped: tuple[str, ...] = ()
    topic_ids: tuple[tuple[str, str], ...] = ()


def prepare(cfg: AppConfig) -> TablePlan:
    """Driver, before the query: create the table (time partitioning, clustering) if missing; add declared
    columns it lacks as NULLABLE under evolution=compatible (tables.patch); never change a column's type."""
    from google.api_core.exceptions import NotFound
    from google.cloud import bigquery

    sink = _sink(cfg)
    client = bigquery_client.rest_client(sink)
    wanted = declared_fields(cfg.schema_.columns)
    ref = bigquery_client.table_ref(sink)
    try:
        table = client.get_table(ref, retry=None)
    except NotFound:
        if not sink.auto_create:
            raise RuntimeError(f"BigQuery table {ref} does not exist and sink.autoCreate is false") from None
        try:
            client.create_dataset(f"{sink.project}.{sink.dataset}", exists_ok=True, retry=None)
        except Exception:  # noqa: BLE001 — no permission to create datasets is fine if it exists
            log.debug("create_dataset failed", exc_info=True)
        table = bigquery.Table(ref, schema=schema_fields(wanted))
        if sink.partition_by:
            table.time_partitioning = bigquery.TimePartitioning(type_=bigquery.TimePartitioningType.DAY,
                                                                field=sink.partition_by)
        # Clustering on the Kafka coordinates by default: it keeps the replay check (a range scan over
        # _kafka_partition/_kafka_offset) cheap on a large table.
        table.clustering_fields = list(sink.cluster_by) or [KAFKA_TOPIC, KAFKA_PARTITION, KAFKA_OFFSET]
        try:
            table = client.create_table(table, retry=None)
        except Exception:  # noqa: BLE001 — created concurrently (another query start): use it
            table = client.get_table(ref, retry=None)
    plan = plan_schema(fields_of(table), wanted)
    dropped: list[str] = []
    if plan.conflicts:
        text = "; ".join(f"column {n!r} is declared {d} but the table has {t}" for n, d, t in plan.conflicts)
        if cfg.schema_.on_incompatible == "halt":
            raise SchemaIncompatibleError(
                f"handoff {cfg.handoff_id}: declared schema does not fit BigQuery table {ref}: {text}. Handoff "
                f"never changes a column's type; declare the table's type or migrate the table.")
        log.warning("%s; values of these columns go to the dead-letter topic", text)
        dropped = [n for n, _, _ in plan.conflicts]
    if plan.add:
        if cfg.schema_.evolution != "compatible":
            missing = ", ".join(f.name for f in plan.add)
            raise SchemaIncompatibleError(
                f"handoff {cfg.handoff_id}: table {ref} lacks columns {missing} and schema.evolution is none. "
                f"Add them to the table, or set schema.evolution=compatible.")
        table = add_columns(client, ref, list(plan.add))
    current = {t: i for t, i in incarnations(bigquery_ledger.epochs(sink, cfg.handoff_id, client)).items()
               if t in cfg.source.topics}
    if current and KAFKA_TOPIC_ID not in {f.name for f in fields_of(table)}:
        table = add_columns(client, ref, [TOPIC_ID_FIELD])  # Handoff's own column: whatever schema.evolution says
    return TablePlan(tuple(fields_of(table)), tuple(dropped), tuple(sorted(current.items())))


# ------------------------------------------------------------------------------------------ executors

@dataclass
class BigQueryCommitMessage(WriterCommitMessage):  # type: ignore[misc]
    """What a write task hands the driver: its streams with confirmed row counts, and what it did."""

    streams: list[StreamResult] = field(default_factory=list)
    rows: int = 0
    dlq_rows: int = 0
    max_event_time_ms: int | None = None
    stats: AppendStats = field(default_factory=AppendStats)
    new_columns: list[str] = field(default_factory=list)
    records: int = 0  # Kafka records read (rows + dead letters); the fused path's Spark row count is ranges
    schemas: dict[str, list[str]] = field(default_factory=dict)  # registry writer schemas of the rows
    kafka_bytes: int | None = 0  # the records' keys and values (sink.common.record_bytes); None: not counted




def writer_settings(sink: BigQuerySink) -> dict[str, Any]:
    return {"fmt": sink.append_format, "max_rows": sink.max_rows_per_request, "max_bytes": sink.max_request_bytes,
            "max_inflight": sink.max_inflight}


class _DeadLetters:
    """Dead letters of one task, grouped by what they are made of: the raw Kafka batch they came from (the DLQ
    record keeps the original key, value and headers), or, on the DataFrame path, the Spark rows (the value is the
    row as JSON: `sink.dead_letters.send_row_dead_letters`)."""

    def __init__(self) -> None:
        self.groups: list[tuple[pa.Table, list[DeadLetter], bool]] = []
        self.count = 0

    def add(self, source: pa.Table, dead: list[DeadLetter], as_rows: bool = False) -> None:
        if dead:
            self.groups.append((source, dead, as_rows))
            self.count += len(dead)

    def send(self, cfg: AppConfig) -> None:
        if not self.count:
            return
        from handoff_spark.sink import dead_letters as dlq

        for source, dead, as_rows in self.groups:
            if as_rows:
                dlq.send_row_dead_letters(cfg, source, dead)
            else:
                dlq.send_dead_letters(cfg, source, dead)


@dataclass(frozen=True)
class _Chunk:
    """Decoded rows on their way to the table, and what a dead letter of one of them is made of.

    `source`: the raw Kafka records the rows were decoded from (a row finds its record by Kafka coordinates:
    decoding drops and reorders nothing it keeps, but dead letters leave gaps), or, on the DataFrame path, the rows
    themselves as Spark handed them over (`by_position`: row i is source row i; there is no record to keep, and a
    transform may even make two rows of one record, so coordinates would not tell them apart)."""

    source: pa.Table
    rows: pa.Table
    by_position: bool = False

    def dead(self, rejected: list[tuple[int, str]], reason: str) -> list[DeadLetter]:
        """Rows of `rows` (position, detail) → dead letters pointing at their rows in `source`."""
        if not rejected:
            return []
        at = pa.array([i for i, _ in rejected], pa.int64())
        topics, parts, offs = (self.rows.column(n).take(at).to_pylist()
                               for n in (KAFKA_TOPIC, KAFKA_PARTITION, KAFKA_OFFSET))
        if self.by_position:
            index = [i for i, _ in rejected]
        else:
            where = {(t, p, o): i for i, (t, p, o) in enumerate(zip(self.source.column("topic").to_pylist(),
                                                                   self.source.column("partition").to_pylist(),
                                                                   self.source.column("offset").to_pylist()))}
            index = [where[key] for key in zip(topics, parts, offs)]
        return [DeadLetter(index=j, topic=t, partition=int(p), offset=int(o), reason=reason,  # type: ignore[arg-type]
                           detail=detail) for j, t, p, o, (_, detail) in zip(index, topics, parts, offs, rejected)]


def _nth_kept(n: int, rejected: list[int]) -> int:
    """The position of the `n`-th row (from 0) that is not in `rejected` (sorted positions)."""
    pos = n
    for r in rejected:
        if r > pos:
            break
        pos += 1
    return pos


class _TaskAppender:
    """What both write tasks do with decoded rows (`write_partition`: decoded here from Kafka records;
    `write_rows_partition`: rows Spark made on the DataFrame path): stamp the batch id and the topic id, conform to
    the table's fields (adding discovered columns under evolution=compatible), dead-letter the rows BigQuery would
    reject, append the rest (PENDING streams under exactlyOnce), and, once the streams are closed, dead-letter the
    rows BigQuery itself rejected. One class so that the two paths cannot drift apart in what reaches the table."""

    def __init__(self, cfg: AppConfig, plan: TablePlan, batch_id: int | None) -> None:
        self.cfg, self.plan, self.batch_id = cfg, plan, batch_id
        self.sink = _sink(cfg)
        self.fields = list(plan.fields)
        self.settings = writer_settings(self.sink)
        self.requests_sent = 0
        self.msg = BigQueryCommitMessage()
        self.dead = _DeadLetters()
        # Each appended chunk with its rejected positions (sorted) and its appended row count, for BigQuery row
        # errors found after the fact (`writer.rejected` numbers rows across all appends).
        self.appended: list[tuple[_Chunk, list[int], int]] = []
        self.event_times: list[int] = []
        self.writer = StreamWriter(bigquery_client.write_client(self.sink), bigquery_client.table_path(self.sink),
                                   arrow_schema(self.fields), pending=self.sink.write_mode == "exactlyOnce",
                                   retry=RetryPolicy(), on_request=self._on_request, **self.settings)

    def _on_request(self) -> None:
        self.requests_sent += 1
        if self.batch_id is not None and self.requests_sent == 2:
            faults.maybe_crash("crash-mid-write", self.batch_id)  # kill -9 mid-append

    def append(self, chunk: _Chunk) -> None:
        cfg, plan = self.cfg, self.plan
        decoded = chunk.rows
        decoded = decoded.append_column(pa.field(BATCH_ID, pa.int64()),
                                        pa.array([self.batch_id] * decoded.num_rows, pa.int64()))
        if plan.topic_ids:
            stamp = dict(plan.topic_ids)
            decoded = decoded.append_column(pa.field(KAFKA_TOPIC_ID, pa.string()), pa.array(
                [stamp.get(t) for t in decoded.column(KAFKA_TOPIC).to_pylist()], pa.string()))
        try:
            shaped, rejected = conform(decoded, self.fields, plan.dropped)
        except UnknownColumns as exc:
            # Discovered columns (evolution=compatible in decode): BigQuery would reject the append. Add them
            # (NULLABLE) when allowed, else follow onIncompatible.
            if cfg.schema_.evolution == "compatible":
                self.fields = _add_discovered(cfg, decoded, exc.names)
                self.writer = _reopen(self.writer, arrow_schema(self.fields), self.sink, self._on_request,
                                      self.settings, self.msg)
                self.msg.new_columns += exc.names
                shaped, rejected = conform(decoded, self.fields, plan.dropped)
            elif cfg.schema_.on_incompatible == "halt":
                raise SchemaIncompatibleError(
                    f"handoff {cfg.handoff_id}: records have columns {exc.names} the BigQuery table lacks and "
                    f"schema.evolution is none") from exc
            else:
                decoded = decoded.drop_columns(exc.names)
                shaped, rejected = conform(decoded, self.fields, plan.dropped)
        self.dead.add(chunk.source, chunk.dead([(r.index, r.reason) for r in rejected],
                                               "missing-required" if all("REQUIRED" in r.reason for r in rejected)
                                               else "type-mismatch"), as_rows=chunk.by_position)
        met = max_event_time_ms(shaped, cfg.schema_.event_time_column)
        if met is not None:
            self.event_times.append(met)
        if shaped.num_rows:
            self.appended.append((chunk, sorted(r.index for r in rejected), shaped.num_rows))
            self.writer.write(shaped)

    def finish(self) -> BigQueryCommitMessage:
        """Close the streams, dead-letter BigQuery's row errors, send every dead letter (durable before the task
        reports success) and say what the task did."""
        msg = self.msg
        streams = self.writer.close()
        msg.stats.merge(self.writer.stats)
        # Rows BigQuery refused (row errors): the rest of their requests was resent, these go to the DLQ with
        # BigQuery's message.
        for i, text in sorted(self.writer.rejected):
            base = 0
            for chunk, rejected, count in self.appended:
                if i < base + count:
                    pos = _nth_kept(i - base, rejected)
                    self.dead.add(chunk.source, chunk.dead([(pos, text)], "rejected-by-bigquery"),
                                  as_rows=chunk.by_position)
                    break
                base += count
        self.dead.send(self.cfg)  # durable before the task reports success
        msg.streams = streams
        msg.rows = msg.stats.rows
        msg.dlq_rows = self.dead.count
        msg.max_event_time_ms = max(self.event_times) if self.event_times else None
        return msg


def write_partition(cfg: AppConfig, plan: TablePlan, batches: Iterator[pa.RecordBatch],
                    batch_id: int | None) -> BigQueryCommitMessage:
    """One write task: decode, dead-letter what BigQuery would reject, append the rest, return the streams."""
    task = _TaskAppender(cfg, plan, batch_id)
    msg = task.msg
    for rb in task_records(cfg, batches):
        if rb.num_rows == 0:
            continue
        msg.records += rb.num_rows
        msg.kafka_bytes = (msg.kafka_bytes or 0) + record_bytes(rb)
        raw = pa.Table.from_batches([rb])
        decoded, dead_decode, schemas = decode_source(raw, cfg)
        msg.schemas.update(schemas)
        task.dead.add(raw, dead_decode)
        task.append(_Chunk(raw, decoded))
    return task.finish()


def write_rows_partition(cfg: AppConfig, plan: TablePlan, batches: Iterator[pa.RecordBatch],
                         batch_id: int | None) -> BigQueryCommitMessage:
    """One write task of the DataFrame path (option `rows=true`): its input is rows Spark made (the frame source's
    decoded records through the transform and the dedupe), not Kafka records. Nothing is decoded and no decode or
    late dead letter is sent here (the frame source did both, and counted the records: `commit_batch(frames=True)`
    takes them from there); rows BigQuery would reject, or rejects, are dead letters whose value is the row as
    JSON. `records` stays 0: the batch's records are the frame source's count, and its Kafka ranges, so the
    ledger, come from Spark's offset log at commit, never from the rows.

    A declared `required` column the transform left null is a dead letter (`missing-required`) here: on the fused
    path decode enforces it, and the table Handoff creates has every declared column NULLABLE."""
    from handoff_spark.sink.dead_letters import split_missing_required

    task = _TaskAppender(cfg, plan, batch_id)
    required = [c.name for c in cfg.schema_.columns if c.required]
    for rb in batches:
        if not rb.num_rows:
            continue
        rows = pa.Table.from_batches([rb])
        kept, dead = split_missing_required(rows, required)
        task.dead.add(rows, dead, as_rows=True)
        rows = kept
        if rows.num_rows:
            task.append(_Chunk(rows, rows, by_position=True))
    return task.finish()


def _add_discovered(cfg: AppConfig, decoded: pa.Table, names: list[str]) -> list[Field]:
    from handoff_spark.bigquery.schema import canonical_type

    arrow_to_bq = {pa.string(): "STRING", pa.int64(): "INT64", pa.int32(): "INT64", pa.float64(): "FLOAT64",
                   pa.float32(): "FLOAT64", pa.bool_(): "BOOL", pa.binary(): "BYTES", pa.date32(): "DATE"}
    new = []
    for n in names:
        t = decoded.schema.field(n).type
        bq = "TIMESTAMP" if pa.types.is_timestamp(t) else arrow_to_bq.get(t, "STRING")
        new.append(Field(n, canonical_type(bq), "NULLABLE"))
    sink = _sink(cfg)
    table = add_columns(bigquery_client.rest_client(sink), bigquery_client.table_ref(sink), new)
    return fields_of(table)


def _reopen(writer: StreamWriter, schema: pa.Schema, sink: BigQuerySink, on_request: Any,
            settings: dict[str, Any], msg: BigQueryCommitMessage) -> StreamWriter:
    """A new writer schema needs new connections; the old writer's streams stay part of this task."""
    previous = writer.close()
    msg.stats.merge(writer.stats)
    fresh = StreamWriter(writer.client, writer.table_path, schema, pending=writer.pending,
                         retry=writer.retry, on_request=on_request, **settings)
    fresh.streams = list(previous)
    fresh.rejected = writer.rejected  # row numbers keep counting across both writers
    fresh._rows_in = writer._rows_in
    return fresh


def _above_line(batches: Iterator[pa.RecordBatch], seed_line: str | None) -> Iterator[pa.RecordBatch]:
    """The rows writer's input without the seed rows (`sink.common.above_seed_line`)."""
    line = ckpt.parse_seed_line(seed_line)
    for rb in batches:
        if line and rb.num_rows:
            yield from above_seed_line(pa.Table.from_batches([rb]), line).to_batches()
        else:
            yield rb


class BigQueryStreamWriter(ConfigOnDemand, DataSourceStreamArrowWriter):  # type: ignore[misc,valid-type]
    """Write tasks (executors) append to PENDING streams; the commit (driver side) commits them at once.

    `rows`: the DataFrame path (option `rows=true`): the tasks' input is rows Spark made (`sink.frames` and the
    transform), not Kafka records or ranges."""

    def __init__(self, config_json: str, plan: TablePlan, rows: bool = False, seed_line: str | None = None) -> None:
        super().__init__(config_json)
        self.plan = plan
        self.rows, self.seed_line = rows, seed_line

    def write(self, iterator: Iterator[pa.RecordBatch]) -> BigQueryCommitMessage:
        batch_id = task_batch_id()
        if faults.armed("fail-task", batch_id):
            raise RuntimeError("HANDOFF_FAULT fail-task (test hook)")
        if self.rows:
            return write_rows_partition(self.cfg, self.plan, _above_line(iterator, self.seed_line), batch_id)
        return write_partition(self.cfg, self.plan, iterator, batch_id)

    def commit(self, messages: list[BigQueryCommitMessage | None], batchId: int) -> None:  # noqa: N803
        commit_batch(self.cfg, [m for m in messages if m is not None], batchId, dict(self.plan.topic_ids),
                     frames=self.rows)

    def abort(self, messages: list[BigQueryCommitMessage | None], batchId: int) -> None:  # noqa: N803
        # Nothing to undo: uncommitted PENDING streams never become visible and BigQuery drops them.
        log.warning("batch %s aborted: %d task stream(s) left uncommitted", batchId,
                    sum(len(m.streams) for m in messages if m is not None))


class BigQuerySinkDataSource(DataSource):  # type: ignore[misc,valid-type]
    """`df.writeStream.format("handoff-bigquery").option("config", AppConfig JSON)`; `.option("rows", "true")`
    on the DataFrame path."""

    @classmethod
    def name(cls) -> str:
        return "handoff-bigquery"

    def streamWriter(self, schema: Any, overwrite: bool) -> BigQueryStreamWriter:  # noqa: N802
        cfg = AppConfig.model_validate_json(self.options["config"])
        options = {k.lower(): v for k, v in self.options.items()}
        return BigQueryStreamWriter(self.options["config"], prepare(cfg), rows=options.get("rows", "false") == "true",
                                    seed_line=options.get("seedline"))


DATA_SOURCE = BigQuerySinkDataSource


def register(spark: Any) -> None:
    spark.dataSource.register(BigQuerySinkDataSource)


def ledger_end(cfg: AppConfig) -> dict[tuple[str, int], int]:
    """Where the table ends for this handoff: past every offset in the data table and every range the ledger
    index records (DLQ-only batches, filtered tails, gaps), and past the checkpoint's pending batch when its rows
    are in the table (`_with_landed_pending_batch`). A Backfill's own query: the ends its ledger-index rows
    record."""
    if cfg.backfill is not None:
        commits = bigquery_ledger.list_commits(_sink(cfg), cfg.handoff_id)
        held = bigquery_ledger.ends(commits, incarnations(commits), cfg.query_name)
        return {(t, p): end for t, parts in held.items() for p, end in parts.items()}
    return _with_landed_pending_batch(cfg, _table_end(cfg))


def _table_end(cfg: AppConfig) -> dict[tuple[str, int], int]:
    """The stream's end as BigQuery alone says it: the data table's offsets and the ledger index's ranges."""
    offsets = bigquery_ledger.resume_offsets(_sink(cfg), cfg.handoff_id)
    return {(t, p): off for t, parts in offsets.items() for p, off in parts.items()}


def _with_landed_pending_batch(cfg: AppConfig, end: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """`end`, moved to the end of the checkpoint's pending batch (planned by Spark, not marked done) when that batch
    is in the data table but its ledger-index row is not (a crash between the two commits).

    Why: the data table's end is the offset after its last row, so when a batch's last records left no row (dead
    letters; on the DataFrame path also rows the transform filtered or the dedupe dropped) only the index row says
    where the batch ended, and that row is best effort. Without this the start would see a table ending inside the
    pending batch, discard the checkpoint (and with it the dedupe's state) and re-read the batch's tail. The rule
    is the replay check's (`commit_batch`): a batch commit is all-or-nothing, so any row of the batch's range means
    the whole batch landed; Spark then re-runs the batch, the commit skips it and writes the missing index row.
    Asked only when the table ends inside the batch's range (at or below its end everywhere, past its start
    somewhere): a table past the batch is another writer's or a stale checkpoint's case, left to `driver.resume`."""
    point = ckpt.resume_point(cfg.checkpoint_location)
    if point.pending_batch is None:
        return end
    try:
        ranges = ckpt.batch_range(cfg.checkpoint_location, point.pending_batch)
    except ckpt.OffsetLogError:
        return end
    moving = {tp: se for tp, se in ranges.items() if se[1] > se[0]}
    if not moving or any(end.get(tp, se[0]) > se[1] for tp, se in moving.items()) \
            or all(end.get(tp, se[0]) >= se[1] for tp, se in moving.items()) \
            or all(end.get(tp, se[0]) <= se[0] for tp, se in moving.items()):
        return end
    sink = _sink(cfg)
    present = rows_in_range(bigquery_client.rest_client(sink), bigquery_client.table_ref(sink), moving,
                            current_topic_ids(cfg))
    if not present:
        return end
    log.info("batch %s (pending in the checkpoint) is in %s (%d rows) without its ledger-index row: the table ends "
             "at the batch's end", point.pending_batch, bigquery_client.table_ref(sink), present)
    return {**end, **{tp: max(end.get(tp, 0), se[1]) for tp, se in moving.items()}}


def backfill_overlap(cfg: AppConfig) -> list[str]:
    """What of `cfg.backfill`'s range the table already holds, before the backfill wrote any (once its own
    ledger-index rows exist, rows in the range are the resumed backfill's, not a duplicate). Two sources: the
    ledger index's entries of the handoff's other queries (which also cover ranges whose records all went to the
    DLQ), then the data table itself, the truth (an entry can be missing after a crash between the data commit
    and its index row)."""
    assert cfg.backfill is not None
    sink = _sink(cfg)
    client = bigquery_client.rest_client(sink)
    commits = bigquery_ledger.list_commits(sink, cfg.handoff_id, client)
    current = incarnations(commits)
    if bigquery_ledger.ends(commits, current, cfg.query_name):
        return []
    wanted = cfg.backfill.ranges()
    held = [c for c in commits if c.query != cfg.query_name and all(of_incarnation(c, t, current) for t, _ in wanted)]
    problems = held_overlaps(held, wanted)  # "snapshot": the entry's commit time in µs, as `handoff ledger show`
    found = rows_held(client, bigquery_client.table_ref(sink), wanted, current_topic_ids(cfg))
    problems += [f"{t}[{p}] has {n} rows in the data table at offsets {lo}..{hi}"
                 for (t, p), (n, lo, hi) in sorted(found.items())]
    return problems


def ledger_identity(cfg: AppConfig) -> tuple[str | None, dict[str, str]]:
    """The Kafka cluster id and topic ids the ledger index recorded last for this query (Iceberg's rule)."""
    return bigquery_ledger.latest_identity(_sink(cfg), cfg.handoff_id, cfg.query_name)


def current_topic_ids(cfg: AppConfig) -> dict[str, str]:
    """{topic: topic id} of the handoff's topics an `epoch` marker named: the incarnation whose rows count."""
    return {t: i for t, i in incarnations(bigquery_ledger.epochs(_sink(cfg), cfg.handoff_id)).items()
            if t in cfg.source.topics}


def record_epoch(cfg: AppConfig, ranges: dict[str, dict[str, list[int]]], reason: str, kafka: dict[str, Any]) -> str:
    """`handoff ledger accept-kafka`: record an `epoch` marker in the ledger index, whose partitions start at
    `ranges`. Refused for a topic without a topic id (a Kafka before 2.8): its new rows could not be told from the
    old topic's. Returns what was recorded, for the person who ran it."""
    missing = sorted(t for t in ranges if not (kafka.get("topics") or {}).get(t))
    if missing:
        raise HandoffConfigError(
            f"handoff {cfg.handoff_id}: Kafka gives no topic id for {', '.join(missing)}, so BigQuery's table could "
            f"not tell the new topic's rows from the old one's (both start at offset 0). Nothing was recorded. "
            f"Fix: write the new topic into another table (spec.sink.bigquery.table).")
    bigquery_ledger.record_marker(cfg, ranges, EPOCH, reason, kafka)
    return f"ledger row in {bigquery_ledger.ledger_table(_sink(cfg))}"


def overlap_problems(cfg: AppConfig, ranges: ckpt.OffsetRange) -> list[str]:
    """The contiguity check for BigQuery, the overlap half: a batch starting below where the table ends would
    duplicate rows. (A start past the end is not refused here: a batch whose last records all went to the DLQ
    leaves no rows, and its ledger-index row is best effort, so the table's end can lag the true one.)"""
    moving = {tp: se for tp, se in ranges.items() if se[1] > se[0]}
    end = _table_end(cfg)
    return [p for p in contiguity_problems(moving, {tp: end[tp] for tp in moving if tp in end})
            if "already holds" in p]


# ---------------------------------------------------------------------------------------- driver side

@dataclass(frozen=True)
class CommitResult(SinkCommitResult):
    """The common keys, and what the batch's appends met. `snapshot_id` is BigQuery's commit time in
    microseconds (BigQuery has no snapshot ids; the commit time is what time travel takes)."""

    bytes: int = 0
    append_requests: int = 0
    append_retries: dict[str, int] = field(default_factory=dict)
    append_errors: dict[str, int] = field(default_factory=dict)
    append_latency_p50_ms: float | None = None
    append_latency_p99_ms: float | None = None
    degraded_reason: str | None = None


# Per process: the last batch this process committed (or verified) for a (table, checkpoint). Lets the driver
# skip the replay query when it already knows; cleared on any commit failure so the next try asks the table.
_known_committed: dict[tuple[str, str], int] = {}
#: Per checkpoint, the committed batches whose ledger-index row is still to be written (`ckpt.UNINDEXED_FILE`),
#: read from the checkpoint at this process's first commit on it.
_unindexed: dict[str, list[dict[str, Any]]] = {}


def _index_later(cfg: AppConfig, row: dict[str, Any]) -> None:
    """Keep a committed batch's index row for the next commit to write (the stream goes on meanwhile)."""
    pending = _unindexed.setdefault(cfg.checkpoint_location, ckpt.read_unindexed(cfg.checkpoint_location))
    pending.append(row)
    ckpt.write_unindexed(cfg.checkpoint_location, pending)
    log.warning("batch %s: its ledger-index row is written at a later commit", row["batch_id"])


def _write_unindexed_rows(cfg: AppConfig, batch_id: int) -> None:
    """Before batch `batch_id`'s own row: write the index rows earlier batches could not (only if missing: a row
    may have landed unacknowledged). A kept row of this batch (a replay) is left to this commit, which writes it
    only if missing too."""
    location = cfg.checkpoint_location
    if location not in _unindexed:
        _unindexed[location] = ckpt.read_unindexed(location)
    pending = _unindexed[location]
    if not pending:
        return
    earlier = [row for row in pending if int(row["batch_id"]) < batch_id]
    left = [row for row in earlier if not bigquery_ledger.record_batch(cfg, only_if_missing=True, **row)]
    if len(left) < len(pending):
        log.info("wrote %d ledger-index row(s) of earlier batches", len(earlier) - len(left))
        _unindexed[location] = left
        ckpt.write_unindexed(location, left)

_TOPIC = re.compile(r"^[A-Za-z0-9._-]+$")
_TOPIC_ID = re.compile(r"^[A-Za-z0-9+/=_-]+$")  # Kafka prints a topic id in base64


def _range_conditions(ranges: ckpt.OffsetRange, topic_ids: dict[str, str] | None) -> list[str]:
    """One SQL condition per non-empty range (names checked, so they can be inlined)."""
    conds = []
    for (topic, partition), (start, end) in sorted(ranges.items()):
        if end <= start:
            continue
        if not _TOPIC.match(topic):
            raise ValueError(f"unexpected topic name {topic!r}")
        tid = (topic_ids or {}).get(topic)
        if tid is not None and not _TOPIC_ID.match(tid):
            raise ValueError(f"unexpected topic id {tid!r}")
        same = f" AND {KAFKA_TOPIC_ID} = '{tid}'" if tid is not None else ""
        conds.append(f"({KAFKA_TOPIC} = '{topic}'{same} AND {KAFKA_PARTITION} = {int(partition)} AND "
                     f"{KAFKA_OFFSET} >= {int(start)} AND {KAFKA_OFFSET} < {int(end)})")
    return conds


def rows_in_range(client: Any, ref: str, ranges: ckpt.OffsetRange, topic_ids: dict[str, str] | None = None) -> int:
    """How many rows of the table lie in the offset ranges (the replay check; see the module docstring). Of a
    topic in `topic_ids` (an epoch named it: `current_topic_ids`), only rows stamped with its id count."""
    conds = _range_conditions(ranges, topic_ids)
    if not conds:
        return 0
    sql = f"SELECT COUNT(*) AS n FROM `{ref}` WHERE " + " OR ".join(conds)
    rows = list(client.query(sql, retry=None).result())
    return int(rows[0]["n"])


def rows_held(client: Any, ref: str, ranges: ckpt.OffsetRange, topic_ids: dict[str, str] | None = None
              ) -> dict[tuple[str, int], tuple[int, int, int]]:
    """{(topic, partition): (rows, lowest offset, highest offset)} of the table's rows inside `ranges` (the
    partitions that have any), for a refusal that names what is there; `topic_ids` as for `rows_in_range`."""
    conds = _range_conditions(ranges, topic_ids)
    if not conds:
        return {}
    sql = (f"SELECT {KAFKA_TOPIC} AS t, {KAFKA_PARTITION} AS p, COUNT(*) AS n, MIN({KAFKA_OFFSET}) AS lo, "
           f"MAX({KAFKA_OFFSET}) AS hi FROM `{ref}` WHERE " + " OR ".join(conds) + " GROUP BY 1, 2")
    return {(r["t"], int(r["p"])): (int(r["n"]), int(r["lo"]), int(r["hi"]))
            for r in client.query(sql, retry=None).result()}


def _finalize_all(write_client: Any, streams: list[StreamResult], retry: RetryPolicy) -> None:
    """Finalize every stream (concurrently) and check BigQuery holds exactly the rows the tasks confirmed."""
    import random

    rng = random.Random()

    def one(s: StreamResult) -> None:
        for attempt in range(retry.max_attempts):
            try:
                resp = write_client.finalize_write_stream(name=s.name)
                break
            except Exception as exc:  # noqa: BLE001
                from handoff_spark.bigquery.append import Action, classify, exception_code

                code, message = exception_code(exc)
                if classify(code, message, False, 0, False) is not Action.RETRY or attempt + 1 == retry.max_attempts:
                    raise
                time.sleep(retry.delay(attempt, rng))
        if int(resp.row_count) != s.rows:
            raise BatchCommitError(f"stream {s.name} holds {resp.row_count} rows, the task confirmed {s.rows}; "
                                   f"not committing a batch whose rows do not add up")

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, max(1, len(streams)))) as pool:
        list(pool.map(one, streams))


def _batch_commit(write_client: Any, parent: str, streams: list[StreamResult]) -> int:
    from google.cloud.bigquery_storage_v1 import types

    resp = write_client.batch_commit_write_streams(
        types.BatchCommitWriteStreamsRequest(parent=parent, write_streams=[s.name for s in streams]))
    if resp.stream_errors:
        errors = "; ".join(f"{e.entity}: {e.error_message}" for e in resp.stream_errors)
        raise BatchCommitError(f"BatchCommitWriteStreams refused the batch (nothing applied): {errors}")
    ct = resp.commit_time
    return int(ct.timestamp() * 1_000_000) if ct is not None else int(time.time() * 1_000_000)


#: The degraded reason while BigQuery does not answer at a driver's start (`driver.table_wait`).
OUTAGE_REASON = DEGRADED_BIGQUERY_UNAVAILABLE
#: Where BigQuery's addresses are in the spec, when they are not Google's (named when a host does not resolve).
OUTAGE_FIELD = "spec.sink.bigquery (restEndpoint, grpcEndpoint)"


def is_outage(exc: BaseException) -> bool:
    """At a driver's start: BigQuery (or its token endpoint) did not answer or answered with a transient server
    error, which the driver waits out (`driver.table_wait`); a refusal (not found, forbidden, a bad request) is not."""
    names = {c.__name__ for c in type(exc).__mro__}
    return bool(names & {"ServiceUnavailable", "InternalServerError", "BadGateway", "GatewayTimeout",
                         "DeadlineExceeded", "ConnectionError", "TimeoutError", "ConnectTimeout", "ReadTimeout",
                         "TransportError"})


def forget_clients(cfg: AppConfig) -> None:
    """Nothing cached that a failed connection spoils: the clients reconnect on their own."""


def degraded_reason(stats: AppendStats) -> str | None:
    """`BigQueryResourceExhausted` when the batch met quota or size limits, `BigQueryUnavailable` for transient
    server errors; the progress record carries it (`degradedReason`) for the operator's Degraded condition."""
    if stats.retries.get("RESOURCE_EXHAUSTED") or stats.errors.get("RESOURCE_EXHAUSTED"):
        return DEGRADED_BIGQUERY_RESOURCE_EXHAUSTED
    if any(stats.retries.get(k) for k in ("UNAVAILABLE", "INTERNAL", "DEADLINE_EXCEEDED", "ABORTED", "CANCELLED")):
        return DEGRADED_BIGQUERY_UNAVAILABLE
    return None


def commit_batch(cfg: AppConfig, msgs: list[BigQueryCommitMessage], batch_id: int,
                 topic_ids: dict[str, str] | None = None, frames: bool = False) -> CommitResult:
    """Driver: make batch `batch_id` visible exactly once (see the module docstring), then record it.
    `topic_ids`: the writer's `TablePlan.topic_ids` (None: read from the ledger when the replay check runs).

    `frames`: the DataFrame path (`sink.frames`): the write tasks saw rows, not records; what the batch read, sent
    to dead letters (decode, late) and its newest event time come from the read tasks' counts (as Iceberg's
    `commit_batch(frames=True)`), and the ledger index records how many records were late and how many the
    transform filtered or the dedupe dropped (read − dead letters − rows). The replay check is unchanged: a
    replayed batch's SQL and dedupe (the state of the batch before) give the same rows."""
    sink = _sink(cfg)
    t0 = time.monotonic()
    ranges = ckpt.batch_range(cfg.checkpoint_location, batch_id)
    if frames:  # a seed batch's records are in the table already (driver.seed): the ledger starts at the line
        ranges = ckpt.clip_to_seed_line(ranges, ckpt.read_seed_line(cfg.checkpoint_location))
    offsets_json = ckpt.to_json_ranges(ranges)
    late_rows: int | None = None
    dropped_rows: int | None = None
    if frames:
        from handoff_spark.sink.frames import frame_counts

        counts = frame_counts(cfg, batch_id, ranges)
        if counts.complete:
            written = sum(m.rows for m in msgs)
            rejected = sum(m.dlq_rows for m in msgs)  # rows BigQuery would reject or rejected: dead letters too
            msgs = [*msgs, BigQueryCommitMessage(records=counts.records, dlq_rows=counts.dlq_rows,
                                                 max_event_time_ms=counts.max_event_time_ms,
                                                 kafka_bytes=counts.kafka_bytes)]
            late_rows = counts.late_rows
            dropped_rows = max(0, counts.records - counts.dlq_rows - rejected - written)
        else:
            log.warning("batch %s: the read tasks' counts are not all on this machine (executors without the "
                        "checkpoint's volume): the ledger index records rows only", batch_id)
            for m in msgs:
                m.kafka_bytes = None  # the rows tasks read no Kafka records; what the read tasks read is unknown
    ref = bigquery_client.table_ref(sink)
    rows = sum(m.rows for m in msgs)
    dlq_rows = sum(m.dlq_rows for m in msgs)
    streams = [s for m in msgs for s in m.streams if s.rows > 0]
    stats = AppendStats()
    for m in msgs:
        stats.merge(m.stats)
    key = (ref, cfg.checkpoint_location)
    snapshot_id: int | None = None
    skipped = False
    if sink.write_mode == "exactlyOnce":
        try:
            if _known_committed.get(key) != batch_id - 1:
                if topic_ids is None:
                    topic_ids = current_topic_ids(cfg)
                present = rows_in_range(bigquery_client.rest_client(sink), ref, ranges, topic_ids)
                if present:
                    if present != rows:
                        raise BatchCommitError(
                            f"batch {batch_id}: the table already holds {present} rows of this batch's offset range "
                            f"{offsets_json}, the replay produced {rows}. A batch commit is all-or-nothing, so the "
                            f"range was written by something else (another query or a reset checkpoint). Resume "
                            f"from the table's offsets (handoff ledger) instead of replaying over them.")
                    log.info("batch %s already in %s (%d rows): skipping the replay", batch_id, ref, present)
                    skipped = True
                elif cfg.backfill is None:
                    overlap = overlap_problems(cfg, ranges)
                    if overlap:
                        raise BatchCommitError(
                            f"batch {batch_id} of handoff {cfg.handoff_id} is not committed: " + "; ".join(overlap)
                            + ". The checkpoint is stale or another writer moved the table; the driver restarts "
                              "and resumes from the table.")
            if not skipped:
                faults.maybe_crash("crash-before-table-commit", batch_id)
                if streams:
                    wc = bigquery_client.write_client(sink)
                    _finalize_all(wc, streams, RetryPolicy())
                    snapshot_id = _batch_commit(wc, bigquery_client.table_path(sink), streams)
            _known_committed[key] = batch_id
        except BaseException:
            _known_committed.pop(key, None)
            raise
        faults.maybe_crash("crash-after-table-commit", batch_id)
    end = {t: {int(p): se[1] for p, se in parts.items()} for t, parts in offsets_json.items()}
    nonempty = any(se[0] != se[1] for se in ranges.values())
    newest_event = max((m.max_event_time_ms for m in msgs if m.max_event_time_ms is not None), default=None)
    if nonempty:
        # After the data commit, never before; on a skipped replay only if the crash came before it.
        index_row = {"batch_id": batch_id, "offsets": offsets_json, "rows": rows, "dlq_rows": dlq_rows,
                     "max_event_time_ms": newest_event, "commit_time_us": snapshot_id,
                     "schemas": {sid: v for m in msgs for sid, v in m.schemas.items()},
                     "kafka": ckpt.read_kafka_identity(cfg.checkpoint_location),
                     "late_rows": late_rows, "dropped_rows": dropped_rows}
        _write_unindexed_rows(cfg, batch_id)
        indexed = bigquery_ledger.record_batch(cfg, only_if_missing=skipped, **index_row)
        if not indexed and cfg.backfill is None:
            _index_later(cfg, index_row)
        if not indexed and cfg.backfill is not None:
            # A backfill resumes, and its request follows its progress, from its own index rows only: without
            # this one the range would look unwritten (or refused as held). Fail the batch; its replay finds the
            # rows, skips the data commit and writes the index row again.
            raise BatchCommitError(f"backfill {cfg.query_name}: batch {batch_id} is in the table but its "
                                   f"ledger-index row could not be written; the batch is retried")
    # a backfill never moves the stream's group offsets
    group_ok = commit_group_offsets(cfg.source.bootstrap_servers, cfg.consumer_group, end, cfg.source.properties) \
        if nonempty and cfg.backfill is None else True
    result = CommitResult(
        batch_id=batch_id, snapshot_id=snapshot_id, skipped=skipped, rows=rows, dlq_rows=dlq_rows,
        offsets=offsets_json, commit_latency_ms=round((time.monotonic() - t0) * 1000, 1), attempts=1,
        group_offsets_committed=group_ok, bytes=stats.bytes, append_requests=stats.requests,
        append_retries=dict(stats.retries), append_errors=dict(stats.errors),
        append_latency_p50_ms=percentile(stats.latencies_ms, 50), append_latency_p99_ms=percentile(stats.latencies_ms, 99),
        degraded_reason=degraded_reason(stats), records=sum(m.records for m in msgs), max_event_time_ms=newest_event,
        kafka_bytes=(None if not msgs or any(m.kafka_bytes is None for m in msgs)
                     else sum(int(m.kafka_bytes or 0) for m in msgs)))
    write_last_commit(cfg.checkpoint_location, result)
    if frames:
        ckpt.clear_frame_stats(cfg.checkpoint_location, up_to=batch_id)
    return result




__all__ = ["DATA_SOURCE", "BigQuerySinkDataSource", "ledger_end", "ledger_identity", "current_topic_ids",
           "record_epoch", "overlap_problems", "BigQueryStreamWriter", "BigQueryCommitMessage", "CommitResult", "TablePlan",
           "prepare", "register", "commit_batch", "write_partition", "write_rows_partition", "rows_in_range", "read_last_commit",
           "SchemaIncompatibleError", "BatchCommitError"]
