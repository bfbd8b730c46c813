"""What both table sinks (Iceberg, BigQuery) need alike, kept in one place so a fix lands once (the
sub-millisecond event-time cast was fixed in one sink and not the other before they shared this).

pyarrow is imported where a batch is handled, not here: the sinks' light data-source modules (`iceberg.stream`)
import this one in Spark's planner interpreters, which never touch a batch (see `iceberg.stream`)."""
from __future__ import annotations

import dataclasses
import itertools
import logging
from typing import TYPE_CHECKING, Any, Iterator, TypeVar

from dataclasses import dataclass

from handoff_spark.contract import KAFKA_OFFSET, KAFKA_PARTITION, KAFKA_TIMESTAMP, KAFKA_TOPIC

if TYPE_CHECKING:
    import pyarrow as pa

    from handoff_spark.config import AppConfig

log = logging.getLogger(__name__)

SinkT = TypeVar("SinkT")


class SchemaIncompatibleError(RuntimeError):
    """The declared schema or a batch needs a table change the sink cannot make safely (a narrowing, a type
    change, a column the table lacks under evolution=none) and onIncompatible=halt."""


def configured_sink(cfg: AppConfig, kind: type[SinkT], fmt: str) -> SinkT:
    """The app config's sink settings, checked to be the kind the `fmt` data source writes (a config for
    another sink reaching it is a bug in the driver, not a user mistake)."""
    if not isinstance(cfg.sink, kind):
        raise ValueError(f"{fmt} needs a {kind.__name__} in the app config")
    return cfg.sink


@dataclass(frozen=True)
class CommitResult:
    """What a sink's driver-side commit of one micro-batch did: the keys every sink reports, so the progress
    record (`last-commit.json`) and the operator treat all sinks alike. A sink adds its own keys by
    subclassing."""

    batch_id: int
    snapshot_id: int | None
    skipped: bool
    rows: int
    dlq_rows: int
    offsets: dict[str, dict[str, list[int]]]
    commit_latency_ms: float
    attempts: int
    group_offsets_committed: bool
    # Kafka records the batch read (rows + dead letters), whatever the source's row count (the fused path's
    # Spark rows are ranges); None: not counted, Spark's numInputRows stands.
    records: int | None = None
    max_event_time_ms: int | None = None  # newest event time in the batch (the driver's freshness)
    # What the batch cost (issue 35): bytes of the Kafka records it read (keys + values, `record_bytes`; None: not
    # counted, as on the DataFrame path), and the data files it added to the table with their bytes (Iceberg;
    # BigQuery reports its appended bytes as `bytes`).
    kafka_bytes: int | None = None
    files_added: int | None = None
    file_bytes: int | None = None
    # The upkeep round after this commit, when one rewrote files (Iceberg compaction): files replaced, and the
    # bytes it wrote in their place (None: no rewrite after this batch).
    rewritten_files: int | None = None
    rewritten_bytes: int | None = None


class ConfigOnDemand:
    """A sink's stream writer holds the app config as JSON and parses it on first use: the writer travels to
    the executors pickled, and a JSON string pickles small and independent of pydantic's internals."""

    def __init__(self, config_json: str) -> None:
        self.config_json = config_json
        self._cfg: AppConfig | None = None

    @property
    def cfg(self) -> AppConfig:
        if self._cfg is None:
            from handoff_spark.config import AppConfig

            self._cfg = AppConfig.model_validate_json(self.config_json)
        return self._cfg


def task_batch_id() -> int | None:
    """The micro-batch id a write task belongs to: Spark sets it as a job-local property that executors read
    through the task context (used by the fault hooks and the per-batch bookkeeping)."""
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        value = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
        return int(value) if value is not None else None
    except Exception:  # noqa: BLE001 - outside a Spark task (tests, driver)
        return None


def max_event_time_ms(tbl: pa.Table, column: str | None) -> int | None:
    """Newest event time in the batch, in epoch ms: the declared event-time column, else the Kafka timestamp.

    The max is taken in the column's own unit and converted afterwards: a *safe* µs→ms cast raises on
    sub-millisecond values, which ISO timestamps with microseconds produce."""
    import pyarrow as pa
    import pyarrow.compute as pc

    name = column if column and column in tbl.column_names else KAFKA_TIMESTAMP
    if name not in tbl.column_names or tbl.num_rows == 0:
        return None
    col = tbl.column(name)
    if not pa.types.is_timestamp(col.type):
        return None
    m = pc.max(col)
    if not m.is_valid:
        return None
    value = m.cast(pa.int64()).as_py()
    per_ms = {"s": None, "ms": 1, "us": 1_000, "ns": 1_000_000}[col.type.unit]
    return value * 1000 if per_ms is None else value // per_ms


def record_bytes(raw: pa.Table | pa.RecordBatch) -> int:
    """Bytes of Kafka records as read: their keys and values (what the brokers count as the records' payload;
    headers and the protocol's framing are left out). The cost surface's "bytes read from Kafka"."""
    import pyarrow.compute as pc

    total = 0
    for name in ("key", "value"):
        if name in raw.schema.names:
            n = pc.sum(pc.binary_length(raw.column(name))).as_py()
            total += int(n or 0)
    return total


def write_last_commit(checkpoint: str, result: Any) -> None:
    """Record a sink's CommitResult (a dataclass) for the driver's progress record. The commit runs in a Spark
    Python worker, not in the driver's Python process, hence a file in the checkpoint. Best effort."""
    from handoff_spark import checkpoint as ckpt

    try:
        ckpt.write_last_commit(checkpoint, dataclasses.asdict(result))
    except OSError:
        log.warning("could not write %s", ckpt.LAST_COMMIT_FILE, exc_info=True)


def task_records(cfg: Any, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A write task's input as Kafka record batches, lazily.

    On the fused path (`handoff-kafka-ranges`) the task's input rows are offset ranges, and their records are
    read here, in the write task, with the same reader and options as the `handoff-kafka` source — so records
    never cross Python → JVM → Python. Otherwise the batches already are records and pass through. Lazy, so
    a sink can append (BigQuery) while the rest of its ranges are still being read."""
    from handoff_spark.kafka import source as kafka_source  # pyspark-only module; the operator imports this one without pyspark

    it = iter(batches)
    for first in it:
        if first.schema.names != kafka_source.RANGE_ARROW_SCHEMA.names:
            yield first
            yield from it
            return
        opts = kafka_source.SourceOptions.parse(kafka_source.source_options(cfg, None))
        for rng in kafka_source.ranges_of(itertools.chain([first], it)):
            yield from kafka_source.read_range(opts, rng)
        return


def above_seed_line(rows: pa.Table, line: dict[tuple[str, int], int]) -> pa.Table:
    """The DataFrame path's rows at or above the seed line (`driver.seed`): the rows below it only rebuilt the
    dedupe's window and are in the table already. Both sinks' rows writers drop them first."""
    import pyarrow as pa

    if not line or not rows.num_rows:
        return rows
    keep = [off >= line.get((t, p), -1) for t, p, off in zip(rows.column(KAFKA_TOPIC).to_pylist(),
                                                            rows.column(KAFKA_PARTITION).to_pylist(),
                                                            rows.column(KAFKA_OFFSET).to_pylist())]
    return rows.filter(pa.array(keep, pa.bool_()))
