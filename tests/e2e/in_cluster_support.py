"""A Kubernetes cluster whose pods really run, for the in-cluster e2e tests, and what they need on it.

The tests take any cluster: a kubeconfig, an image the nodes can run, and an address on this machine the
pods reach (`pod_host`, where the tests' Kafka, PostgreSQL and S3 are offered to them).

- Here (default): the test bed's kube-apiserver without kwok plus its real `node` (kubelet, containerd,
  CNI, kube-proxy), the image built by `make image` imported into the node's containerd, and the node's
  bridge gateway as `pod_host`.
- Anywhere else (kind: hack/kind-e2e): `HANDOFF_E2E_KUBECONFIG`, `HANDOFF_E2E_POD_HOST` (an address of
  this machine the cluster's pods reach, e.g. the kind network's gateway), and either `HANDOFF_E2E_IMAGE`
  (an image the nodes already have: hack/kind-e2e builds it with `docker build` and `kind load`s it) or
  `HANDOFF_E2E_LOAD_IMAGE`, a command that loads the image `make image` built, with `{tarball}` and
  `{image}` filled in (e.g. `kind load image-archive {tarball} --name handoff-e2e`).

The operator is installed from the chart, rendered by the Helm SDK and applied with kubectl, so it runs
as a pod with exactly the chart's RBAC.
"""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import helm_python as helm
import yaml

from handoff_operator import yaml_text
from handoff_testbed.eventually import eventually as _eventually
from handoff_testbed.image import build_image
from handoff_testbed.proc import Service
from handoff_testbed.tcp_forward import start_relay

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")


@dataclass
class Cluster:
    kubeconfig: Path
    image: str  # a reference the nodes have (pulled or loaded)
    pod_host: str  # an address of this machine that pods reach
    workdir: Path
    # True when the cluster's node is this machine (the test bed): hostPath volumes are local dirs.
    local_node: bool = False
    relays: list[Service] = field(default_factory=list)

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120) -> str:
        result = subprocess.run(["kubectl", f"--kubeconfig={self.kubeconfig}", *args], input=stdin,
                                capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def apply(self, *docs: dict[str, Any]) -> None:
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=yaml_text.dump_all(docs))

    def offer(self, port: int) -> str:
        """`host:port` where pods reach the loopback service on `port` (a relay on pod_host)."""
        service, relay_port = start_relay(self.pod_host, f"127.0.0.1:{port}",
                                          self.workdir / f"relay-{port}.log")
        self.relays.append(service)
        return f"{self.pod_host}:{relay_port}"

    def close(self) -> None:
        for relay in self.relays:
            relay.stop()


@contextlib.contextmanager
def testbed_cluster(workdir: Path) -> Iterator[Cluster]:
    """kube-apiserver (no kwok) + the real node, the project's image imported into the node."""
    from handoff_testbed.apiserver import ApiServer
    from handoff_testbed.node import Node

    image = build_image()
    api = ApiServer()
    api.fake_nodes = False
    node = Node()
    node.images = [image.tarball]
    api.build()
    node.build()
    api.start(workdir / "apiserver")
    try:
        assert api.kubeconfig is not None
        node.kubeconfig = api.kubeconfig
        node.start(workdir / "node")
        cluster = Cluster(api.kubeconfig, image.ref, node.gateway, workdir, local_node=True)
        try:
            yield cluster
        finally:
            cluster.close()
    finally:
        node.stop()
        api.stop()


@contextlib.contextmanager
def external_cluster(workdir: Path) -> Iterator[Cluster]:
    """The cluster of $HANDOFF_E2E_KUBECONFIG (kind, or any other), the image loaded by
    $HANDOFF_E2E_LOAD_IMAGE."""
    ref = os.environ.get("HANDOFF_E2E_IMAGE")
    if not ref:
        image = build_image()
        ref = image.ref
        loader = os.environ.get("HANDOFF_E2E_LOAD_IMAGE")
        if loader:
            command = loader.format(tarball=shlex.quote(str(image.tarball)), image=shlex.quote(image.ref))
            subprocess.run(command, shell=True, check=True)
    pod_host = os.environ.get("HANDOFF_E2E_POD_HOST")
    if not pod_host:
        raise AssertionError("HANDOFF_E2E_POD_HOST: set it to an address of this machine the cluster's pods "
                             "reach (for kind: the gateway of the `kind` docker network)")
    workdir.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(Path(os.environ["HANDOFF_E2E_KUBECONFIG"]), ref, pod_host, workdir)
    try:
        yield cluster
    finally:
        cluster.close()


def cluster_from_environment(workdir: Path) -> contextlib.AbstractContextManager[Cluster]:
    return external_cluster(workdir) if os.environ.get("HANDOFF_E2E_KUBECONFIG") else testbed_cluster(workdir)


def eventually(probe: Callable[[], T | None], what: str, timeout: float = 180.0, interval: float = 1.0) -> T:
    """handoff_testbed.eventually for the in-cluster drills: a probe's own assertion, a status field not written
    yet (KeyError) and a kubectl call that timed out mean "not yet"."""
    return _eventually(probe, what, timeout=timeout, interval=interval,
                       retry_on=(AssertionError, KeyError, subprocess.TimeoutExpired))


# ------------------------------------------------------------------------------------ the operator

def install_operator(cluster: Cluster, namespace: str, watched: str, values: dict[str, Any]) -> str:
    """CRDs (crds/, what the chart ships) + the chart's templates in `namespace`; waits until the
    operator pod is Ready. Returns the release name."""
    crds = [yaml.safe_load(p.read_text()) for p in sorted((REPO / "crds").glob("*.yaml"))]
    cluster.apply(*crds)
    for crd in crds:
        # Asked again while the new CRD has no conditions yet: `kubectl wait` fails at once then ("<nil> is of the
        # type <nil>"), as it did in one run, instead of waiting.
        name = crd["metadata"]["name"]
        eventually(lambda: cluster.kubectl("get", f"crd/{name}", "-o",
                                           "jsonpath={.status.conditions[?(@.type=='Established')].status}",
                                           check=False).strip() == "True" or None,
                   f"CRD {name} Established", timeout=60)
    cluster.kubectl("create", "namespace", namespace)
    repository, _, tag = cluster.image.rpartition(":")
    release = f"e2e-{uuid.uuid4().hex[:5]}"
    rendered = helm.Chart.load(REPO / "charts/handoff-operator").render(
        {"image": {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"},
         "watchNamespaces": [watched], **values},
        name=release, namespace=namespace, is_install=True)
    docs = [d for path, text in sorted(rendered.items()) if path.endswith(".yaml")
            for d in yaml.safe_load_all(text) if d]
    # The ServiceMonitor needs the Prometheus operator's CRD, which a bare cluster does not have.
    docs = [d for d in docs if d["kind"] != "ServiceMonitor"]
    for doc in docs:
        doc.setdefault("metadata", {}).setdefault("namespace", namespace)
    cluster.apply(*docs)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    cluster.kubectl("-n", namespace, "rollout", "status", f"deployment/{deployment['metadata']['name']}",
                    "--timeout=180s", timeout=200)
    return release


def provide_checkpoint_volume(cluster: Cluster, namespace: str, claim: str) -> str | None:
    """Where no StorageClass provisions volumes (the test bed), a hostPath PersistentVolume bound to the
    checkpoint claim the operator creates, on a directory the image's uid 185 may write. Returns the PV's
    name (to delete after), or None when the cluster provisions volumes itself (kind's default class)."""
    if not cluster.local_node:
        return None
    path = cluster.workdir / "volumes" / f"{namespace}-{claim}"
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)
    name = f"{namespace}-{claim}"
    cluster.apply({
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                 "claimRef": {"namespace": namespace, "name": claim},
                 "hostPath": {"path": str(path), "type": "Directory"}},
    })
    return name


@dataclass(frozen=True)
class HandoffNamespace:
    namespace: str        # where the handoff goes (watched by `system`'s operator)
    system: str           # the operator's own namespace
    topic: str            # a new 3-partition topic on the pods' Kafka


@contextlib.contextmanager
def handoff_namespace(cluster: Cluster, kafka: Any, prefix: str, handoff: str,
                      values: dict[str, Any]) -> Iterator[HandoffNamespace]:
    """A fresh namespace for one handoff named `handoff`: its own operator from the chart (`values`), a topic,
    and the checkpoint volume its claim binds to; all removed afterwards."""
    suffix = uuid.uuid4().hex[:5]
    where = HandoffNamespace(f"{prefix}-{suffix}", f"handoff-system-{suffix}", f"{prefix}-{suffix}")
    cluster.kubectl("create", "namespace", where.namespace)
    install_operator(cluster, where.system, where.namespace, values)
    kafka.create_topic(where.topic, partitions=3)
    pv = provide_checkpoint_volume(cluster, where.namespace, f"{handoff}-checkpoint")
    try:
        yield where
    finally:
        remove(cluster, where.namespace, where.system, pv=pv)


def pods(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    return cluster.get("pods", "-n", namespace, "-l", selector)["items"]


def running(pod: dict[str, Any]) -> bool:
    return pod["status"].get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")


def describe_failure(cluster: Cluster, namespace: str, err: object) -> str:
    """`err`, then the pods, events and logs of `namespace` (drivers' logs last), then `err`'s first line again: CI
    shows only a failure's tail, which must still say what failed."""
    parts = [str(err), cluster.kubectl("get", "pods,events", "-n", namespace, "-o", "wide", check=False)]
    items = cluster.get("pods", "-n", namespace)["items"]
    for pod in sorted(items, key=lambda p: (p["metadata"].get("labels") or {}).get("app.kubernetes.io/component")
                      == "driver"):
        name = pod["metadata"]["name"]
        parts.append(f"--- logs {name}\n" + cluster.kubectl("logs", "-n", namespace, name, "--tail=60",
                                                           check=False))
    parts.append(f"--- what failed: {str(err).splitlines()[0] if str(err) else type(err).__name__}")
    return "\n".join(parts)


@contextlib.contextmanager
def kafka_for_pods(cluster: Cluster) -> Iterator[Any]:
    """A test-bed broker with a second listener advertised at `cluster.pod_host`, so pods follow its
    metadata to it (tests on this machine use `.bootstrap`, pods `.pod_bootstrap`)."""
    from handoff_testbed.kafka import Kafka

    kafka = Kafka()
    kafka.pod_host = cluster.pod_host
    kafka.build()
    kafka.start(cluster.workdir / "kafka")
    try:
        yield kafka
    finally:
        kafka.stop()


def pod_proxy_json(cluster: Cluster, namespace: str, pod: str, port: int, path: str) -> Any:
    """GET `path` on a pod's port through the API server's pod proxy (the pods' network is not this
    machine's), parsed as JSON."""
    return json.loads(cluster.kubectl("get", "--raw", f"/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy{path}"))


def lake_handoff(cluster: Cluster, namespace: str, name: str, *, bootstrap: str, topic: str, postgres: Any, s3: Any,
                 bucket: str, table: str, scaling: dict[str, Any], source: dict[str, Any] | None = None,
                 spark_conf: dict[str, str] | None = None, executor_memory: str = "512Mi") -> dict[str, Any]:
    """A StreamTableHandoff from `topic` into an Iceberg table (PostgreSQL catalog, S3 warehouse on the test
    bed's moto) that pods reach through relays, with the `lake-s3` Secret it reads; small executors
    (1 core, `executor_memory`, `spark_conf` for the rest) for a 2-CPU node."""
    pg_for_pods, s3_for_pods = cluster.offer(postgres.port), cluster.offer(s3.port)
    cluster.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "lake-s3", "namespace": namespace},
                   "stringData": {"access-key-id": "testing", "secret-access-key": "testing"}})
    return {
        "apiVersion": "handoff.io/v1alpha1", "kind": "StreamTableHandoff",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "source": {"bootstrapServers": bootstrap, "topics": [topic], "startingOffsets": "earliest",
                       "format": "json", **(source or {})},
            "sink": {"iceberg": {
                "catalog": {"name": "lake",
                            "properties": {"type": "sql", "warehouse": f"s3://{bucket}/warehouse",
                                           "uri": f"postgresql+psycopg2://postgres@{pg_for_pods}/{postgres.database}",
                                           "s3.endpoint": f"http://{s3_for_pods}", "s3.region": "us-east-1"},
                            "propertiesFrom": [{"secretRef": {"name": "lake-s3"}, "prefix": "s3."}]},
                "table": table, "autoCreate": True}},
            "schema": {"columns": [{"name": "id", "type": "long", "required": True},
                                   {"name": "ts", "type": "timestamp"}, {"name": "region", "type": "string"}]},
            "commitInterval": "2s",
            "freshness": {"target": "5m"},
            "scaling": scaling,
            "spark": {"imagePullPolicy": "IfNotPresent",
                      "driver": {"cores": 1, "memory": "1Gi"}, "executor": {"cores": 1, "memory": executor_memory},
                      "sparkConf": {"spark.sql.shuffle.partitions": "2", **(spark_conf or {})}},
        },
    }


def lake_catalog(postgres: Any, s3: Any, bucket: str) -> Any:
    """The lake's catalog as seen from this machine (the pods see it through relays): the PostgreSQL catalog
    with its warehouse in `bucket` on the test bed's S3, which is created here."""
    from pyiceberg.catalog import load_catalog

    s3.create_bucket(bucket)
    return load_catalog("lake", **{"type": "sql", "uri": postgres.uri, "warehouse": f"s3://{bucket}/warehouse",
                                   **s3.iceberg_properties()})


def table_rows(catalog: Any, table: str) -> int:
    """Rows in `table` now, by its current snapshot's summary (0 before the driver created it or committed).

    Why the summary and not a scan: the tests poll this every second or two while the pods run, and a scan reads
    every data file from S3 each time; the summary's `total-records` is Iceberg's own count of the snapshot's rows
    (Handoff writes no delete files). The tests' exactly-once checks still read every row."""
    try:
        snapshot = catalog.load_table(table).current_snapshot()
    except Exception:  # noqa: BLE001 - not created yet
        return 0
    if snapshot is None or snapshot.summary is None:
        return 0
    return int(snapshot.summary["total-records"])


def remove(cluster: Cluster, *namespaces: str, pv: str | None = None) -> None:
    """A test's namespaces and its checkpoint PersistentVolume, without waiting (the next test does not need
    them gone)."""
    for namespace in namespaces:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    if pv:
        cluster.kubectl("delete", "pv", pv, "--wait=false", check=False)
