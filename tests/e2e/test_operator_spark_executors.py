"""Spark itself (pyspark 4.3's own Kubernetes backend, no mocks) creates executor pods from the settings the
operator rendered into the handoff's app.json, against the real kube-apiserver: pod names from the prefix,
image, executor resources, the handoff's labels, and an ownerReference to the driver pod (so executors go
when the driver goes). The driver runs in a subprocess on this machine instead of in the driver pod, so only
its API address, CA and host are overridden and it authenticates with a token of the driver's own
ServiceAccount (so the rendered Role is what authorizes Spark); everything else is the rendered config. kwok runs the
executor pods, and the operator's status counts them."""
from __future__ import annotations

import json
import subprocess
import sys


import pytest

from operator_support import (PROBE_DRIVER, Cluster, Operator, base_spec, eventually, kubectl, local_driver_conf,
                              stop_driver)

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

def test_spark_creates_executor_pods_from_the_rendered_settings(cluster: Cluster, apiserver, tmp_path) -> None:
    ns = cluster.new_namespace("spark")
    op = Operator(cluster.kubeconfig, status_interval=1.0)
    op.start()
    driver = None
    try:
        cluster.create(ns, "orders", base_spec(checkpoint={"location": "file:///mnt/checkpoints/orders"}))
        cluster.wait_condition(ns, "orders", "Ready", "True", timeout=90)  # kwok runs the driver pod
        (driver_pod,) = cluster.driver_pods(ns, "orders")
        app = json.loads(cluster.core.read_namespaced_config_map("orders-app", ns).data["app.json"])
        # The driver authenticates as the ServiceAccount the operator made for it, so the Role the
        # operator rendered is what lets Spark manage its executors (real RBAC in the test bed).
        conf, _token = local_driver_conf(cluster, apiserver, ns, "orders", driver_pod.metadata.name)
        sa = f"system:serviceaccount:{ns}:orders-driver"
        can = lambda *a: kubectl(cluster.kubeconfig, "auth", "can-i", *a, "-n", ns, "--as", sa,  # noqa: E731
                                 check=False).stdout.strip()
        assert can("create", "pods") == "yes" and can("list", "secrets") == "no"
        driver = subprocess.Popen([sys.executable, "-c", PROBE_DRIVER, json.dumps(conf)], stdin=subprocess.PIPE,
                                  stdout=open(tmp_path / "driver.log", "w"), stderr=subprocess.STDOUT, text=True)
        selector = "handoff.io/name=orders,app.kubernetes.io/component=executor"
        pods = eventually(lambda: cluster.core.list_namespaced_pod(ns, label_selector=selector).items,
                          "executor pods created by Spark", timeout=240)
        pod = pods[0]
        assert pod.metadata.name.startswith("orders-exec-")
        assert pod.metadata.labels["spark-role"] == "executor"
        assert pod.metadata.labels["app.kubernetes.io/managed-by"] == "handoff-operator"
        (container,) = pod.spec.containers
        assert container.image == app["sparkConf"]["spark.kubernetes.container.image"]
        assert container.resources.requests["cpu"] == "2"  # spec.spark.executor.cores
        assert [(r.kind, r.name) for r in pod.metadata.owner_references] == [("Pod", driver_pod.metadata.name)]
        assert len(pods) <= 3  # spec.scaling.maxExecutors
        # kwok runs the executor; the handoff's status counts it.
        eventually(lambda: (cluster.get(ns, "orders")["status"].get("executors") or {}).get("current", 0) >= 1,
                   "status.executors.current", timeout=90)
    finally:
        stop_driver(driver)
        cluster.delete_all_handoffs()
        op.stop()
