"""The chart's RBAC against a real kube-apiserver: as the chart's ServiceAccount (a real token from the
TokenRequest API, real RBAC authorization), do everything the operator does in a watched namespace —
read the handoff and its Secrets, write its status, server-side-apply every rendered child including the
driver's Role (which the API server only allows if the operator holds every right it grants) and the Spark UI's
Ingress, delete the UI's Service and Ingress once the spec drops them, create the
checkpoint PVC, scale the driver, create/read/list/delete a Backfill request's Job, post an Event — and check it is refused in a namespace it does not
watch. Last, the operator itself (`handoff operator`) runs with only that token and must take a handoff
through create → status → delete without one Forbidden."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from handoff_operator.runtime.kube import Kube
from handoff_operator.models import StreamTableHandoffSpec
from handoff_operator.spec.render import Resolved, render
from handoff_operator.replay.backfill import backfill_job
from handoff_testbed.eventually import eventually
from operator_support import delete_cluster_rbac, install_chart_rbac, token_client, token_kubeconfig

pytestmark = pytest.mark.apiserver

REPO = Path(__file__).resolve().parents[3]
GROUP, VERSION = "handoff.io", "v1alpha1"


def _apply_crds(admin: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(admin)
    for path in sorted((REPO / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        try:
            ext.create_custom_resource_definition(crd)
        except ApiException as err:
            if err.status != 409:
                raise
    for path in sorted((REPO / "crds").glob("*.yaml")):
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        eventually(lambda: any(c.type == "Established" and c.status == "True"
                               for c in ext.read_custom_resource_definition(name).status.conditions or []),
                   f"CRD {name} Established", timeout=60)


@pytest.fixture(scope="module")
def setup(apiserver) -> Iterator[dict[str, Any]]:
    admin = config.new_client_from_config(config_file=str(apiserver.kubeconfig))
    core = client.CoreV1Api(admin)
    suffix = uuid.uuid4().hex[:6]
    release, watched, other = f"rel-{suffix}", f"watched-{suffix}", f"other-{suffix}"
    for ns in (release, watched, other):
        core.create_namespace({"metadata": {"name": ns}})
    _apply_crds(admin)
    rbac_docs, token = install_chart_rbac(admin, apiserver, release, {"watchNamespaces": [watched]}, f"h{suffix}")
    operator = token_client(apiserver, token)
    kubeconfig = token_kubeconfig(apiserver, apiserver.workdir / f"operator-{suffix}.kubeconfig", "operator", token)
    try:
        yield {"admin": admin, "operator": operator, "watched": watched, "other": other,
               "kubeconfig": kubeconfig}
    finally:
        operator.close()
        delete_cluster_rbac(admin, rbac_docs)
        for ns in (release, watched, other):
            core.delete_namespace(ns)
        admin.close()


SPEC = {"source": {"bootstrapServers": "kafka:9092", "topics": ["orders"],
                   "propertiesFrom": [{"property": "sasl.password",
                                       "secretKeyRef": {"name": "kafka-creds", "key": "password"}}]},
        "sink": {"iceberg": {"table": "shop.orders"}},
        "spark": {"ui": {"ingress": {"host": "orders-ui.example.com"}}}}


def test_operator_service_account_can_do_its_job(setup: dict[str, Any]) -> None:
    admin, operator, ns = setup["admin"], setup["operator"], setup["watched"]
    client.CoreV1Api(admin).create_namespaced_secret(
        ns, {"metadata": {"name": "kafka-creds"}, "stringData": {"password": "s3cret"}})
    client.CustomObjectsApi(admin).create_namespaced_custom_object(
        GROUP, VERSION, ns, "streamtablehandoffs",
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "StreamTableHandoff",
         "metadata": {"name": "orders"}, "spec": SPEC})

    kube = Kube(operator)
    obj = kube.get_handoff(ns, "orders")
    assert obj is not None
    client.CustomObjectsApi(operator).list_namespaced_custom_object(GROUP, VERSION, ns, "streamtablehandoffs")
    client.CustomObjectsApi(operator).list_namespaced_custom_object(GROUP, VERSION, ns, "replayrequests")
    assert kube.read_secrets(ns, ["kafka-creds"]) == {"kafka-creds": {"password": "s3cret"}}

    spec = StreamTableHandoffSpec.model_validate(obj["spec"])
    rendered = render(obj, spec, "handoff:test", Resolved(source_properties={"sasl.password": "s3cret"}))
    kinds = [c["kind"] for c in rendered.children]
    assert {"ConfigMap", "Secret", "ServiceAccount", "Role", "RoleBinding", "Service", "Ingress",
            "Deployment"} <= set(kinds)
    for child in rendered.children:
        kube.apply(child)  # the Role is refused unless the operator holds what it grants
    # The UI's Service and Ingress turned off in the spec: the operator deletes the ones it made.
    off = StreamTableHandoffSpec.model_validate({**obj["spec"], "spark": {"ui": {"service": False}}})
    absent = render(obj, off, "handoff:test", Resolved(source_properties={"sasl.password": "s3cret"})).absent
    assert sorted(a["kind"] for a in absent) == ["Ingress", "Service"]
    for child in absent:
        assert kube.delete_if_owned(child, obj["metadata"]["uid"]), child
    for child in rendered.unowned:
        assert kube.create_if_missing(child)
    assert kube.scale_driver(ns, "orders", 0)
    # A Backfill request's Job, owned by the request (blockOwnerDeletion: replayrequests/finalizers).
    request = client.CustomObjectsApi(admin).create_namespaced_custom_object(
        GROUP, VERSION, ns, "replayrequests",
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ReplayRequest", "metadata": {"name": "fill"},
         "spec": {"handoffRef": {"name": "orders"}, "mode": "Backfill",
                  "from": {"orders": {"0": 0}}, "to": {"orders": {"0": 5}}}})
    deployment = operator.sanitize_for_serialization(client.AppsV1Api(operator).read_namespaced_deployment(
        "orders-driver", ns))
    batch = client.BatchV1Api(operator)
    job = backfill_job(deployment, request, "orders", {"orders": {"0": 0}}, {"orders": {"0": 5}})
    batch.create_namespaced_job(ns, job)
    assert batch.read_namespaced_job(job["metadata"]["name"], ns).spec.backoff_limit == job["spec"]["backoffLimit"]
    assert [j.metadata.name for j in batch.list_namespaced_job(ns).items] == [job["metadata"]["name"]]
    batch.delete_namespaced_job(job["metadata"]["name"], ns, propagation_policy="Background")
    assert kube.driver_facts(ns, "orders") is not None
    assert kube.executor_count(ns, "orders") == 0
    kube.patch_status(ns, "orders", {"observedGeneration": 1, "phase": "Starting"})
    client.CoreV1Api(operator).create_namespaced_event(ns, {
        "metadata": {"generateName": "orders."},
        "involvedObject": {"apiVersion": f"{GROUP}/{VERSION}", "kind": "StreamTableHandoff",
                           "name": "orders", "namespace": ns, "uid": obj["metadata"]["uid"]},
        "reason": "Test", "message": "rbac test", "type": "Normal"})
    # Cluster-level reads kopf makes at startup.
    client.ApiextensionsV1Api(operator).list_custom_resource_definition()
    client.CoreV1Api(operator).list_namespace()


def test_operator_service_account_is_refused_elsewhere(setup: dict[str, Any]) -> None:
    operator, other = setup["operator"], setup["other"]
    core = client.CoreV1Api(operator)
    for call in (lambda: core.list_namespaced_secret(other),
                 lambda: core.create_namespaced_config_map(other, {"metadata": {"name": "x"}}),
                 lambda: client.CustomObjectsApi(operator).list_namespaced_custom_object(
                     GROUP, VERSION, other, "streamtablehandoffs"),
                 lambda: client.RbacAuthorizationV1Api(operator).create_cluster_role(
                     {"metadata": {"name": f"evil-{other}"}, "rules": []})):
        with pytest.raises(ApiException) as err:
            call()
        assert err.value.status == 403


def test_operator_runs_with_only_the_chart_rbac(setup: dict[str, Any], tmp_path: Path) -> None:
    admin, ns = setup["admin"], setup["watched"]
    objs = client.CustomObjectsApi(admin)
    env = {**os.environ, "KUBECONFIG": str(setup["kubeconfig"]), "HANDOFF_NAMESPACES": ns,
           "HANDOFF_METRICS_PORT": "0", "HANDOFF_STATUS_INTERVAL": "3600", "HANDOFF_DELETE_GRACE_SECONDS": "5"}
    log_path = tmp_path / "operator.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "handoff_operator.cli", "operator"], env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        objs.create_namespaced_custom_object(GROUP, VERSION, ns, "streamtablehandoffs", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "StreamTableHandoff",
            "metadata": {"name": "as-sa"},
            "spec": {"source": {"bootstrapServers": "127.0.0.1:1", "topics": ["t"]},
                     "sink": {"iceberg": {"table": "db.t", "catalog": {"properties": {
                         "type": "sql", "uri": "sqlite:////tmp/never.db"}}}}}})

        def reconciled() -> dict[str, Any] | None:
            obj = objs.get_namespaced_custom_object(GROUP, VERSION, ns, "streamtablehandoffs", "as-sa")
            status = obj.get("status") or {}
            return obj if status.get("observedGeneration") == 1 and status.get("conditions") else None

        obj = _while_running(reconciled, proc, log_path, "the operator (as its ServiceAccount) wrote status")
        assert "handoff.io/finalizer" in obj["metadata"].get("finalizers", [])
        apps = client.AppsV1Api(admin)
        assert apps.read_namespaced_deployment("as-sa-driver", ns) is not None

        objs.delete_namespaced_custom_object(GROUP, VERSION, ns, "streamtablehandoffs", "as-sa")

        def gone() -> bool:
            try:
                objs.get_namespaced_custom_object(GROUP, VERSION, ns, "streamtablehandoffs", "as-sa")
                return False
            except ApiException as err:
                return err.status == 404

        _while_running(gone, proc, log_path, "the operator released its finalizer")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log_text = log_path.read_text()
    assert "Forbidden" not in log_text and " 403" not in log_text, log_text[-5000:]


def _while_running(probe: Any, proc: subprocess.Popen, log_path: Path, what: str) -> Any:
    """`eventually`, giving up as soon as the operator has exited, and showing its log on failure."""
    return eventually(probe, what, timeout=120, interval=0.5,
                      give_up=lambda: None if proc.poll() is None else f"the operator exited with {proc.returncode}",
                      context=lambda: f"--- operator log ---\n{log_path.read_text()[-5000:]}")
