"""Reading (and raising) topic retention in Kafka (I/O; the rule is in `retention`).

Per check, per handoff: one DescribeConfigs (retention.ms, retention.bytes, cleanup.policy; its answer is
reused for the check interval by other handoffs on the same topic, dropped when we raise it, and not kept again
until the broker shows the raise), ListOffsets
for earliest, latest and "first offset at now − RATE_WINDOW" (the write rate), and one short fetch per
partition to read two record timestamps Kafka has no offset→timestamp lookup for: the oldest record not
yet committed (the lag age) and the record that starts the rate window (its real age; a young or idle
topic would otherwise look slower than it is). The fetched records' sizes give the average record size
for the `retention.bytes` estimate. The AdminClient is the operator's per-cluster one (`truth.reading.admin_client`).

Shared across handoffs (issue 16: a thousand handoffs each created a consumer and asked for the same offsets):
the earliest and latest offsets come from the status refresh's own batched read when it has them
(`truth.ClusterOffsets`); the rate window's start offset is read once per topic per minute; a sampled record's
timestamp and size are kept per (cluster, partition, position) for the check interval (the record at an offset
does not change; retention or compaction moving past it changes the position asked for, not the answer).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Mapping

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, OffsetSpec, ResourceType

from handoff_spark.config import AppConfig

from handoff_operator.runtime import metrics
from handoff_operator.retention.rule import PartitionFacts, TopicFacts
from handoff_operator.truth.reading import admin_client

RATE_WINDOW_MS = 15 * 60 * 1000
_SAMPLE_RECORDS = 50     # per partition, for the average record size
_REFUSED = {KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED,
            KafkaError.POLICY_VIOLATION}


_configs: dict[tuple[str, str], tuple[float, dict[str, str | None]]] = {}
#: (bootstrap, topic) → (raised at, the retention.ms we set): until a broker reports it, its answers are not cached
_raised: dict[tuple[str, str], tuple[float, str]] = {}
RAISE_PROPAGATION = 120.0  # KRaft brokers apply the controller's change asynchronously; longer means lost
_configs_lock = threading.Lock()
#: (bootstrap, topic, partition) → (read at, offset of the first record at or after now − RATE_WINDOW_MS)
_window_starts: dict[tuple[str, str, int], tuple[float, int]] = {}
WINDOW_START_MAX_AGE = 60.0
#: (bootstrap, topic, partition, position) → (read at, (first record's timestamp ms, average record bytes))
_samples: dict[tuple[str, str, int, int], tuple[float, tuple[int, float]]] = {}
_SAMPLES_MAX = 100_000
_cache_lock = threading.Lock()


class RetentionRefused(RuntimeError):
    """Kafka refused to change the config (ACLs, a create/alter policy)."""


def _int(value: str | None) -> int | None:
    return None if value in (None, "") else int(value)  # type: ignore[arg-type]


def describe_topics(config: AppConfig, topics: list[str], timeout: float = 10.0, max_age: float = 0.0
                    ) -> dict[str, dict[str, str | None]]:
    """retention.ms, retention.bytes, cleanup.policy per topic, as the broker reports them (defaults included).
    Answers younger than `max_age` seconds are reused: handoffs sharing a topic describe it once per interval.
    An answer that still shows the retention.ms from before our own raise is returned but not kept: in KRaft the
    broker applies the controller's change a moment later, and keeping it would hide the raise for an interval."""
    now = time.monotonic()
    out: dict[str, dict[str, str | None]] = {}
    with _configs_lock:
        for topic in topics:
            cached = _configs.get((config.source.bootstrap_servers, topic))
            if cached is not None and now - cached[0] < max_age:
                out[topic] = cached[1]
    missing = [t for t in topics if t not in out]
    if not missing:
        return out
    metrics.KAFKA_REQUESTS.labels(api="describe_configs").inc()
    futures = admin_client(config).describe_configs([ConfigResource(ResourceType.TOPIC, t) for t in missing],
                                              request_timeout=timeout)
    for resource, future in futures.items():
        entries = future.result(timeout=timeout)
        out[resource.name] = {key: (entries[key].value if key in entries else None)
                              for key in ("retention.ms", "retention.bytes", "cleanup.policy")}
        key = (config.source.bootstrap_servers, resource.name)
        with _configs_lock:
            raised = _raised.get(key)
            if raised is not None and out[resource.name]["retention.ms"] != raised[1] \
                    and now - raised[0] < RAISE_PROPAGATION:
                continue  # the broker has not applied our raise yet
            _raised.pop(key, None)
            _configs[key] = (now, out[resource.name])
    return out


def _offsets(admin: object, specs: Mapping[TopicPartition, OffsetSpec], timeout: float
             ) -> dict[tuple[str, int], int]:
    metrics.KAFKA_REQUESTS.labels(api="list_offsets").inc()
    futures = admin.list_offsets(dict(specs), isolation_level=IsolationLevel.READ_COMMITTED,  # type: ignore[attr-defined]
                                 request_timeout=timeout)
    return {(tp.topic, tp.partition): f.result(timeout=timeout).offset for tp, f in futures.items()}


Sample = dict[tuple[str, int], tuple[int, float]]


def _sample(config: AppConfig, rounds: list[Mapping[tuple[str, int], int]], timeout: float) -> list[Sample]:
    """Per round of positions: (timestamp ms of the first record at or after each position, average size of the
    records fetched there). One consumer for all rounds (its start-up is most of a sample's cost); it never
    joins or commits to a group. librdkafka's fetch-queue backoff (1 s) is off: a sample is a few fetches."""
    if not any(rounds):
        return [{} for _ in rounds]
    metrics.KAFKA_REQUESTS.labels(api="sample_records").inc()  # a consumer: connect, fetch per position
    consumer = Consumer({**dict(config.source.properties), "bootstrap.servers": config.source.bootstrap_servers,
                         "group.id": "handoff-operator-retention-probe", "enable.auto.commit": False,
                         "enable.auto.offset.store": False, "isolation.level": "read_committed",
                         "fetch.queue.backoff.ms": 0, "fetch.wait.max.ms": 10, "fetch.message.max.bytes": 16384,
                         "client.id": "handoff-operator"})
    out: list[Sample] = []
    try:
        for positions in rounds:
            found: dict[tuple[str, int], list[tuple[int, int]]] = {}
            if positions:
                consumer.assign([TopicPartition(t, p, o) for (t, p), o in positions.items()])
                deadline = time.monotonic() + timeout
                while len(found) < len(positions) and time.monotonic() < deadline:
                    for msg in consumer.consume(num_messages=500, timeout=0.5):
                        if msg.error() is not None:
                            continue
                        sizes = found.setdefault((msg.topic(), msg.partition()), [])
                        if len(sizes) < _SAMPLE_RECORDS:
                            sizes.append((msg.timestamp()[1], len(msg.key() or b"") + len(msg.value() or b"") + sum(
                                len(k) + len(v or b"") for k, v in (msg.headers() or []))))
                consumer.unassign()
            out.append({key: (rows[0][0], sum(s for _, s in rows) / len(rows)) for key, rows in found.items()})
    finally:
        consumer.close()
    return out


Offsets = Mapping[str, Mapping[str, int]]   # {topic: {partition: offset}}, as ProgressFacts holds them


def _flat(offsets: Offsets, topics: list[str]) -> dict[tuple[str, int], int] | None:
    """{(topic, partition): offset} when `offsets` covers every topic, else None (read them here)."""
    if any(not offsets.get(t) for t in topics):
        return None
    return {(t, int(p)): int(o) for t in topics for p, o in offsets[t].items()}


def _window_start(config: AppConfig, tps: list[TopicPartition], now_ms: int, timeout: float
                  ) -> dict[tuple[str, int], int]:
    """The first offset at or after now − RATE_WINDOW_MS per partition, read at most once a minute per partition
    (shared by the handoffs reading it: the rate is measured from the record found there, whatever its age)."""
    bootstrap, now = config.source.bootstrap_servers, time.monotonic()
    out: dict[tuple[str, int], int] = {}
    with _cache_lock:
        for tp in tps:
            cached = _window_starts.get((bootstrap, tp.topic, tp.partition))
            if cached is not None and now - cached[0] < WINDOW_START_MAX_AGE:
                out[(tp.topic, tp.partition)] = cached[1]
    missing = [tp for tp in tps if (tp.topic, tp.partition) not in out]
    if missing:
        read = _offsets(admin_client(config), {tp: OffsetSpec.for_timestamp(now_ms - RATE_WINDOW_MS) for tp in missing},
                        timeout)
        with _cache_lock:
            for (topic, partition), offset in read.items():
                _window_starts[(bootstrap, topic, partition)] = (now, offset)
        out.update(read)
    return out


def _sample_cached(config: AppConfig, rounds: list[Mapping[tuple[str, int], int]], timeout: float,
                   max_age: float) -> list[Sample]:
    """_sample, with the answers for positions sampled within `max_age` seconds taken from the cache."""
    bootstrap, now = config.source.bootstrap_servers, time.monotonic()
    known: list[Sample] = [{} for _ in rounds]
    wanted: list[dict[tuple[str, int], int]] = [{} for _ in rounds]
    with _cache_lock:
        for i, positions in enumerate(rounds):
            for key, position in positions.items():
                cached = _samples.get((bootstrap, key[0], key[1], position))
                if cached is not None and now - cached[0] < max_age:
                    known[i][key] = cached[1]
                else:
                    wanted[i][key] = position
    fetched = _sample(config, wanted, timeout) if any(wanted) else [{} for _ in rounds]
    with _cache_lock:
        for i, found in enumerate(fetched):
            for key, answer in found.items():
                _samples[(bootstrap, key[0], key[1], wanted[i][key])] = (now, answer)
            known[i].update(found)
        if len(_samples) > _SAMPLES_MAX:  # drop the oldest half: positions of handoffs long moved on
            for key, _ in sorted(_samples.items(), key=lambda kv: kv[1][0])[:len(_samples) // 2]:
                del _samples[key]
    return known


def topic_facts(config: AppConfig, committed: Mapping[str, Mapping[str, int]] | None, now_ms: int,
                timeout: float = 5.0, config_max_age: float = 0.0, end: Offsets | None = None,
                earliest_offsets: Offsets | None = None) -> dict[str, TopicFacts]:
    """Everything the retention rule needs about the handoff's topics (configs and sampled records reused up to
    `config_max_age` s). `end`/`earliest_offsets`: the refresh's own read of Kafka's offsets (not asked again)."""
    topics = list(config.source.topics)
    configs = describe_topics(config, topics, timeout, config_max_age)
    latest, earliest = _flat(end or {}, topics), _flat(earliest_offsets or {}, topics)
    if latest is None or earliest is None or set(latest) != set(earliest):
        admin = admin_client(config)
        metadata = admin.list_topics(timeout=timeout)
        metrics.KAFKA_REQUESTS.labels(api="list_topics").inc()
        tps = []
        for topic in topics:
            meta = metadata.topics.get(topic)
            if meta is None or meta.error is not None:
                raise RuntimeError(f"topic {topic!r} not found in Kafka")
            tps += [TopicPartition(topic, p) for p in meta.partitions]
        earliest = _offsets(admin, {tp: OffsetSpec.earliest() for tp in tps}, timeout)
        latest = _offsets(admin, {tp: OffsetSpec.latest() for tp in tps}, timeout)
    else:
        tps = [TopicPartition(t, p) for t, p in sorted(latest)]
    window_start = _window_start(config, tps, now_ms, timeout)
    nexts = {(t, int(p)): int(o) for t, parts in (committed or {}).items() for p, o in parts.items()}
    waiting = {k: max(o, earliest[k]) for k, o in nexts.items() if k in latest and o < latest[k]}
    rate_from = {k: o for k, o in window_start.items() if 0 <= o < latest[k]}
    oldest, rate_rows = _sample_cached(config, [waiting, rate_from], timeout, config_max_age)
    out: dict[str, TopicFacts] = {}
    for topic in topics:
        conf = configs.get(topic, {})
        partitions: dict[int, PartitionFacts] = {}
        for tp in (tp for tp in tps if tp.topic == topic):
            key = (topic, tp.partition)
            rate, size = 0.0, None
            if key in rate_rows:
                first_ms, size = rate_rows[key]
                rate = (latest[key] - rate_from[key]) / max(1.0, (now_ms - first_ms) / 1000.0)
            elif key in oldest:
                size = oldest[key][1]
            partitions[tp.partition] = PartitionFacts(
                earliest=earliest[key], latest=latest[key], next_offset=nexts.get(key),
                oldest_unconsumed_ms=oldest[key][0] if key in oldest else None,
                records_per_second=rate, average_record_bytes=size)
        out[topic] = TopicFacts(topic, _int(conf.get("retention.ms")), _int(conf.get("retention.bytes")),
                                tuple(p.strip() for p in (conf.get("cleanup.policy") or "delete").split(",")),
                                partitions)
    return out


def raise_retention_ms(config: AppConfig, topic: str, target_ms: int, timeout: float = 10.0) -> None:
    """Set the topic's retention.ms (IncrementalAlterConfigs: only this key changes). The caller has
    checked that this raises it. Raises RetentionRefused when the broker says no for permissions."""
    admin = admin_client(config)
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", str(target_ms), incremental_operation=AlterConfigOpType.SET)])
    key = (config.source.bootstrap_servers, topic)
    with _configs_lock:  # set first: a describe answering during the alter must not be kept either
        _configs.pop(key, None)
        _raised[key] = (time.monotonic(), str(target_ms))
    try:
        for future in admin.incremental_alter_configs([resource], request_timeout=timeout).values():
            future.result(timeout=timeout)
    except KafkaException as exc:
        with _configs_lock:
            _raised.pop(key, None)
        error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        if error is not None and error.code() in _REFUSED:
            raise RetentionRefused(f"Kafka refused AlterConfigs ({error.name()}): grant the operator's principal "
                                   f"AlterConfigs on topic {topic}, or raise retention.ms to {target_ms} yourself"
                                   ) from exc
        raise
