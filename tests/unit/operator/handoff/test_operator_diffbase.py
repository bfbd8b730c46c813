"""The slim diff-base storage gives kopf's own essence of a handoff, without copying its status and metadata."""
from __future__ import annotations

import copy

import kopf

from handoff_operator.handoff.diffbase import SlimAnnotationsDiffBaseStorage, slim_body

BODY = {
    "apiVersion": "handoff.io/v1alpha1", "kind": "StreamTableHandoff",
    "metadata": {"name": "orders", "namespace": "shop", "uid": "u-1", "generation": 3, "resourceVersion": "99",
                 "labels": {"team": "data"},
                 "annotations": {"handoff.io/last-handled-configuration": "{}", "handoff.io/replay": "r1",
                                 "kubectl.kubernetes.io/last-applied-configuration": "{...}", "owner": "x"},
                 "finalizers": ["handoff.io/finalizer"],
                 "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}] * 50},
    "spec": {"source": {"topics": ["orders"]}, "sink": {"iceberg": {"table": "shop.orders"}}},
    "status": {"conditions": [{"type": "Ready", "status": "True"}] * 20, "lag": 5},
}


def storages() -> tuple[kopf.AnnotationsDiffBaseStorage, SlimAnnotationsDiffBaseStorage]:
    kwargs = {"prefix": "handoff.io", "key": "last-handled-configuration"}
    return kopf.AnnotationsDiffBaseStorage(**kwargs), SlimAnnotationsDiffBaseStorage(**kwargs)


def test_the_essence_is_kopfs() -> None:
    theirs, ours = storages()
    for extra in (None, {("spec",)}, {("spec", "source")}, {("metadata", "labels")}):
        assert ours.build(body=kopf.Body(copy.deepcopy(BODY)), extra_fields=extra) == \
            theirs.build(body=kopf.Body(copy.deepcopy(BODY)), extra_fields=extra)


def test_a_field_in_status_or_dropped_metadata_gets_the_whole_body() -> None:
    theirs, ours = storages()
    for extra in ({("status", "lag")}, {("metadata", "generation")}, {"status.lag"}):
        assert slim_body(BODY, extra) is BODY
        assert ours.build(body=kopf.Body(BODY), extra_fields=extra) == theirs.build(body=kopf.Body(BODY), extra_fields=extra)


def test_the_slim_body_has_no_status_or_managed_fields() -> None:
    slim = slim_body(BODY, {("spec",)})
    assert "status" not in slim and set(slim["metadata"]) == {"labels", "annotations"}
    assert slim["spec"] is BODY["spec"]  # not copied here: kopf's build copies what it keeps
