"""The native range reader (`kafka_native`, C `_kafka_native`) against the test bed's real Kafka broker: the same
batches as confluent-kafka's `Consumer` gives, record for record, on data with every shape a topic can hold."""
from __future__ import annotations

import time
import uuid
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import KafkaException, Producer

from handoff_spark.kafka import native as kafka_native
from handoff_spark.kafka import readers as kafka_readers
from handoff_spark.kafka.source import (ARROW_SCHEMA, OffsetOutOfRange, OffsetRange, SourceOptions, read_range,
                                        reader_conf)

pytestmark = [pytest.mark.kafka]


def new_topic(kafka: Any, partitions: int = 1) -> str:
    name = f"native-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(name, partitions=partitions)
    return name


def read(opts: SourceOptions, rng: OffsetRange, reader: str, monkeypatch: pytest.MonkeyPatch) -> pa.Table:
    monkeypatch.setenv(kafka_native.READER_ENV, reader)
    return pa.Table.from_batches(list(read_range(opts, rng)), schema=ARROW_SCHEMA)


def test_the_native_reader_is_the_default_and_drives_confluent_kafkas_own_librdkafka(kafka, monkeypatch):
    """Built with the package and used unless told otherwise; bound to the librdkafka confluent-kafka loaded, so
    the process holds one copy of it (no second client library with other defaults and bugs)."""
    monkeypatch.delenv(kafka_native.READER_ENV, raising=False)
    topic = new_topic(kafka)
    opts = SourceOptions.parse({"subscribe": topic, "kafka.bootstrap.servers": kafka.bootstrap})
    assert kafka_native.load_error() is None and kafka_native.mismatch() is None
    assert kafka_native.consumer_factory(reader_conf(opts)) is kafka_native.NativeConsumer
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    p.produce(topic, b"one")
    assert p.flush(30) == 0
    assert read(opts, OffsetRange(topic, 0, 0, 1), "native", monkeypatch).column("value").to_pylist() == [b"one"]
    with open("/proc/self/maps") as maps:
        libraries = {line.split()[-1] for line in maps if "librdkafka" in line}
    assert len(libraries) == 1, libraries


def test_both_readers_give_the_same_batches_for_keys_nulls_headers_timestamps_and_transactions(kafka, monkeypatch):
    """Null and empty keys and values, headers on some records (one with a null value), explicit timestamps, an
    aborted transaction and commit markers inside the range, and a range ending before the partition does."""
    topic = new_topic(kafka)
    # Recent explicit timestamps: records stamped days in the past would sit in their own segment (rolled when the
    # next, current-time record arrives) that the test bed's 5-second retention check deletes mid-test.
    base_ms = int(time.time() * 1000) - 60_000
    p = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"tx-{topic}"})
    p.init_transactions()
    p.begin_transaction()
    for i in range(300):
        key = None if i % 7 == 0 else (b"" if i % 11 == 0 else b"k%d" % i)
        value = None if i % 13 == 0 else (b"" if i % 17 == 0 else b'{"n": %d}' % i)
        headers = [("h", b"v%d" % i), ("empty", None)] if i % 5 == 0 else None
        p.produce(topic, value, key=key, headers=headers, timestamp=base_ms + i)
    p.commit_transaction()
    p.begin_transaction()
    for i in range(50):
        p.produce(topic, b"aborted-%d" % i)
    p.flush()
    p.abort_transaction()
    p.begin_transaction()
    for i in range(40):
        p.produce(topic, b"after-%d" % i)
    p.commit_transaction()
    opts = SourceOptions.parse({"subscribe": topic, "kafka.bootstrap.servers": kafka.bootstrap,
                                "consumeBatch": "64"})
    # 300 records + marker, 50 aborted + marker, 40 records + marker: offsets 0..392
    for rng in (OffsetRange(topic, 0, 0, 393), OffsetRange(topic, 0, 150, 360), OffsetRange(topic, 0, 3, 4)):
        native = read(opts, rng, "native", monkeypatch)
        python = read(opts, rng, "python", monkeypatch)
        assert native.equals(python), rng
    rows = read(opts, OffsetRange(topic, 0, 0, 393), "native", monkeypatch).to_pylist()
    assert len(rows) == 340 and not any((r["value"] or b"").startswith(b"aborted") for r in rows)
    first = {r["offset"]: r for r in rows[:300]}
    assert first[0]["key"] is None and first[11]["key"] == b"" and first[12]["key"] == b"k12"
    assert first[13]["value"] is None and first[17]["value"] == b"" and first[1]["value"] == b'{"n": 1}'
    assert first[5]["headers"] == [{"key": "h", "value": b"v5"}, {"key": "empty", "value": None}]
    assert first[6]["headers"] is None
    assert first[299]["timestamp"].timestamp() == pytest.approx((base_ms + 299) / 1000)


def test_a_fetch_larger_than_a_batch_may_hold_is_handed_out_in_several_batches(kafka):
    """Arrow's binary offsets are 32-bit: a fetch with more key and value bytes than a batch may hold (256 MiB; 1 KiB
    here) is handed out over several calls, the rest pending in the reader, none lost or repeated."""
    topic = new_topic(kafka)
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(100):
        p.produce(topic, b"%04d" % i + b"x" * 96, key=b"k")
    assert p.flush(30) == 0
    native = kafka_native.module()
    conf = kafka_native.native_conf(reader_conf(SourceOptions.parse(
        {"subscribe": topic, "kafka.bootstrap.servers": kafka.bootstrap})))
    reader = native.Reader(conf, 100, 1024)
    try:
        reader.assign(topic, 0, 0)
        seen, polls, sizes = [], [], []
        while len(seen) < 100:
            polled, rows, last, errors, cols = reader.read(100, 1000, 1 << 62)
            polls.append(polled)
            if rows:
                batch = kafka_native._batch(topic, 0, rows, cols, ARROW_SCHEMA)
                seen += batch.column("offset").to_pylist()
                sizes.append(sum(len(v) + 1 for v in batch.column("value").to_pylist()))
        assert seen == list(range(100))
        assert max(sizes) <= 1024 and len(sizes) >= 10
        assert -1 in polls  # calls that handed out what an earlier fetch left pending, without fetching
    finally:
        reader.close()


def test_reader_errors_name_what_is_wrong(kafka, monkeypatch):
    """A bad client setting is one line naming the key; an unknown reader choice names the variable; a range the
    log no longer holds is OffsetOutOfRange with either reader; a callback in the settings (which only
    confluent-kafka's wrapper can call) reads with confluent-kafka's consumer."""
    topic = new_topic(kafka)
    bad = SourceOptions.parse({"subscribe": topic, "kafka.bootstrap.servers": kafka.bootstrap,
                               "kafka.fetch.wait.max.ms": "soon"})
    monkeypatch.setenv(kafka_native.READER_ENV, "native")
    with pytest.raises(KafkaException, match="fetch.wait.max.ms"):
        list(read_range(bad, OffsetRange(topic, 0, 0, 1)))
    monkeypatch.setenv(kafka_native.READER_ENV, "fast")
    with pytest.raises(ValueError, match=f"{kafka_native.READER_ENV}='fast'"):
        kafka_native.use_native({})
    monkeypatch.setenv(kafka_native.READER_ENV, "native")
    assert kafka_native.consumer_factory({"bootstrap.servers": "x", "error_cb": print}) is None
    opts = SourceOptions.parse({"subscribe": topic, "kafka.bootstrap.servers": kafka.bootstrap})
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    p.produce(topic, b"a")
    assert p.flush(30) == 0
    kafka_readers.close_idle()
    for reader in ("native", "python"):
        monkeypatch.setenv(kafka_native.READER_ENV, reader)
        with pytest.raises(OffsetOutOfRange):
            list(read_range(opts, OffsetRange(topic, 0, 40, 50)))
        assert kafka_readers.idle_count() == 0  # a failed read closes its consumer


def test_client_errors_are_confluent_kafkas_exceptions_with_the_same_code():
    """What the reader's own calls fail with (here: metadata from a broker that is not there) is confluent-kafka's
    `KafkaException` with the code its consumer raises, so callers (`kafka_readers`) handle both readers alike."""
    import socket

    from confluent_kafka import Consumer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    conf = {"bootstrap.servers": f"127.0.0.1:{closed}", "group.id": "g", "enable.auto.commit": False}
    codes = []
    for consumer in (kafka_native.NativeConsumer(conf), Consumer(conf)):
        try:
            with pytest.raises(KafkaException) as raised:
                consumer.list_topics("t", timeout=0.3)
            codes.append(raised.value.args[0].code())
        finally:
            consumer.close()
    assert codes[0] == codes[1], codes


def test_a_broker_that_cannot_be_reached_does_not_fail_a_read_that_another_broker_serves(kafka, monkeypatch):
    """Client-level errors (here: one bootstrap address refuses connections) are librdkafka's to retry, never error
    records that would fail the task: both readers read the whole range from the broker that is there."""
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    topic = new_topic(kafka)
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(2_000):
        p.produce(topic, b"%d" % i)
    assert p.flush(30) == 0
    opts = SourceOptions.parse({"subscribe": topic, "kafka.bootstrap.servers": f"127.0.0.1:{closed},{kafka.bootstrap}",
                                "consumeBatch": "100", "kafka.reconnect.backoff.ms": "1",
                                "kafka.reconnect.backoff.max.ms": "10"})
    for reader in ("native", "python"):
        kafka_readers.close_idle()
        values = read(opts, OffsetRange(topic, 0, 0, 2_000), reader, monkeypatch).column("value").to_pylist()
        assert values == [b"%d" % i for i in range(2_000)], reader
