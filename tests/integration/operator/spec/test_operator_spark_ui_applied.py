"""The driver's Spark UI (spec.spark.ui) through the test bed's real kube-apiserver and kube-controller-manager: a
handoff applied with `kubectl apply` gets a ClusterIP Service `<name>-ui` owned by it, whose endpoints (the
EndpointSlice controller's, not the operator's) are the driver pod's UI port once the pod runs (kwok runs it);
`kubectl handoff status` prints the port-forward to it; `ui.service: false` makes the operator delete the Service it
made, without restarting the driver. (That the UI answers HTTP needs a real node: kwok's pods have no network.)

The opt-in Ingress (spec.spark.ui.ingress) the same way: applied with `kubectl apply`, the operator makes Ingress
`<name>-ui` owned by the handoff, with the host, path, class, TLS and annotations given and the UI Service's port
4040 as its backend; `kubectl handoff status` prints its URL (https with TLS); a changed spec changes it (a path
prefix also reaches the driver as spark.ui.proxyBase), and removing ui.ingress deletes it. The API server refuses an
ingress with ui.service: false (the CRD's CEL rule) and a bad host (its pattern). The test bed runs no ingress
controller: what is checked is the Ingress object, not traffic through it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from handoff_operator import yaml_text

from operator_support import Cluster, Operator, base_spec, eventually, kubectl

pytestmark = pytest.mark.apiserver


def _plugin(kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`kubectl handoff ...` with the package's scripts on PATH (where pip put kubectl-handoff)."""
    env = {**os.environ, "KUBECONFIG": kubeconfig,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["kubectl", "handoff", *args], capture_output=True, text=True, env=env, timeout=180)


def _manifest(tmp_path: Path, ns: str, name: str, spec: dict[str, Any]) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml_text.dump({"apiVersion": "handoff.io/v1alpha1", "kind": "StreamTableHandoff",
                                    "metadata": {"name": name, "namespace": ns}, "spec": spec}))
    return path


def _ui_endpoints(cluster: Cluster, ns: str) -> list[tuple[str, int]] | None:
    slices = client.DiscoveryV1Api(cluster.api).list_namespaced_endpoint_slice(
        ns, label_selector="kubernetes.io/service-name=orders-ui").items
    found = [(e.target_ref.name, p.port) for s in slices for e in s.endpoints or () for p in s.ports or ()
             if e.target_ref is not None and (e.conditions is None or e.conditions.ready)]
    return found or None


def test_the_ui_service_reaches_the_running_driver_and_status_says_how_to_open_it(cluster: Cluster,
                                                                                    tmp_path: Path) -> None:
    ns = cluster.new_namespace("sparkui")
    op = Operator(cluster.kubeconfig, status_interval=1.0)
    op.start()
    try:
        spec = base_spec(checkpoint={"location": "file:///mnt/checkpoints/orders"})
        kubectl(cluster.kubeconfig, "apply", "-f", str(_manifest(tmp_path, ns, "orders", spec)))
        cluster.wait_condition(ns, "orders", "Ready", "True", timeout=90)  # kwok runs the driver pod
        svc = eventually(lambda: cluster.core.read_namespaced_service("orders-ui", ns), "the UI Service")
        assert svc.spec.type == "ClusterIP" and svc.spec.cluster_ip not in (None, "None")
        assert svc.metadata.owner_references[0].kind == "StreamTableHandoff"
        (driver,) = cluster.driver_pods(ns, "orders")
        assert eventually(lambda: _ui_endpoints(cluster, ns), "the UI Service's endpoints") == \
            [(driver.metadata.name, 4040)]

        out = _plugin(cluster.kubeconfig, "status", "orders", "-n", ns)
        assert out.returncode == 0, out.stderr
        assert f"kubectl port-forward -n {ns} svc/orders-ui 4040, then http://localhost:4040" in out.stdout, out.stdout

        # Turned off: the operator deletes the Service it made, and the driver is not restarted for it.
        generation = cluster.apps.read_namespaced_deployment("orders-driver", ns).metadata.generation
        spec["spark"]["ui"] = {"service": False}
        kubectl(cluster.kubeconfig, "apply", "-f", str(_manifest(tmp_path, ns, "orders", spec)))
        eventually(lambda: "orders-ui" not in [s.metadata.name for s in cluster.core.list_namespaced_service(ns).items]
                   or None, "the UI Service deleted")
        assert cluster.apps.read_namespaced_deployment("orders-driver", ns).metadata.generation == generation
        out = _plugin(cluster.kubeconfig, "status", "orders", "-n", ns)
        assert f"kubectl port-forward -n {ns} svc/orders-driver 4040" in out.stdout, out.stdout
    finally:
        cluster.delete_all_handoffs()
        op.stop()


def _ingress(cluster: Cluster, ns: str) -> client.V1Ingress | None:
    try:
        return client.NetworkingV1Api(cluster.api).read_namespaced_ingress("orders-ui", ns)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _submit_args(cluster: Cluster, ns: str) -> str:
    # The operator makes the UI's Service and Ingress in the same reconcile as the driver's Deployment, and may make
    # them first: a test that has seen the Ingress waits for the Deployment too (eventually retries the 404).
    deployment = eventually(lambda: cluster.apps.read_namespaced_deployment("orders-driver", ns),
                            "the driver's Deployment")
    (container,) = deployment.spec.template.spec.containers
    return next(e.value for e in container.env if e.name == "PYSPARK_SUBMIT_ARGS")


def test_the_opt_in_ingress_follows_the_spec_and_status_prints_its_url(cluster: Cluster, tmp_path: Path) -> None:
    ns = cluster.new_namespace("sparkuiing")
    op = Operator(cluster.kubeconfig, status_interval=1.0)
    op.start()
    try:
        spec = base_spec(checkpoint={"location": "file:///mnt/checkpoints/orders"})
        # Refused at admission, before the operator sees anything: the CRD's CEL rule and the host's pattern.
        spec["spark"]["ui"] = {"service": False, "ingress": {"host": "orders-ui.example.com"}}
        out = kubectl(cluster.kubeconfig, "apply", "-f", str(_manifest(tmp_path, ns, "orders", spec)), check=False)
        assert out.returncode != 0
        assert "spec.spark.ui: Invalid value" in out.stderr and \
            "spark.ui.ingress needs the UI Service it points to: remove spark.ui.service: false" in out.stderr, \
            out.stderr
        spec["spark"]["ui"] = {"ingress": {"host": "Orders UI"}}
        out = kubectl(cluster.kubeconfig, "apply", "-f", str(_manifest(tmp_path, ns, "orders", spec)), check=False)
        assert out.returncode != 0 and "spec.spark.ui.ingress.host" in out.stderr, out.stderr
        spec["spark"]["ui"] = {"ingress": {"host": "spark.example.com", "path": "/spark/orders(/|$)(.*)"}}
        out = kubectl(cluster.kubeconfig, "apply", "-f", str(_manifest(tmp_path, ns, "orders", spec)), check=False)
        assert out.returncode != 0 and "regular-expression characters needs pathType: ImplementationSpecific" \
            in out.stderr, out.stderr

        spec["spark"]["ui"] = {"ingress": {
            "host": "orders-ui.example.com", "ingressClassName": "nginx", "tls": {"secretName": "orders-ui-tls"},
            "annotations": {"cert-manager.io/cluster-issuer": "letsencrypt",
                            "nginx.ingress.kubernetes.io/auth-url": "https://auth.example.com/check"}}}
        kubectl(cluster.kubeconfig, "apply", "-f", str(_manifest(tmp_path, ns, "orders", spec)))
        handoff = cluster.get(ns, "orders")
        # The API server's defaults from the CRD.
        assert handoff["spec"]["spark"]["ui"]["ingress"]["path"] == "/"
        assert handoff["spec"]["spark"]["ui"]["ingress"]["pathType"] == "Prefix"
        ing = eventually(lambda: _ingress(cluster, ns), "the UI Ingress")
        (ref,) = ing.metadata.owner_references
        assert (ref.kind, ref.name, ref.uid, ref.controller) == (
            "StreamTableHandoff", "orders", handoff["metadata"]["uid"], True)
        assert ing.metadata.annotations == {"cert-manager.io/cluster-issuer": "letsencrypt",
                                            "nginx.ingress.kubernetes.io/auth-url": "https://auth.example.com/check"}
        assert ing.spec.ingress_class_name == "nginx"
        (rule,) = ing.spec.rules
        (path,) = rule.http.paths
        assert (rule.host, path.path, path.path_type) == ("orders-ui.example.com", "/", "Prefix")
        assert (path.backend.service.name, path.backend.service.port.number) == ("orders-ui", 4040)
        # The backend is the operator's UI Service, on that port.
        svc = eventually(lambda: cluster.core.read_namespaced_service("orders-ui", ns), "the UI Service")
        assert [p.port for p in svc.spec.ports] == [4040]
        (tls,) = ing.spec.tls
        assert (tls.hosts, tls.secret_name) == (["orders-ui.example.com"], "orders-ui-tls")
        assert "proxyBase" not in _submit_args(cluster, ns)

        out = _plugin(cluster.kubeconfig, "status", "orders", "-n", ns)
        assert out.returncode == 0, out.stderr
        assert ("spark ui    https://orders-ui.example.com/ (Ingress orders-ui), or "
                f"kubectl port-forward -n {ns} svc/orders-ui 4040, then http://localhost:4040 "
                "(only while the driver runs: a stopped driver's UI is not kept)") in out.stdout, out.stdout

        # Changed: under a path of a shared host, the way ingress-nginx strips a prefix (a regex path and
        # rewrite-target), no TLS, the auth annotation kept and cert-manager's dropped, the default class.
        rewrite = {"nginx.ingress.kubernetes.io/auth-url": "https://auth.example.com/check",
                   "nginx.ingress.kubernetes.io/use-regex": "true",
                   "nginx.ingress.kubernetes.io/rewrite-target": "/$2"}
        spec["spark"]["ui"] = {"ingress": {"host": "spark.example.com", "path": "/spark/orders(/|$)(.*)",
                                           "pathType": "ImplementationSpecific", "annotations": rewrite}}
        kubectl(cluster.kubeconfig, "apply", "-f", str(_manifest(tmp_path, ns, "orders", spec)))

        def changed() -> client.V1Ingress | None:
            found = _ingress(cluster, ns)
            return found if found is not None and found.spec.rules[0].host == "spark.example.com" else None

        ing = eventually(changed, "the UI Ingress changed")
        (path,) = ing.spec.rules[0].http.paths
        assert (path.path, path.path_type) == ("/spark/orders(/|$)(.*)", "ImplementationSpecific")
        assert ing.spec.tls is None and ing.spec.ingress_class_name is None
        assert ing.metadata.annotations == rewrite
        # Spark's links must start with the prefix, its redirects go under it: the driver is started so.
        eventually(lambda: "--conf spark.ui.proxyBase=/spark/orders --conf spark.ui.proxyRedirectUri="
                           "http://spark.example.com " in _submit_args(cluster, ns) or None,
                   "spark.ui.proxyBase in the driver's PYSPARK_SUBMIT_ARGS")
        out = _plugin(cluster.kubeconfig, "status", "orders", "-n", ns)
        assert "spark ui    http://spark.example.com/spark/orders/ (Ingress orders-ui)" in out.stdout, out.stdout

        # Removed: the operator deletes the Ingress it made, and status is back to the port-forward alone.
        del spec["spark"]["ui"]
        kubectl(cluster.kubeconfig, "apply", "-f", str(_manifest(tmp_path, ns, "orders", spec)))
        eventually(lambda: _ingress(cluster, ns) is None or None, "the UI Ingress deleted")
        assert cluster.core.read_namespaced_service("orders-ui", ns).metadata.name == "orders-ui"
        out = _plugin(cluster.kubeconfig, "status", "orders", "-n", ns)
        assert "Ingress" not in out.stdout and \
            f"spark ui    kubectl port-forward -n {ns} svc/orders-ui 4040, then http://localhost:4040" in out.stdout
    finally:
        cluster.delete_all_handoffs()
        op.stop()
