"""Strimzi `KafkaTopic` resources (I/O): when one manages a topic, retention is raised there.

Strimzi's Topic Operator owns the configs of the topics it manages and reverts changes made to the topic
directly, so enforce mode patches `spec.config["retention.ms"]` of the KafkaTopic instead and lets Strimzi
apply it. A KafkaTopic names its topic with `spec.topicName`, or with `metadata.name` when that is unset.
Looked for only when the CRD `kafkatopics.kafka.strimzi.io` is installed, in the namespaces
HANDOFF_KAFKA_TOPIC_NAMESPACES lists (empty: cluster-wide).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

GROUP, PLURAL = "kafka.strimzi.io", "kafkatopics"
CRD_NAME = f"{PLURAL}.{GROUP}"


class KafkaTopicRefused(RuntimeError):
    """The API server refused (403) reading or patching KafkaTopics."""


@dataclass(frozen=True)
class KafkaTopicRef:
    namespace: str
    name: str
    version: str
    retention_ms: int | None      # spec.config["retention.ms"], if set

    def __str__(self) -> str:
        return f"KafkaTopic {self.namespace}/{self.name}"


def _refused(exc: ApiException, what: str) -> KafkaTopicRefused:
    return KafkaTopicRefused(f"the API server refused to {what} ({exc.status} {exc.reason}): grant the operator "
                             f"get/list/patch on kafkatopics.kafka.strimzi.io (Helm value retention.enforce=true)")


def served_version(api: client.ApiClient) -> str | None:
    """The KafkaTopic CRD's storage version, or None when Strimzi's CRD is not installed."""
    try:
        crd = client.ApiextensionsV1Api(api).read_custom_resource_definition(CRD_NAME)
    except ApiException as exc:
        if exc.status == 404:
            return None
        if exc.status == 403:
            raise _refused(exc, "read the KafkaTopic CRD") from exc
        raise
    versions = [v for v in crd.spec.versions if v.served]
    storage = [v.name for v in versions if v.storage]
    return (storage or [v.name for v in versions] or [None])[0]


def _retention(obj: dict[str, Any]) -> int | None:
    value = ((obj.get("spec") or {}).get("config") or {}).get("retention.ms")
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def find(api: client.ApiClient, topic: str, namespaces: Sequence[str]) -> list[KafkaTopicRef]:
    """KafkaTopics that name `topic` (empty: Strimzi does not manage it, or is not installed)."""
    version = served_version(api)
    if version is None:
        return []
    custom = client.CustomObjectsApi(api)
    items: list[dict[str, Any]] = []
    try:
        if namespaces:
            for ns in namespaces:
                items += custom.list_namespaced_custom_object(GROUP, version, ns, PLURAL)["items"]
        else:
            items = custom.list_cluster_custom_object(GROUP, version, PLURAL)["items"]
    except ApiException as exc:
        if exc.status == 403:
            raise _refused(exc, "list KafkaTopics") from exc
        raise
    return [KafkaTopicRef(o["metadata"]["namespace"], o["metadata"]["name"], version, _retention(o))
            for o in items if ((o.get("spec") or {}).get("topicName") or o["metadata"]["name"]) == topic]


def patch_retention(api: client.ApiClient, ref: KafkaTopicRef, target_ms: int) -> None:
    try:
        client.CustomObjectsApi(api).patch_namespaced_custom_object(
            GROUP, ref.version, ref.namespace, PLURAL, ref.name,
            {"spec": {"config": {"retention.ms": target_ms}}}, _content_type="application/merge-patch+json")
    except ApiException as exc:
        if exc.status == 403:
            raise _refused(exc, f"patch {ref}") from exc
        raise
