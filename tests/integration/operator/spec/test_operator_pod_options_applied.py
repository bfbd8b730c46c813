"""Pod options (spec.spark.pod, spec.spark.driver.pod, spec.spark.executor.pod) through the test bed's real
kube-apiserver: a handoff applied with `kubectl apply` (as Argo CD would) is admitted with them, the driver
Deployment the operator creates carries them, the driver pod kube-controller-manager creates from it passes the
API server's pod admission (priority class, ServiceAccount) with them, the operator does not fight the API server
over them (the Deployment's generation stays, `kubectl diff` of the handoff is empty), the CRD's rules refuse the
operator's own labels, and `kubectl explain` tells what the fields do. Then Spark itself (pyspark's Kubernetes
backend, no mocks) creates executor pods from the pod template the operator rendered."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from handoff_operator import yaml_text

from operator_support import (PROBE_DRIVER, Cluster, Operator, base_spec, eventually, kubectl, local_driver_conf,
                              stop_driver)

pytestmark = pytest.mark.apiserver

POD: dict[str, Any] = {
    "nodeSelector": {"pool": "spark"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "spark", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "preference": {"matchExpressions": [
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]}}]}},
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                   "whenUnsatisfiable": "ScheduleAnyway",
                                   "labelSelector": {"matchLabels": {"team": "payments"}}}],
    "imagePullSecrets": [{"name": "regcred"}],
    "labels": {"team": "payments"},
    "annotations": {"example.com/owner": "payments"},
    "env": [{"name": "TZ", "value": "UTC"},
            {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {"name": "api", "key": "token"}}}],
    "envFrom": [{"configMapRef": {"name": "settings"}}],
    "volumes": [{"name": "certs", "secret": {"secretName": "kafka-ca"}}, {"name": "tmp", "emptyDir": {}}],
    "volumeMounts": [{"name": "certs", "mountPath": "/etc/kafka-ca", "readOnly": True},
                     {"name": "tmp", "mountPath": "/tmp"}],
    "podSecurityContext": {"runAsNonRoot": True, "runAsUser": 185, "fsGroup": 185,
                           "seccompProfile": {"type": "RuntimeDefault"}},
    "containerSecurityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                                 "capabilities": {"drop": ["ALL"]}},
}


def _priority_class(cluster: Cluster) -> str:
    name = f"handoff-test-{uuid.uuid4().hex[:8]}"
    client.SchedulingV1Api(cluster.api).create_priority_class(
        client.V1PriorityClass(metadata=client.V1ObjectMeta(name=name), value=1000))
    return name


def _manifest(tmp_path: Path, ns: str, name: str, spec: dict[str, Any]) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml_text.dump({"apiVersion": "handoff.io/v1alpha1", "kind": "StreamTableHandoff",
                                    "metadata": {"name": name, "namespace": ns}, "spec": spec}))
    return path


def test_pod_options_applied_with_kubectl_reach_the_driver_deployment_and_pass_pod_admission(
        cluster: Cluster, tmp_path: Path) -> None:
    ns = cluster.new_namespace("pods")
    priority = _priority_class(cluster)
    spec = base_spec()
    spec["spark"]["pod"] = {**POD, "priorityClassName": priority}
    spec["spark"]["driver"]["pod"] = {"nodeSelector": {"pool": "drivers"}, "labels": {"tier": "driver"}}
    op = Operator(cluster.kubeconfig, status_interval=1.0)
    op.start()
    try:
        manifest = _manifest(tmp_path, ns, "orders", spec)
        kubectl(cluster.kubeconfig, "apply", "-f", str(manifest))
        dep = eventually(lambda: cluster.apps.read_namespaced_deployment("orders-driver", ns), "driver Deployment")
        raw = cluster.api.sanitize_for_serialization(dep)
        meta, pod = raw["spec"]["template"]["metadata"], raw["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert meta["labels"]["team"] == "payments" and meta["labels"]["tier"] == "driver"
        assert meta["labels"]["handoff.io/name"] == "orders"  # the selector's labels are the operator's
        assert meta["annotations"]["example.com/owner"] == "payments"
        assert pod["nodeSelector"] == {"pool": "drivers"}  # the driver's block wins
        for key, field in (("tolerations", "tolerations"), ("affinity", "affinity"),
                           ("topologySpreadConstraints", "topologySpreadConstraints"),
                           ("imagePullSecrets", "imagePullSecrets"), ("securityContext", "podSecurityContext")):
            assert pod[key] == POD[field], key
        assert pod["priorityClassName"] == priority
        assert container["securityContext"] == POD["containerSecurityContext"]
        env = {e["name"]: e for e in container["env"]}
        assert env["TZ"]["value"] == "UTC" and env["API_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "token"
        assert container["envFrom"] == POD["envFrom"]
        assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
        assert {"name": "certs", "secret": {"secretName": "kafka-ca", "defaultMode": 420}} in pod["volumes"]

        # The ReplicaSet's pod passes the API server's pod admission with them (Priority resolves the class).
        (driver,) = eventually(lambda: cluster.driver_pods(ns, "orders"), "driver pod", timeout=60)
        assert driver.spec.priority == 1000 and driver.spec.priority_class_name == priority
        assert driver.spec.node_selector == {"pool": "drivers"}
        assert [(t.key, t.effect) for t in driver.spec.tolerations][:1] == [("dedicated", "NoSchedule")]
        assert driver.spec.security_context.run_as_non_root is True
        assert driver.metadata.labels["team"] == "payments"

        # The executors' template is in the ConfigMap the driver mounts, and Spark is pointed at it.
        cm = cluster.core.read_namespaced_config_map("orders-app", ns).data
        template = json.loads(cm["executor-pod-template.json"])
        assert template["spec"]["nodeSelector"] == {"pool": "spark"}
        assert "tier" not in template["metadata"]["labels"]
        assert json.loads(cm["app.json"])["sparkConf"]["spark.kubernetes.executor.podTemplateFile"] == \
            "/etc/handoff/executor-pod-template.json"

        # No fight with the API server's defaults: status refreshes leave the Deployment alone, and the handoff
        # as applied has nothing to diff (what Argo CD compares).
        generation = dep.metadata.generation
        time.sleep(5)
        assert cluster.apps.read_namespaced_deployment("orders-driver", ns).metadata.generation == generation
        out = kubectl(cluster.kubeconfig, "diff", "-f", str(manifest), check=False)
        assert out.returncode == 0, out.stdout + out.stderr

        # The CRD refuses the operator's own labels at apply, naming them.
        bad = base_spec()
        bad["spark"]["executor"]["pod"] = {"labels": {"handoff.io/name": "other"}}
        out = kubectl(cluster.kubeconfig, "apply", "-f", str(_manifest(tmp_path, ns, "bad", bad)), check=False)
        assert out.returncode != 0 and "spec.spark.executor.pod.labels" in out.stderr, out.stderr
        assert "must not use the operator's or Spark's own keys" in out.stderr
        # kubectl explain tells what a role's block does.
        out = kubectl(cluster.kubeconfig, "explain", "sth.spec.spark.driver.pod")
        assert "laid over" in out.stdout and "tolerations" in out.stdout
    finally:
        cluster.delete_all_handoffs()
        op.stop()


def test_spark_creates_executor_pods_from_the_rendered_pod_template(cluster: Cluster, apiserver,
                                                                     tmp_path: Path) -> None:
    ns = cluster.new_namespace("podtpl")
    spec = base_spec(checkpoint={"location": "file:///mnt/checkpoints/orders"})
    spec["spark"]["pod"] = {k: v for k, v in POD.items() if k != "nodeSelector"}
    spec["spark"]["executor"]["pod"] = {"env": [{"name": "ROLE", "value": "executor"}],
                                        "labels": {"tier": "executor"}}
    op = Operator(cluster.kubeconfig, status_interval=1.0)
    op.start()
    driver = None
    try:
        cluster.create(ns, "orders", spec)
        cluster.wait_condition(ns, "orders", "Ready", "True", timeout=90)  # kwok runs the driver pod
        (driver_pod,) = cluster.driver_pods(ns, "orders")
        conf, _token = local_driver_conf(cluster, apiserver, ns, "orders", driver_pod.metadata.name)
        # The file the driver pod reads from its mounted ConfigMap, here on this machine.
        template = tmp_path / "executor-pod-template.json"
        template.write_text(cluster.core.read_namespaced_config_map("orders-app", ns).data[template.name])
        assert conf["spark.kubernetes.executor.podTemplateFile"] == f"/etc/handoff/{template.name}"
        conf["spark.kubernetes.executor.podTemplateFile"] = str(template)
        driver = subprocess.Popen([sys.executable, "-c", PROBE_DRIVER, json.dumps(conf)], stdin=subprocess.PIPE,
                                  stdout=open(tmp_path / "driver.log", "w"), stderr=subprocess.STDOUT, text=True)
        selector = "handoff.io/name=orders,app.kubernetes.io/component=executor"
        try:
            pods = eventually(lambda: cluster.core.list_namespaced_pod(ns, label_selector=selector).items,
                              "executor pods created by Spark", timeout=240)
        except AssertionError:
            raise AssertionError((tmp_path / "driver.log").read_text()[-4000:]) from None
        pod = pods[0]
        assert pod.metadata.labels["team"] == "payments" and pod.metadata.labels["tier"] == "executor"
        assert pod.metadata.labels["spark-role"] == "executor"  # Spark's own labels beside the user's
        assert pod.metadata.annotations["example.com/owner"] == "payments"
        assert [(t.key, t.value, t.effect) for t in pod.spec.tolerations][:1] == [("dedicated", "spark",
                                                                                 "NoSchedule")]
        assert pod.spec.affinity.node_affinity.preferred_during_scheduling_ignored_during_execution[0].weight == 10
        assert pod.spec.topology_spread_constraints[0].topology_key == "kubernetes.io/hostname"
        assert [s.name for s in pod.spec.image_pull_secrets] == ["regcred"]
        assert pod.spec.security_context.run_as_non_root is True and pod.spec.security_context.fs_group == 185
        (container,) = pod.spec.containers
        assert container.name == "executor"
        assert container.security_context.read_only_root_filesystem is True
        env = {e.name: e for e in container.env}
        assert env["TZ"].value == "UTC" and env["ROLE"].value == "executor"
        assert env["API_TOKEN"].value_from.secret_key_ref.name == "api"
        assert "SPARK_EXECUTOR_ID" in env  # Spark's own environment is still there
        assert [e.config_map_ref.name for e in container.env_from] == ["settings"]
        assert {"/etc/kafka-ca", "/tmp"} <= {m.mount_path for m in container.volume_mounts}
        assert {"certs", "tmp"} <= {v.name for v in pod.spec.volumes}
        assert container.image == conf["spark.kubernetes.container.image"]
        assert container.resources.requests["cpu"] == "2"
    finally:
        stop_driver(driver)
        cluster.delete_all_handoffs()
        op.stop()
