"""A checkpoint on S3 (spec.checkpoint.location s3a://…) through the test bed's real kube-apiserver: the CRD admits
the new fields, the operator creates no checkpoint PersistentVolumeClaim and mounts no volume, the driver
Deployment's pod takes the credentials from the named Secret by secretKeyRef (they appear nowhere else: not in the
app config the operator writes), the pod the ReplicaSet creates from it passes admission, and an object store
without a shipped connector (abfs://) is an InvalidSpec naming s3a:// and gs://. A checkpoint on Google Cloud Storage
(gs://) gets its key Secret mounted and Google's variable pointing at it, in the Deployment and in the admitted pod."""
from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from operator_support import Cluster, Operator, base_spec, eventually

pytestmark = pytest.mark.apiserver

CHECKPOINT = {"location": "s3a://lake/checkpoints/orders", "credentialsSecret": "ckpt-s3",
              "endpoint": "http://minio.storage:9000", "pathStyleAccess": True, "region": "eu-west-1"}


def _env(container: Any) -> dict[str, Any]:
    return {e["name"]: e for e in container["env"]}


def test_s3_checkpoint_renders_the_secret_into_the_drivers_env_and_no_volume(cluster: Cluster) -> None:
    ns = cluster.new_namespace("ckpt")
    cluster.core.create_namespaced_secret(ns, client.V1Secret(
        metadata=client.V1ObjectMeta(name="ckpt-s3"),
        string_data={"AWS_ACCESS_KEY_ID": "AKIA-TESTBED", "AWS_SECRET_ACCESS_KEY": "testbed-secret-key"}))
    op = Operator(cluster.kubeconfig, status_interval=1.0)
    op.start()
    try:
        cluster.create(ns, "orders", base_spec(checkpoint=CHECKPOINT))
        dep = eventually(lambda: cluster.apps.read_namespaced_deployment("orders-driver", ns), "driver Deployment")
        raw = cluster.api.sanitize_for_serialization(dep)
        pod = raw["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = _env(container)
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            assert env[key]["valueFrom"]["secretKeyRef"] == {"name": "ckpt-s3", "key": key}
        assert env["HANDOFF_CHECKPOINT_S3_ENDPOINT"]["value"] == "http://minio.storage:9000"
        assert env["HANDOFF_CHECKPOINT_S3_PATH_STYLE"]["value"] == "true"
        assert env["HANDOFF_CHECKPOINT_S3_REGION"]["value"] == "eu-west-1"
        assert "checkpoint" not in [v["name"] for v in pod["volumes"]]
        assert not cluster.children(ns, "orders")["PersistentVolumeClaim"]
        assert not cluster.core.list_namespaced_persistent_volume_claim(ns).items
        # the app config the driver reads names the location; the keys are in no ConfigMap or Secret of the operator
        cm = cluster.core.read_namespaced_config_map("orders-app", ns).data
        assert json.loads(cm["app.json"])["checkpointLocation"] == "s3a://lake/checkpoints/orders"
        assert "testbed-secret-key" not in json.dumps(cm) and "AKIA-TESTBED" not in json.dumps(cm)
        # the pod kube-controller-manager creates from the Deployment passes admission with the same env
        (driver,) = eventually(lambda: cluster.driver_pods(ns, "orders"), "driver pod", timeout=60)
        refs = {e.name: e.value_from.secret_key_ref.name for e in driver.spec.containers[0].env
                if e.value_from is not None and e.value_from.secret_key_ref is not None}
        assert refs["AWS_ACCESS_KEY_ID"] == refs["AWS_SECRET_ACCESS_KEY"] == "ckpt-s3"

        # abfs:// has no connector in the image: InvalidSpec naming the field and the fix, and nothing is created
        cluster.create(ns, "azure", base_spec(checkpoint={"location": "abfs://c@acct.dfs.core.windows.net/ckpt"}))
        cond = cluster.wait_condition(ns, "azure", "Ready", "False", "InvalidSpec")
        assert "spec.checkpoint.location" in cond["message"] and "s3a://<bucket>/<prefix>" in cond["message"]
        assert "gs://<bucket>/<prefix>" in cond["message"]
        assert not cluster.children(ns, "azure")["Deployment"]

        # gs://: the key Secret mounted read-only, GOOGLE_APPLICATION_CREDENTIALS naming the file, no volume claim
        cluster.core.create_namespaced_secret(ns, client.V1Secret(
            metadata=client.V1ObjectMeta(name="ckpt-gcs"), string_data={"key.json": '{"type": "service_account"}'}))
        cluster.create(ns, "gcs", base_spec(checkpoint={"location": "gs://lake/checkpoints/gcs",
                                                        "credentialsSecret": "ckpt-gcs",
                                                        "endpoint": "http://fake-gcs.storage:4443"}))
        dep = eventually(lambda: cluster.apps.read_namespaced_deployment("gcs-driver", ns), "gs:// driver Deployment")
        pod = cluster.api.sanitize_for_serialization(dep)["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env["HANDOFF_CHECKPOINT_GCS_ENDPOINT"] == "http://fake-gcs.storage:4443"
        (key_volume,) = [v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == "ckpt-gcs"]
        (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == key_volume["name"]]
        assert env["GOOGLE_APPLICATION_CREDENTIALS"] == mount["mountPath"] + "/key.json"
        assert not cluster.children(ns, "gcs")["PersistentVolumeClaim"]
        (driver,) = eventually(lambda: cluster.driver_pods(ns, "gcs"), "gs:// driver pod", timeout=60)
        assert any(v.secret is not None and v.secret.secret_name == "ckpt-gcs" for v in driver.spec.volumes)
    finally:
        cluster.delete_all_handoffs()
        op.stop()
