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
from typing import Any, Callable, NamedTuple

from dataclasses import dataclass

from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from handoff_spark.config import AppConfig, BigQuerySink, IcebergSink
from handoff_spark.ledger import (Commit, committed_group_offsets, forget_iceberg_catalog, iceberg_catalog,
                                  iceberg_latest_commit)

from handoff_operator.runtime import metrics
from handoff_operator.truth.bigquery import BoundedCache
from handoff_operator.conditions import ProgressFacts
from handoff_operator.truth.progress import progress_facts

_admins: dict[tuple[str, tuple[tuple[str, str], ...]], AdminClient] = {}
_admins_lock = threading.Lock()
_KAFKA_LOG = logging.getLogger("handoff.operator.kafka")

# librdkafka properties that only make sense for consumers/producers; the AdminClient would warn.
_CLIENT_ONLY_PREFIXES = ("fetch.", "max.poll", "session.timeout", "auto.", "enable.", "queued.",
                         "isolation.", "group.", "acks", "linger", "batch.", "compression.")


def admin_client(config: AppConfig) -> AdminClient:
    """One AdminClient per Kafka cluster (bootstrap servers + client properties), shared by every handoff
    reading it: librdkafka keeps a connection and a thread per broker per client."""
    key = _cluster_key(config)
    props = dict(key[1])
    with _admins_lock:
        admin = _admins.get(key)
        if admin is None:
            # librdkafka's own log lines go to Python logging (debug), not to stderr: an unreachable
            # broker is reported once per refresh in the status, not 20 times a second in the log.
            admin = AdminClient({**props, "bootstrap.servers": config.source.bootstrap_servers,
                                 "client.id": "handoff-operator", "logger": _KAFKA_LOG})
            _admins[key] = admin
        return admin


Offsets = dict[str, dict[int, int]]

#: How old a cluster's shared offsets may be when a status refresh uses them (seconds), at most: every handoff
#: reading a cluster refreshes from the same snapshot, so a cluster sees ~3 AdminClient calls per max age
#: whatever the number of handoffs, and a handoff's lag is at most this much older than its refresh. The status
#: interval lowers it (offsets_max_age).
OFFSETS_MAX_AGE = 5.0


def offsets_max_age(status_interval: float) -> float:
    """How old the shared offsets a status refresh reads may be: OFFSETS_MAX_AGE, or half the status interval
    when that is shorter, so that every refresh of a handoff sees a snapshot newer than its previous refresh's.
    A max age above the interval made every other refresh reuse the previous snapshot (3 s refreshes, 5 s max
    age): the same end offsets twice, an input rate of 0/s every other refresh (measured on the test bed: the
    scaling rule saw "input 0/s" under 6,000 records/s), and a lag up to 5 s old at a spike."""
    return min(OFFSETS_MAX_AGE, status_interval / 2)


class OffsetsRead(NamedTuple):
    """Kafka's offsets per topic partition, and when they were read (epoch ms; a shared snapshot can be older
    than the refresh that uses it, and a rate over time must use this time, not the refresh's)."""

    end: Offsets
    earliest: Offsets
    read_at_ms: int


#: A topic no refresh asked for in this long is no longer read for the cluster (its handoffs are gone).
TOPIC_IDLE_SECONDS = 600.0


def _fetch_offsets(admin: AdminClient, topics: list[str], timeout: float
                   ) -> tuple[Offsets, Offsets, dict[str, str]]:
    """(end offsets, earliest offsets, {topic: why it cannot be read}) for `topics`, read_committed like the
    source reads: one metadata request and two ListOffsets calls whatever the number of topics."""
    metadata = admin.list_topics(timeout=timeout)
    metrics.KAFKA_REQUESTS.labels(api="list_topics").inc()
    partitions, missing = [], {}
    for topic in topics:
        meta = metadata.topics.get(topic)
        if meta is None or meta.error is not None:
            missing[topic] = f"topic {topic!r} not found in Kafka"
            continue
        partitions += [TopicPartition(topic, p) for p in meta.partitions]
    result: list[Offsets] = []
    for spec in (OffsetSpec.latest(), OffsetSpec.earliest()):
        offsets: Offsets = {}
        if partitions:
            futures = admin.list_offsets({tp: spec for tp in partitions},
                                         isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=timeout)
            metrics.KAFKA_REQUESTS.labels(api="list_offsets").inc()
            for tp, future in futures.items():
                offsets.setdefault(tp.topic, {})[tp.partition] = future.result(timeout=timeout).offset
        result.append(offsets)
    return result[0], result[1], missing


class ClusterOffsets:
    """The offsets of every topic the handoffs of one Kafka cluster read, fetched in one batch and shared.

    Single flight: a refresh that finds the snapshot older than its max age fetches for all the cluster's topics
    while holding the lock; the refreshes waiting on the lock then find it fresh. A failed fetch is shared the
    same way (an unreachable cluster is asked once per max age, not once per handoff)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.asked: dict[str, float] = {}            # topic → when a refresh last asked for it (monotonic)
        self.read_at: float | None = None
        self.read_at_ms = 0                          # the same, wall clock (epoch ms): OffsetsRead.read_at_ms
        self.end: Offsets = {}
        self.earliest: Offsets = {}
        self.missing: dict[str, str] = {}
        self.error: Exception | None = None

    def read(self, admin: AdminClient, topics: list[str], timeout: float, max_age: float,
             clock: Callable[[], float] = time.monotonic) -> OffsetsRead:
        with self.lock:
            now = clock()
            new_topic = any(t not in self.asked for t in topics)
            for topic in topics:
                self.asked[topic] = now
            if new_topic or self.read_at is None or now - self.read_at >= max_age:
                self.asked = {t: at for t, at in self.asked.items() if now - at < TOPIC_IDLE_SECONDS}
                self.read_at_ms = int(time.time() * 1000)  # as of the request
                try:
                    self.end, self.earliest, self.missing = _fetch_offsets(admin, sorted(self.asked), timeout)
                    self.error = None
                except Exception as exc:  # noqa: BLE001 - shared with every refresh until the next fetch
                    self.error = exc
                self.read_at = clock()
            if self.error is not None:
                raise self.error
            for topic in topics:
                if topic in self.missing:
                    raise RuntimeError(self.missing[topic])
            return OffsetsRead({t: dict(self.end.get(t, {})) for t in topics},
                               {t: dict(self.earliest.get(t, {})) for t in topics}, self.read_at_ms)


_clusters: dict[tuple[str, tuple[tuple[str, str], ...]], ClusterOffsets] = {}


def _cluster_key(config: AppConfig) -> tuple[str, tuple[tuple[str, str], ...]]:
    props = {k: v for k, v in config.source.properties.items() if not k.startswith(_CLIENT_ONLY_PREFIXES)}
    return config.source.bootstrap_servers, tuple(sorted(props.items()))


def kafka_offsets(config: AppConfig, timeout: float = 5.0, max_age: float = 0.0) -> tuple[Offsets, Offsets]:
    """(end offsets, earliest offsets) per topic partition, read_committed like the source reads.

    `max_age` 0 (replay planning, retention enforcement): read now, for these topics only. Above 0 (status
    refreshes): the cluster's shared snapshot when it is younger than that (ClusterOffsets)."""
    read = kafka_offsets_read(config, timeout, max_age)
    return read.end, read.earliest


def kafka_offsets_read(config: AppConfig, timeout: float = 5.0, max_age: float = 0.0) -> OffsetsRead:
    """kafka_offsets, with when they were read."""
    admin = admin_client(config)
    topics = list(config.source.topics)
    if max_age <= 0:
        at_ms = int(time.time() * 1000)
        end, earliest, missing = _fetch_offsets(admin, topics, timeout)
        if missing:
            raise RuntimeError(next(iter(missing.values())))
        return OffsetsRead(end, earliest, at_ms)
    with _admins_lock:
        board = _clusters.setdefault(_cluster_key(config), ClusterOffsets())
    return board.read(admin, topics, timeout, max_age)


#: The newest ledger commit per (handoff, catalog, table), with the table's metadata location it was read at.
_LEDGER: BoundedCache[tuple[Any, ...], tuple[str, Any]] = BoundedCache(4096)


def _pointer(catalog: Any, identifier: str) -> tuple[bool, str | None]:
    """(known, metadata location) of a table in a SQL catalog: one indexed SELECT of the catalog row, no
    metadata file read. known=False: not a SQL catalog (no cheap pointer; the table is loaded every time)."""
    from pyiceberg.catalog import Catalog
    from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    if not isinstance(catalog, SqlCatalog):
        return False, None
    namespace = Catalog.namespace_to_string(Catalog.namespace_from(identifier))
    with Session(catalog.engine) as session:
        location = session.scalar(select(IcebergTables.metadata_location).where(
            IcebergTables.catalog_name == catalog.name, IcebergTables.table_namespace == namespace,
            IcebergTables.table_name == Catalog.table_name_from(identifier)))
    metrics.CATALOG_READS.labels(kind="iceberg_pointer").inc()
    return True, location


def latest_commit(config: AppConfig) -> Commit | None:
    """The newest ledger commit of this handoff in the table (None: none yet, or not an Iceberg sink).

    The table (metadata file, snapshot scan) is read only when its metadata pointer moved since the last read:
    a table nobody commits to costs one indexed SELECT per refresh. For BigQuery see `bigquery_commit`."""
    sink = config.sink
    if not isinstance(sink, IcebergSink):
        return None
    props = dict(sink.catalog_properties)
    key = (config.handoff_id, sink.catalog_name, tuple(sorted(props.items())), sink.table)
    try:
        catalog = iceberg_catalog(sink.catalog_name, props)  # pyiceberg imported here: Iceberg sinks only
        known, location = _pointer(catalog, sink.table)
        if known and location is None:
            _LEDGER.pop(key)
            return None  # created by the driver's first batch
        cached = _LEDGER.get(key)
        if known and cached is not None and cached[0] == location:
            return cached[1]
        metrics.CATALOG_READS.labels(kind="iceberg_load_table").inc()
        table = catalog.load_table(sink.table)
    except Exception as exc:
        if type(exc).__name__ == "NoSuchTableError":
            return None  # created by the driver's first batch
        forget_iceberg_catalog(sink.catalog_name, props)  # reconnect next time
        raise
    commit = iceberg_latest_commit(table, config.handoff_id)
    _LEDGER.put(key, (table.metadata_location, commit))
    return commit


def bigquery_commit(config: AppConfig, key_json: str | None = None) -> Commit | None:
    """The newest row of this handoff in the table's `__handoff_ledger` (None: no ledger table or row yet).

    `key_json`: the service-account key from the sink's `credentialsFrom` Secret (the operator's pod does
    not mount it). Without one, a sink whose `credentialsFile` this pod lacks gives None too (the group's
    offsets are read then). The SELECT runs only when the ledger table changed (see bigquery_truth)."""
    from handoff_operator.truth.bigquery import ledger_commit  # google-cloud imports deferred: only for BigQuery sinks

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
    metrics.KAFKA_REQUESTS.labels(api="committed_group_offsets").inc()
    committed = committed_group_offsets(config.source.bootstrap_servers, config.consumer_group, partitions,
                                        dict(config.source.properties))
    return GroupCommit(committed) if committed else None


def read_progress(config: AppConfig, bigquery_key: str | None = None,
                  offsets_max_age: float = OFFSETS_MAX_AGE) -> ProgressFacts:
    """`bigquery_key`: the service-account JSON of a BigQuery sink's credentialsFrom, if it has one;
    `offsets_max_age`: how old the cluster's shared Kafka offsets may be (kafka_offsets)."""
    errors: list[str] = []
    commit = end = earliest = read_at_ms = None
    try:
        end, earliest, read_at_ms = kafka_offsets_read(config, max_age=offsets_max_age)
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
    return progress_facts(commit, end, earliest, int(time.time() * 1000), errors, end_read_at_ms=read_at_ms)
