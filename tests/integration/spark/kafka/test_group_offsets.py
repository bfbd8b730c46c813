"""The consumer-group commit after a durable table commit (`kafka.offsets.commit_group_offsets`), against real Kafka:
what lag tools read back is what was committed, batch after batch, through one consumer the process keeps (a new
consumer per commit spent most of each commit connecting; docs/benchmarks.md, "A new Kafka client's first
answer"), and a commit that cannot succeed gives that consumer up instead of keeping it."""
from __future__ import annotations

import pytest

from handoff_spark.kafka import readers as kafka_readers
from handoff_spark.kafka.offsets import commit_group_offsets, committed_group_offsets, group_client_conf

pytestmark = [pytest.mark.kafka]


def test_each_batchs_commit_is_read_back_through_one_kept_consumer(kafka) -> None:
    topic, group = "group-offsets-kept", "handoff-test.group-kept"
    kafka.create_topic(topic, partitions=2)
    kafka_readers.close_idle()
    conf = group_client_conf(kafka.bootstrap, group, None, {"socket.timeout.ms": 10_000})
    for batch, (p0, p1) in enumerate(((5, 0), (9, 4), (12, 7))):
        assert commit_group_offsets(kafka.bootstrap, group, {topic: {0: p0, 1: p1}})
        read = committed_group_offsets(kafka.bootstrap, group, [(topic, 0), (topic, 1)])
        assert read == {topic: {0: p0, 1: p1}}, batch
        assert kafka_readers.idle_count(conf) == 1  # the same consumer, kept for the next commit
    kafka_readers.close_idle()


def test_a_commit_that_fails_every_attempt_returns_false_and_keeps_no_consumer(kafka) -> None:
    group = "handoff-test.group-refused"
    kafka_readers.close_idle()
    # A topic that does not exist: the broker refuses each partition's commit (UNKNOWN_TOPIC_OR_PART).
    assert not commit_group_offsets(kafka.bootstrap, group, {"group-offsets-no-such-topic": {0: 1}},
                                    timeout_s=5.0, attempts=2)
    assert kafka_readers.idle_count() == 0
