"""What a status refresh reads, shared between handoffs (issue 16): one batched Kafka offsets read per cluster per
max age for every handoff reading it, and the table's ledger read only when its metadata pointer moved — against
the real broker and a real SQLite Iceberg catalog, counted with the operator's own metrics."""
from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Producer

from handoff_operator.runtime import metrics
from handoff_operator.truth import reading as truth
from handoff_operator.spec.render import app_config
from handoff_operator.spec.validation import parse_spec
from operator_support import base_spec, ledger_commit, sqlite_ledger_table

pytestmark = [pytest.mark.kafka]


def _count(counter, **labels) -> float:
    return counter.labels(**labels)._value.get()


def _config(bootstrap: str, topics: list[str], name: str, catalog: dict[str, str] | None = None):
    spec = base_spec(bootstrap)
    spec["source"]["topics"] = topics
    if catalog is not None:
        spec["sink"]["iceberg"]["catalog"]["properties"] = catalog
    parsed, problems = parse_spec(spec)
    assert parsed is not None, problems
    return app_config(parsed, "shared", name, image="test")


def test_handoffs_on_one_cluster_share_one_batched_offsets_read(kafka) -> None:
    a, b = f"orders-{uuid.uuid4().hex[:6]}", f"refunds-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(a, partitions=3)
    kafka.create_topic(b, partitions=2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(5):
        producer.produce(a, b"{}", partition=i % 3)
    assert producer.flush(30) == 0
    first, second = _config(kafka.bootstrap, [a], "first"), _config(kafka.bootstrap, [b], "second")

    truth.kafka_offsets(first, max_age=60)
    truth.kafka_offsets(second, max_age=60)  # a topic new to the cluster: fetched (with the first's) at once
    before = _count(metrics.KAFKA_REQUESTS, api="list_offsets")
    end_a, earliest_a = truth.kafka_offsets(first, max_age=60)
    end_b, _ = truth.kafka_offsets(second, max_age=60)
    assert _count(metrics.KAFKA_REQUESTS, api="list_offsets") == before  # both served from the snapshot
    assert end_a == {a: {0: 2, 1: 2, 2: 1}} and earliest_a == {a: {0: 0, 1: 0, 2: 0}} and end_b == {b: {0: 0, 1: 0}}

    # A snapshot reused says when it was read, not when it was asked for: a rate over time needs that.
    shared = truth.kafka_offsets_read(first, max_age=60)
    time.sleep(0.05)
    assert truth.kafka_offsets_read(second, max_age=60).read_at_ms == shared.read_at_ms

    # Older than max age: one fetch (two ListOffsets calls: latest, earliest) for both handoffs' topics.
    producer.produce(b, b"{}", partition=1)
    assert producer.flush(30) == 0
    fresh = truth.kafka_offsets_read(second, max_age=0.001)
    assert fresh.read_at_ms > shared.read_at_ms
    assert _count(metrics.KAFKA_REQUESTS, api="list_offsets") == before + 2
    assert truth.kafka_offsets(first, max_age=60)[0] == {a: {0: 2, 1: 2, 2: 1}}
    assert truth.kafka_offsets(second, max_age=60)[0] == {b: {0: 0, 1: 1}}

    missing = _config(kafka.bootstrap, [f"gone-{uuid.uuid4().hex[:6]}"], "missing")
    with pytest.raises(RuntimeError, match="not found in Kafka"):
        truth.kafka_offsets(missing, max_age=60)


def test_the_ledger_is_read_again_only_when_the_table_pointer_moved(kafka, tmp_path) -> None:
    catalog, table = sqlite_ledger_table(tmp_path)
    config = _config(kafka.bootstrap, ["orders"], "ledger", catalog)
    handoff_id = config.handoff_id
    ledger_commit(table, handoff_id, 0, {"orders": {"0": [0, 3]}}, int(time.time() * 1000), 3)

    loads = _count(metrics.CATALOG_READS, kind="iceberg_load_table")
    assert truth.latest_commit(config).batch_id == 0
    assert truth.latest_commit(config).batch_id == 0
    assert _count(metrics.CATALOG_READS, kind="iceberg_load_table") == loads + 1  # the second: pointer only

    ledger_commit(table, handoff_id, 1, {"orders": {"0": [3, 5]}}, int(time.time() * 1000), 2)
    commit = truth.latest_commit(config)
    assert commit.batch_id == 1 and commit.end_offsets == {"orders": {0: 5}}
    assert _count(metrics.CATALOG_READS, kind="iceberg_load_table") == loads + 2
