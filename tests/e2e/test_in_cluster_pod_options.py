"""Pod options on a real node (the test bed's kubelet, or any cluster: in_cluster_support): every node is tainted
and labelled for this test only, so nothing schedules there but pods that tolerate the taint. The operator pod
runs because the chart's `tolerations` value says so; the driver and the executors Spark creates run, and commit
records to the table, because the handoff's `spec.spark.pod` tolerates the taint and its nodeSelector matches the
label; a pod without the toleration stays Pending (the taint does bite). The driver also sees an environment
variable and a volume from a Secret, and runs with runAsNonRoot; its checkpoint is on the test bed's Google Cloud
Storage (gs://, fake-gcs-server, through the GCS connector the image ships). A second handoff runs confined as a restricted
namespace asks (non-root, read-only root filesystem with an emptyDir at /tmp, no capabilities) to a commit, sized
with the typed pod resources (CPU requests below the cores, memory overheads), its checkpoint on the test bed's S3
(s3a://, credentials from a Secret, no volume), and its Spark UI answers through the UI Service the operator made
for it; then its transform's SQL changes twice with kubectl, in the same driver container: a good SQL restarts its
query and is marked good, a bad one is refused by the driver and rolled back by the operator; last, a topic added
at its latest offset has its history backfilled by the operator's Job, in a pod under the same confinement."""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

import pytest
from confluent_kafka import Producer

from handoff_testbed.gcs import Gcs
from handoff_testbed.kafka import Kafka
from handoff_testbed.proc import free_port
from handoff_testbed.pytest_plugin import LOG_ROOT
from iceberg_drill_support import end_offsets, produce, value
from in_cluster_support import (Cluster, cluster_from_environment, describe_failure, eventually, handoff_namespace,
                                kafka_for_pods, lake_catalog, lake_handoff, pods, running, table_rows)

pytestmark = [pytest.mark.e2e, pytest.mark.node]

NAME = "placed"
TABLE = "e2e.placed"
#: The second test's table: both tests share the PostgreSQL catalog, so one name would be one table (the first
#: test's rows counted as the second's).
TABLE_RO = "e2e.placed_ro"
BUCKET = "e2e-placed"
TAINT_KEY = "e2e.handoff.io/dedicated"
LABEL_KEY = "e2e.handoff.io/pool"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    # A short folder: the kubelet binds unix sockets below it, whose paths may not exceed 108 bytes.
    with cluster_from_environment(LOG_ROOT / "pod-options") as cluster:
        yield cluster


@pytest.fixture(scope="module")
def pod_kafka(cluster: Cluster) -> Iterator[Kafka]:
    with kafka_for_pods(cluster) as kafka:
        yield kafka


@dataclass
class PodGcs:
    server: Gcs
    for_pods: str  # host:port where pods reach it


@pytest.fixture(scope="module")
def pod_gcs(cluster: Cluster) -> Iterator[PodGcs]:
    """fake-gcs-server reachable from pods through a relay; it names the relay's address in its upload sessions
    (a resumable upload's next request comes from the pod)."""
    port = free_port()
    for_pods = cluster.offer(port)
    server = Gcs(port=port, public_url=f"http://{for_pods}")
    server.start(LOG_ROOT / "pod-options-gcs")
    try:
        yield PodGcs(server, for_pods)
    finally:
        server.stop()


@pytest.fixture()
def dedicated_nodes(cluster: Cluster) -> Iterator[str]:
    """Every node tainted `<TAINT_KEY>=<value>:NoSchedule` and labelled `<LABEL_KEY>=<value>` for this test."""
    value = uuid.uuid4().hex[:8]
    cluster.kubectl("taint", "nodes", "--all", f"{TAINT_KEY}={value}:NoSchedule")
    cluster.kubectl("label", "nodes", "--all", f"{LABEL_KEY}={value}")
    try:
        yield value
    finally:
        cluster.kubectl("taint", "nodes", "--all", f"{TAINT_KEY}-", check=False)
        cluster.kubectl("label", "nodes", "--all", f"{LABEL_KEY}-", check=False)


def _running_pods(cluster: Cluster, ns: str, component: str) -> list[dict[str, Any]]:
    """The running pods of handoff NAME's `component` (driver, executor) in `ns`."""
    return [p for p in pods(cluster, ns, f"handoff.io/name={NAME},app.kubernetes.io/component={component}")
            if running(p)]


def _unschedulable(cluster: Cluster, ns: str, name: str) -> str | None:
    pod = cluster.get("pod", name, "-n", ns)
    cond = next((c for c in pod["status"].get("conditions") or [] if c["type"] == "PodScheduled"), None)
    return cond.get("message") if cond and cond["status"] == "False" and cond.get("reason") == "Unschedulable" \
        else None


@pytest.mark.timeout(2400)
def test_only_the_handoffs_tolerations_and_node_selector_place_its_pods(cluster: Cluster, pod_kafka: Kafka,
                                                                        postgres: Any, s3: Any, pod_gcs: PodGcs,
                                                                        dedicated_nodes: str) -> None:
    toleration = {"key": TAINT_KEY, "operator": "Equal", "value": dedicated_nodes, "effect": "NoSchedule"}
    # The operator's own pod needs the chart's tolerations to run at all on these nodes.
    with handoff_namespace(cluster, pod_kafka, "pods", NAME,
                           {"statusInterval": 3, "tolerations": [toleration]}) as where:
        ns = where.namespace
        catalog = lake_catalog(postgres, s3, BUCKET)
        handoff = lake_handoff(cluster, ns, NAME, bootstrap=pod_kafka.pod_bootstrap, topic=where.topic,
                               postgres=postgres, s3=s3, bucket=BUCKET, table=TABLE,
                               scaling={"minExecutors": 1, "maxExecutors": 1}, executor_memory="1Gi",
                               spark_conf={"spark.kubernetes.executor.request.cores": "250m"})
        cluster.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "extra", "namespace": ns},
                       "stringData": {"token": f"token-{dedicated_nodes}"}})
        handoff["spec"]["spark"]["pod"] = {
            "tolerations": [toleration],
            "nodeSelector": {LABEL_KEY: dedicated_nodes},
            "labels": {"team": "e2e"},
            "env": [{"name": "EXTRA_TOKEN", "valueFrom": {"secretKeyRef": {"name": "extra", "key": "token"}}}],
            "volumes": [{"name": "extra", "secret": {"secretName": "extra"}}],
            "volumeMounts": [{"name": "extra", "mountPath": "/etc/extra", "readOnly": True}],
            "podSecurityContext": {"runAsNonRoot": True},
        }
        # Its checkpoint on GCS (issue 36: the in-cluster run once with each object store; the second test's is on S3)
        checkpoint_bucket = f"{BUCKET}-ckpt-{dedicated_nodes}"
        pod_gcs.server.create_bucket(checkpoint_bucket)
        handoff["spec"]["checkpoint"] = {"location": f"gs://{checkpoint_bucket}/{NAME}",
                                         "endpoint": f"http://{pod_gcs.for_pods}", "anonymous": True}

        # The taint bites: a pod without the toleration is not scheduled.
        cluster.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "untolerated", "namespace": ns},
                       "spec": {"containers": [{"name": "c", "image": cluster.image, "command": ["sleep", "600"]}]}})
        message = eventually(lambda: _unschedulable(cluster, ns, "untolerated"), "the untolerated pod Unschedulable",
                             timeout=120)
        assert "taint" in message, message

        produced = produce(pod_kafka.bootstrap, where.topic, range(0, 500))
        cluster.apply(handoff)
        try:
            eventually(lambda: table_rows(catalog, TABLE) == produced, "the records in the table", timeout=900,
                       interval=2)
        except AssertionError as err:
            raise AssertionError(describe_failure(cluster, ns, err)) from None

        (driver,) = eventually(lambda: _running_pods(cluster, ns, "driver") or None, "the running driver pod")
        executors = eventually(lambda: _running_pods(cluster, ns, "executor") or None, "a running executor pod",
                               timeout=300)
        for pod in (driver, *executors):
            assert toleration in pod["spec"]["tolerations"], pod["metadata"]["name"]
            assert pod["spec"]["nodeSelector"][LABEL_KEY] == dedicated_nodes
            assert pod["metadata"]["labels"]["team"] == "e2e"
            assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        assert _unschedulable(cluster, ns, "untolerated")  # still not scheduled
        # The Secret's key as environment and as a file, inside the driver.
        name = driver["metadata"]["name"]
        seen = cluster.kubectl("exec", "-n", ns, name, "-c", "driver", "--", "sh", "-c",
                               "printf '%s ' \"$EXTRA_TOKEN\"; cat /etc/extra/token; echo; id -u")
        assert seen.split() == [f"token-{dedicated_nodes}", f"token-{dedicated_nodes}", "185"], seen
        # Spark's offset and commit logs and Handoff's side files are in the bucket; no volume was made for them.
        # Waited for: Spark writes a batch's commit log after the table commit the rows above were seen by.
        def logged() -> list[str] | None:
            keys = pod_gcs.server.list_objects(checkpoint_bucket, f"{NAME}/")
            done = all(any(k.startswith(log) and k != log for k in keys) for log in ("offsets/", "commits/"))
            return keys if done else None

        keys = eventually(logged, "Spark's offset and commit logs in the checkpoint bucket", timeout=120)
        assert "sources/handoff-initial.json" in keys, keys[:20]
        assert not json.loads(cluster.kubectl("get", "pvc", "-n", ns, "-o", "json"))["items"]
        for pod in executors:  # executors would write a stateful query's state there: the same settings
            (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "executor"]
            env = {e["name"]: e.get("value") for e in container.get("env") or []}
            assert env.get("HANDOFF_CHECKPOINT_GCS_ANONYMOUS") == "true", env


@pytest.mark.timeout(2400)
def test_a_read_only_root_filesystem_as_non_root_runs_to_a_commit(cluster: Cluster, pod_kafka: Kafka,
                                                                  postgres: Any, s3: Any) -> None:
    """The confinement a restricted namespace asks for (Pod Security Standard "restricted"): non-root, no privilege
    escalation, no capabilities, RuntimeDefault seccomp, and a read-only root filesystem with an emptyDir for
    scratch space at /tmp; the driver and Spark's executors run with it and commit, through a dedupe whose RocksDB
    state goes to the checkpoint on S3."""
    with handoff_namespace(cluster, pod_kafka, "ro", NAME, {"statusInterval": 3}) as where:
        ns = where.namespace
        catalog = lake_catalog(postgres, s3, f"{BUCKET}-ro")
        handoff = lake_handoff(cluster, ns, NAME, bootstrap=pod_kafka.pod_bootstrap, topic=where.topic,
                               postgres=postgres, s3=s3, bucket=f"{BUCKET}-ro", table=TABLE_RO,
                               scaling={"minExecutors": 1, "maxExecutors": 1}, executor_memory="1Gi")
        # Sized with the typed resources (docs/operator.md "Pod resources"): both pods get 1Gi heap + 512Mi.
        handoff["spec"]["spark"]["driver"].update({"coreRequest": "500m", "memoryOverhead": "512Mi"})
        handoff["spec"]["spark"]["executor"].update({"coreRequest": "250m", "memoryOverhead": "512Mi"})
        # Its checkpoint on the test bed's S3 (s3a://, credentials from a Secret): the in-cluster run with an
        # object-store checkpoint, beside the PVC of the test above (issue 36).
        checkpoint_bucket = f"{BUCKET}-ro-ckpt"
        s3.create_bucket(checkpoint_bucket)
        cluster.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ckpt-s3", "namespace": ns},
                       "stringData": {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}})
        s3_for_pods = handoff["spec"]["sink"]["iceberg"]["catalog"]["properties"]["s3.endpoint"]
        handoff["spec"]["checkpoint"] = {"location": f"s3a://{checkpoint_bucket}/{NAME}",
                                         "credentialsSecret": "ckpt-s3", "endpoint": s3_for_pods,
                                         "pathStyleAccess": True, "region": "us-east-1"}
        # A dedupe on the id: the DataFrame path, with its state in RocksDB (a native library it unpacks into
        # the scratch space, its files uploaded to the checkpoint on S3) under the same confinement.
        handoff["spec"]["dedupe"] = {"keys": ["id"], "within": "1h"}
        handoff["spec"]["transform"] = {"sql": SQL_V1}  # changed in the running driver below
        # The shuffle's partitions the operator sizes (maxExecutors × cores), not the test bed's usual setting.
        del handoff["spec"]["spark"]["sparkConf"]["spark.sql.shuffle.partitions"]
        handoff["spec"]["deadLetter"] = {"topic": f"{where.topic}-dlq"}
        handoff["spec"]["spark"]["pod"] = {
            "podSecurityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containerSecurityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                                         "capabilities": {"drop": ["ALL"]}},
            "volumes": [{"name": "tmp", "emptyDir": {}}],
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        }
        produced = produce(pod_kafka.bootstrap, where.topic, range(0, 500))
        cluster.apply(handoff)
        try:
            eventually(lambda: table_rows(catalog, TABLE_RO) == produced, "the records in the table", timeout=900,
                       interval=2)
            executors = eventually(lambda: _running_pods(cluster, ns, "executor") or None, "a running executor pod",
                                   timeout=300)
            # More records once the executor runs: the stream keeps committing with the executors confined too.
            more = produce(pod_kafka.bootstrap, where.topic, range(500, 1000))
            eventually(lambda: table_rows(catalog, TABLE_RO) == produced + more, "more records in the table",
                       timeout=600, interval=2)
        except AssertionError as err:
            raise AssertionError(describe_failure(cluster, ns, err)) from None
        # The checkpoint is in the bucket (Spark's offset and commit logs), no volume was made for it, and the
        # executors got the Secret's keys too.
        keys = [o["Key"] for page in s3.client().get_paginator("list_objects_v2").paginate(
            Bucket=checkpoint_bucket, Prefix=f"{NAME}/") for o in page.get("Contents", [])]
        assert any("/offsets/" in k for k in keys) and any("/commits/" in k for k in keys), keys[:20]
        # the dedupe's state, RocksDB's files (changelogs; SSTs once a snapshot is uploaded)
        assert any("/state/" in k and ("/SSTs/" in k or k.endswith(".changelog")) for k in keys), keys
        # One shuffle partition per executor core the handoff may scale to (maxExecutors 1 × 1 core): one store of
        # the dedupe's state, and the query's offset log says so (the operator's spark.handoff.shufflePartitions).
        stores = {k.split("/state/0/")[1].split("/")[0] for k in keys if "/state/0/" in k}
        assert {s for s in stores if s.isdigit()} == {"0"}, keys
        last = max((k for k in keys if k.startswith(f"{NAME}/offsets/") and k.rsplit("/", 1)[1].isdigit()),
                   key=lambda k: int(k.rsplit("/", 1)[1]))
        offsets = s3.client().get_object(Bucket=checkpoint_bucket, Key=last)["Body"].read()
        assert b'"spark.sql.shuffle.partitions":"1"' in offsets, offsets[:2000]
        assert not json.loads(cluster.kubectl("get", "pvc", "-n", ns, "-o", "json"))["items"]
        for pod in executors:
            (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "executor"]
            refs = {e["name"]: (e.get("valueFrom") or {}).get("secretKeyRef") for e in container.get("env") or []}
            assert refs.get("AWS_ACCESS_KEY_ID") == {"name": "ckpt-s3", "key": "AWS_ACCESS_KEY_ID"}, refs
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            # Spark sized the executor pod from what the operator told it.
            assert container["resources"] == {"requests": {"cpu": "250m", "memory": "1536Mi"},
                                              "limits": {"cpu": "1", "memory": "1536Mi"}}, container["resources"]
        (driver,) = _running_pods(cluster, ns, "driver")
        assert driver["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "500m", "memory": "1536Mi"},
                                                                "limits": {"cpu": "1", "memory": "1536Mi"}}
        # The running driver's Spark UI answers through its Service (`<name>-ui`, spec.spark.ui), here through the
        # API server's service proxy: Spark's own REST API lists the application.
        def applications() -> list[dict[str, Any]] | None:
            out = cluster.kubectl("get", "--raw", f"/api/v1/namespaces/{ns}/services/{NAME}-ui:http/proxy"
                                                  f"/api/v1/applications", check=False)
            return json.loads(out) if out.strip().startswith("[") else None

        apps = eventually(applications, "the Spark UI's application list through the UI Service", timeout=120)
        assert apps and all(a.get("id") and a.get("name") for a in apps), apps
        total, columns = _transform_changes_in_the_running_driver(cluster, ns, pod_kafka, where.topic, catalog,
                                                                  driver["metadata"]["name"], produced + more)
        _backfill_an_added_topics_history(cluster, ns, pod_kafka, where.topic, catalog, total, columns)


KAFKA_COLUMNS = "_kafka_topic, _kafka_partition, _kafka_offset, _kafka_timestamp"
SQL_V1 = f"SELECT id, ts, region, {KAFKA_COLUMNS} FROM source"
SQL_V2 = f"SELECT id, ts, upper(region) AS region, {KAFKA_COLUMNS} FROM source"
SQL_BAD = f"SELECT id, ts, nope AS region, {KAFKA_COLUMNS} FROM source"


def _transform_changes_in_the_running_driver(cluster: Cluster, ns: str, pod_kafka: Kafka, topic: str, catalog: Any,
                                             driver: str, produced: int) -> tuple[int, list[dict[str, Any]]]:
    """A changed SQL applied with kubectl: the same driver pod checks it and restarts its query with it (no new pod,
    no container restart), the operator marks the generation good once a batch of it committed (from the driver's
    report of the config it runs), and the records after it carry its derivation. Then a SQL that fails the check:
    the driver refuses it and runs on with the SQL before, the operator rolls the spec back (UpgradeRolledBack,
    reason TransformInvalid), and the stream goes on, still in the same container. Then the transform and the dedupe
    removed: the same container's query moves to the fused path and the stream goes on. Last, a declared column added
    (the table gets it and its values, from the same container), and a schema the table cannot take (refused there,
    rolled back with reason SchemaIncompatible, the stream going on). Returns the rows the table holds then, and the
    last good columns (the spec still declares the refused ones: the operator runs the last good config until the
    spec changes again)."""
    def handoff() -> dict[str, Any]:
        return cluster.get("streamtablehandoff", NAME, "-n", ns)

    def record() -> dict[str, Any]:
        data = cluster.get("configmap", f"{NAME}-progress", "-n", ns).get("data") or {}
        return json.loads(data.get("progress.json") or "{}")

    def patch_spec(spec: dict[str, Any]) -> int:
        cluster.kubectl("patch", "streamtablehandoff", NAME, "-n", ns, "--type", "merge", "-p",
                        json.dumps({"spec": spec}))
        return int(handoff()["metadata"]["generation"])

    def patch_sql(sql: str) -> int:
        return patch_spec({"transform": {"sql": sql}})

    def rolled_back(generation: int) -> dict[str, Any] | None:
        status = handoff().get("status") or {}
        return status if (status.get("upgrade") or {}).get("rolledBackGeneration") == generation else None

    def same_container() -> None:
        (pod,) = _running_pods(cluster, ns, "driver")
        assert pod["metadata"]["name"] == driver, "the same driver pod"
        assert all(c.get("restartCount", 0) == 0 for c in pod["status"]["containerStatuses"]), pod["status"]

    try:
        v1 = eventually(lambda: record().get("configHash"), "the driver reporting the config it runs")
        generation = patch_sql(SQL_V2)
        v2 = eventually(lambda: (h := (handoff().get("status") or {}).get("app", {}).get("configHash")) != v1 and h,
                        "the operator's new config hash")
        eventually(lambda: record().get("configHash") == v2, "the driver running the new SQL", timeout=180)
        more = produce(pod_kafka.bootstrap, topic, range(10_000, 10_300))
        eventually(lambda: table_rows(catalog, TABLE_RO) == produced + more, "the records after the change",
                   timeout=300, interval=2)
        eventually(lambda: (handoff().get("status") or {}).get("lastGoodGeneration") == generation,
                   f"generation {generation} marked good", timeout=120)
        same_container()
        log = cluster.kubectl("logs", "-n", ns, driver)
        assert log.count(f"restarted with the operator's query config {v2}") == 1, log[-3000:]
        data = catalog.load_table(TABLE_RO).scan(selected_fields=("id", "region")).to_arrow()
        regions = dict(zip(data["id"].to_pylist(), data["region"].to_pylist()))
        assert len(regions) == data.num_rows == produced + more
        assert {regions[i] for i in range(10_000, 10_300)} == {"EU", "US", "AP"}
        assert {regions[i] for i in range(0, 500)} == {"eu", "us", "ap"}

        bad = patch_sql(SQL_BAD)
        status = eventually(lambda: rolled_back(bad), "the refused SQL rolled back", timeout=180)
        assert status["upgrade"]["rolledBackReason"] == "TransformInvalid", status["upgrade"]
        assert "refused by the running driver" in status["upgrade"]["message"], status["upgrade"]
        assert "nope" in status["upgrade"]["message"], status["upgrade"]
        degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", "UpgradeRolledBack"), degraded
        # Back on the last good config the driver runs already: its refusal is cleared, the stream goes on.
        eventually(lambda: (r := record()).get("configHash") == v2 and "configRefusedHash" not in r,
                   "the driver's refusal cleared after the rollback", timeout=120)
        again = produce(pod_kafka.bootstrap, topic, range(10_300, 10_400))
        eventually(lambda: table_rows(catalog, TABLE_RO) == produced + more + again, "the stream going on",
                   timeout=300, interval=2)
        same_container()

        # Without the transform and the dedupe, the same container's query moves to the fused path: the checkpoint
        # the DataFrame path's query wrote (on S3) is discarded and the query starts from the table's ledger.
        cluster.kubectl("patch", "streamtablehandoff", NAME, "-n", ns, "--type", "merge", "-p",
                        json.dumps({"spec": {"transform": None, "dedupe": None}}))
        v3 = eventually(lambda: (h := (handoff().get("status") or {}).get("app", {}).get("configHash"))
                        not in (v1, v2) and h, "the operator's config hash without the transform and the dedupe")
        eventually(lambda: record().get("configHash") == v3, "the driver running the fused path", timeout=180)
        fused = produce(pod_kafka.bootstrap, topic, range(10_400, 10_500))
        eventually(lambda: table_rows(catalog, TABLE_RO) == produced + more + again + fused,
                   "the records after the switch", timeout=300, interval=2)
        same_container()
        log = cluster.kubectl("logs", "-n", ns, driver)
        assert "the query moved from the DataFrame path (a transform, dedupe or event time) to the fused path" \
            in log, log[-3000:]
        data = catalog.load_table(TABLE_RO).scan(selected_fields=("id", "region")).to_arrow()
        regions = dict(zip(data["id"].to_pylist(), data["region"].to_pylist()))
        assert len(regions) == data.num_rows and {regions[i] for i in range(10_400, 10_500)} == {"eu", "us", "ap"}

        # A declared column added: the same container adds it to the table at a batch boundary and writes it. Then a
        # type the table's column cannot become (id: long → string): the driver refuses it there, the operator rolls
        # the spec back with reason SchemaIncompatible, and the stream goes on, still in the same container.
        columns = handoff()["spec"]["schema"]["columns"] + [{"name": "note", "type": "string"}]
        cluster.kubectl("patch", "streamtablehandoff", NAME, "-n", ns, "--type", "merge", "-p",
                        json.dumps({"spec": {"schema": {"columns": columns}}}))
        v4 = eventually(lambda: (h := (handoff().get("status") or {}).get("app", {}).get("configHash"))
                        not in (v1, v2, v3) and h, "the operator's config hash with the new column")
        eventually(lambda: record().get("configHash") == v4, "the driver running the new column", timeout=180)
        noted = produce(pod_kafka.bootstrap, topic, range(10_500, 10_600), note="n")
        total = produced + more + again + fused + noted
        eventually(lambda: table_rows(catalog, TABLE_RO) == total, "the records with a note", timeout=300, interval=2)
        # Seen committing by the operator before the next change, as a user watching the status would wait (the
        # change before it was applied at once: the race tests/integration/operator/upgrade covers).
        eventually(lambda: ((handoff().get("status") or {}).get("upgrade") or {}).get("lastGoodConfigHash") == v4,
                   "the new column marked good", timeout=120)
        same_container()
        data = catalog.load_table(TABLE_RO).scan(selected_fields=("id", "note")).to_arrow()
        notes = dict(zip(data["id"].to_pylist(), data["note"].to_pylist()))
        assert {notes[i] for i in range(10_500, 10_600)} == {"n"} and notes[0] is None, notes
        retyped = patch_spec({"schema": {"columns": [{**c, "type": "string"} if c["name"] == "id" else c
                                                     for c in columns]}})
        status = eventually(lambda: rolled_back(retyped), "the incompatible schema rolled back", timeout=180)
        assert status["upgrade"]["rolledBackReason"] == "SchemaIncompatible", status["upgrade"]
        assert "SchemaIncompatible: spec.schema:" in status["upgrade"]["message"], status["upgrade"]
        eventually(lambda: (r := record()).get("configHash") == v4 and "configRefusedHash" not in r,
                   "the driver's schema refusal cleared after the rollback", timeout=120)
        last = produce(pod_kafka.bootstrap, topic, range(10_600, 10_700))
        eventually(lambda: table_rows(catalog, TABLE_RO) == total + last, "the stream going on after the refusal",
                   timeout=300, interval=2)
        same_container()
    except AssertionError as err:
        raise AssertionError(describe_failure(cluster, ns, err)) from None
    return total + last, columns


def _backfill_an_added_topics_history(cluster: Cluster, ns: str, pod_kafka: Kafka, topic: str, catalog: Any,
                                      rows: int, columns: list[dict[str, Any]]) -> None:
    """A topic added with kubectl at `startingOffsets: latest`, then its history backfilled with a Backfill
    ReplayRequest up to where the stream started it: the operator's Job runs `python -m handoff_spark backfill` in a
    pod of the driver's image under the same confinement (non-root, read-only root filesystem, /tmp an emptyDir),
    with Spark in local mode and its Python processes forked from the fork server (its launcher written into /tmp).
    The topic then holds each of its offsets once, and the stream's driver kept running. The same change puts back
    the last good columns (the spec still declares the refused ones)."""
    added = f"{topic}-history"
    pod_kafka.create_topic(added, partitions=2)
    history = produce(pod_kafka.bootstrap, added, range(20_000, 20_200))
    history_ends = end_offsets(pod_kafka.bootstrap, added)
    assert sum(history_ends.values()) == history
    driver = [p["metadata"]["name"] for p in _running_pods(cluster, ns, "driver")]
    producer = Producer({"bootstrap.servers": pod_kafka.bootstrap, "enable.idempotence": True})
    live_ids = iter(range(20_200, 21_000))

    def offsets_in_table() -> dict[int, list[int]]:
        data = catalog.load_table(TABLE_RO).scan(selected_fields=("_kafka_topic", "_kafka_partition",
                                                                  "_kafka_offset")).to_arrow()
        found: dict[int, list[int]] = {}
        for t, p, o in zip(data["_kafka_topic"].to_pylist(), data["_kafka_partition"].to_pylist(),
                           data["_kafka_offset"].to_pylist()):
            if t == added:
                found.setdefault(p, []).append(o)
        return found

    def streamed() -> dict[int, list[int]] | None:
        """One more record in each partition; the added topic's offsets in the table once both partitions have some
        (records produced before the query took the topic are not streamed: it started at the latest offset)."""
        for partition in (0, 1):
            i = next(live_ids)
            producer.produce(added, key=str(i).encode(), value=value(i), partition=partition)
        assert producer.flush(30) == 0
        found = offsets_in_table()
        return found if len(found) == 2 else None

    try:
        cluster.kubectl("patch", "streamtablehandoff", NAME, "-n", ns, "--type", "merge", "-p",
                        json.dumps({"spec": {"source": {"topics": [topic, added], "startingOffsets": "latest"},
                                             "schema": {"columns": columns}}}))
        started = {p: min(o) for p, o in eventually(streamed, "the added topic streamed from its latest offset",
                                                    timeout=300, interval=3).items()}
        assert all(started[p] >= history_ends[p] for p in (0, 1)), (started, history_ends)  # not from 0
        cluster.apply({"apiVersion": "handoff.io/v1alpha1", "kind": "ReplayRequest",
                       "metadata": {"name": "history", "namespace": ns},
                       "spec": {"handoffRef": {"name": NAME}, "mode": "Backfill",
                                "from": {added: {str(p): 0 for p in started}},
                                "to": {added: {str(p): o for p, o in started.items()}}}})

        def succeeded() -> dict[str, Any] | None:
            status = cluster.get("replayrequest", "history", "-n", ns).get("status") or {}
            assert status.get("phase") != "Failed", status
            return status if status.get("phase") == "Succeeded" else None

        status = eventually(succeeded, "the backfill Succeeded", timeout=600, interval=2)
        ends = end_offsets(pod_kafka.bootstrap, added)
        eventually(lambda: {p: sorted(o) for p, o in offsets_in_table().items()}
                   == {p: list(range(end)) for p, end in ends.items()},
                   "every offset of the added topic in the table once", timeout=300, interval=2)
    except AssertionError as err:
        raise AssertionError(describe_failure(cluster, ns, err)) from None
    assert status["progress"]["records"] == sum(started.values()), status
    job = cluster.get("job", "history-backfill", "-n", ns)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True, container
    log = cluster.kubectl("logs", "-n", ns, "job/history-backfill")
    assert "Spark's Python processes fork from a server" in log, log[-3000:]
    assert "no fork server" not in log, log[-3000:]
    ids = catalog.load_table(TABLE_RO).scan(selected_fields=("id",)).to_arrow()["id"].to_pylist()
    assert len(ids) == len(set(ids)) == rows + sum(ends.values())
    assert set(range(20_000, 20_200)) <= set(ids)
    assert [p["metadata"]["name"] for p in _running_pods(cluster, ns, "driver")] == driver, \
        "the stream's driver kept running"
