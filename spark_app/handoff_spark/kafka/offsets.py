"""Commit a handoff's consumer-group offsets to Kafka after a durable table commit.

Why: the table (ledger) is the source of truth for where a query resumes; the group offsets exist so that
ordinary lag tools (kcat, Burrow, kafka-consumer-groups) see the true lag of a handoff. They are therefore
committed only *after* the table commit succeeded (never before, or lag tools would show data as delivered
that a crash could still lose), with explicit partitions and offsets, by a consumer that never joins the
group (no rebalance, works while nothing else consumes). A failure here is logged, not raised: the data is
already committed and the next batch commits newer offsets.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from handoff_spark.kafka import readers as kafka_readers
from handoff_spark.kafka.client_defaults import with_defaults

log = logging.getLogger(__name__)


def group_client_conf(bootstrap_servers: str, group: str, properties: dict[str, str] | None = None,
                      extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The settings of a consumer that commits or reads `group`'s offsets and never joins it: the user's properties
    over Handoff's client defaults (`client_defaults`), then the group and no auto-commit."""
    return with_defaults({**(properties or {}), "bootstrap.servers": bootstrap_servers, "group.id": group,
                          "enable.auto.commit": False, **(extra or {})})


def commit_group_offsets(bootstrap_servers: str, group: str, offsets: dict[str, dict[int, int]],
                         properties: dict[str, str] | None = None, timeout_s: float = 10.0,
                         attempts: int = 3) -> bool:
    """Commit `{topic: {partition: next offset}}` for `group`. Returns False (and logs) on failure."""
    tps = [TopicPartition(topic, int(p), int(off)) for topic, parts in offsets.items() for p, off in parts.items()]
    if not tps:
        return True
    conf = group_client_conf(bootstrap_servers, group, properties, {"socket.timeout.ms": int(timeout_s * 1000)})
    try:
        # One consumer kept per process and settings (`readers.consumer`): the commit runner commits every batch,
        # and a new consumer's connection and coordinator lookup were most of each commit (1.5-2 ms kept against
        # 22-30 ms new, measured: docs/benchmarks.md, "A new Kafka client's first answer").
        with kafka_readers.consumer(conf, ()) as consumer:
            for attempt in range(1, attempts + 1):
                try:
                    result = consumer.commit(offsets=tps, asynchronous=False)
                    failed = [tp for tp in (result or []) if tp.error is not None]
                    if not failed:
                        return True
                    log.warning("consumer-group %s: offset commit failed for %s (attempt %s)", group, failed,
                                attempt)
                except KafkaException as exc:
                    # e.g. COORDINATOR_LOAD_IN_PROGRESS / NOT_COORDINATOR right after a broker (re)start
                    log.warning("consumer-group %s: offset commit failed (attempt %s): %s", group, attempt, exc)
                time.sleep(0.5 * attempt)
            raise _GaveUp  # closes the consumer instead of keeping it: the next commit starts a new one
    except _GaveUp:
        return False


class _GaveUp(Exception):
    """Every attempt of a group commit failed."""


def committed_group_offsets(bootstrap_servers: str, group: str, partitions: list[tuple[str, int]],
                            properties: dict[str, str] | None = None, timeout_s: float = 10.0) -> dict[str, dict[int, int]]:
    """What lag tools see: the group's committed offsets (partitions without a commit are left out)."""
    consumer = Consumer(group_client_conf(bootstrap_servers, group, properties))
    try:
        out: dict[str, dict[int, int]] = {}
        for tp in consumer.committed([TopicPartition(t, p) for t, p in partitions], timeout=timeout_s):
            if tp.offset >= 0:
                out.setdefault(tp.topic, {})[tp.partition] = tp.offset
        return out
    finally:
        consumer.close()
