"""retention_kafka against the real broker: the configs, offsets, lag age, write rate and record size the
retention rule is fed, the rule's answer for a byte-limited topic, and raising retention.ms."""
from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from handoff_operator.retention.rule import Requirement, verdict
from handoff_operator.retention.kafka import describe_topics, raise_retention_ms, topic_facts
from operator_support import eventually
from sink_support import app_config

pytestmark = pytest.mark.kafka


def test_topic_facts_read_configs_offsets_lag_age_rate_and_record_size(kafka, tmp_path) -> None:
    topic = f"facts-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, partitions=2, config={"retention.ms": "7200000", "retention.bytes": "50000",
                                                    "cleanup.policy": "compact,delete"})
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    old_ms = int(time.time() * 1000) - 600_000  # the first records say they were written 10 minutes ago
    for i in range(100):
        producer.produce(topic, b"v" * 90, key=b"k" * 10, partition=0, timestamp=old_ms + i * 1000 if i < 10 else 0)
    producer.produce(topic, b"x" * 90, key=b"y" * 10, partition=1)  # compacted topics need keys
    assert producer.flush(30) == 0
    config = app_config(tmp_path, kafka.bootstrap, topic)
    now_ms = int(time.time() * 1000)
    facts = topic_facts(config, {topic: {"0": 5}}, now_ms)[topic]

    assert (facts.retention_ms, facts.retention_bytes, facts.cleanup_policy) == (7_200_000, 50_000,
                                                                                 ("compact", "delete"))
    p0, p1 = facts.partitions[0], facts.partitions[1]
    assert (p0.earliest, p0.latest, p0.next_offset) == (0, 100, 5)
    assert p0.oldest_unconsumed_ms == old_ms + 5000  # the record at the ledger's next offset
    assert (p1.earliest, p1.latest, p1.next_offset, p1.oldest_unconsumed_ms) == (0, 1, None, None)
    assert p0.average_record_bytes == 100.0 and p1.average_record_bytes == 100.0
    # 100 records since the rate window's first record, 10 minutes ago; the one on p1 came just now (≥ 1 s).
    assert p0.records_per_second == pytest.approx(100 / ((now_ms - old_ms) / 1000), rel=1e-6)
    assert p1.records_per_second is not None and 0 < p1.records_per_second <= 1.0

    # retention.bytes is per partition: the busiest one (100-byte records) decides how long 50 kB last.
    busiest = max(p0.records_per_second, p1.records_per_second) * 100
    v = verdict(facts, Requirement(3600.0, 1800.0), now_ms)
    assert not v.sufficient and v.limited_by == "retention.bytes" and v.compacted
    assert v.have_seconds == pytest.approx(50_000 / busiest)
    assert v.lag_age_seconds == pytest.approx((now_ms - old_ms - 5000) / 1000)
    assert v.target_retention_ms is None  # retention.ms (2h) is enough: enforce has nothing to raise
    assert v.need_bytes == pytest.approx(v.need_seconds * busiest, rel=1e-3)

def test_raise_retention_ms_changes_only_that_config(kafka, tmp_path) -> None:
    topic = f"raise-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, partitions=1, config={"retention.ms": "60000", "max.message.bytes": "123456"})
    config = app_config(tmp_path, kafka.bootstrap, topic)
    assert describe_topics(config, [topic], max_age=600)[topic]["retention.ms"] == "60000"
    raise_retention_ms(config, topic, 3_600_000)
    # The raise drops the cached answer: even a long max_age reads the new value (once the broker has applied
    # the controller's change, which is asynchronous in KRaft).
    eventually(lambda: describe_topics(config, [topic], max_age=600)[topic]["retention.ms"] == "3600000",
               "the raised retention.ms", timeout=30)
    admin = kafka.admin()  # held: a dropped AdminClient cancels its requests
    (future,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
    assert future.result(30)["max.message.bytes"].value == "123456"  # incremental: nothing else changed


def _set_retention_ms(admin, topic: str, value: str) -> None:
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", value, incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def test_an_answer_without_our_raise_is_not_kept_for_the_interval(kafka, tmp_path) -> None:
    """CI once read the old retention.ms right after the raise (the KRaft broker had not applied it yet) and kept
    that answer for the whole interval. Here a broker answer that disagrees with the raise is made certain: another
    writer sets 90000 after our raise. That answer is shown, not kept, so the next value is read anew."""
    topic = f"stale-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, partitions=1, config={"retention.ms": "60000"})
    config = app_config(tmp_path, kafka.bootstrap, topic)
    admin = kafka.admin()
    raise_retention_ms(config, topic, 3_600_000)
    _set_retention_ms(admin, topic, "90000")
    eventually(lambda: describe_topics(config, [topic], max_age=600)[topic]["retention.ms"] == "90000",
               "the other writer's retention.ms", timeout=30)
    _set_retention_ms(admin, topic, "3600000")  # what we raised it to: this answer is kept from now on
    eventually(lambda: describe_topics(config, [topic], max_age=600)[topic]["retention.ms"] == "3600000",
               "the raised retention.ms, not a kept answer from before it", timeout=30)
    _set_retention_ms(admin, topic, "70000")

    def broker_has_it() -> bool:
        (f,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
        return f.result(30)["retention.ms"].value == "70000"
    eventually(broker_has_it, "the broker applied the change", timeout=30)
    assert describe_topics(config, [topic], max_age=600)[topic]["retention.ms"] == "3600000"  # kept: it agreed


def test_topic_configs_are_described_once_per_interval(kafka, tmp_path) -> None:
    topic = f"cache-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, partitions=1, config={"retention.ms": "60000"})
    config = app_config(tmp_path, kafka.bootstrap, topic)
    assert describe_topics(config, [topic], max_age=600)[topic]["retention.ms"] == "60000"
    admin = kafka.admin()  # someone else changes the topic
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", "120000", incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)

    def broker_has_it() -> bool:
        (f,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
        return f.result(30)["retention.ms"].value == "120000"
    eventually(broker_has_it, "the broker applied the change", timeout=30)
    assert describe_topics(config, [topic], max_age=600)[topic]["retention.ms"] == "60000"  # within the interval
    assert describe_topics(config, [topic], max_age=0)[topic]["retention.ms"] == "120000"


def _kafka_requests() -> dict[str, float]:
    from handoff_operator.runtime import metrics

    return {s.labels["api"]: s.value for m in metrics.KAFKA_REQUESTS.collect() for s in m.samples
            if s.name.endswith("_total")}


def test_handoffs_on_one_topic_share_the_checks_reads_and_reuse_the_refreshs_offsets(kafka, tmp_path) -> None:
    """A thousand handoffs on one topic must not each open a consumer and ask for the same offsets (issue 16):
    the second check within the interval samples no record and lists no offsets, and gives the same facts; a
    check fed the refresh's own offsets does not list them again; the next interval reads anew."""
    topic = f"shared-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, partitions=2, config={"retention.ms": "7200000"})
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(40):
        producer.produce(topic, b"v" * 40, key=b"k", partition=i % 2)
    assert producer.flush(30) == 0
    config = app_config(tmp_path, kafka.bootstrap, topic)
    committed = {topic: {"0": 3, "1": 7}}
    end, earliest = {topic: {"0": 20, "1": 20}}, {topic: {"0": 0, "1": 0}}

    now_ms = int(time.time() * 1000)  # the same moment: the rate is over the time since the window's first record
    first = topic_facts(config, committed, now_ms, config_max_age=600)[topic]
    before = _kafka_requests()
    again = topic_facts(config, committed, now_ms, config_max_age=600, end=end,
                        earliest_offsets=earliest)[topic]
    after = _kafka_requests()
    assert again == first
    assert after == before, f"a shared check asked Kafka again: {before} → {after}"
    assert first.partitions[0].next_offset == 3 and first.partitions[1].latest == 20

    # Another handoff, further along on partition 1: only that position is sampled.
    further = topic_facts(config, {topic: {"0": 3, "1": 15}}, int(time.time() * 1000), config_max_age=600,
                          end=end, earliest_offsets=earliest)[topic]
    assert _kafka_requests().get("sample_records", 0) == after.get("sample_records", 0) + 1
    assert further.partitions[1].oldest_unconsumed_ms is not None
    assert _kafka_requests().get("list_offsets", 0) == after.get("list_offsets", 0)

    # Past the interval (max age 0) the samples are read again.
    topic_facts(config, committed, int(time.time() * 1000), config_max_age=0, end=end, earliest_offsets=earliest)
    assert _kafka_requests().get("sample_records", 0) == after.get("sample_records", 0) + 2
