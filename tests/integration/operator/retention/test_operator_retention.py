"""Retention against replay needs, with the operator in-process on the real kube-apiserver and the real Kafka
broker: a too-short retention.ms is reported with its numbers and raised in enforce mode (read back from the
broker); the broker deleting segments past the ledger's position is DataLoss with the lost range; a topic
managed by a Strimzi KafkaTopic is raised in the KafkaTopic, not in Kafka."""
from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from operator_support import (STRIMZI_KAFKATOPIC_CRD, Cluster, base_spec, eventually, first_index, kubectl, ledger_commit,
                              timeline,
                              operator_running)

pytestmark = [pytest.mark.apiserver, pytest.mark.kafka]

HOUR_MS = 3_600_000
# replay.window 2h + replay.maxOutage 1h + lag age 0 + 10% margin = 3h18m; enforce rounds up to whole hours
NEED_MS = 11_880_000
RAISED_MS = 4 * HOUR_MS


def _retention_ms(kafka: Any, topic: str) -> str:
    admin = kafka.admin()  # held: a dropped AdminClient cancels its requests
    (future,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
    return future.result(timeout=30)["retention.ms"].value


def _produce(kafka: Any, topic: str, n: int, start: int = 0, timestamp_ms: int = 0) -> None:
    """n records to partition 0; timestamp_ms 0 = now."""
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(start, start + n):
        producer.produce(topic, json.dumps({"id": i}).encode(), partition=0, timestamp=timestamp_ms)
    assert producer.flush(30) == 0


def _spec(kafka: Any, topic: str, tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    """A handoff reading `topic` into an Iceberg table of a real SQLite catalog under tmp_path."""
    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/warehouse"}
    spec = base_spec(kafka.bootstrap, replay={"window": "2h", "maxOutage": "1h"}, **overrides)
    spec["source"]["topics"] = [topic]
    spec["sink"]["iceberg"]["catalog"]["properties"] = props
    spec["sink"]["iceberg"]["partitionBy"] = []
    return spec


def _warnings(cluster: Cluster, ns: str, name: str) -> dict[str, str]:
    return {e.reason: e.message for e in cluster.events(ns, name)}


def test_short_retention_is_reported_with_numbers_and_raised_in_enforce_mode(cluster: Cluster, kafka,
                                                                              tmp_path: Path) -> None:
    topic = f"ret-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, partitions=2, config={"retention.ms": str(HOUR_MS)})
    ns = cluster.new_namespace("ret")
    with operator_running(cluster.kubeconfig, status_interval=1.0, retention_check_interval=1.0):
        cluster.create(ns, "orders", _spec(kafka, topic, tmp_path))
        cond = cluster.wait_condition(ns, "orders", "RetentionSufficient", "False", "RetentionTooShort")
        assert (f"topic {topic} keeps records only 1h (limited by retention.ms); need 3h18m = replay.window 2h "
                f"+ replay.maxOutage 1h + lag age 0s + 10% margin") in cond["message"]
        assert f"fix: raise retention.ms of topic {topic} to at least {RAISED_MS} (4h)" in cond["message"]
        retention = cluster.get(ns, "orders")["status"]["retention"]
        (entry,) = retention["topics"]
        assert entry["topic"] == topic and entry["sufficient"] is False and entry["limitedBy"] == "retention.ms"
        assert entry["needSeconds"] == NEED_MS / 1000 and entry["haveSeconds"] == HOUR_MS / 1000
        assert retention["headroomSeconds"] == (HOUR_MS - NEED_MS) / 1000
        assert eventually(lambda: "RetentionTooShort" in _warnings(cluster, ns, "orders"), "a RetentionTooShort Event")
        assert _retention_ms(kafka, topic) == str(HOUR_MS)  # audit mode only reports

        cluster.patch_spec(ns, "orders", {"retention": {"mode": "enforce"}})
        eventually(lambda: _retention_ms(kafka, topic) == str(RAISED_MS),  # read back from the broker
                   f"retention.ms raised (condition: {cluster.condition(ns, 'orders', 'RetentionSufficient')})")
        cluster.wait_condition(ns, "orders", "RetentionSufficient", "True")
        events = eventually(lambda: (e := _warnings(cluster, ns, "orders")).get("RetentionEnforced") and e,
                            "a RetentionEnforced Event")
        assert f"retention.ms of topic {topic} {HOUR_MS} → {RAISED_MS} in Kafka" in events["RetentionEnforced"]

        # Never lowered: a shorter need leaves the raised retention as it is.
        cluster.patch_spec(ns, "orders", {"replay": {"window": "1h", "maxOutage": "30m"}})
        eventually(lambda: (cluster.get(ns, "orders")["status"]["retention"]["topics"][0]["needSeconds"]
                            == pytest.approx(1.5 * 3600 * 1.1)), "the check with the smaller need")
        assert cluster.condition(ns, "orders", "RetentionSufficient")["reason"] == "Sufficient"
        assert _retention_ms(kafka, topic) == str(RAISED_MS)
        # The timeline, oldest first: the check that found it short, the switch to enforce, the raise, the
        # smaller need (issue 35: from the operator's own record).
        rows = timeline(cluster.kubeconfig, ns, "orders")
        checked = first_index(rows, "RetentionChecked", "RetentionTooShort")
        assert rows[checked]["source"] == "operator"
        assert checked <= first_index(rows, "RetentionTooShort") < first_index(rows, "SpecChanged", "generation 2") \
            < first_index(rows, "RetentionEnforced", f"{HOUR_MS} → {RAISED_MS}") \
            < first_index(rows, "SpecChanged", "generation 3")
        cluster.delete_all_handoffs()


def test_segments_deleted_past_the_ledger_position_are_data_loss_with_the_range(cluster: Cluster, kafka,
                                                                                 tmp_path: Path) -> None:
    """The broker's own retention deletes the first segment while the ledger still points into it: its records
    carry timestamps an hour old (retention.ms is 10 minutes), the next records are new, so the append rolls a
    segment at offset 10 (segment.ms 1 minute) and the retention check (every 5 s in the test bed) deletes the
    old one. The new segment stays: it is not expired."""
    topic = f"loss-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, partitions=1, config={"segment.ms": "60000", "retention.ms": "600000"})
    _produce(kafka, topic, 10, timestamp_ms=int(time.time() * 1000) - HOUR_MS)
    _produce(kafka, topic, 10, start=10)
    admin = kafka.admin()

    def earliest() -> int:
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import OffsetSpec
        (f,) = admin.list_offsets({TopicPartition(topic, 0): OffsetSpec.earliest()}).values()
        return f.result(timeout=30).offset
    eventually(lambda: earliest() == 10, "the broker deleted the first segment", timeout=60)

    catalog = SqlCatalog("lake", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/warehouse")
    catalog.create_namespace("shop")
    table = catalog.create_table("shop.orders", Schema(NestedField(1, "id", LongType(), required=False)))
    ns = cluster.new_namespace("loss")
    # The handoff had committed offsets 0..4 of partition 0 before it stopped: 5..9 were never read.
    ledger_commit(table, f"{ns}/orders", 0, {topic: {"0": [0, 5]}}, int(time.time() * 1000), 5)
    with operator_running(cluster.kubeconfig, status_interval=1.0, retention_check_interval=1.0):
        cluster.create(ns, "orders", _spec(kafka, topic, tmp_path))
        cond = cluster.wait_condition(ns, "orders", "DataLoss", "True", "RecordsDeleted")
        assert f"{topic}[0] offsets 5..9 (5 records)" in cond["message"]
        assert "onOffsetOutOfRange=fail" in cond["message"]
        status = cluster.get(ns, "orders")["status"]
        assert status["retention"]["lost"] == [{"topic": topic, "partition": 0, "fromOffset": 5, "toOffset": 10}]
        assert eventually(lambda: "RecordsDeleted" in _warnings(cluster, ns, "orders"), "a RecordsDeleted Event")

        # The driver skipped the range (onOffsetOutOfRange=earliest) and committed on from Kafka's earliest:
        # the loss is over, DataLoss goes False.
        ledger_commit(table, f"{ns}/orders", 1, {topic: {"0": [10, 20]}}, int(time.time() * 1000), 10)
        cluster.wait_condition(ns, "orders", "DataLoss", "False", "NoDataLoss")
        assert cluster.get(ns, "orders")["status"]["retention"]["lost"] == []
        cluster.delete_all_handoffs()


def test_topic_managed_by_strimzi_is_raised_in_its_kafkatopic(cluster: Cluster, kafka, tmp_path: Path) -> None:
    kubeconfig = cluster.kubeconfig
    out = kubectl(kubeconfig, "apply", "--server-side", "-f", str(STRIMZI_KAFKATOPIC_CRD), check=False)
    assert out.returncode == 0, out.stderr
    eventually(lambda: kubectl(kubeconfig, "wait", "--for=condition=Established", "--timeout=30s",
                               "crd/kafkatopics.kafka.strimzi.io", check=False).returncode == 0, "CRD Established")
    topic = f"strimzi-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, partitions=1, config={"retention.ms": str(HOUR_MS)})
    kafka_ns = cluster.new_namespace("kafka")
    # Strimzi names KafkaTopics by Kubernetes rules; spec.topicName carries the real topic name. Another
    # KafkaTopic for another topic must be left alone.
    for name, topic_name in (("orders-topic", topic), ("other-topic", f"other-{topic}")):
        cluster.custom.create_namespaced_custom_object("kafka.strimzi.io", "v1beta2", kafka_ns, "kafkatopics", {
            "apiVersion": "kafka.strimzi.io/v1beta2", "kind": "KafkaTopic",
            "metadata": {"name": name, "labels": {"strimzi.io/cluster": "test"}},
            "spec": {"topicName": topic_name, "partitions": 1, "replicas": 1,
                     "config": {"retention.ms": HOUR_MS, "cleanup.policy": "delete"}}})
    ns = cluster.new_namespace("strimzi")
    with operator_running(kubeconfig, status_interval=1.0, retention_check_interval=1.0):
        cluster.create(ns, "orders", _spec(kafka, topic, tmp_path, retention={"mode": "enforce"}))
        cond = cluster.wait_condition(ns, "orders", "RetentionSufficient", "False", "WaitingForStrimzi")
        assert f"patched KafkaTopic {kafka_ns}/orders-topic spec.config retention.ms {HOUR_MS} → {RAISED_MS}" \
            in cond["message"]

        def kafka_topic(name: str) -> dict[str, Any]:
            return cluster.custom.get_namespaced_custom_object("kafka.strimzi.io", "v1beta2", kafka_ns,
                                                               "kafkatopics", name)
        assert kafka_topic("orders-topic")["spec"]["config"] == {"retention.ms": RAISED_MS, "cleanup.policy": "delete"}
        assert kafka_topic("other-topic")["spec"]["config"]["retention.ms"] == HOUR_MS
        assert _retention_ms(kafka, topic) == str(HOUR_MS)  # the topic itself is Strimzi's to change
        assert eventually(lambda: "KafkaTopicPatched" in _warnings(cluster, ns, "orders"), "a KafkaTopicPatched Event")

        # Play Strimzi's Topic Operator: it applies the KafkaTopic's config to the topic.
        resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
            ConfigEntry("retention.ms", str(RAISED_MS), incremental_operation=AlterConfigOpType.SET)])
        admin = kafka.admin()
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(timeout=30)
        cluster.wait_condition(ns, "orders", "RetentionSufficient", "True", "Sufficient")
        assert kafka_topic("orders-topic")["metadata"]["generation"] == 2  # patched once, not on every check
        cluster.delete_all_handoffs()
