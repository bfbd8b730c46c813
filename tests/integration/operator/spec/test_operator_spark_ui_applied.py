"""The driver's Spark UI (spec.spark.ui) through the test bed's real kube-apiserver and kube-controller-manager: a
handoff applied with `kubectl apply` gets a ClusterIP Service `<name>-ui` owned by it, whose endpoints (the
EndpointSlice controller's, not the operator's) are the driver pod's UI port once the pod runs (kwok runs it);
`kubectl handoff status` prints the port-forward to it; `ui.service: false` makes the operator delete the Service it
made, without restarting the driver. (That the UI answers HTTP needs a real node: kwok's pods have no network.)"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from operator_support import Cluster, Operator, base_spec, eventually, kubectl

pytestmark = pytest.mark.apiserver


def _plugin(kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`kubectl handoff ...` with the package's scripts on PATH (where pip put kubectl-handoff)."""
    env = {**os.environ, "KUBECONFIG": kubeconfig,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["kubectl", "handoff", *args], capture_output=True, text=True, env=env, timeout=180)


def _manifest(tmp_path: Path, ns: str, name: str, spec: dict[str, Any]) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "handoff.io/v1alpha1", "kind": "StreamTableHandoff",
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
