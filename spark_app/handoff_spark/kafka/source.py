"""`handoff-kafka`: a PySpark Python streaming data source over confluent-kafka (no JVM Kafka jars).

Why our own source: Handoff's exactly-once contract needs offsets Spark checkpoints to be exactly the
records a sink commits, and the images ship no spark-sql-kafka jar. This source:

* plans one input partition per topic-partition offset range `[start, end)` (end exclusive, Spark
  checkpoints `{"<topic>": {"<partition>": <next offset>}}`);
* reads with `isolation.level=read_committed` always, and bounds every range by the *last stable offset*
  (ListOffsets READ_COMMITTED), so an open transaction is never half-read and aborted records never
  appear;
* reads a range "until the position reaches `end`", not "until N records": compaction and aborted
  transactions leave offset gaps, and control records (transaction markers) consume offsets;
* admission control: `maxRecordsPerBatch` → `ReadMaxRows`, split across partitions by backlog;
* `Trigger.AvailableNow`: the target is the latest offsets when the query starts;
* new partitions are picked up mid-stream: a partition first appears in the offsets at its earliest
  offset with an empty range, and is read from the next micro-batch on (so every range's start is
  known from Spark's offset log; see docs/design/data-plane-contract.md);
* a start offset deleted by retention fails the query naming topic/partition/offset and the
  `source.onOffsetOutOfRange` setting, or (`earliest`) skips to the log start, logs the gap and appends it
  to `<checkpoint>/sources/handoff-gaps.jsonl`;
* persists its initial offsets to `<checkpoint>/sources/handoff-initial.json` (Spark does not persist a
  Python source's initial offsets; a query that crashes in batch 0 must replay the same range, and the
  sink needs the start of batch 0).

Rows are Arrow record batches built column-wise; the only per-record Python work is what confluent-kafka
forces (one `Message` object per record).

Options (keys are case-insensitive, Spark lower-cases them):
  `subscribe` (comma-separated topics), `kafka.bootstrap.servers`, `kafka.<librdkafka property>`,
  `startingOffsets` (earliest|latest), `maxRecordsPerBatch`, `onOffsetOutOfRange` (fail|earliest),
  `checkpointLocation`, `stopMarker` (path; when it exists no new data is admitted — graceful stop),
  `readTimeoutSeconds` (a range that makes no progress for this long fails; default 120),
  `minPartitions` (split large ranges so a batch has at least this many tasks; see `split_ranges`),
  `minPartitionsFile` (path; when it holds a number, that number wins over `minPartitions`, read as each batch
  is planned: the driver rewrites it when its executors change, so batches follow the cores it has now;
  `N wave` means exactly N tasks, ranges packed together if needed, see `pack_ranges`),
  `startOffsets` (JSON `{"topic": {"partition": offset}}`: where the table's ledger says the query resumes; a
  fresh checkpoint starts there, and only partitions the ledger lacks start at `startingOffsets`),
  `endingOffsets` (same form: a bounded read for Backfill; partitions it does not name are not read).
"""
from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType, StructField, StructType,
                               TimestampType)

from handoff_spark import checkpoint as ckpt
from handoff_spark.contract import MIN_SPLIT_OFFSETS
from handoff_spark.kafka import native as kafka_native
from handoff_spark.kafka.client_defaults import CLIENT_DEFAULTS, with_defaults
from handoff_spark.kafka import readers as kafka_readers

if TYPE_CHECKING:
    from handoff_spark.config import AppConfig

log = logging.getLogger("handoff.kafka_source")

SOURCE_NAME = "handoff-kafka"
RANGES_SOURCE_NAME = "handoff-kafka-ranges"

SPARK_SCHEMA = StructType([
    StructField("topic", StringType(), False),
    StructField("partition", IntegerType(), False),
    StructField("offset", LongType(), False),
    StructField("timestamp", TimestampType(), True),
    StructField("key", BinaryType(), True),
    StructField("value", BinaryType(), True),
    StructField("headers", ArrayType(StructType([StructField("key", StringType(), True),
                                                 StructField("value", BinaryType(), True)]), True), True),
])

#: The fused path's rows: one per planned topic-partition range `[start_offset, end_offset)`.
RANGE_SCHEMA = StructType([
    StructField("topic", StringType(), False),
    StructField("partition", IntegerType(), False),
    StructField("start_offset", LongType(), False),
    StructField("end_offset", LongType(), False),
])
RANGE_ARROW_SCHEMA = pa.schema([
    pa.field("topic", pa.string(), False),
    pa.field("partition", pa.int32(), False),
    pa.field("start_offset", pa.int64(), False),
    pa.field("end_offset", pa.int64(), False),
])

HEADER_TYPE = pa.list_(pa.field("element", pa.struct([pa.field("key", pa.string()),
                                                        pa.field("value", pa.binary())])))
#: Must equal `to_arrow_schema(SPARK_SCHEMA, timezone="UTC")` exactly (Spark checks it); a test pins this.
ARROW_SCHEMA = pa.schema([
    pa.field("topic", pa.string(), False),
    pa.field("partition", pa.int32(), False),
    pa.field("offset", pa.int64(), False),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("headers", HEADER_TYPE),
])

Offsets = dict[str, dict[str, int]]  # {"topic": {"partition": next offset}} (JSON keys are strings)
#: How long one `consume` call may wait for its batch to fill (see `read_range`).
CONSUME_WAIT_S = 0.1
#: librdkafka's fetcher settings for reading a range (user `kafka.*` options override them).
#: - `fetch.queue.backoff.ms`: once a partition's local queue holds `queued.min.messages` (100,000), librdkafka
#:   stops fetching it and looks again only after this backoff, 1,000 ms by default; a reader drains 100,000
#:   records in ~0.1 s, then sat idle for the rest of the second. So every range longer than what the fetches
#:   in flight hold (~285,000 of these 180-byte lz4 records at 8 MiB) stalled ~1 s per such refill: a 900,000-record
#:   range read in 3.3 s instead of 0.8-0.9 s, the raw consumer's 3M records in 5.7 s instead of 2.5 s (measured,
#:   local broker, docs/benchmarks.md "Throughput"). 10 ms keeps the queue filled for the same CPU.
#: - 8 MiB per partition per fetch: one fetch brings a whole range of a 1M-record batch split over 6 tasks.
#: - `fetch.wait.max.ms`: how long the broker holds a fetch that finds no new record (500 ms by default). A reader's
#:   consumer is kept for its process's next range (`kafka_readers`), and its first fetch there waited for the one
#:   still in flight from the last range: ~0.5 s before the first record, against 0.03-0.09 s at 10 ms (measured).
#:   A reader only fetches while it reads a range, so the shorter wait costs the broker little.
READ_FETCH_DEFAULTS = {"max.partition.fetch.bytes": str(8 << 20), "fetch.max.bytes": str(64 << 20),
                       "fetch.queue.backoff.ms": "10", "fetch.wait.max.ms": "10"}


# ------------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------------
class OffsetOutOfRange(RuntimeError):
    """The offset to resume from no longer exists (retention deleted it)."""

    def __init__(self, topic: str, partition: int, offset: int, earliest: int | None) -> None:
        self.topic, self.partition, self.offset, self.earliest = topic, partition, offset, earliest
        where = f"the log now starts at {earliest}" if earliest is not None else "the broker no longer has it"
        super().__init__(
            f"Kafka offset {offset} of {topic}[{partition}] was deleted by retention ({where}); records "
            f"{offset}..{'?' if earliest is None else earliest - 1} can no longer be handed off. The query stops "
            f"instead of skipping them silently. Fix: restore from an older table snapshot/replay, or accept the "
            f"loss by setting spec.source.onOffsetOutOfRange=earliest (source option onOffsetOutOfRange=earliest), "
            f"which skips to the earliest available offset and records the gap.")


class SourceConfigError(ValueError):
    pass


# ------------------------------------------------------------------------------------------------
# Pure planning logic (unit-tested without Kafka)
# ------------------------------------------------------------------------------------------------
def to_offsets(mapping: Mapping[tuple[str, int], int]) -> Offsets:
    out: Offsets = {}
    for (topic, partition), off in sorted(mapping.items()):
        out.setdefault(topic, {})[str(partition)] = int(off)
    return out


def from_offsets(offsets: Mapping[str, Mapping[str, Any]]) -> dict[tuple[str, int], int]:
    return {(topic, int(p)): int(o) for topic, parts in offsets.items() for p, o in parts.items()}


def admit(start: Mapping[tuple[str, int], int], latest: Mapping[tuple[str, int], int],
          max_rows: int | None) -> dict[tuple[str, int], int]:
    """End offsets for the next micro-batch: all of `latest`, or at most `max_rows` offsets in total,
    shared across partitions in proportion to their backlog (every partition with backlog progresses).

    Offsets are an upper bound on records (gaps hold none), so ≤ max_rows offsets ⇒ ≤ max_rows records.
    Only partitions in `start` are considered (new ones enter through `add_new_partitions`); a partition
    missing from `latest` keeps its start.
    """
    end = {tp: max(off, latest.get(tp, off)) for tp, off in start.items()}
    if max_rows is None:
        return end
    backlog = {tp: end[tp] - start[tp] for tp in start if end[tp] > start[tp]}
    total = sum(backlog.values())
    if total <= max_rows:
        return end
    grants = {tp: (lag * max_rows) // total for tp, lag in backlog.items()}
    spare = max_rows - sum(grants.values())
    # Hand out the rounding remainder one offset at a time, biggest backlog first; give starving
    # partitions (grant 0) at least one offset when there is room, so none is starved forever.
    for tp in sorted(backlog, key=lambda t: (grants[t] > 0, -backlog[t], t)):
        if spare <= 0:
            break
        if grants[tp] < backlog[tp]:
            grants[tp] += 1
            spare -= 1
    for tp, grant in grants.items():
        end[tp] = start[tp] + grant
    return end


def add_new_partitions(start: Mapping[tuple[str, int], int], end: dict[tuple[str, int], int],
                       known: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """Partitions in `known` (value: their entry offset, `entry_points`) that are absent from `start` enter `end`
    at it: an empty range this batch, read from the next one. Why: the start of every
    range then comes from Spark's offset log, never from a guess."""
    for tp, entry in known.items():
        if tp not in start:
            end[tp] = entry
    return end


def entry_points(new: list[tuple[str, int]], known_topics: set[str],
                 starting_offsets: str) -> dict[tuple[str, int], str]:
    """Where each partition the query has no offset for enters (`earliest` or `latest`, as Kafka's ListOffsets
    names them). Pure.

    - A new partition of a topic the handoff reads already: `earliest`. All its records came after it was added,
      while the handoff was reading the topic, so all of them belong to the stream (Spark's Kafka source does the
      same).
    - A topic new to the handoff (added to spec.source.topics): `startingOffsets`, where a new handoff would start.

    Why one rule for both places a partition enters (`initialOffset` on a fresh checkpoint, `latestOffset` on a
    kept one): whether Spark's checkpoint survived must never change where a topic starts reading (the table's
    ledger is the truth, the checkpoint a cache). `known_topics`: the topics of the table's ledger and of the
    checkpoint's offsets."""
    return {tp: "earliest" if tp[0] in known_topics else starting_offsets for tp in new}


@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    start: int
    end: int


def plan_ranges(start: Mapping[tuple[str, int], int], end: Mapping[tuple[str, int], int]) -> list[OffsetRange]:
    """Non-empty `[start, end)` per partition; a partition absent from `start` has an empty range."""
    return [OffsetRange(t, p, start[(t, p)], e) for (t, p), e in sorted(end.items())
            if (t, p) in start and e > start[(t, p)]]


#: A range is split only into pieces of at least this many offsets: below that a task's fixed cost (a
#: consumer, a Parquet file) outweighs the balance gained, and a caught-up stream's small batches stay whole.


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None,
                 min_split: int = MIN_SPLIT_OFFSETS) -> list[OffsetRange]:
    """Spark's Kafka `minPartitions`: when a batch has fewer ranges than `min_partitions`, cut the large ones
    into contiguous pieces, each range's share of pieces in proportion to its size (as Spark's own
    KafkaOffsetRangeCalculator does), never into pieces under `min_split` offsets.

    Why: one task per topic-partition leaves cores idle whenever partitions are fewer than cores or do not
    divide evenly over them (3 partitions on 2 cores run as 2 waves, the second one half empty). Splitting is
    invisible to exactly-once: the batch's offsets come from Spark's offset log, each piece is read with
    the same reader, and a replayed batch re-plans the same pieces from the same offsets.
    """
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.end - r.start for r in ranges)
    if total <= 0:
        return ranges
    out: list[OffsetRange] = []
    for r in ranges:
        size = r.end - r.start
        parts = max(1, min(round(size * min_partitions / total), size // max(1, min_split)))
        step, extra = divmod(size, parts)
        start = r.start
        for i in range(parts):
            end = start + step + (1 if i < extra else 0)
            out.append(OffsetRange(r.topic, r.partition, start, end))
            start = end
    return out


def pack_ranges(ranges: list[OffsetRange], at_most: int | None) -> list[list[OffsetRange]]:
    """The ranges as tasks: one each, or at most `at_most` tasks, the largest ranges first each into the
    least-loaded task (ties to the lowest task), each task's ranges in topic/partition/offset order.

    Why: while the autoscaler's new executors warm up, a batch runs as one wave on the warm cores
    (startup.executor_warmup.partitions_target). A task still pending when a new executor registers would go to it
    cold and hold the batch. Exactly-once is unchanged: a task reading several ranges writes them as one
    task, and the batch's offsets still come from Spark's offset log."""
    if not at_most or len(ranges) <= at_most:
        return [[r] for r in ranges]
    tasks: list[list[OffsetRange]] = [[] for _ in range(at_most)]
    load = [0] * at_most
    for r in sorted(ranges, key=lambda r: (-(r.end - r.start), r.topic, r.partition, r.start)):
        i = min(range(at_most), key=lambda k: (load[k], k))
        tasks[i].append(r)
        load[i] += r.end - r.start
    return [sorted(t, key=lambda r: (r.topic, r.partition, r.start)) for t in tasks]


# ------------------------------------------------------------------------------------------------
# Options
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SourceOptions:
    topics: tuple[str, ...]
    kafka: dict[str, str]
    starting_offsets: str = "earliest"
    max_records_per_batch: int | None = None
    on_offset_out_of_range: str = "fail"
    checkpoint: str | None = None
    stop_marker: str | None = None
    read_timeout_s: float = 120.0
    consume_batch: int = 10000
    min_partitions: int | None = None
    #: Rewritten by the driver when its executors change (executor_scaler); read as each batch is planned.
    min_partitions_file: str | None = None
    #: Where the table's ledger says this query resumes (a fresh checkpoint starts here, not at startingOffsets).
    start_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    #: A bounded read (Backfill): never past these offsets, and partitions not named here are not read at all.
    ending_offsets: dict[tuple[str, int], int] | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "SourceOptions":
        opts = {k.lower(): v for k, v in options.items()}
        topics = tuple(t.strip() for t in opts.get("subscribe", "").split(",") if t.strip())
        if not topics:
            raise SourceConfigError("handoff-kafka needs option subscribe=<topic>[,<topic>...]")
        kafka = {k[len("kafka."):]: v for k, v in opts.items() if k.startswith("kafka.")}
        if "bootstrap.servers" not in kafka:
            raise SourceConfigError("handoff-kafka needs option kafka.bootstrap.servers")
        starting = opts.get("startingoffsets", "earliest")
        if starting not in ("earliest", "latest"):
            raise SourceConfigError(f"startingOffsets must be earliest or latest, not {starting!r}")
        policy = opts.get("onoffsetoutofrange", "fail")
        if policy not in ("fail", "earliest"):
            raise SourceConfigError(f"onOffsetOutOfRange must be fail or earliest, not {policy!r}")
        max_rows = opts.get("maxrecordsperbatch")
        min_parts = opts.get("minpartitions")
        return cls(topics=topics, kafka=kafka, starting_offsets=starting,
                   max_records_per_batch=int(max_rows) if max_rows else None,
                   on_offset_out_of_range=policy, checkpoint=opts.get("checkpointlocation") or None,
                   stop_marker=opts.get("stopmarker") or None,
                   read_timeout_s=float(opts.get("readtimeoutseconds", 120)),
                   consume_batch=int(opts.get("consumebatch", 10000)),
                   min_partitions=int(min_parts) if min_parts else None,
                   min_partitions_file=opts.get("minpartitionsfile") or None,
                   start_offsets=from_offsets(json.loads(opts["startoffsets"])) if opts.get("startoffsets") else {},
                   ending_offsets=from_offsets(json.loads(opts["endingoffsets"])) if opts.get("endingoffsets") else None)

    def task_bounds(self) -> tuple[int | None, int | None]:
        """(at least, at most) tasks for the next batch. `minPartitionsFile` holds `N` (at least N: split large
        ranges) or `N wave` (exactly N: split, and also pack ranges together so that the batch is one wave on
        N warm cores, see executor_warmup); without a readable file, `minPartitions` and no upper bound."""
        if self.min_partitions_file:
            try:
                words = Path(self.min_partitions_file).read_text().split()
                n = max(1, int(words[0]))
                return n, (n if words[1:] == ["wave"] else None)
            except (OSError, ValueError, IndexError):
                pass
        return self.min_partitions, None

    def client_conf(self) -> dict[str, str]:
        # read_committed always: a Handoff table must never contain aborted records.
        return {**self.kafka, "isolation.level": "read_committed"}


def source_options(cfg: "AppConfig", stop_marker: str | None,
                   start_offsets: Mapping[str, Mapping[int, int]] | None = None) -> dict[str, str]:
    """The source's options for a handoff's app config: what the driver passes to the query and what a fused
    write task parses to read its ranges the same way."""
    src = cfg.source
    opts = {f"kafka.{k}": v for k, v in src.properties.items()}
    opts.update({
        "subscribe": ",".join(src.topics),
        "kafka.bootstrap.servers": src.bootstrap_servers,
        "startingOffsets": src.starting_offsets,
        "onOffsetOutOfRange": src.on_offset_out_of_range,
        "checkpointLocation": cfg.checkpoint_location,
    })
    if src.max_records_per_batch:
        opts["maxRecordsPerBatch"] = str(src.max_records_per_batch)
    if src.min_partitions:
        opts["minPartitions"] = str(src.min_partitions)
    if stop_marker:
        opts["stopMarker"] = stop_marker
    if start_offsets:
        opts["startOffsets"] = json.dumps({t: {str(p): int(o) for p, o in parts.items()}
                                           for t, parts in start_offsets.items()}, sort_keys=True)
    if cfg.backfill is not None:
        opts["endingOffsets"] = json.dumps({t: {str(p): int(o) for p, o in parts.items()}
                                            for t, parts in cfg.backfill.to.items()}, sort_keys=True)
    return opts


# ------------------------------------------------------------------------------------------------
# Broker queries (driver side)
# ------------------------------------------------------------------------------------------------
class Broker:
    """Metadata and ListOffsets through one AdminClient (one round trip per query for all partitions)."""

    def __init__(self, opts: SourceOptions) -> None:
        from confluent_kafka.admin import AdminClient

        conf = {k: v for k, v in opts.kafka.items() if not k.startswith(("isolation.", "auto.offset", "group."))}
        self.admin = AdminClient(with_defaults(conf))
        self.topics = opts.topics

    def partitions(self) -> list[tuple[str, int]]:
        found: list[tuple[str, int]] = []
        for topic in self.topics:
            md = self.admin.list_topics(topic=topic, timeout=30).topics.get(topic)
            if md is None or md.error is not None or not md.partitions:
                raise SourceConfigError(f"Kafka topic {topic!r} does not exist or has no partitions "
                                        f"({md.error if md is not None else 'unknown topic'})")
            found.extend((topic, p) for p in sorted(md.partitions))
        return found

    def list_offsets(self, tps: list[tuple[str, int]], which: str) -> dict[tuple[str, int], int]:
        """`which` = earliest | latest; latest is the last stable offset (READ_COMMITTED)."""
        if not tps:
            return {}
        from confluent_kafka import IsolationLevel, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        spec = OffsetSpec.earliest() if which == "earliest" else OffsetSpec.latest()
        futures = self.admin.list_offsets({TopicPartition(t, p): spec for t, p in tps},
                                          isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=30)
        return {(tp.topic, tp.partition): fut.result().offset for tp, fut in futures.items()}


# ------------------------------------------------------------------------------------------------
# The data source
# ------------------------------------------------------------------------------------------------
class KafkaPartition(InputPartition):
    """One Spark task's offset ranges: usually one; several when `pack_ranges` put them together."""

    def __init__(self, ranges: list[OffsetRange]) -> None:
        super().__init__(ranges)
        self.ranges = ranges


class HandoffKafkaDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return SPARK_SCHEMA

    def streamReader(self, schema: StructType) -> "KafkaStreamReader":
        return KafkaStreamReader(SourceOptions.parse(self.options))


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets/planning run in Spark's long-lived Python source runner on the driver; `read` runs on
    executors from a pickled copy (broker clients are dropped on pickling)."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._broker: Broker | None = None
        self._target: dict[tuple[str, int], int] | None = None  # AvailableNow
        self._latest: dict[tuple[str, int], int] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "_broker": None, "_target": None, "_latest": {}}

    @property
    def broker(self) -> Broker:
        if self._broker is None:
            self._broker = Broker(self.opts)
        return self._broker

    # -- offsets -------------------------------------------------------------------------------
    def initialOffset(self) -> dict:
        """The start of batch 0 of a fresh checkpoint: the table ledger's offsets (`startOffsets`, passed by the
        driver) for the partitions it has, `entry_points` for the others (a new topic at `startingOffsets`, a new
        partition of a topic the ledger knows at its earliest offset). Persisted,
        so a query that crashes in batch 0 replays the same range."""
        if self.opts.checkpoint:
            known = ckpt.initial_offsets(self.opts.checkpoint)
            if known is not None:
                return to_offsets(known)
        tps = self.broker.partitions()
        ledger = {tp: off for tp, off in self.opts.start_offsets.items() if tp in set(tps)}
        rest = [tp for tp in tps if tp not in ledger]
        initial = {**self._entry_offsets(rest, {t for t, _ in self.opts.start_offsets}), **ledger}
        doc = to_offsets(initial)
        if self.opts.checkpoint:
            ckpt.write_initial_offsets(self.opts.checkpoint, doc)
        log.info("handoff-kafka initial offsets (ledger for %d partitions, entry points for %d: new topics at "
                 "startingOffsets=%s, new partitions of known topics at earliest): %s", len(ledger),
                 len(rest), self.opts.starting_offsets, doc)
        return doc

    def _entry_offsets(self, new: list[tuple[str, int]], known_topics: set[str]) -> dict[tuple[str, int], int]:
        """Kafka's offsets where partitions without one enter (`entry_points`), one ListOffsets per kind."""
        where = entry_points(new, known_topics, self.opts.starting_offsets)
        out: dict[tuple[str, int], int] = {}
        for which in sorted(set(where.values())):
            out.update(self.broker.list_offsets([tp for tp in new if where[tp] == which], which))
        return out

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_records_per_batch:
            return ReadMaxRows(self.opts.max_records_per_batch)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        tps = self.broker.partitions()
        self._target = self.broker.list_offsets(tps, "latest")
        log.info("handoff-kafka AvailableNow target: %s", to_offsets(self._target))

    def _stopping(self) -> bool:
        return bool(self.opts.stop_marker) and os.path.exists(self.opts.stop_marker)  # type: ignore[arg-type]

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = from_offsets(start)
        if self._stopping():
            return start  # graceful stop: admit nothing new, the driver stops at this batch boundary
        if self._target is not None:
            tps = sorted(self._target)
            latest = dict(self._target)
            self._latest = dict(latest)
        else:
            tps = self.broker.partitions()
            latest = self.broker.list_offsets(tps, "latest")
            self._latest = dict(latest)
        if self.opts.ending_offsets is not None:
            cap = self.opts.ending_offsets
            latest = {tp: min(off, cap.get(tp, begin.get(tp, off))) for tp, off in latest.items()}
        new = [tp for tp in tps if tp not in begin]
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = admit(begin, {tp: off for tp, off in latest.items() if tp in begin}, max_rows)
        if new:
            known = {t for t, _ in begin} | {t for t, _ in self.opts.start_offsets}
            entry = self._entry_offsets(new, known)
            log.info("handoff-kafka: partitions %s enter at %s (new topics at startingOffsets=%s, new partitions of "
                     "known topics at earliest)", new, entry, self.opts.starting_offsets)
            end = add_new_partitions(begin, end, entry)
        return to_offsets(end)

    def reportLatestOffset(self) -> dict | None:
        return to_offsets(self._latest) if self._latest else None

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        ranges = plan_ranges(from_offsets(start), from_offsets(end))
        if not ranges:
            return []
        earliest = self.broker.list_offsets([(r.topic, r.partition) for r in ranges], "earliest")
        planned: list[OffsetRange] = []
        for r in ranges:
            low = earliest[(r.topic, r.partition)]
            if r.start < low:
                if self.opts.on_offset_out_of_range == "fail":
                    raise OffsetOutOfRange(r.topic, r.partition, r.start, low)
                self._record_gap(r, low)
                r = OffsetRange(r.topic, r.partition, min(low, r.end), r.end)
                if r.start >= r.end:
                    continue
            planned.append(r)
        at_least, at_most = self.opts.task_bounds()
        return [KafkaPartition(task) for task in pack_ranges(split_ranges(planned, at_least), at_most)]

    def _record_gap(self, r: OffsetRange, low: int) -> None:
        lost_to = min(low, r.end)
        log.warning("handoff-kafka: %s[%d] offsets %d..%d were deleted by retention before being handed off; "
                    "skipping to %d (onOffsetOutOfRange=earliest)", r.topic, r.partition, r.start, lost_to - 1,
                    lost_to)
        if self.opts.checkpoint:
            ckpt.append_gap(self.opts.checkpoint, {"topic": r.topic, "partition": r.partition, "from": r.start,
                                                   "to": lost_to, "detectedAtMs": int(time.time() * 1000)})

    def commit(self, end: dict) -> None:
        # Consumer-group offsets are committed by the sink after the table commit is durable.
        pass

    def stop(self) -> None:
        self._broker = None

    # -- reading (executors) ---------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        for rng in partition.ranges:  # type: ignore[attr-defined]
            yield from read_range(self.opts, rng)


class HandoffKafkaRangesDataSource(HandoffKafkaDataSource):
    """`handoff-kafka-ranges`: the same offsets, planning and checkpointing as `handoff-kafka`, but each input
    partition yields ONE row `(topic, partition, start_offset, end_offset)` instead of its records.

    Why: with a Python sink, records read by a Python source cross Python → JVM (Arrow) → Python again
    before the sink sees them, plus a second Python worker per task; on a small node that hand-over and
    Spark's per-row accounting cost more than reading Kafka itself. A sink that takes ranges reads the
    records in its own write task (`sink.common.task_records`, the fused path). Exactly-once is unchanged: the
    ranges are the ones Spark checkpoints for the batch, and a replayed batch plans the same ranges.
    `numInputRows` in Spark's progress counts ranges, not records (sinks report records themselves).
    """

    @classmethod
    def name(cls) -> str:
        return RANGES_SOURCE_NAME

    def schema(self) -> StructType:
        return RANGE_SCHEMA

    def streamReader(self, schema: StructType) -> "KafkaRangeStreamReader":
        return KafkaRangeStreamReader(SourceOptions.parse(self.options))


class KafkaRangeStreamReader(KafkaStreamReader):
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        for rng in partition.ranges:  # type: ignore[attr-defined]
            yield range_batch(rng)


def range_batch(rng: OffsetRange) -> pa.RecordBatch:
    """One `handoff-kafka-ranges` row for `rng`: what a fused write task receives for its range."""
    return pa.RecordBatch.from_pylist([{"topic": rng.topic, "partition": rng.partition,
                                        "start_offset": rng.start, "end_offset": rng.end}],
                                      schema=RANGE_ARROW_SCHEMA)


def ranges_of(batches: Iterator[pa.RecordBatch] | list[pa.RecordBatch]) -> list[OffsetRange]:
    """The `OffsetRange`s in `handoff-kafka-ranges` rows."""
    out: list[OffsetRange] = []
    for b in batches:
        for row in b.to_pylist():
            out.append(OffsetRange(row["topic"], int(row["partition"]), int(row["start_offset"]),
                                   int(row["end_offset"])))
    return out


def reader_conf(opts: SourceOptions) -> dict[str, Any]:
    """A range reader's consumer settings: assign only, never joined nor committed."""
    return {
        **CLIENT_DEFAULTS,
        **READ_FETCH_DEFAULTS,
        **opts.client_conf(),
        "group.id": opts.kafka.get("group.id", "handoff-reader"),
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "enable.partition.eof": True,
    }


def warm_reader(opts: SourceOptions) -> None:
    """What a range reader sets up before its first fetch (librdkafka, the connection, the topics' metadata),
    done ahead on a new executor (executor_warmup), and kept for the next range this worker process reads
    (`kafka_readers`). Reads no record."""
    conf = reader_conf(opts)
    with kafka_readers.consumer(conf, opts.topics, kafka_native.consumer_factory(conf)):  # kept for the next range
        pass


def read_range(opts: SourceOptions, rng: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Records of `rng` in offset order as Arrow batches of ≤ `opts.consume_batch` rows.

    Done when a record at offset ≥ end-1 arrives, or the consumer's position (which moves past
    transaction markers and aborted records) reaches `end`, or end-of-partition is reported at ≥ end.
    Read by the native reader (`kafka_native`) or confluent-kafka's `Consumer`; the decisions here are the same.
    """
    from confluent_kafka import KafkaError, KafkaException

    from handoff_spark.kafka.confluent_kafka_private import AUTO_OFFSET_RESET, PARTITION_EOF

    conf = reader_conf(opts)
    factory = kafka_native.consumer_factory(conf)
    with kafka_readers.consumer(conf, [rng.topic], factory) as consumer:
        fetch, position_of = (_python_fetcher if factory is None else _native_fetcher)(consumer, rng)
        end, last_progress, position = rng.end, time.monotonic(), rng.start
        while position < end:
            # Ask for no more than the range still holds: a fetch waits (up to its timeout) until it has
            # `n_batch` records, so asking for more than exist — a range ending at the partition's end, i.e. every
            # caught-up streaming batch — cost a full second per task (measured), and asking past `end`
            # built records only to drop them.
            # A short timeout too: offsets are an upper bound on records, so a range whose tail holds no records
            # (transaction markers, aborted or compacted records — every caught-up batch of a transactional
            # topic ends at a commit marker) never fills `n_batch`, and the fetch would sit out its whole
            # timeout (1 s per task per batch, measured) before handing over the records and the EOF it has.
            n_batch = max(1, min(opts.consume_batch, end - position))
            got = fetch(n_batch, end)
            for code, offset, err in got.errors:
                if code == PARTITION_EOF:
                    position = max(position, offset)
                elif code in (AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                    raise OffsetOutOfRange(rng.topic, rng.partition, rng.start, None)
                elif not err.retriable():
                    raise KafkaException(err)
            if got.last >= 0:
                position = max(position, got.last + 1)
                last_progress = time.monotonic()
            if got.batch is not None:
                yield got.batch
            if position < end and got.short:
                # The call timed out short of its batch: the position may already be past a tail without
                # records (librdkafka moves it past transaction markers and aborted records, often without an
                # EOF event), which would otherwise cost one more wasted wait per task.
                pos = position_of()
                if pos >= 0 and pos > position:
                    position = pos
                    last_progress = time.monotonic()
                elif time.monotonic() - last_progress > opts.read_timeout_s:
                    raise TimeoutError(f"handoff-kafka: reading {rng.topic}[{rng.partition}] {rng.start}..{end}: no "
                                       f"progress at offset {position} for {opts.read_timeout_s:.0f}s")


Fetcher = tuple[Callable[[int, int], kafka_native.Fetched], Callable[[], int]]


def _native_fetcher(consumer: kafka_native.NativeConsumer, rng: OffsetRange) -> Fetcher:
    """(fetch(n, end), position()) of a native consumer, assigned to `rng` from its start."""
    consumer.assign(rng.topic, rng.partition, rng.start)

    def fetch(n: int, end: int) -> kafka_native.Fetched:
        return consumer.fetch(n, CONSUME_WAIT_S, end, rng.topic, rng.partition, ARROW_SCHEMA)
    return fetch, lambda: consumer.position(rng.topic, rng.partition)


def _python_fetcher(consumer: Any, rng: OffsetRange) -> Fetcher:
    """The same over confluent-kafka's `Consumer`: `consume()`'s messages made into the native reader's `Fetched`."""
    from confluent_kafka import TopicPartition

    consumer.assign([TopicPartition(rng.topic, rng.partition, rng.start)])

    def fetch(n: int, end: int) -> kafka_native.Fetched:
        with gc_paused():
            msgs = consumer.consume(num_messages=n, timeout=CONSUME_WAIT_S)
            good = [m for m in msgs if m.error() is None]
            errors = [(m.error().code(), m.offset(), m.error()) for m in msgs if m.error() is not None] \
                if len(good) < len(msgs) else []
            last = good[-1].offset() if good else -1
            if last >= end:
                good = [m for m in good if m.offset() < end]
            batch = _to_batch(rng.topic, rng.partition, good) if good else None
        return kafka_native.Fetched(batch=batch, last=last, errors=errors, short=len(msgs) < n)
    return fetch, lambda: consumer.position([TopicPartition(rng.topic, rng.partition)])[0].offset


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (as it was after it).

    Why: reading a range allocates several objects per record (confluent-kafka's `Message`, its timestamp tuple,
    the column lists), and every 700 allocations start a collection, which also walks the in-flight messages and
    whatever else the worker holds that is not frozen. Collections were 43 % of `_to_batch`'s time (109 vs 62 ms per
    166,000 records, measured on its own) and a range read took 0.27 → 0.20 s of CPU without them. None of these
    objects is part of a reference cycle, so reference counting frees them all the same; the collections skipped
    are made up for by the first one after the block. Scoped to the source's own code, never across a `yield`."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _to_batch(topic: str, partition: int, msgs: list) -> pa.RecordBatch:
    """Column-wise Arrow batch from confluent-kafka messages."""
    n = len(msgs)
    offsets = [m.offset() for m in msgs]
    ts = [m.timestamp() for m in msgs]
    keys = [m.key() for m in msgs]
    values = [m.value() for m in msgs]
    headers = [m.headers() for m in msgs]
    ts_us = pa.array([t[1] * 1000 if t[0] else None for t in ts], pa.int64())
    if any(h is not None for h in headers):
        header_arr = pa.array(headers, HEADER_TYPE)
    else:
        header_arr = pa.nulls(n, HEADER_TYPE)
    return pa.RecordBatch.from_arrays([
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.array(offsets, pa.int64()),
        ts_us.cast(pa.timestamp("us", tz="UTC")),
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        header_arr,
    ], schema=ARROW_SCHEMA)
