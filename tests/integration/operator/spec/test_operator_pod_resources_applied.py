"""Pod resources (cores, coreRequest, coreLimit, memory, memoryOverhead, memoryOverheadFactor of
spec.spark.driver and spec.spark.executor) through the test bed's real kube-apiserver: applied with `kubectl apply`,
the driver Deployment's container requests and limits are heap + overhead and the CPU given, Spark is told the same
numbers, the driver pod passes admission, nothing fights the API server (the Deployment's generation stays, `kubectl
diff` of the handoff is empty), and the CRD refuses what cannot work at apply, naming the field. Then Spark itself
(pyspark's Kubernetes backend, no mocks) creates an executor pod from the rendered config: its memory is heap +
overhead and its CPU the request and limit given."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from handoff_operator import yaml_text
from operator_support import (PROBE_DRIVER, Cluster, Operator, base_spec, eventually, kubectl, local_driver_conf,
                              stop_driver)

pytestmark = pytest.mark.apiserver


def _manifest(tmp_path: Path, ns: str, name: str, spec: dict[str, Any]) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml_text.dump({"apiVersion": "handoff.io/v1alpha1", "kind": "StreamTableHandoff",
                                    "metadata": {"name": name, "namespace": ns}, "spec": spec}))
    return path


def _sized_spec() -> dict[str, Any]:
    spec = base_spec(checkpoint={"location": "file:///mnt/checkpoints/orders"})
    spec["spark"]["driver"] = {"cores": 2, "memory": "1Gi", "coreRequest": "0.5", "memoryOverhead": "512Mi"}
    spec["spark"]["executor"] = {"cores": 2, "memory": "1Gi", "coreRequest": "250m", "coreLimit": "1.5",
                                 "memoryOverheadFactor": 0.5}
    return spec


def test_resources_applied_with_kubectl_size_the_driver_and_tell_spark_the_same(cluster: Cluster,
                                                                                tmp_path: Path) -> None:
    ns = cluster.new_namespace("sized")
    op = Operator(cluster.kubeconfig, status_interval=1.0)
    op.start()
    try:
        manifest = _manifest(tmp_path, ns, "orders", _sized_spec())
        kubectl(cluster.kubeconfig, "apply", "-f", str(manifest))
        dep = eventually(lambda: cluster.apps.read_namespaced_deployment("orders-driver", ns), "driver Deployment")
        (container,) = cluster.api.sanitize_for_serialization(dep)["spec"]["template"]["spec"]["containers"]
        # 1Gi heap + 512Mi overhead; 0.5 core requested (written back as 500m), the limit is cores.
        assert container["resources"] == {"requests": {"cpu": "500m", "memory": "1536Mi"},
                                          "limits": {"cpu": "2", "memory": "1536Mi"}}
        conf = json.loads(cluster.core.read_namespaced_config_map("orders-app", ns).data["app.json"])["sparkConf"]
        assert conf["spark.driver.memoryOverhead"] == "512m"
        assert conf["spark.executor.memoryOverheadFactor"] == "0.5"
        assert (conf["spark.kubernetes.executor.request.cores"], conf["spark.kubernetes.executor.limit.cores"]) == \
            ("250m", "1500m")
        (driver,) = eventually(lambda: cluster.driver_pods(ns, "orders"), "driver pod", timeout=60)
        assert driver.spec.containers[0].resources.limits["memory"] == "1536Mi"

        # Nothing the API server writes back differs from what the operator applies: status refreshes leave the
        # Deployment alone, and the handoff as applied has nothing to diff (what Argo CD compares).
        generation = dep.metadata.generation
        time.sleep(5)
        assert cluster.apps.read_namespaced_deployment("orders-driver", ns).metadata.generation == generation
        out = kubectl(cluster.kubeconfig, "diff", "-f", str(manifest), check=False)
        assert out.returncode == 0, out.stdout + out.stderr

        # What cannot work is refused at apply, naming the field.
        bad = base_spec()
        bad["spark"]["executor"] = {"cores": 1, "memory": "1Gi", "coreRequest": "2"}
        out = kubectl(cluster.kubeconfig, "apply", "-f", str(_manifest(tmp_path, ns, "greedy", bad)), check=False)
        assert out.returncode != 0 and "spec.spark.executor.coreRequest" in out.stderr, out.stderr
        assert "must not exceed coreLimit" in out.stderr
        bad = base_spec()
        bad["spark"]["driver"] = {"memoryOverhead": "1Gi", "memoryOverheadFactor": 0.2}
        out = kubectl(cluster.kubeconfig, "apply", "-f", str(_manifest(tmp_path, ns, "twice", bad)), check=False)
        assert out.returncode != 0 and "spec.spark.driver.memoryOverheadFactor" in out.stderr, out.stderr
        bad = base_spec()
        bad["spark"]["executor"] = {"coreLimit": "0.0001"}
        out = kubectl(cluster.kubeconfig, "apply", "-f", str(_manifest(tmp_path, ns, "fine", bad)), check=False)
        assert out.returncode != 0 and "spec.spark.executor.coreLimit" in out.stderr, out.stderr

        # A sparkConf key that would tell Spark another driver size is admitted by the schema but refused by the
        # operator, naming the key and the fields to use.
        conflicting = base_spec()
        conflicting["spark"]["sparkConf"] = {"spark.driver.memoryOverhead": "2g"}
        kubectl(cluster.kubeconfig, "apply", "-f", str(_manifest(tmp_path, ns, "conflict", conflicting)))
        cond = cluster.wait_condition(ns, "conflict", "Ready", "False", timeout=60)
        assert cond["reason"] == "InvalidSpec", cond
        assert "spec.spark.sparkConf[spark.driver.memoryOverhead]" in cond["message"], cond
        assert "spec.spark.driver.memory, memoryOverhead or memoryOverheadFactor" in cond["message"], cond
        # kubectl explain tells what the overhead is.
        out = kubectl(cluster.kubeconfig, "explain", "sth.spec.spark.executor.memoryOverhead")
        assert "beyond the JVM heap" in out.stdout, out.stdout
    finally:
        cluster.delete_all_handoffs()
        op.stop()


def test_spark_sizes_executor_pods_as_the_spec_says(cluster: Cluster, apiserver, tmp_path: Path) -> None:
    ns = cluster.new_namespace("sizedexec")
    op = Operator(cluster.kubeconfig, status_interval=1.0)
    op.start()
    driver = None
    try:
        cluster.create(ns, "orders", _sized_spec())
        cluster.wait_condition(ns, "orders", "Ready", "True", timeout=90)  # kwok runs the driver pod
        (driver_pod,) = cluster.driver_pods(ns, "orders")
        conf, _token = local_driver_conf(cluster, apiserver, ns, "orders", driver_pod.metadata.name)
        driver = subprocess.Popen([sys.executable, "-c", PROBE_DRIVER, json.dumps(conf)], stdin=subprocess.PIPE,
                                  stdout=open(tmp_path / "driver.log", "w"), stderr=subprocess.STDOUT, text=True)
        selector = "handoff.io/name=orders,app.kubernetes.io/component=executor"
        try:
            pods = eventually(lambda: cluster.core.list_namespaced_pod(ns, label_selector=selector).items,
                              "executor pods created by Spark", timeout=240)
        except AssertionError:
            raise AssertionError((tmp_path / "driver.log").read_text()[-4000:]) from None
        (container,) = pods[0].spec.containers
        # 1Gi heap + max(384Mi, 0.5 × 1024Mi) = 1536Mi, requested and limited; CPU 250m requested, 1.5 limited.
        assert container.resources.requests == {"cpu": "250m", "memory": "1536Mi"}, container.resources
        assert container.resources.limits == {"cpu": "1500m", "memory": "1536Mi"}, container.resources
    finally:
        stop_driver(driver)
        cluster.delete_all_handoffs()
        op.stop()
