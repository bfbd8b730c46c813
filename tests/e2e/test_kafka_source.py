"""The handoff-kafka streaming source against a real Kafka broker and a real (local) Spark.

One Spark session for the module (start-up costs seconds); queries write through foreachBatch into a
driver-side list so each test sees exactly which records each micro-batch held.
"""
from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import NewPartitions, OffsetSpec

from handoff_testbed.eventually import eventually

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from handoff_spark.kafka.source import HandoffKafkaDataSource

    session = (SparkSession.builder.master("local[2]").appName("test-kafka-source")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2").config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(HandoffKafkaDataSource)
    yield session
    session.stop()


def new_topic(kafka: Any, partitions: int = 1, config: dict[str, str] | None = None) -> str:
    name = f"src-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(name, partitions=partitions, config=config)
    return name


def produce(kafka: Any, topic: str, values: list[bytes], partition: int | None = None) -> None:
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for v in values:
        if partition is None:
            p.produce(topic, v)
        else:
            p.produce(topic, v, partition=partition)
    assert p.flush(30) == 0


class Collect:
    """foreachBatch target: per batch, the (partition, offset, value) rows."""

    def __init__(self) -> None:
        self.batches: dict[int, list[tuple[int, int, bytes]]] = {}

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = df.select("partition", "offset", "value").collect()
        self.batches[batch_id] = [(r.partition, r.offset, bytes(r.value)) for r in rows]

    @property
    def rows(self) -> list[tuple[int, int, bytes]]:
        return [r for b in sorted(self.batches) for r in self.batches[b]]


def start(spark: Any, kafka: Any, topic: str, checkpoint: Path, sink: Any, available_now: bool = True,
          **options: str) -> Any:
    reader = (spark.readStream.format("handoff-kafka").option("subscribe", topic)
              .option("kafka.bootstrap.servers", kafka.bootstrap).option("checkpointLocation", str(checkpoint)))
    for k, v in options.items():
        reader = reader.option(k, v)
    writer = reader.load().writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime="500 milliseconds")
    return writer.start()


def test_backlog_is_split_into_batches_of_at_most_max_records_and_available_now_stops(spark, kafka, tmp_path):
    topic = new_topic(kafka, partitions=3)
    values = [json.dumps({"i": i}).encode() for i in range(1000)]
    produce(kafka, topic, values)
    sink = Collect()
    query = start(spark, kafka, topic, tmp_path / "ck", sink, maxRecordsPerBatch="300")
    assert query.awaitTermination(300), "AvailableNow query did not stop after draining the backlog"
    assert query.exception() is None
    sizes = [len(sink.batches[b]) for b in sorted(sink.batches)]
    assert all(0 < n <= 300 for n in sizes), sizes
    assert sum(sizes) == 1000 and len(sizes) == 4
    assert sorted(v for _, _, v in sink.rows) == sorted(values)
    assert len({(p, o) for p, o, _ in sink.rows}) == 1000
    # the initial offsets (start of batch 0) are persisted for the sink and for replays of batch 0
    initial = json.loads((tmp_path / "ck" / "sources" / "handoff-initial.json").read_text())
    assert initial == {topic: {"0": 0, "1": 0, "2": 0}}
    # a second AvailableNow run on the same checkpoint finds nothing new and stops at once
    produce(kafka, topic, [b'{"late": 1}'])
    sink2 = Collect()
    query = start(spark, kafka, topic, tmp_path / "ck", sink2, maxRecordsPerBatch="300")
    assert query.awaitTermination(300)
    assert [v for _, _, v in sink2.rows] == [b'{"late": 1}']


def test_aborted_transactions_never_appear_and_ranges_advance_past_markers(spark, kafka, tmp_path):
    topic = new_topic(kafka)
    p = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"tx-{topic}"})
    p.init_transactions()
    expected = []
    for round_ in range(3):
        p.begin_transaction()
        for i in range(5):
            p.produce(topic, f"committed-{round_}-{i}".encode())
            expected.append(f"committed-{round_}-{i}".encode())
        p.commit_transaction()
        p.begin_transaction()
        for i in range(4):
            p.produce(topic, f"aborted-{round_}-{i}".encode())
        p.flush()
        p.abort_transaction()
    sink = Collect()
    query = start(spark, kafka, topic, tmp_path / "ck", sink, maxRecordsPerBatch="7")
    assert query.awaitTermination(300)
    assert query.exception() is None
    values = [v for _, _, v in sink.rows]
    assert values == expected
    # 3 × (5 committed + marker + 4 aborted + marker) = 33 offsets consumed, end offset past the last marker
    end = json.loads(query.lastProgress["sources"][0]["endOffset"])
    assert end == {topic: {"0": 33}}
    # an open transaction bounds the range at the last stable offset: its records are not read until committed
    p.begin_transaction()
    p.produce(topic, b"pending")
    p.flush()
    sink2 = Collect()
    query = start(spark, kafka, topic, tmp_path / "ck", sink2)
    assert query.awaitTermination(300)
    assert sink2.rows == []
    p.commit_transaction()
    query = start(spark, kafka, topic, tmp_path / "ck", sink2)
    assert query.awaitTermination(300)
    assert [v for _, _, v in sink2.rows] == [b"pending"]


def test_partition_added_mid_stream_is_read(spark, kafka, tmp_path):
    topic = new_topic(kafka, partitions=1)
    produce(kafka, topic, [b"p0-a", b"p0-b"], partition=0)
    sink = Collect()
    query = start(spark, kafka, topic, tmp_path / "ck", sink, available_now=False)
    try:
        query.processAllAvailable()
        assert sorted(v for _, _, v in sink.rows) == [b"p0-a", b"p0-b"]
        admin = kafka.admin()  # keep a reference: a collected client cancels its futures
        admin.create_partitions([NewPartitions(topic, 2)])[topic].result(30)
        eventually(lambda: len(admin.list_topics(topic=topic, timeout=10).topics[topic].partitions) == 2,
                   "the broker's metadata shows the second partition", timeout=60)
        produce(kafka, topic, [b"p1-a", b"p1-b", b"p1-c"], partition=1)
        produce(kafka, topic, [b"p0-c"], partition=0)

        def six_rows() -> bool:
            query.processAllAvailable()
            return len(sink.rows) >= 6

        eventually(six_rows, "the query reads the new partition's records", timeout=120, interval=0.5)
    finally:
        query.stop()
    assert sorted((p, v) for p, _, v in sink.rows) == [(0, b"p0-a"), (0, b"p0-b"), (0, b"p0-c"),
                                                       (1, b"p1-a"), (1, b"p1-b"), (1, b"p1-c")]
    assert len(sink.rows) == 6


def fails_then_skips(spark: Any, kafka: Any, topic: str, checkpoint: Path, lost: tuple[int, int]
                     ) -> list[tuple[int, bytes]]:
    """Resuming `checkpoint` after partition 0's offsets [lost) were deleted: the query fails naming them
    (onOffsetOutOfRange=fail, the default); with onOffsetOutOfRange=earliest it skips to the log start and
    records the gap. Returns the (offset, value) rows read after the skip."""
    query = start(spark, kafka, topic, checkpoint, Collect())
    with pytest.raises(Exception) as err:
        query.awaitTermination(300)
    message = str(err.value)
    assert f"{topic}[0]" in message and f"offset {lost[0]}" in message and f"starts at {lost[1]}" in message
    assert "onOffsetOutOfRange" in message
    sink = Collect()
    query = start(spark, kafka, topic, checkpoint, sink, onOffsetOutOfRange="earliest")
    assert query.awaitTermination(300)
    assert query.exception() is None
    gaps = [json.loads(line) for line in (checkpoint / "sources" / "handoff-gaps.jsonl").read_text().splitlines()]
    assert [(g["topic"], g["partition"], g["from"], g["to"]) for g in gaps] == [(topic, 0, *lost)]
    return [(o, v) for _, o, v in sink.rows]


def test_start_offset_deleted_by_retention_fails_clearly_or_skips_when_told(spark, kafka, tmp_path):
    topic = new_topic(kafka, partitions=1)
    produce(kafka, topic, [f"first-{i}".encode() for i in range(10)])
    sink = Collect()
    query = start(spark, kafka, topic, tmp_path / "ck", sink)
    assert query.awaitTermination(300)
    assert len(sink.rows) == 10
    # 10 more records, then retention (here: DeleteRecords) removes everything below offset 15
    produce(kafka, topic, [f"second-{i}".encode() for i in range(10)])
    admin = kafka.admin()
    result = admin.delete_records([TopicPartition(topic, 0, 15)])
    for fut in result.values():
        fut.result(30)
    rows = fails_then_skips(spark, kafka, topic, tmp_path / "ck", lost=(10, 15))
    assert rows == [(15 + i, f"second-{5 + i}".encode()) for i in range(5)]


def test_segments_deleted_by_the_brokers_retention_fail_clearly_or_skip_when_told(spark, kafka, tmp_path):
    """The same, with the broker's own retention instead of DeleteRecords: records 0..19 carry hour-old
    timestamps, 20..29 are new (the append rolls a segment at 20, segment.ms 1 minute); after the query has
    read 0..9, retention.ms drops to 10 minutes and the broker's retention check (every 5 s in the test bed)
    deletes the segment [0, 20) under the query's position."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    topic = new_topic(kafka, partitions=1, config={"segment.ms": "60000"})
    old_ms = int(time.time() * 1000) - 3_600_000
    p = Producer({"bootstrap.servers": kafka.bootstrap})

    def produce_old(start: int) -> None:
        for i in range(start, start + 10):
            p.produce(topic, f"old-{i}".encode(), partition=0, timestamp=old_ms + i)
        assert p.flush(30) == 0
    produce_old(0)
    sink = Collect()
    query = start(spark, kafka, topic, tmp_path / "ck", sink)
    assert query.awaitTermination(300)
    assert [o for _, o, _ in sink.rows] == list(range(10))
    produce_old(10)
    produce(kafka, topic, [f"new-{i}".encode() for i in range(10)])
    admin = kafka.admin()
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", "600000", incremental_operation=AlterConfigOpType.SET)])
    for fut in admin.incremental_alter_configs([resource]).values():
        fut.result(30)
    tp = TopicPartition(topic, 0)
    eventually(lambda: admin.list_offsets({tp: OffsetSpec.earliest()})[tp].result(30).offset == 20,
               "the broker deletes the old segment", timeout=60, interval=0.5)
    rows = fails_then_skips(spark, kafka, topic, tmp_path / "ck", lost=(10, 20))
    assert rows == [(20 + i, f"new-{i}".encode()) for i in range(10)]


def test_initial_offsets_are_persisted_so_a_replayed_batch_zero_reads_the_same_range(kafka, tmp_path):
    """Spark does not persist a Python source's initial offsets: with startingOffsets=latest a crash during
    batch 0 would otherwise replay a different range. No Spark needed: the reader's driver-side methods."""
    from handoff_spark.kafka.source import KafkaStreamReader, OffsetRange, ReadAllAvailable, SourceOptions

    topic = new_topic(kafka, partitions=2)
    produce(kafka, topic, [b"old-0", b"old-1"], partition=0)
    opts = SourceOptions.parse({"subscribe": topic, "kafka.bootstrap.servers": kafka.bootstrap,
                                "startingOffsets": "latest", "checkpointLocation": str(tmp_path / "ck")})
    first = KafkaStreamReader(opts).initialOffset()
    assert first == {topic: {"0": 2, "1": 0}}
    produce(kafka, topic, [b"new"], partition=1)
    assert KafkaStreamReader(opts).initialOffset() == first  # a restarted driver gets the same start
    assert json.loads((tmp_path / "ck" / "sources" / "handoff-initial.json").read_text()) == first
    # and the planned range of the first batch starts there
    reader = KafkaStreamReader(opts)
    end = reader.latestOffset(first, ReadAllAvailable())
    assert end == {topic: {"0": 2, "1": 1}}
    assert [p.ranges for p in reader.partitions(first, end)] == [[OffsetRange(topic, 1, 0, 1)]]
    assert reader.reportLatestOffset() == end


def test_compaction_gaps_end_the_range_by_position_not_by_count(kafka):
    """After compaction a range [0, 100) holds fewer than 100 records; the reader must still finish (it stops
    when its position reaches the end, not after N records) and return the survivors in offset order."""
    from handoff_spark.kafka.source import OffsetRange, SourceOptions, read_range

    topic = new_topic(kafka, config={"cleanup.policy": "compact", "segment.ms": "100",
                                     "min.cleanable.dirty.ratio": "0.001", "min.compaction.lag.ms": "0",
                                     "delete.retention.ms": "100"})
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for round_ in range(20):
        for k in range(5):
            p.produce(topic, b"v%d" % round_, key=b"k%d" % k)
        assert p.flush(30) == 0
        time.sleep(0.2)  # let segments roll so the cleaner has closed segments to compact
    opts = SourceOptions.parse({"subscribe": topic, "kafka.bootstrap.servers": kafka.bootstrap,
                                "readTimeoutSeconds": "60"})

    def compacted() -> list[dict] | None:
        rows = [r for b in read_range(opts, OffsetRange(topic, 0, 0, 100)) for r in b.to_pylist()]
        return rows if len(rows) < 100 else None

    rows = eventually(compacted, "the broker compacts the topic", timeout=120, interval=2)
    offsets = [r["offset"] for r in rows]
    assert offsets == sorted(set(offsets)) and offsets[-1] == 99
    latest = {r["key"]: r["value"] for r in rows}
    assert latest == {b"k%d" % k: b"v19" for k in range(5)}


def test_reading_a_range_pauses_the_cyclic_collector_and_restores_it(kafka, monkeypatch):
    """`read_range` allocates several objects per record; the cyclic collector is paused while it does (a third of
    the batch building's time went to collections, docs/benchmarks.md "Throughput"): collections during a
    30,000-record read stay a handful (without the pause: one every ~700 allocations, hundreds), the records are
    all there, and the collector is enabled again after the read — also when the read fails."""
    import gc

    from handoff_spark.kafka import native as kafka_native
    from handoff_spark.kafka.source import OffsetOutOfRange, OffsetRange, SourceOptions, read_range

    monkeypatch.setenv(kafka_native.READER_ENV, "python")  # the native reader makes no Python object per record
    topic = new_topic(kafka)
    produce(kafka, topic, [b'{"n": %d}' % i for i in range(30_000)])
    opts = SourceOptions.parse({"subscribe": topic, "kafka.bootstrap.servers": kafka.bootstrap})
    collections = []

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(count)
    try:
        offsets = [o for b in read_range(opts, OffsetRange(topic, 0, 0, 30_000)) for o in b.column("offset").to_pylist()]
    finally:
        gc.callbacks.remove(count)
    assert offsets == list(range(30_000))
    assert len(collections) < 30, collections
    assert gc.isenabled()
    # a range the log no longer holds fails inside the paused block: the collector is enabled again all the same
    with pytest.raises(OffsetOutOfRange):
        list(read_range(opts, OffsetRange(topic, 0, 40_000, 40_010)))
    assert gc.isenabled()


@pytest.mark.parametrize("reader", ["native", "python"])
def test_a_range_reader_keeps_its_consumer_for_the_next_range_and_reads_only_that_range(kafka, reader, monkeypatch):
    """A reader's consumer is kept in the process for the next range (kafka_readers: no new librdkafka threads and
    arenas per task); whatever it had fetched past its last range never shows up in the next one. A read that
    fails or is abandoned closes its consumer instead; a forked child does not get the parent's. With either
    reader (kafka_native)."""
    from handoff_spark.kafka import native as kafka_native
    from handoff_spark.kafka import readers as kafka_readers
    from handoff_spark.kafka.source import (OffsetOutOfRange, OffsetRange, SourceOptions, read_range, reader_conf,
                                            warm_reader)

    topic = new_topic(kafka, partitions=2)
    produce(kafka, topic, [b"p0-%d" % i for i in range(30_000)], partition=0)
    produce(kafka, topic, [b"p1-%d" % i for i in range(5_000)], partition=1)
    opts = SourceOptions.parse({"subscribe": topic, "kafka.bootstrap.servers": kafka.bootstrap})
    conf = reader_conf(opts)
    monkeypatch.setenv(kafka_native.READER_ENV, reader)
    factory = kafka_native.consumer_factory(conf)
    assert (factory is None) == (reader == "python")
    kafka_readers.close_idle()

    def read(partition: int, start: int, end: int) -> list[tuple[int, int, bytes]]:
        return [(r["partition"], r["offset"], r["value"])
                for b in read_range(opts, OffsetRange(topic, partition, start, end)) for r in b.to_pylist()]

    def expected(partition: int, start: int, end: int) -> list[tuple[int, int, bytes]]:
        return [(partition, o, b"p%d-%d" % (partition, o)) for o in range(start, end)]

    warm_reader(opts)
    assert kafka_readers.idle_count(conf) == 1
    with kafka_readers.consumer(conf, [], factory) as kept:
        pass
    # the first range's fetch brings far more of partition 0 than [0, 1000): none of it may leak into the next
    for partition, start, end in ((0, 0, 1_000), (0, 20_000, 20_500), (1, 100, 200), (0, 0, 10), (0, 29_990, 30_000)):
        assert read(partition, start, end) == expected(partition, start, end)
        assert kafka_readers.idle_count(conf) == 1
    with kafka_readers.consumer(conf, [], factory) as again:
        assert again is kept
        assert again.assignment() == []  # an idle consumer fetches nothing

    abandoned = read_range(opts, OffsetRange(topic, 0, 0, 30_000))
    next(abandoned)
    abandoned.close()
    assert kafka_readers.idle_count(conf) == 0
    with pytest.raises(OffsetOutOfRange):
        read(0, 40_000, 40_010)
    assert kafka_readers.idle_count(conf) == 0
    assert read(1, 4_990, 5_000) == expected(1, 4_990, 5_000)
    assert kafka_readers.idle_count(conf) == 1

    child = os.fork()
    if child == 0:  # the parent's consumer and its threads are not the child's to use or destroy
        os._exit(0 if kafka_readers.idle_count() == 0 else 1)
    assert os.waitpid(child, 0)[1] == 0
    assert kafka_readers.idle_count(conf) == 1
    kafka_readers.close_idle()
    assert kafka_readers.idle_count() == 0


class CollectWithTasks(Collect):
    """Also records how many input partitions (tasks) each batch had."""

    def __init__(self) -> None:
        super().__init__()
        self.tasks: dict[int, int] = {}

    def __call__(self, df: Any, batch_id: int) -> None:
        self.tasks[batch_id] = df.rdd.getNumPartitions()
        super().__call__(df, batch_id)


def test_min_partitions_splits_a_partition_into_tasks_and_every_record_is_read_once(spark, kafka, tmp_path):
    """One topic-partition, minPartitions=3: the batch runs as several tasks over contiguous pieces of the
    range, one piece starting inside an aborted transaction; every committed record arrives exactly once."""
    topic = new_topic(kafka)
    p = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"tx-{topic}", "linger.ms": 20})
    p.init_transactions()
    expected = []
    for label, count, commit in (("a", 12_000, True), ("x", 3_000, False), ("b", 9_000, True)):
        p.begin_transaction()
        for i in range(count):
            p.produce(topic, f"{label}{i}".encode())
        p.flush()
        if commit:
            p.commit_transaction()
            expected += [f"{label}{i}".encode() for i in range(count)]
        else:
            p.abort_transaction()
    sink = CollectWithTasks()
    query = start(spark, kafka, topic, tmp_path / "ck", sink, minPartitions="3")
    assert query.awaitTermination(300)
    assert query.exception() is None
    assert list(sink.tasks.values()) == [2]  # 24,002 offsets: two pieces of ≥ 10,000 (MIN_SPLIT_OFFSETS)
    values = [v for _, _, v in sink.rows]
    assert len(values) == len(expected) == len({o for _, o, _ in sink.rows})
    assert sorted(values) == sorted(expected)
    assert not any(v.startswith(b"x") for v in values)
