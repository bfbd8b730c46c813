"""The chart's retention RBAC on a real kube-apiserver (real ServiceAccount tokens, real RBAC): audit mode
(the default) holds nothing on Strimzi KafkaTopics and the operator's lookup fails with a clear message, not a
crash; `retention.enforce=true` grants exactly what enforce does — find the KafkaTopic (list), read and patch
it — cluster-wide or, with `retention.kafkaTopicNamespaces`, only there; never create or delete."""
from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from handoff_operator.retention import strimzi
from operator_support import (STRIMZI_KAFKATOPIC_CRD, delete_cluster_rbac, eventually, install_chart_rbac,
                              token_client)

pytestmark = pytest.mark.apiserver


def _install(admin: client.ApiClient, apiserver: Any, release_ns: str, values: dict[str, Any]
             ) -> tuple[client.ApiClient, list[dict[str, Any]], str]:
    """The chart's RBAC for `values`, a client holding its ServiceAccount's token, and the token."""
    docs, token = install_chart_rbac(admin, apiserver, release_ns, values, f"r{uuid.uuid4().hex[:6]}")
    return token_client(apiserver, token), docs, token


@pytest.fixture(scope="module")
def setup(apiserver) -> Iterator[dict[str, Any]]:
    admin = config.new_client_from_config(config_file=str(apiserver.kubeconfig))
    core, ext = client.CoreV1Api(admin), client.ApiextensionsV1Api(admin)
    suffix = uuid.uuid4().hex[:6]
    release_ns, kafka_ns, other_ns = f"rel-{suffix}", f"kafka-{suffix}", f"other-{suffix}"
    for ns in (release_ns, kafka_ns, other_ns):
        core.create_namespace({"metadata": {"name": ns}})
    try:
        ext.create_custom_resource_definition(yaml.safe_load(STRIMZI_KAFKATOPIC_CRD.read_text()))
    except ApiException as err:
        if err.status != 409:
            raise
    eventually(lambda: any(c.type == "Established" and c.status == "True" for c in
                           ext.read_custom_resource_definition(strimzi.CRD_NAME).status.conditions or []),
               "KafkaTopic CRD Established")
    topic = f"orders-{suffix}"
    for ns in (kafka_ns, other_ns):
        eventually(lambda ns=ns: client.CustomObjectsApi(admin).create_namespaced_custom_object(
            strimzi.GROUP, "v1beta2", ns, strimzi.PLURAL, {
                "apiVersion": "kafka.strimzi.io/v1beta2", "kind": "KafkaTopic", "metadata": {"name": "orders"},
                "spec": {"topicName": topic if ns == kafka_ns else f"elsewhere-{suffix}",
                         "config": {"retention.ms": 3600000}}}), "KafkaTopic created")
    clients, tokens = {}, {}
    created: list[dict[str, Any]] = []
    for name, values in (("audit", {}), ("enforce", {"retention": {"enforce": True}}),
                         ("enforce-namespaced", {"watchNamespaces": [release_ns],
                                                 "retention": {"enforce": True, "kafkaTopicNamespaces": [kafka_ns]}})):
        clients[name], docs, tokens[name] = _install(admin, apiserver, release_ns, values)
        created += docs
    try:
        yield {"admin": admin, "clients": clients, "tokens": tokens, "topic": topic, "kafka_ns": kafka_ns,
               "other_ns": other_ns}
    finally:
        for api in clients.values():
            api.close()
        delete_cluster_rbac(admin, created)
        for ns in (release_ns, kafka_ns, other_ns):
            core.delete_namespace(ns)
        admin.close()


def test_audit_holds_nothing_on_kafkatopics_and_lookup_fails_clearly(setup: dict[str, Any]) -> None:
    api = setup["clients"]["audit"]
    with pytest.raises(strimzi.KafkaTopicRefused) as err:
        strimzi.find(api, setup["topic"], [])
    assert "403" in str(err.value) and "retention.enforce=true" in str(err.value)
    with pytest.raises(ApiException) as denied:
        client.CustomObjectsApi(api).get_namespaced_custom_object(strimzi.GROUP, "v1beta2", setup["kafka_ns"],
                                                                 strimzi.PLURAL, "orders")
    assert denied.value.status == 403


def test_enforce_can_find_and_patch_the_kafkatopic_and_nothing_more(setup: dict[str, Any]) -> None:
    api, ns = setup["clients"]["enforce"], setup["kafka_ns"]
    (ref,) = strimzi.find(api, setup["topic"], [])  # cluster-wide: the other namespace's KafkaTopic is not it
    assert (ref.namespace, ref.name, ref.retention_ms) == (ns, "orders", 3600000)
    strimzi.patch_retention(api, ref, 7200000)
    objs = client.CustomObjectsApi(setup["admin"])
    assert objs.get_namespaced_custom_object(strimzi.GROUP, "v1beta2", ns, strimzi.PLURAL, "orders"
                                             )["spec"]["config"]["retention.ms"] == 7200000
    custom = client.CustomObjectsApi(api)
    for call in (lambda: custom.delete_namespaced_custom_object(strimzi.GROUP, "v1beta2", ns, strimzi.PLURAL, "orders"),
                 lambda: custom.create_namespaced_custom_object(strimzi.GROUP, "v1beta2", ns, strimzi.PLURAL, {
                     "apiVersion": "kafka.strimzi.io/v1beta2", "kind": "KafkaTopic", "metadata": {"name": "new"},
                     "spec": {}})):
        with pytest.raises(ApiException) as denied:
            call()
        assert denied.value.status == 403


def test_enforce_with_kafka_topic_namespaces_is_confined_to_them(setup: dict[str, Any]) -> None:
    api, ns = setup["clients"]["enforce-namespaced"], setup["kafka_ns"]
    (ref,) = strimzi.find(api, setup["topic"], [ns])
    strimzi.patch_retention(api, ref, 10800000)
    with pytest.raises(strimzi.KafkaTopicRefused):
        strimzi.find(api, setup["topic"], [])  # cluster-wide listing is not granted
    with pytest.raises(strimzi.KafkaTopicRefused):
        strimzi.find(api, setup["topic"], [setup["other_ns"]])


@pytest.mark.kafka
def test_operator_in_enforce_mode_without_the_rights_says_so_in_a_condition(setup: dict[str, Any], apiserver,
                                                                            cluster, kafka, tmp_path: Path) -> None:
    """The operator running as the audit chart's ServiceAccount, a handoff asking for enforce on a topic a
    KafkaTopic manages: the 403 becomes RetentionSufficient=False reason=EnforceRefused naming the Helm value;
    the operator goes on (status keeps being written), nothing is changed anywhere."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    from operator_support import base_spec, operator_running, token_kubeconfig

    topic, kafka_ns = setup["topic"], setup["kafka_ns"]
    kafka.create_topic(topic, partitions=1, config={"retention.ms": "3600000"})
    kubeconfig = token_kubeconfig(apiserver, tmp_path / "audit.kubeconfig", "audit", setup["tokens"]["audit"])
    spec = base_spec(kafka.bootstrap, replay={"window": "2h", "maxOutage": "1h"}, retention={"mode": "enforce"})
    spec["source"]["topics"] = [topic]
    spec["sink"]["iceberg"]["catalog"]["properties"] = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
                                                        "warehouse": f"file://{tmp_path}/warehouse"}
    ns = cluster.new_namespace("refused")
    with operator_running(str(kubeconfig), status_interval=1.0, retention_check_interval=1.0):
        cluster.create(ns, "orders", spec)
        cond = cluster.wait_condition(ns, "orders", "RetentionSufficient", "False", "EnforceRefused")
        assert f"could not raise retention.ms of topic {topic} in KafkaTopic" in cond["message"]
        assert "403" in cond["message"] and "retention.enforce=true" in cond["message"]
        assert "fix: raise retention.ms of topic" in cond["message"]
        assert cluster.condition(ns, "orders", "Ready") is not None  # the rest of the status is still written
        cluster.delete_all_handoffs()
    objs = client.CustomObjectsApi(setup["admin"])
    assert objs.get_namespaced_custom_object(strimzi.GROUP, "v1beta2", kafka_ns, strimzi.PLURAL, "orders"
                                             )["spec"]["config"]["retention.ms"] != 14400000
    admin = kafka.admin()
    (future,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
    assert future.result(30)["retention.ms"].value == "3600000"
