"""Running the operator in-process against the test-bed kube-apiserver, and small helpers for its tests.

kopf runs in a thread with its own event loop (kopf.operator with stop_flag/ready_flag), so a test can
stop and start it (operator restart) and inspect everything through the real API meanwhile. There is no
kubelet: where a test needs a running driver, it writes the pod's status itself (pods/status).
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import kopf
import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from handoff_operator import register_handlers
from handoff_operator.runtime.settings import OperatorSettings, use_settings
from handoff_testbed.eventually import eventually as _eventually

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "handoff.io", "v1alpha1", "streamtablehandoffs"
IMAGE = "registry.test/handoff-spark:test"
#: A copy of Strimzi's KafkaTopic CRD, for retention through a KafkaTopic (the operator's and the chart's RBAC tests
#: of it).
STRIMZI_KAFKATOPIC_CRD = Path(__file__).resolve().parent / "data" / "strimzi-kafkatopic-crd.yaml"


#: What "not yet" looks like through the API: the object is not created yet (404), a field of its status is not
#: written yet (KeyError).
NOT_YET = (ApiException, KeyError)


def timeline(kubeconfig: str, namespace: str, name: str) -> list[dict[str, Any]]:
    """`kubectl handoff timeline NAME -o json` as a person runs it (the real kubectl finds the installed plugin),
    oldest first for the drills' order checks."""
    import json
    import sys

    env = {**os.environ, "KUBECONFIG": kubeconfig,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    out = subprocess.run(["kubectl", "handoff", "timeline", name, "-n", namespace, "-o", "json"],
                         capture_output=True, text=True, env=env, timeout=180)
    assert out.returncode == 0, out.stderr
    return list(reversed(json.loads(out.stdout)))


def first_index(rows: list[dict[str, Any]], kind: str, contains: str = "") -> int:
    """Where the first row of `kind` (whose text holds `contains`) stands; fails naming what the rows were."""
    for i, row in enumerate(rows):
        if row["kind"] == kind and contains in row["what"]:
            return i
    raise AssertionError(f"no {kind} row with {contains!r}: {[(r['source'], r['kind']) for r in rows]}")


def eventually(probe: Callable[[], T | None], what: str, timeout: float = 60.0,
               context: Callable[[], str] | None = None) -> T:
    """handoff_testbed.eventually for the operator's tests: the API server's "not yet" retried."""
    return _eventually(probe, what, timeout=timeout, retry_on=NOT_YET, context=context)


def kubectl(kubeconfig: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", "--kubeconfig", kubeconfig, *args], check=check, capture_output=True,
                          text=True, timeout=120)


def token_kubeconfig(apiserver: Any, path: Path, user: str, token: str) -> Path:
    """A kubeconfig for the test bed's API server that authenticates with a ServiceAccount token (e.g. from the
    TokenRequest API): what a pod running as that account would present."""
    from handoff_operator import yaml_text

    path.write_text(yaml_text.dump({
        "apiVersion": "v1", "kind": "Config", "current-context": user,
        "clusters": [{"name": "test", "cluster": {"server": apiserver.server,
                                                  "certificate-authority": str(apiserver.ca_cert)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": "test", "user": user}}],
    }))
    return path


def local_driver_conf(cluster: "Cluster", apiserver: Any, namespace: str, name: str,
                      driver_pod: str) -> tuple[dict[str, str], str]:
    """The rendered sparkConf of a handoff, for a driver run on this machine instead of in its pod, and a token
    of the driver's own ServiceAccount (so the rendered Role is what authorizes Spark). Only what differs
    between "in the driver pod" and "here" is overridden: API address, CA, token, driver host, memory."""
    import json

    app = json.loads(cluster.core.read_namespaced_config_map(f"{name}-app", namespace).data["app.json"])
    conf = dict(app["sparkConf"])
    token = cluster.core.create_namespaced_service_account_token(
        f"{name}-driver", namespace, {"spec": {"expirationSeconds": 3600}}).status.token
    conf.update({
        "spark.master": f"k8s://{apiserver.server}",
        "spark.kubernetes.authenticate.caCertFile": str(apiserver.ca_cert),
        "spark.kubernetes.authenticate.oauthToken": token,
        "spark.driver.host": "127.0.0.1",
        "spark.kubernetes.driver.pod.name": driver_pod,
        "spark.driver.memory": "512m",
    })
    conf.pop("spark.kubernetes.authenticate.oauthTokenFile")
    return conf, token


#: A Spark driver on this machine for `python -c PROBE_DRIVER '<sparkConf as JSON>'`: it starts a SparkSession with
#: that conf (so Spark's Kubernetes backend creates the executor pods the conf says), prints "driver up" and runs
#: until its stdin closes (`stop_driver`). Its start does not wait for executors to register (ratio 0): the test
#: bed's executor pods never run a process, and Spark's default on Kubernetes waits for 80 % of them for
#: spark.scheduler.maxRegisteredResourcesWaitingTime (30 s), which only delayed the stop.
PROBE_DRIVER = """
import json, sys
from pyspark.sql import SparkSession
conf = json.loads(sys.argv[1])
builder = SparkSession.builder.appName("handoff-executor-probe").config("spark.scheduler.minRegisteredResourcesRatio", "0")
for key, value in conf.items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
print("driver up", flush=True)
sys.stdin.read()          # until the test closes stdin
spark.stop()
"""


def stop_driver(driver: subprocess.Popen[str] | None) -> None:
    """End a local driver started with stdin=PIPE: closing stdin asks it to stop; killed if it does not."""
    if driver is None:
        return
    driver.stdin.close()  # type: ignore[union-attr]
    try:
        driver.wait(120)
    except subprocess.TimeoutExpired:
        driver.kill()
        driver.wait(30)


def install_chart_rbac(admin: client.ApiClient, apiserver: Any, namespace: str, values: dict[str, Any],
                       release: str) -> tuple[list[dict[str, Any]], str]:
    """Create the RBAC objects (ServiceAccount, (Cluster)Roles, bindings) the chart renders with `values`; returns
    them and a real token of the ServiceAccount (TokenRequest API)."""
    import helm_python as helm
    import yaml
    from kubernetes import utils

    rendered = helm.Chart.load(REPO / "charts/handoff-operator").render(values, name=release, namespace=namespace,
                                                                        is_install=True)
    docs = [d for path, text in rendered.items() if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]
    rbac_docs = [d for d in docs if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                                                  "RoleBinding")]
    utils.create_from_yaml(admin, yaml_objects=rbac_docs)
    (sa,) = [d for d in docs if d["kind"] == "ServiceAccount"]
    token = client.CoreV1Api(admin).create_namespaced_service_account_token(
        sa["metadata"]["name"], namespace, {"spec": {"expirationSeconds": 3600}}).status.token
    return rbac_docs, token


def token_client(apiserver: Any, token: str) -> client.ApiClient:
    """An API client that authenticates with a ServiceAccount token, as a pod running as that account would."""
    cfg = client.Configuration()
    cfg.host = apiserver.server
    cfg.ssl_ca_cert = str(apiserver.ca_cert)
    cfg.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(cfg)


def delete_cluster_rbac(admin: client.ApiClient, docs: list[dict[str, Any]]) -> None:
    """Delete the cluster-scoped RBAC objects among `docs` (namespaced ones go with their namespaces)."""
    rbac = client.RbacAuthorizationV1Api(admin)
    for d in docs:
        if d["kind"] == "ClusterRole":
            rbac.delete_cluster_role(d["metadata"]["name"])
        elif d["kind"] == "ClusterRoleBinding":
            rbac.delete_cluster_role_binding(d["metadata"]["name"])


def driver_kubeconfig(cluster: "Cluster", apiserver: Any, namespace: str, service_account: str) -> str:
    """A kubeconfig holding a real token of the driver's ServiceAccount (TokenRequest API): the rights the
    operator's rendered Role gives a driver pod, nothing more."""
    token = cluster.core.create_namespaced_service_account_token(
        service_account, namespace, {"spec": {"expirationSeconds": 3600}}).status.token
    return str(token_kubeconfig(apiserver, apiserver.workdir / f"driver-{namespace}.kubeconfig", "driver", token))


def install_crds(kubeconfig: str) -> None:
    out = kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"),
                  check=False)
    assert out.returncode == 0, out.stderr
    eventually(lambda: kubectl(kubeconfig, "wait", "--for=condition=Established", "--timeout=30s",
                               f"crd/{PLURAL}.{GROUP}", check=False).returncode == 0, "CRD Established")


class Operator:
    """The operator in a background thread; `start()`/`stop()` may be called repeatedly."""

    def __init__(self, kubeconfig: str, **settings: Any) -> None:
        self.kubeconfig = kubeconfig
        self.settings = OperatorSettings(metrics_port=None, default_image=IMAGE, **settings)
        self.thread: threading.Thread | None = None
        self.stop_flag: threading.Event | None = None

    def start(self) -> None:
        os.environ["KUBECONFIG"] = self.kubeconfig
        register_handlers()
        use_settings(self.settings)
        ready, stop = threading.Event(), threading.Event()
        self.stop_flag = stop

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            with contextlib.suppress(asyncio.CancelledError):
                scope: dict[str, Any] = ({"namespaces": self.settings.namespaces} if self.settings.namespaces
                                         else {"clusterwide": True})
                loop.run_until_complete(kopf.operator(standalone=True, ready_flag=ready, stop_flag=stop,
                                                      **scope))
            loop.close()

        self.thread = threading.Thread(target=run, name="kopf-operator", daemon=True)
        self.thread.start()
        if not ready.wait(60):
            raise AssertionError("the operator did not become ready")

    def stop(self) -> None:
        if self.thread is None or self.stop_flag is None:
            return
        self.stop_flag.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), "the operator did not stop"
        self.thread = None


class Cluster:
    """Typed API clients plus helpers over one namespace."""

    def __init__(self, kubeconfig: str) -> None:
        self.kubeconfig = kubeconfig
        self.api = config.new_client_from_config(config_file=kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.rbac = client.RbacAuthorizationV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.namespaces: list[str] = []

    def new_namespace(self, prefix: str = "op") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        self.namespaces.append(name)
        return name

    def create(self, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "StreamTableHandoff",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec})

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)

    def patch_spec(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                          {"spec": patch},
                                                          _content_type="application/merge-patch+json")

    def condition(self, namespace: str, name: str, type_: str) -> dict[str, Any] | None:
        status = self.get(namespace, name).get("status") or {}
        return next((c for c in status.get("conditions") or [] if c["type"] == type_), None)

    def wait_condition(self, namespace: str, name: str, type_: str, status: str,
                       reason: str | None = None, timeout: float = 60.0) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            cond = self.condition(namespace, name, type_)
            if cond and cond["status"] == status and (reason is None or cond["reason"] == reason):
                return cond
            return None
        try:
            return eventually(probe, f"{name}: {type_}={status} {reason or ''}", timeout)
        except AssertionError as exc:  # say what it was instead
            raise AssertionError(f"{exc}; the status: {(self.get(namespace, name).get('status') or {})}") from None

    def driver_pods(self, namespace: str, name: str) -> list[client.V1Pod]:
        pods = self.core.list_namespaced_pod(
            namespace, label_selector=f"handoff.io/name={name},app.kubernetes.io/component=driver").items
        return [p for p in pods if p.metadata.deletion_timestamp is None]

    def make_driver_crash(self, namespace: str, name: str, restarts: int, message: str) -> client.V1Pod:
        """Play kubelet: the driver container exited with an error and is in CrashLoopBackOff."""
        (pod,) = eventually(lambda: self.driver_pods(namespace, name), f"a driver pod for {name}")
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.core.patch_namespaced_pod_status(pod.metadata.name, namespace, {"status": {
            "phase": "Running", "startTime": now,
            "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now}],
            "containerStatuses": [{"name": "driver", "ready": False, "restartCount": restarts, "image": IMAGE,
                                   "imageID": "", "started": False,
                                   "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                   "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                                                                "message": message,
                                                                "startedAt": now, "finishedAt": now}}}],
        }})
        return pod

    def delete_all_handoffs(self, timeout: float = 90.0) -> None:
        """Delete every handoff in the namespaces this object created (the operator must be running
        to release the finalizers), so no later test meets leftovers."""
        for ns in self.namespaces:
            for item in self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]:
                with contextlib.suppress(ApiException):
                    self.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                                                item["metadata"]["name"])
        eventually(lambda: all(not self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
                               for ns in self.namespaces), "all test handoffs deleted", timeout)

    def make_driver_ready(self, namespace: str, name: str) -> client.V1Pod:
        """Play kubelet: mark the (single) driver pod Running and Ready through pods/status."""
        pods = eventually(lambda: self.driver_pods(namespace, name), f"a driver pod for {name}")
        assert len(pods) == 1, [p.metadata.name for p in pods]
        pod = pods[0]
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        patched = self.core.patch_namespaced_pod_status(pod.metadata.name, namespace, {"status": {
            "phase": "Running", "startTime": now,
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now},
                           {"type": "ContainersReady", "status": "True", "lastTransitionTime": now}],
            "containerStatuses": [{"name": "driver", "ready": True, "restartCount": 0, "image": IMAGE,
                                   "imageID": "", "started": True,
                                   "state": {"running": {"startedAt": now}}}],
        }})
        assert patched.status.phase == "Running", patched.status
        return pod

    def events(self, namespace: str, name: str) -> list[client.CoreV1Event]:
        return [e for e in self.core.list_namespaced_event(namespace).items
                if e.involved_object.name == name and e.involved_object.kind == "StreamTableHandoff"]

    def children(self, namespace: str, name: str) -> dict[str, list[Any]]:
        sel = f"handoff.io/name={name}"
        return {
            "Deployment": self.apps.list_namespaced_deployment(namespace, label_selector=sel).items,
            "ReplicaSet": self.apps.list_namespaced_replica_set(namespace, label_selector=sel).items,
            "Service": self.core.list_namespaced_service(namespace, label_selector=sel).items,
            "ConfigMap": self.core.list_namespaced_config_map(namespace, label_selector=sel).items,
            "Secret": self.core.list_namespaced_secret(namespace, label_selector=sel).items,
            "ServiceAccount": self.core.list_namespaced_service_account(namespace, label_selector=sel).items,
            "Role": self.rbac.list_namespaced_role(namespace, label_selector=sel).items,
            "RoleBinding": self.rbac.list_namespaced_role_binding(namespace, label_selector=sel).items,
            "PersistentVolumeClaim": self.core.list_namespaced_persistent_volume_claim(
                namespace, label_selector=sel).items,
        }


@contextlib.contextmanager
def operator_running(kubeconfig: str, **settings: Any) -> Iterator[Operator]:
    op = Operator(kubeconfig, **settings)
    op.start()
    try:
        yield op
    finally:
        op.stop()


def base_spec(bootstrap: str = "127.0.0.1:9", **overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "source": {"bootstrapServers": bootstrap, "topics": ["orders"]},
        "sink": {"iceberg": {"catalog": {"name": "lake", "properties": {
            "type": "sql", "uri": "sqlite:////nonexistent/lake.db", "warehouse": "file:///nonexistent"}},
            "table": "shop.orders", "partitionBy": ["day(created_at)"]}},
        "schema": {"columns": [{"name": "id", "type": "long"}, {"name": "created_at", "type": "timestamp"}],
                   "eventTimeColumn": "created_at"},
        "commitInterval": "10s",
        "scaling": {"minExecutors": 1, "maxExecutors": 3},
        "spark": {"driver": {"cores": 1, "memory": "1Gi"}, "executor": {"cores": 2, "memory": "2Gi"}},
    }
    spec.update(overrides)
    return spec


def sqlite_ledger_table(tmp_path: Path) -> tuple[dict[str, str], Any]:
    """An empty Iceberg table `shop.orders` (one long column `id`) in a real SQLite catalog under `tmp_path`:
    the catalog properties a handoff's sink names, and the PyIceberg table to write ledger commits into."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/warehouse"}
    catalog = SqlCatalog("lake", **{k: v for k, v in props.items() if k != "type"})
    catalog.create_namespace("shop")
    return props, catalog.create_table("shop.orders", Schema(NestedField(1, "id", LongType(), required=False)))


def ledger_commit(table: Any, handoff_id: str, batch: int, offsets: dict[str, dict[str, list[int]]], event_ms: int,
                  rows: int) -> int:
    """A ledger snapshot exactly as the sink writes it (docs/design/data-plane-contract.md), appended to a
    PyIceberg table with one long column `id`; returns the snapshot id."""
    import json

    import pyarrow as pa

    table.append(pa.table({"id": pa.array(range(rows), pa.int64())}), snapshot_properties={
        "handoff.id": handoff_id, "handoff.query": "handoff", "handoff.batch-id": str(batch),
        "handoff.offsets": json.dumps(offsets), "handoff.rows": str(rows), "handoff.dlq-rows": "0",
        "handoff.max-event-time-ms": str(event_ms)})
    table.refresh()
    return table.current_snapshot().snapshot_id


@pytest.fixture(scope="module")
def cluster(apiserver: Any) -> Iterator[Cluster]:
    """The test bed's API server with Handoff's CRDs installed, and clients for it (the `cluster` fixture of
    tests/integration and tests/e2e: each tier's conftest imports it)."""
    install_crds(str(apiserver.kubeconfig))
    c = Cluster(str(apiserver.kubeconfig))
    yield c
    c.api.close()
