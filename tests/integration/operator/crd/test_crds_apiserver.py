"""The generated CRDs against a real kube-apiserver: it accepts them (so the schemas are structural and
the CEL rules compile within the cost budget), the examples are accepted, invalid objects are refused
with the CEL/schema message, defaults are applied, and a status written from the status models passes
the status schema and shows up in the printer columns."""
from __future__ import annotations

import copy
import json
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from handoff_operator.models import (CommittedStatus, Condition, ExecutorsStatus, ReplayRequestStatus,
                                     StreamTableHandoffStatus)
from handoff_testbed.eventually import eventually

pytestmark = pytest.mark.apiserver

REPO = Path(__file__).resolve().parents[4]
GROUP, VERSION = "handoff.io", "v1alpha1"


def _apply_crd(ext: client.ApiextensionsV1Api, crd: dict[str, Any]) -> None:
    """Create or replace (idempotent: other tests in the session may have installed them already)."""
    try:
        ext.create_custom_resource_definition(crd)
    except ApiException as err:
        if err.status != 409:
            raise
        current = ext.read_custom_resource_definition(crd["metadata"]["name"])
        crd = copy.deepcopy(crd)
        crd["metadata"]["resourceVersion"] = current.metadata.resource_version
        ext.replace_custom_resource_definition(crd["metadata"]["name"], crd)
    name = crd["metadata"]["name"]
    eventually(lambda: any(c.type == "Established" and c.status == "True"
                           for c in ext.read_custom_resource_definition(name).status.conditions or []),
               f"CRD {name} Established", timeout=60)


@pytest.fixture(scope="module")
def api(apiserver) -> Iterator[client.ApiClient]:
    api_client = config.new_client_from_config(config_file=str(apiserver.kubeconfig))
    try:
        ext = client.ApiextensionsV1Api(api_client)
        for path in sorted((REPO / "crds").glob("*.yaml")):
            _apply_crd(ext, yaml.safe_load(path.read_text()))
        yield api_client
    finally:
        api_client.close()


@pytest.fixture(scope="module")
def namespace(api: client.ApiClient) -> Iterator[str]:
    name = f"crds-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


def _example(name: str, namespace: str, new_name: str | None = None) -> dict[str, Any]:
    manifest = yaml.safe_load((REPO / "examples" / name).read_text())
    manifest["metadata"]["namespace"] = namespace
    if new_name:
        manifest["metadata"]["name"] = new_name
    return manifest


def _create(api: client.ApiClient, obj: dict[str, Any]) -> dict[str, Any]:
    plural = {"StreamTableHandoff": "streamtablehandoffs", "ReplayRequest": "replayrequests"}[obj["kind"]]
    return client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, obj["metadata"]["namespace"], plural, obj)


def _rejected(api: client.ApiClient, obj: dict[str, Any]) -> str:
    with pytest.raises(ApiException) as err:
        _create(api, obj)
    assert err.value.status == 422, err.value.body
    status = json.loads(err.value.body)
    causes = (status.get("details") or {}).get("causes") or []
    return "\n".join([status["message"]] + [f"{c.get('field')}: {c.get('message')}" for c in causes])


@pytest.mark.parametrize("name", ["orders-to-iceberg.yaml", "clicks-to-bigquery.yaml",
                                  "orders-transform-to-iceberg.yaml", "replay-rollback.yaml", "replay-backfill.yaml"])
def test_examples_are_accepted(api: client.ApiClient, namespace: str, name: str) -> None:
    created = _create(api, _example(name, namespace))
    assert created["metadata"]["generation"] == 1


def test_defaults_are_applied(api: client.ApiClient, namespace: str) -> None:
    created = _create(api, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "StreamTableHandoff",
        "metadata": {"name": "minimal", "namespace": namespace},
        "spec": {"source": {"bootstrapServers": "k:9092", "topics": ["t"]},
                 "sink": {"iceberg": {"table": "db.t"}}, "scaling": {}},
    })
    spec = created["spec"]
    assert spec["commitInterval"] == "10s" and spec["suspend"] is False
    assert spec["source"]["startingOffsets"] == "earliest"
    assert spec["sink"]["iceberg"]["autoCreate"] is True
    assert spec["scaling"] == {"minExecutors": 1, "maxExecutors": 4, "targetCatchUp": "5m", "cooldown": "2m"}
    limited = _create(api, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "StreamTableHandoff",
        "metadata": {"name": "limited", "namespace": namespace},
        "spec": {"source": {"bootstrapServers": "k:9092", "topics": ["t"]},
                 "sink": {"iceberg": {"table": "db.t"}}, "schema": {"limits": {"maxDepth": 8}}},
    })
    assert limited["spec"]["schema"]["limits"] == {"maxDepth": 8, "maxValueBytes": 8 * 1024 * 1024}


def _orders(namespace: str, name: str) -> dict[str, Any]:
    return _example("orders-to-iceberg.yaml", namespace, name)


def test_invalid_handoffs_are_rejected_with_the_rule_message(api: client.ApiClient, namespace: str) -> None:
    both = _orders(namespace, "both-sinks")
    both["spec"]["sink"]["bigquery"] = {"project": "p1", "dataset": "d", "table": "t"}
    assert "set exactly one of sink.iceberg or sink.bigquery" in _rejected(api, both)

    neither = _orders(namespace, "no-sink")
    neither["spec"]["sink"] = {}
    assert "set exactly one of sink.iceberg or sink.bigquery" in _rejected(api, neither)

    scaling = _orders(namespace, "min-over-max")
    scaling["spec"]["scaling"].update(minExecutors=8, maxExecutors=2)
    assert "scaling.minExecutors must be <= scaling.maxExecutors" in _rejected(api, scaling)

    enum = _orders(namespace, "bad-enum")
    enum["spec"]["source"]["startingOffsets"] = "middle"
    body = _rejected(api, enum)
    assert "spec.source.startingOffsets" in body and "Unsupported value" in body

    no_topics = _orders(namespace, "no-topics")
    no_topics["spec"]["source"]["topics"] = []
    assert "spec.source.topics" in _rejected(api, no_topics)

    dupe_topics = _orders(namespace, "dupe-topics")
    dupe_topics["spec"]["source"]["topics"] = ["a", "a"]
    assert "Duplicate value" in _rejected(api, dupe_topics)

    dupe_cols = _orders(namespace, "dupe-columns")
    dupe_cols["spec"]["schema"]["columns"].append({"name": "status", "type": "long"})
    assert "Duplicate value" in _rejected(api, dupe_cols)

    bad_type = _orders(namespace, "bad-type")
    bad_type["spec"]["schema"]["columns"][0]["type"] = "varchar"
    assert "spec.schema.columns[0].type" in _rejected(api, bad_type)

    dlq = _orders(namespace, "dlq-missing")
    del dlq["spec"]["deadLetter"]
    assert "schema.onIncompatible=deadLetter needs deadLetter.topic" in _rejected(api, dlq)

    secret = _orders(namespace, "secret-in-spec")
    secret["spec"]["source"]["properties"]["sasl.password"] = "hunter2"
    assert "use source.propertiesFrom" in _rejected(api, secret)

    conf = _orders(namespace, "reserved-conf")
    conf["spec"]["spark"]["sparkConf"]["spark.dynamicAllocation.enabled"] = "true"
    assert "spark.sparkConf must not set" in _rejected(api, conf)

    duration = _orders(namespace, "bad-duration")
    duration["spec"]["commitInterval"] = "30"
    assert "spec.commitInterval" in _rejected(api, duration)

    long_name = _orders(namespace, "x" * 53)
    assert "metadata.name must be at most 52" in _rejected(api, long_name)

    table = _orders(namespace, "bad-table")
    table["spec"]["sink"]["iceberg"]["table"] = "orders"
    assert "spec.sink.iceberg.table" in _rejected(api, table)

    depth = _orders(namespace, "too-deep-limit")
    depth["spec"]["schema"]["limits"] = {"maxDepth": 513}
    assert "spec.schema.limits.maxDepth" in _rejected(api, depth)

    size = _orders(namespace, "no-value-room")
    size["spec"]["schema"]["limits"] = {"maxValueBytes": 0}
    assert "spec.schema.limits.maxValueBytes" in _rejected(api, size)


def _get_json(api: client.ApiClient, path: str, accept: str = "application/json") -> dict[str, Any]:
    method, url, headers, body, post = api.param_serialize(
        "GET", path, header_params={"Accept": accept}, auth_settings=["BearerToken"])
    response = api.call_api(method, url, headers, body, post)
    response.read()
    assert response.status == 200, response.data
    return json.loads(response.data)


def _replay(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ReplayRequest",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"handoffRef": {"name": "orders-to-iceberg"}, **spec}}


def test_invalid_replays_are_rejected(api: client.ApiClient, namespace: str) -> None:
    assert "mode Backfill requires from and to offsets" in _rejected(
        api, _replay(namespace, "r1", mode="Backfill", to={"t": {"0": 5}}))
    assert "modes Rollback and RollbackAndReplay require target" in _rejected(
        api, _replay(namespace, "r2", mode="Rollback"))
    assert "target needs exactly one of snapshotId, timestamp or tag" in _rejected(
        api, _replay(namespace, "r3", mode="RollbackAndReplay", target={"tag": "a", "snapshotId": 1}))
    assert "from and to must name the same topics" in _rejected(
        api, _replay(namespace, "r4", mode="Backfill", **{"from": {"a": {"0": 1}}}, to={"b": {"0": 5}}))
    assert "target.snapshotId must be an integer" in _rejected(
        api, _replay(namespace, "r6", mode="Rollback", target={"snapshotId": "latest"}))
    body = _rejected(api, _replay(namespace, "r5", mode="Restore", target={"tag": "a"}))
    assert "spec.mode" in body and "Unsupported value" in body


def test_replay_spec_is_immutable_but_status_is_writable(api: client.ApiClient, namespace: str) -> None:
    objs = client.CustomObjectsApi(api)
    created = _create(api, _replay(namespace, "immutable", mode="Rollback", target={"snapshotId": "42"}))
    changed = copy.deepcopy(created)
    changed["spec"]["dryRun"] = True
    with pytest.raises(ApiException) as err:
        objs.replace_namespaced_custom_object(GROUP, VERSION, namespace, "replayrequests", "immutable", changed)
    assert err.value.status == 422 and "spec is immutable" in json.loads(err.value.body)["message"]
    status = ReplayRequestStatus(phase="Planned", observed_generation=1,
                                 conditions=[Condition(type="Progressing", status="True", reason="Planned")])
    patched = objs.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, "replayrequests",
                                                         "immutable", {"status": status.to_dict()})
    assert ReplayRequestStatus.model_validate(patched["status"]) == status


def test_status_from_models_and_printer_columns(api: client.ApiClient, namespace: str) -> None:
    objs = client.CustomObjectsApi(api)
    _create(api, _orders(namespace, "with-status"))
    status = StreamTableHandoffStatus(
        observed_generation=1, phase="Running", lag=1234, freshness="42s", freshness_seconds=42.0,
        conditions=[Condition(type="Ready", status="True", reason="Committing", observed_generation=1),
                    Condition(type="Degraded", status="False", reason="AsExpected")],
        committed=CommittedStatus(snapshot=8123456789012345678, batch=7, offsets={"orders.created": {"0": 10}}),
        executors=ExecutorsStatus(current=3, desired=3),
    )
    patched = objs.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "streamtablehandoffs", "with-status", {"status": status.to_dict()})
    assert StreamTableHandoffStatus.model_validate(patched["status"]) == status
    assert patched["status"]["committed"]["snapshot"] == "8123456789012345678"

    # A bad status is refused by the status schema too (the operator cannot write garbage).
    with pytest.raises(ApiException) as err:
        objs.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, "streamtablehandoffs", "with-status", {"status": {"phase": "Exploded"}})
    assert err.value.status == 422
    # Conditions are a map keyed by type: two Ready conditions are refused.
    twice = status.to_dict()
    twice["conditions"].append(dict(twice["conditions"][0], status="False"))
    with pytest.raises(ApiException) as err:
        objs.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, "streamtablehandoffs", "with-status", {"status": twice})
    assert err.value.status == 422 and "Duplicate value" in err.value.body

    # What `kubectl get sth` shows: the server-side Table with the printer columns.
    table = _get_json(api, f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/streamtablehandoffs/with-status",
                      accept="application/json;as=Table;v=v1;g=meta.k8s.io")
    names = [c["name"] for c in table["columnDefinitions"]]
    row = dict(zip(names, table["rows"][0]["cells"]))
    assert row["Phase"] == "Running" and row["Lag"] == 1234 and row["Freshness"] == "42s"
    assert row["Executors"] == 3 and "Age" in row


def test_short_names_and_categories(api: client.ApiClient) -> None:
    listing = _get_json(api, f"/apis/{GROUP}/{VERSION}")
    by_name = {r["name"]: r for r in listing["resources"]}
    assert by_name["streamtablehandoffs"]["shortNames"] == ["sth"]
    assert by_name["replayrequests"]["shortNames"] == ["replay"]
    assert by_name["streamtablehandoffs"]["categories"] == ["handoff"]
