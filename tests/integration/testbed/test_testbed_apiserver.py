"""Smoke tests of the test bed's control plane: the behaviours the operator leans on must be real.

Each test pins one thing kopf or the operator depends on — CRD schema + CEL validation, the status
subresource, watches, RBAC, ownerReference garbage collection, the Deployment controllers — so that a
broken test-bed build fails here, with a plain message, rather than deep inside an operator test.
The CRD is defined here on purpose: these tests check the cluster, not the project's crds/.
"""
from __future__ import annotations

import json
import subprocess
import uuid
from typing import Any, Iterator

import pytest
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from handoff_testbed.eventually import eventually

pytestmark = pytest.mark.apiserver

#: How long a check waits for the controllers, which act asynchronously (a bound on a hang, no measurement).
CONTROLLERS_S = 90.0

GROUP, VERSION, PLURAL = "testbed.handoff.dev", "v1", "widgets"

WIDGET_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PLURAL}.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": PLURAL, "singular": "widget", "kind": "Widget"},
        "versions": [{
            "name": VERSION, "served": True, "storage": True,
            "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {
                        "type": "object",
                        "required": ["size"],
                        "properties": {"size": {"type": "integer"}, "maxSize": {"type": "integer"}},
                        "x-kubernetes-validations": [
                            {"rule": "!has(self.maxSize) || self.size <= self.maxSize",
                             "message": "size must not exceed maxSize"},
                        ],
                    },
                    "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
                },
            }},
        }],
    },
}


@pytest.fixture(scope="module")
def api(apiserver) -> Iterator[client.ApiClient]:
    api_client = config.new_client_from_config(config_file=str(apiserver.kubeconfig))
    try:
        yield api_client
    finally:
        api_client.close()


@pytest.fixture(scope="module")
def namespace(api: client.ApiClient) -> str:
    name = f"smoke-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name


@pytest.fixture(scope="module")
def widgets(api: client.ApiClient) -> client.CustomObjectsApi:
    ext = client.ApiextensionsV1Api(api)
    try:
        ext.create_custom_resource_definition(WIDGET_CRD)
    except ApiException as err:
        if err.status != 409:
            raise

    def established() -> bool:
        crd = ext.read_custom_resource_definition(WIDGET_CRD["metadata"]["name"])
        return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])

    eventually(established, "CRD Established", timeout=CONTROLLERS_S)
    return client.CustomObjectsApi(api)


def widget(name: str, **spec: int) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Widget", "metadata": {"name": name}, "spec": spec}


def test_kubectl_talks_to_the_apiserver(apiserver) -> None:
    out = subprocess.run(["kubectl", "--kubeconfig", str(apiserver.kubeconfig), "version", "-o", "json"],
                         check=True, capture_output=True, text=True).stdout
    server = json.loads(out)["serverVersion"]
    assert server["gitVersion"] == apiserver.version


def test_custom_resource_crud_and_cel_validation(widgets: client.CustomObjectsApi, namespace: str) -> None:
    created = widgets.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, widget("ok", size=3, maxSize=5))
    assert created["metadata"]["uid"] and created["metadata"]["resourceVersion"]

    with pytest.raises(ApiException) as rejected:
        widgets.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, widget("too-big", size=9, maxSize=5))
    assert rejected.value.status == 422
    assert "size must not exceed maxSize" in rejected.value.body

    with pytest.raises(ApiException) as missing:
        widgets.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, widget("no-size", maxSize=5))
    assert missing.value.status == 422


def test_status_subresource_is_isolated_and_watched(widgets: client.CustomObjectsApi, namespace: str) -> None:
    created = widgets.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, widget("w", size=1))
    since = created["metadata"]["resourceVersion"]

    # Through /status the spec cannot change; through the main resource the status cannot.
    patched = widgets.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "w", {"spec": {"size": 7}, "status": {"phase": "Ready"}})
    assert patched["status"] == {"phase": "Ready"}
    assert patched["spec"] == {"size": 1}
    patched = widgets.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "w", {"spec": {"size": 2}, "status": {"phase": "Hacked"}})
    assert patched["spec"] == {"size": 2}
    assert patched["status"] == {"phase": "Ready"}
    assert patched["metadata"]["generation"] == 2  # status writes do not bump the generation

    seen: list[tuple[str, dict[str, Any]]] = []
    stream = watch.Watch().stream(widgets.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL,
                                  resource_version=since, field_selector="metadata.name=w", timeout_seconds=30)
    for event in stream:
        seen.append((event["type"], event["object"]))
        if len(seen) == 2:
            break
    assert [kind for kind, _ in seen] == ["MODIFIED", "MODIFIED"]
    assert seen[0][1]["status"] == {"phase": "Ready"} and seen[0][1]["spec"] == {"size": 1}
    assert seen[1][1]["spec"] == {"size": 2}


def test_rbac_is_enforced_for_service_account_tokens(apiserver, api: client.ApiClient, namespace: str) -> None:
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    core.create_namespaced_service_account(namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="reader")))
    token = core.create_namespaced_service_account_token(
        "reader", namespace, client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
    ).status.token

    sa_config = client.Configuration()
    sa_config.host = apiserver.server
    sa_config.ssl_ca_cert = str(apiserver.ca_cert)
    sa_config.api_key = {"authorization": f"Bearer {token}"}
    with client.ApiClient(sa_config) as sa_api:
        as_reader = client.CoreV1Api(sa_api)
        with pytest.raises(ApiException) as denied:
            as_reader.list_namespaced_config_map(namespace)
        assert denied.value.status == 403

        rbac.create_namespaced_role(namespace, client.V1Role(
            metadata=client.V1ObjectMeta(name="cm-reader"),
            rules=[client.V1PolicyRule(api_groups=[""], resources=["configmaps"], verbs=["get", "list"])]))
        rbac.create_namespaced_role_binding(namespace, client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="cm-reader"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="cm-reader"),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name="reader", namespace=namespace)]))

        def allowed() -> bool:
            try:
                as_reader.list_namespaced_config_map(namespace)
            except ApiException as err:
                if err.status == 403:
                    return False
                raise
            return True

        eventually(allowed, "RoleBinding grants list configmaps", timeout=CONTROLLERS_S)
        with pytest.raises(ApiException) as still_denied:
            as_reader.list_namespaced_secret(namespace)
        assert still_denied.value.status == 403


def test_garbage_collector_deletes_children_of_a_deleted_owner(api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api)
    owner = core.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner")))
    ref = client.V1OwnerReference(api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid)
    core.create_namespaced_config_map(namespace, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="child", owner_references=[ref])))
    core.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="bystander")))

    core.delete_namespaced_config_map("owner", namespace)

    def child_gone() -> bool:
        try:
            core.read_namespaced_config_map("child", namespace)
        except ApiException as err:
            if err.status == 404:
                return True
            raise
        return False

    eventually(child_gone, "child ConfigMap garbage-collected", timeout=CONTROLLERS_S)
    assert core.read_namespaced_config_map("bystander", namespace).metadata.name == "bystander"


def test_deployment_controllers_create_replicaset_and_pods(apiserver, api: client.ApiClient, namespace: str) -> None:
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    labels = {"app": "smoke"}
    deployment = apps.create_namespaced_deployment(namespace, client.V1Deployment(
        metadata=client.V1ObjectMeta(name="smoke"),
        spec=client.V1DeploymentSpec(
            replicas=2, selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="registry.invalid/none:0")])))))

    replicasets = eventually(lambda: apps.list_namespaced_replica_set(namespace, label_selector="app=smoke").items,
                             "ReplicaSet created", timeout=CONTROLLERS_S)
    assert [r.uid for r in replicasets[0].metadata.owner_references] == [deployment.metadata.uid]

    def two_pods() -> list[client.V1Pod] | None:
        pods = core.list_namespaced_pod(namespace, label_selector="app=smoke").items
        return pods if len(pods) == 2 else None

    pods = eventually(two_pods, "2 Pods created", timeout=CONTROLLERS_S)
    for pod in pods:
        assert pod.metadata.owner_references[0].uid == replicasets[0].metadata.uid
        # ServiceAccount admission ran: the bound token volume is projected into every pod.
        assert pod.spec.service_account_name == "default"
        assert any(v.name.startswith("kube-api-access-") for v in pod.spec.volumes)

    if not apiserver.nodes:  # HANDOFF_TESTBED_NODES=0: nothing schedules or runs pods
        assert {pod.status.phase for pod in pods} == {"Pending"}
        return
    # kube-scheduler binds the pods to kwok's fake node, kwok reports them Running and Ready, and the
    # Deployment controller counts them available — the signal an operator waits for.
    available = eventually(
        lambda: apps.read_namespaced_deployment_status("smoke", namespace).status.available_replicas == 2,
        "Deployment has 2 available replicas", timeout=CONTROLLERS_S)
    assert available
    running = core.list_namespaced_pod(namespace, label_selector="app=smoke").items
    assert {pod.status.phase for pod in running} == {"Running"}
    assert {pod.spec.node_name for pod in running} <= set(apiserver.nodes)
