"""Reading the truth sources a status is made of: the table's ledger and Kafka's offsets (I/O).

The operator never trusts what the driver says about itself for committed progress: the ledger in the
table is what a reader of the table sees, and Kafka's end offsets are what is waiting. Errors are
returned as text (they become a Degraded=StatusUnavailable message), never raised: one unreachable
catalog must not stop the status of every other handoff.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any

from dataclasses import dataclass

from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from handoff_spark.config import AppConfig, BigQuerySink, IcebergSink
from handoff_spark.kafka_offsets import committed_group_offsets

from .conditions import ProgressFacts
from .progress import progress_facts

_admins: dict[tuple[str, tuple[tuple[str, str], ...]], AdminClient] = {}
_admins_lock = threading.Lock()
_KAFKA_LOG = logging.getLogger("handoff.operator.kafka")

# librdkafka properties that only make sense for consumers/producers; the AdminClient would warn.
_CLIENT_ONLY_PREFIXES = ("fetch.", "max.poll", "session.timeout", "auto.", "enable.", "queued.",
                         "isolation.", "group.", "acks", "linger", "batch.", "compression.")


def _admin(config: AppConfig) -> AdminClient:
    props = {k: v for k, v in config.source.properties.items() if not k.startswith(_CLIENT_ONLY_PREFIXES)}
    key = (config.source.bootstrap_servers, tuple(sorted(props.items())))
    with _admins_lock:
        admin = _admins.get(key)
        if admin is None:
            # librdkafka's own log lines go to Python logging (debug), not to stderr: an unreachable
            # broker is reported once per refresh in the status, not 20 times a second in the log.
            admin = AdminClient({**props, "bootstrap.servers": config.source.bootstrap_servers,
                                 "client.id": "handoff-operator", "logger": _KAFKA_LOG})
            _admins[key] = admin
        return admin


def kafka_offsets(config: AppConfig, timeout: float = 5.0
                  ) -> tuple[dict[str, dict[int, int]], dict[str, dict[int, int]]]:
    """(end offsets, earliest offsets) per topic partition, read_committed like the source reads."""
    admin = _admin(config)
    metadata = admin.list_topics(timeout=timeout)
    partitions = []
    for topic in config.source.topics:
        meta = metadata.topics.get(topic)
        if meta is None or meta.error is not None:
            raise RuntimeError(f"topic {topic!r} not found in Kafka")
        partitions += [TopicPartition(topic, p) for p in meta.partitions]
    result: list[dict[str, dict[int, int]]] = []
    for spec in (OffsetSpec.latest(), OffsetSpec.earliest()):
        futures = admin.list_offsets({tp: spec for tp in partitions},
                                     isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=timeout)
        offsets: dict[str, dict[int, int]] = {}
        for tp, future in futures.items():
            offsets.setdefault(tp.topic, {})[tp.partition] = future.result(timeout=timeout).offset
        result.append(offsets)
    return result[0], result[1]


def latest_commit(config: AppConfig) -> Any:
    """The newest ledger commit of this handoff in the table (None: none yet, or not an Iceberg sink).

    For BigQuery see `bigquery_commit`."""
    from handoff_spark.iceberg import ledger  # pyiceberg import deferred: only needed for Iceberg sinks
    from handoff_spark.iceberg.table import forget_catalog

    sink = config.sink
    if not isinstance(sink, IcebergSink):
        return None
    try:
        table = ledger.load_table(sink.catalog_name, dict(sink.catalog_properties), sink.table)
    except Exception as exc:
        if type(exc).__name__ == "NoSuchTableError":
            return None  # created by the driver's first batch
        forget_catalog(sink.catalog_name, dict(sink.catalog_properties))  # reconnect next time
        raise
    return ledger.latest_commit(table, config.handoff_id)


def bigquery_commit(config: AppConfig, key_json: str | None = None) -> Any:
    """The newest row of this handoff in the table's `__handoff_ledger` (None: no ledger table or row yet).

    `key_json`: the service-account key from the sink's `credentialsFrom` Secret (the operator's pod does
    not mount it). Without one, a sink whose `credentialsFile` this pod lacks gives None too (the group's
    offsets are read then). The SELECT runs only when the ledger table changed (see bigquery_truth)."""
    from .bigquery_truth import ledger_commit  # google-cloud imports deferred: only for BigQuery sinks

    return ledger_commit(config, key_json)


@dataclass(frozen=True)
class GroupCommit:
    """Committed progress when the table has no ledger row yet (a BigQuery sink before its first batch
    recorded one): the consumer group's offsets, which the data plane commits only after the table commit
    is durable."""

    end_offsets: dict[str, dict[int, int]]
    snapshot_id: None = None
    batch_id: None = None
    timestamp_ms: None = None
    max_event_time_ms: None = None


def group_commit(config: AppConfig, end: dict[str, dict[int, int]]) -> GroupCommit | None:
    partitions = [(t, p) for t, parts in end.items() for p in parts]
    committed = committed_group_offsets(config.source.bootstrap_servers, config.consumer_group, partitions,
                                        dict(config.source.properties))
    return GroupCommit(committed) if committed else None


def read_progress(config: AppConfig, bigquery_key: str | None = None) -> ProgressFacts:
    """`bigquery_key`: the service-account JSON of a BigQuery sink's credentialsFrom, if it has one."""
    errors: list[str] = []
    commit = end = earliest = None
    try:
        end, earliest = kafka_offsets(config)
    except Exception as exc:  # noqa: BLE001 - reported in the status, never raised
        errors.append(f"cannot read Kafka offsets: {type(exc).__name__}: {exc}")
    ledger_read = False
    try:
        commit = (latest_commit(config) if isinstance(config.sink, IcebergSink)
                  else bigquery_commit(config, bigquery_key))
        ledger_read = True
    except Exception as exc:  # noqa: BLE001
        errors.append(f"cannot read the table ledger: {type(exc).__name__}: {exc}")
    try:
        # BigQuery without a ledger row (new table, or the operator cannot authenticate as the sink):
        # the consumer group's offsets. Not after a ledger error: that is reported, not papered over.
        if ledger_read and commit is None and isinstance(config.sink, BigQuerySink) and end is not None:
            commit = group_commit(config, end)
    except Exception as exc:  # noqa: BLE001
        errors.append(f"cannot read the consumer group's offsets: {type(exc).__name__}: {exc}")
    return progress_facts(commit, end, earliest, int(time.time() * 1000), errors)
