"""Which Kafka cluster and which topics a handoff reads, by id rather than by name (driver side, I/O).

A topic deleted and created again under the same name starts its offsets at 0 again; a handoff pointed at
another cluster sees other offsets under the same names. The ledger records the cluster id and topic ids with
every entry, and the driver compares them at start (`resume.prepare_start`).
"""
from __future__ import annotations

from typing import Any

from confluent_kafka import TopicCollection
from confluent_kafka.admin import AdminClient

from handoff_spark.kafka.client_defaults import with_defaults

TopicPartition = tuple[str, int]

# librdkafka properties that only make sense for consumers/producers; the AdminClient would warn about them.
_CLIENT_ONLY = ("isolation.", "auto.offset", "group.", "enable.auto", "fetch.", "max.partition", "max.poll",
                "session.timeout", "queued.", "acks", "linger", "batch.", "compression.")


def admin_client(cfg: Any) -> AdminClient:
    props = {k: v for k, v in cfg.source.properties.items() if not k.startswith(_CLIENT_ONLY)}
    return AdminClient(with_defaults({**props, "bootstrap.servers": cfg.source.bootstrap_servers}))


def kafka_identity(cfg: Any, admin: AdminClient | None = None, timeout: float = 30.0, *,
                   cluster_id: str | None = None) -> tuple[str | None, dict[str, str]]:
    """(cluster id, {topic: topic id}) of the handoff's topics; a topic that does not exist is left out (the
    source reports it by name). `cluster_id`: from a metadata request the caller made already (not asked again)."""
    admin = admin or admin_client(cfg)
    cluster = cluster_id if cluster_id is not None else admin.list_topics(timeout=timeout).cluster_id
    ids: dict[str, str] = {}
    futures = admin.describe_topics(TopicCollection(list(cfg.source.topics)), request_timeout=timeout)
    for topic, future in futures.items():
        try:
            description = future.result()
        except Exception:  # noqa: BLE001 - unknown topic: the source fails on it with its own message
            continue
        if description.topic_id is not None:
            ids[topic] = str(description.topic_id)
    return cluster, ids


def list_earliest(cfg: Any, partitions: list[TopicPartition], admin: AdminClient | None = None,
                  timeout: float = 30.0) -> dict[TopicPartition, int]:
    """Kafka's earliest offsets of `partitions` (read_committed, as the source reads)."""
    if not partitions:
        return {}
    from confluent_kafka import IsolationLevel
    from confluent_kafka import TopicPartition as KafkaTP
    from confluent_kafka.admin import OffsetSpec

    admin = admin or admin_client(cfg)
    futures = admin.list_offsets({KafkaTP(t, p): OffsetSpec.earliest() for t, p in partitions},
                                 isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=timeout)
    return {(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()}
