"""`handoff-kafka-frames`: the DataFrame path's source — `handoff-kafka`'s offsets, planning and checkpoint files,
its records decoded into Spark rows of one fixed schema (`decode.frame`).

Why: a transform, a dedupe or event time needs the records as Spark rows (issue 31; which path, and why this one:
docs/design/spark-data-path.md). The read task decodes (the sinks' decoder), so a record that does not decode is a
dead letter sent here, before the task's rows reach Spark (durable before the task succeeds: the sinks' rule), and
a record older than the batch's watermark is judged here too — dead letter with reason `late`, or kept — instead
of being dropped silently by Spark's stateful operator (which drops rows at or below the watermark).

The lateness line: Spark records the watermark each batch's stateful operators use in its offset log
(`batchWatermarkMs`), before the batch's partitions are planned; the planner reads it and hands it to the read
tasks. Spark's delay is `dedupe.within` when a dedupe is set (the window is Spark's watermark delay), else
`eventTime.watermark`; a record is late when its event time is at or below Spark's watermark plus the difference
between Spark's delay and `eventTime.watermark` (so at or below what Spark itself would drop, never less). The
time column is `eventTime.column`, or the Kafka timestamp for a dedupe without event time.

What each read task counted (records read, dead letters, late records, the newest event time it read) goes to
`<checkpoint>/handoff/frames/<batch>/<range>.json`, summed by the sink's commit into the ledger entry
(`frame_counts`). Those files need the checkpoint on the executors' file system (local mode; a shared
checkpoint); where it is not, the entry records rows only and the counts are logged as unavailable.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Iterator

from pyspark.sql.datasource import InputPartition

from handoff_spark import checkpoint as ckpt
from handoff_spark.kafka.source import (HandoffKafkaDataSource, KafkaPartition, KafkaStreamReader, OffsetRange,
                                        SourceOptions)

if TYPE_CHECKING:
    import pyarrow as pa

    from handoff_spark.config import AppConfig

log = logging.getLogger("handoff.frames")

SOURCE_NAME = "handoff-kafka-frames"


def spark_delay_seconds(cfg: AppConfig) -> float | None:
    """The delay of the watermark the driver sets on the transform's output (`withWatermark`), None for none."""
    if cfg.dedupe is not None:
        return cfg.dedupe.within_seconds
    if cfg.event_time is not None:
        return cfg.event_time.watermark_seconds
    return None


def time_column(cfg: AppConfig) -> str | None:
    """The column lateness and the dedupe's window are measured on."""
    from handoff_spark.contract import KAFKA_TIMESTAMP

    if cfg.event_time is not None:
        return cfg.event_time.column
    return KAFKA_TIMESTAMP if cfg.dedupe is not None else None


def late_line_ms(cfg: AppConfig, batch_watermark_ms: int) -> int | None:
    """Event times at or below this (epoch ms) are late for the batch whose Spark watermark is given; None: no
    record is late (no watermark yet: Spark drops nothing before its first one)."""
    delay = spark_delay_seconds(cfg)
    if delay is None or batch_watermark_ms <= 0:
        return None
    own = cfg.event_time.watermark_seconds if cfg.event_time is not None else delay
    return batch_watermark_ms + int(round((delay - own) * 1000))


@dataclass
class FrameStats:
    """One read task's counts (summed per batch by `frame_counts`)."""

    records: int = 0
    dlq_rows: int = 0
    late_rows: int = 0
    max_event_time_ms: int | None = None
    kafka_bytes: int = 0  # the records' keys and values (sink.common.record_bytes)


class FramePartition(KafkaPartition):
    """A read task's ranges, with the batch it belongs to, the batch's lateness line and the records of its ranges
    the transform failed on (`{(topic, partition, offset): reason}`, `driver.quarantine`)."""

    def __init__(self, ranges: list[OffsetRange], batch_id: int | None, late_ms: int | None,
                 quarantined: dict[tuple[str, int, int], str] | None = None) -> None:
        super().__init__(ranges)
        self.batch_id, self.late_ms = batch_id, late_ms
        self.quarantined = quarantined or {}


class FramesDataSource(HandoffKafkaDataSource):
    """`spark.readStream.format("handoff-kafka-frames").option("config", AppConfig JSON)` + the source options."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> Any:
        from pyspark.sql.pandas.types import from_arrow_schema

        from handoff_spark.config import AppConfig
        from handoff_spark.decode.frame import frame_schema

        return from_arrow_schema(frame_schema(AppConfig.model_validate_json(self.options["config"])))

    def streamReader(self, schema: Any) -> "FrameStreamReader":  # noqa: N802
        options = {k.lower(): v for k, v in self.options.items()}
        return FrameStreamReader(SourceOptions.parse(self.options), self.options["config"],
                                 ckpt.parse_seed_line(options.get("seedline")))


class FrameStreamReader(KafkaStreamReader):
    """`seed_line`: below it, records only rebuild the dedupe's window (`driver.seed`): batches end at the line
    while any partition is below it, and those records are neither counted nor sent to the dead letters."""

    def __init__(self, opts: SourceOptions, config_json: str,
                 seed_line: dict[tuple[str, int], int] | None = None) -> None:
        super().__init__(opts)
        self.config_json = config_json
        self.seed_line = seed_line or {}

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "config_json": self.config_json, "seed_line": self.seed_line}

    def latestOffset(self, start: dict, limit: Any) -> dict:  # noqa: N802
        from handoff_spark.kafka.source import from_offsets, to_offsets

        end = super().latestOffset(start, limit)
        begin = from_offsets(start)
        if not any(begin.get(tp, line) < line for tp, line in self.seed_line.items()):
            return end
        # Still seeding: no partition goes past its line, and partitions without a seed stay where they are.
        capped = {tp: (min(off, self.seed_line[tp]) if tp in self.seed_line else begin.get(tp, off))
                  for tp, off in from_offsets(end).items()}
        return to_offsets(capped)

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        from handoff_spark.config import AppConfig

        planned = super().partitions(start, end)
        batch_id, late_ms = None, None
        quarantine: list[dict[str, Any]] = []
        if self.opts.checkpoint:
            newest = ckpt.latest_planned_batch(self.opts.checkpoint)
            if newest is not None:
                batch_id = newest[0]
                late_ms = late_line_ms(AppConfig.model_validate_json(self.config_json), newest[1])
                ckpt.clear_frame_stats(self.opts.checkpoint, only=batch_id)  # an earlier plan's counts
            quarantine = ckpt.read_quarantine(self.opts.checkpoint)

        def quarantined(ranges: list[OffsetRange]) -> dict[tuple[str, int, int], str]:
            return {(q["topic"], int(q["partition"]), int(q["offset"])): str(q.get("reason", ""))
                    for q in quarantine for r in ranges
                    if q["topic"] == r.topic and int(q["partition"]) == r.partition and r.start <= int(q["offset"]) < r.end}

        return [FramePartition(p.ranges, batch_id, late_ms, quarantined(p.ranges))  # type: ignore[attr-defined]
                for p in planned]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from handoff_spark.config import AppConfig
        from handoff_spark.decode.frame import frame_schema
        from handoff_spark.kafka.source import read_range

        cfg = AppConfig.model_validate_json(self.config_json)
        schema = frame_schema(cfg)
        late_ms = getattr(partition, "late_ms", None)
        quarantined = getattr(partition, "quarantined", {})
        for rng in partition.ranges:  # type: ignore[attr-defined]
            stats = FrameStats()
            if rng.end <= self.seed_line.get((rng.topic, rng.partition), -1):  # seed: window only (driver.seed)
                yield from frames_of(read_range(self.opts, rng), cfg, schema, None, stats, quarantined, send=False)
                continue
            yield from frames_of(read_range(self.opts, rng), cfg, schema, late_ms, stats, quarantined)
            batch_id = getattr(partition, "batch_id", None)
            if batch_id is not None and self.opts.checkpoint:
                key = f"{rng.topic}-{rng.partition}-{rng.start}-{rng.end}"
                doc = {**asdict(stats), "offsets": rng.end - rng.start}
                if not ckpt.write_frame_stats(self.opts.checkpoint, batch_id, key, doc):
                    log.info("frame counts of batch %s not recorded: the checkpoint is not on this machine",
                             batch_id)


def frames_of(raw_batches: Iterator[pa.RecordBatch], cfg: AppConfig, schema: pa.Schema, late_ms: int | None,
              stats: FrameStats, quarantined: dict[tuple[str, int, int], str] | None = None,
              send: bool = True) -> Iterator[pa.RecordBatch]:
    """Raw record batches → frame batches: decoded (dead letters sent first), late records judged, records the
    transform failed on (`quarantined`) sent to the dead letters, counted. `send=False`: nothing is sent or
    quarantined (the driver's search for the records a transform fails on reads the batch again)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from handoff_spark.contract import KAFKA_OFFSET
    from handoff_spark.decode.batch import decode_source
    from handoff_spark.decode.frame import conform
    from handoff_spark.decode.records import DeadLetter
    from handoff_spark.sink.common import max_event_time_ms, record_bytes
    from handoff_spark.sink.dead_letters import send_dead_letters

    column = time_column(cfg)
    for raw in raw_batches:
        if not raw.num_rows:
            continue
        stats.records += raw.num_rows
        stats.kafka_bytes += record_bytes(raw)
        table = pa.Table.from_batches([raw])
        decoded, dead, _schemas = decode_source(table, cfg)
        newest = max_event_time_ms(decoded, column) if decoded.num_rows and column else None
        if newest is not None and (stats.max_event_time_ms is None or newest > stats.max_event_time_ms):
            stats.max_event_time_ms = newest
        if late_ms is not None and column is not None and decoded.num_rows:
            times = decoded.column(column).cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
            late = pc.fill_null(pc.less_equal(times, late_ms * 1000), False)
            n_late = pc.sum(late).as_py() or 0
            if n_late:
                stats.late_rows += n_late
                policy = cfg.event_time.late_records if cfg.event_time is not None else "deadLetter"
                if policy == "deadLetter":
                    topic, part = raw.column("topic")[0].as_py(), raw.column("partition")[0].as_py()
                    row_of = {o: i for i, o in enumerate(table.column("offset").to_pylist())}
                    dead = dead + [DeadLetter(row_of[o], topic, part, o, "late",
                                              f"event time at or below the watermark line ({late_ms} ms)")
                                   for o in decoded.filter(late).column(KAFKA_OFFSET).to_pylist()]
                    decoded = decoded.filter(pc.invert(late))
        if quarantined and decoded.num_rows:
            topic, part = raw.column("topic")[0].as_py(), raw.column("partition")[0].as_py()
            offsets = decoded.column(KAFKA_OFFSET).to_pylist()
            bad = [o for o in offsets if (topic, part, o) in quarantined]
            if bad:
                row_of = {o: i for i, o in enumerate(table.column("offset").to_pylist())}
                dead = dead + [DeadLetter(row_of[o], topic, part, o, "transform-error", quarantined[(topic, part, o)])
                               for o in bad]
                keep = pa.array([(topic, part, o) not in quarantined for o in offsets])
                decoded = decoded.filter(keep)
        if dead and send:
            send_dead_letters(cfg, table, dead)
            stats.dlq_rows += len(dead)
        if decoded.num_rows:
            yield conform(decoded, schema)


@dataclass(frozen=True)
class FrameCounts:
    """A batch's counts from its read tasks; `complete` is False when some were not recorded."""

    records: int
    dlq_rows: int
    late_rows: int
    max_event_time_ms: int | None
    complete: bool
    kafka_bytes: int | None = None  # None: a read task's counts lack them (written by an older driver)


def frame_counts(cfg: AppConfig, batch_id: int, ranges: dict[tuple[str, int], tuple[int, int]]) -> FrameCounts:
    """Sum the read tasks' counts of batch `batch_id` (driver side, at commit). Complete when the files cover
    of the batch's offsets (a read task's ranges are pieces of the batch's; they tile it; the planner removed an
    earlier plan's files)."""
    docs = ckpt.read_frame_stats(cfg.checkpoint_location, batch_id)
    covered = sum(int(d.get("offsets", 0)) for d in docs)
    moving = sum(e - s for s, e in ranges.values() if e > s)
    times = [d["max_event_time_ms"] for d in docs if d.get("max_event_time_ms") is not None]
    return FrameCounts(records=sum(int(d.get("records", 0)) for d in docs),
                       dlq_rows=sum(int(d.get("dlq_rows", 0)) for d in docs),
                       late_rows=sum(int(d.get("late_rows", 0)) for d in docs),
                       max_event_time_ms=max(times) if times else None,
                       complete=covered == moving,
                       kafka_bytes=(sum(int(d["kafka_bytes"]) for d in docs)
                                    if all("kafka_bytes" in d for d in docs) else None))
