"""Smoke tests of the test-bed Kafka broker over the Kafka protocol (confluent-kafka).

They pin down the broker behaviours Handoff's exactly-once contract relies on, so a broker that
silently got them wrong (as Kafka look-alikes do) fails here rather than deep inside a Spark drill.
"""
from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    OffsetSpec,
)

from handoff_testbed.eventually import eventually

pytestmark = pytest.mark.kafka


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _produce(bootstrap: str, topic: str, values: list[bytes], partition: int | None = None,
             timestamps: list[int] | None = None) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i, value in enumerate(values):
        kwargs = {}
        if partition is not None:
            kwargs["partition"] = partition
        if timestamps is not None:
            kwargs["timestamp"] = timestamps[i]
        producer.produce(topic, value=value, key=str(i).encode(), **kwargs)
    assert producer.flush(30) == 0


def _consume_all(bootstrap: str, topic: str, expected: int, isolation: str = "read_uncommitted",
                 timeout: float = 30.0) -> list[bytes]:
    """Read from the beginning until `expected` records arrived (or a quiet second after the timeout)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "isolation.level": isolation})
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                if len(values) >= expected:
                    break  # one more empty poll after reaching the count: nothing extra is pending
                continue
            if msg.error():
                raise KafkaException(msg.error())
            values.append(msg.value())
    finally:
        consumer.close()
    return values


def test_produce_then_consume_roundtrip(kafka):
    topic = _topic("roundtrip")
    kafka.create_topic(topic, partitions=3)
    sent = [f"v{i}".encode() for i in range(50)]
    _produce(kafka.bootstrap, topic, sent)
    got = _consume_all(kafka.bootstrap, topic, expected=len(sent))
    assert sorted(got) == sorted(sent)


def test_retention_config_roundtrip(kafka):
    topic = _topic("retention")
    kafka.create_topic(topic, partitions=1, config={"retention.ms": "3600000"})
    admin = kafka.admin()
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)

    described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)])
    configs = next(iter(described.values())).result(timeout=30)
    assert configs["retention.ms"].value == "7200000"
    assert not configs["retention.ms"].is_default
    # a real broker also reports the keys nobody set (look-alikes return only explicit ones)
    assert configs["cleanup.policy"].value == "delete"


def test_retention_deletes_closed_segments(kafka):
    """retention.ms is enforced (look-alikes only store it): old records leave, the earliest offset
    moves forward. The first records carry hour-old timestamps, so the next produce rolls the segment
    (segment.ms counts from the segment's first timestamp) and the closed segment is past retention."""
    topic = _topic("expire")
    kafka.create_topic(topic, partitions=1, config={"retention.ms": "60000", "segment.ms": "100"})
    old = int(time.time() * 1000) - 3_600_000
    _produce(kafka.bootstrap, topic, [b"old-0", b"old-1"], partition=0, timestamps=[old, old])
    _produce(kafka.bootstrap, topic, [b"new-2"], partition=0)
    tp = TopicPartition(topic, 0)
    admin = kafka.admin()
    earliest = eventually(lambda: admin.list_offsets({tp: OffsetSpec.earliest()})[tp].result(timeout=30).offset,
                          "the broker deletes the closed segment", timeout=60, interval=0.5)
    assert earliest == 2  # the closed segment (offsets 0-1) is gone, the fresh record stays


def test_list_offsets_latest_is_high_watermark(kafka):
    topic = _topic("offsets")
    kafka.create_topic(topic, partitions=1)
    # several produce batches: a broker that returns "newest batch base offset + 1" is caught here
    for chunk in range(4):
        _produce(kafka.bootstrap, topic, [f"{chunk}-{i}".encode() for i in range(10)], partition=0)
    tp = TopicPartition(topic, 0)
    admin = kafka.admin()
    latest = admin.list_offsets({tp: OffsetSpec.latest()})[tp].result(timeout=30)
    earliest = admin.list_offsets({tp: OffsetSpec.earliest()})[tp].result(timeout=30)
    assert (earliest.offset, latest.offset) == (0, 40)


def test_offsets_for_times(kafka):
    topic = _topic("times")
    kafka.create_topic(topic, partitions=1)
    base = int(time.time() * 1000) - 60_000
    timestamps = [base + 1000 * i for i in range(10)]
    _produce(kafka.bootstrap, topic, [f"t{i}".encode() for i in range(10)], partition=0,
             timestamps=timestamps)
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "times-probe"})
    try:
        found = consumer.offsets_for_times([TopicPartition(topic, 0, base + 4500)], timeout=30)
        assert found[0].offset == 5  # first record with timestamp >= the query
        after = consumer.offsets_for_times([TopicPartition(topic, 0, base + 999_999)], timeout=30)
        assert after[0].offset == -1  # nothing that new
    finally:
        consumer.close()


def test_aborted_transaction_invisible_to_read_committed(kafka):
    topic = _topic("txn")
    kafka.create_topic(topic, partitions=1)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"tx-{topic}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, value=f"committed-{i}".encode(), partition=0)
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, value=f"aborted-{i}".encode(), partition=0)
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"committed-last", partition=0)
    producer.commit_transaction(30)

    committed = _consume_all(kafka.bootstrap, topic, expected=6, isolation="read_committed")
    assert committed == [f"committed-{i}".encode() for i in range(5)] + [b"committed-last"]
    everything = _consume_all(kafka.bootstrap, topic, expected=11, isolation="read_uncommitted")
    assert sum(v.startswith(b"aborted-") for v in everything) == 5


def test_restart_keeps_data_and_serves_again(kafka):
    """Runs last in this module: the broker-restart drills depend on same ports + same data dir."""
    topic = _topic("restart")
    kafka.create_topic(topic, partitions=2)
    before = [f"b{i}".encode() for i in range(20)]
    _produce(kafka.bootstrap, topic, before)
    bootstrap = kafka.bootstrap
    kafka.restart()
    assert kafka.bootstrap == bootstrap == kafka.env["KAFKA_BOOTSTRAP"]
    after = [f"a{i}".encode() for i in range(20)]
    _produce(kafka.bootstrap, topic, after)
    assert sorted(_consume_all(kafka.bootstrap, topic, expected=40)) == sorted(before + after)
