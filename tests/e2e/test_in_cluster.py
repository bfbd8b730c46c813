"""The product as it runs for users: the operator installed from the chart runs as a pod; it starts the
driver Deployment from the project's image; the driver's Spark creates real executor pods; data goes from
Kafka into an Iceberg table (PostgreSQL catalog, S3 warehouse) exactly once, across a driver pod killed
mid-stream; status and metrics come from the running pods; a RollbackAndReplay holds the query in the running
driver pod; deleting the handoff leaves nothing behind.

Runs on the test bed's real node by default, or on any cluster (kind: hack/kind-e2e), see
in_cluster_support. Kafka, PostgreSQL and S3 run on this machine and are offered to the pods at
`cluster.pod_host` (a Kafka listener advertised there; relays for the other two).
"""
from __future__ import annotations

import subprocess
import threading
import time
from typing import Any, Iterator

import pytest

from handoff_spark.iceberg import ledger
from handoff_testbed.kafka import Kafka
from handoff_testbed.pytest_plugin import LOG_ROOT
from iceberg_drill_support import end_offsets, produce
from in_cluster_support import (Cluster, cluster_from_environment, describe_failure, eventually, handoff_namespace,
                                kafka_for_pods, lake_catalog, lake_handoff, pods, running, table_rows)

pytestmark = [pytest.mark.e2e, pytest.mark.node]

NAME = "events"
TABLE = "e2e.events"
BUCKET = "e2e-lake"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with cluster_from_environment(LOG_ROOT / "in-cluster") as cluster:
        yield cluster


@pytest.fixture(scope="module")
def pod_kafka(cluster: Cluster) -> Iterator[Kafka]:
    with kafka_for_pods(cluster) as kafka:
        yield kafka


@pytest.fixture(scope="module")
def setup(cluster: Cluster, pod_kafka: Kafka, postgres: Any, s3: Any) -> Iterator[dict[str, Any]]:
    with handoff_namespace(cluster, pod_kafka, "e2e", NAME, {"statusInterval": 3, "deleteGraceSeconds": 120}) as where:
        ns, topic = where.namespace, where.topic
        # Two cores on the test-bed node: the driver takes one, the executor a quarter.
        handoff = lake_handoff(cluster, ns, NAME, bootstrap=pod_kafka.pod_bootstrap, topic=topic, postgres=postgres,
                               s3=s3, bucket=BUCKET, table=TABLE, scaling={"minExecutors": 1, "maxExecutors": 1},
                               executor_memory="1Gi", spark_conf={"spark.kubernetes.executor.request.cores": "250m"})
        yield {"ns": ns, "system": where.system, "topic": topic, "handoff": handoff,
               "catalog": lake_catalog(postgres, s3, BUCKET), "bootstrap": pod_kafka.bootstrap, "produced": 0}


#: Run in a pod: how many fork servers it has (`handoff_spark.startup.fork_server`, not counting its forks), the
#: processes they forked, the Python Spark's JVM runs (its `PYSPARK_PYTHON`, in the driver pod) and the executor's
#: worker daemons (`handoff_spark.startup.worker_daemon` as a process of its own, not a fork) and the program each
#: was started as, and how many forks do not show the `python -m <module>` they stand for (fork_server.retitle).
FORKS_IN_POD = """
import glob, os
procs = {}
for d in glob.glob("/proc/[0-9]*"):
    if int(d[6:]) == os.getpid():  # this program, whose text names what it looks for
        continue
    try:
        cmd = open(d + "/cmdline", "rb").read()
        ppid = int(next(l for l in open(d + "/status") if l.startswith("PPid:")).split()[1])
        env = open(d + "/environ", "rb").read().split(b"\\0")
    except (OSError, StopIteration):
        continue
    procs[int(d[6:])] = (cmd, ppid, env)
def is_server(p):
    return p in procs and b"handoff_spark.startup.fork_server" in procs[p][0]
servers = {p for p in procs if is_server(p) and not is_server(procs[p][1])}
forks = [p for p in procs if procs[p][1] in servers]
jvm = [e for c, _, e in procs.values() if c.startswith(b"/opt/java") or b"/java\\0" in c[:200]]
pythons = {v[len(b"PYSPARK_PYTHON="):].decode() for e in jvm for v in e if v.startswith(b"PYSPARK_PYTHON=")}
def is_daemon(p):
    return p in procs and b"handoff_spark.startup.worker_daemon" in procs[p][0] and not is_server(p)
daemons = {p for p in procs if is_daemon(p) and not is_daemon(procs[p][1])}
started_as = {procs[p][0].split(b"\\0")[0].decode() for p in daemons}
untitled = [p for p in forks if not procs[p][0].split(b"\\0")[0].startswith(b"/opt/venv/bin/python -m ")]
print(f"servers={len(servers)} forks={len(forks)} launcher={','.join(sorted(pythons)) or '-'} "
      f"worker_daemons={len(daemons)} daemon_python={','.join(sorted(started_as)) or '-'} "
      f"untitled_forks={len(untitled)}")
"""


def _rows(state: dict[str, Any]) -> int:
    return table_rows(state["catalog"], TABLE)


def _assert_exactly_once(state: dict[str, Any]) -> None:
    table = state["catalog"].load_table(TABLE)
    data = table.scan(selected_fields=("_kafka_topic", "_kafka_partition", "_kafka_offset")).to_arrow()
    keys = set(zip(data["_kafka_topic"].to_pylist(), data["_kafka_partition"].to_pylist(),
                   data["_kafka_offset"].to_pylist()))
    assert data.num_rows == len(keys) == state["produced"]
    assert ledger.resume_offsets(table)[state["topic"]] == end_offsets(state["bootstrap"], state["topic"])


def _driver(cluster: Cluster, ns: str) -> dict[str, Any] | None:
    """The one running driver pod (None while there is none, or two)."""
    found = [p for p in pods(cluster, ns, f"handoff.io/name={NAME},app.kubernetes.io/component=driver")
             if running(p)]
    return found[0] if len(found) == 1 else None


def _new_driver(cluster: Cluster, ns: str, old: str) -> dict[str, Any] | None:
    pod = _driver(cluster, ns)
    return pod if pod is not None and pod["metadata"]["name"] != old else None


def _handoff(cluster: Cluster, ns: str) -> dict[str, Any]:
    return cluster.get("streamtablehandoff", NAME, "-n", ns)


# Generous: module setup (node start, image import, chart install) is counted in the first test, and two
# Spark drivers start on a shared 2-core machine. The waits below are bounds on hangs, not on speed.
@pytest.mark.timeout(2400)
def test_exactly_once_through_a_killed_driver_pod(cluster: Cluster, setup: dict[str, Any]) -> None:
    ns, state = setup["ns"], setup
    state["produced"] += produce(state["bootstrap"], state["topic"], range(0, 3000))
    cluster.apply(state["handoff"])
    try:
        eventually(lambda: _rows(state) == 3000, "the first 3000 records in the table", timeout=600, interval=2)
    except AssertionError as err:
        raise AssertionError(describe_failure(cluster, ns, err)) from None
    # The executors are pods Spark created, owned by the driver pod (waited for, not assumed present the moment
    # the first records are in).
    first = eventually(lambda: _driver(cluster, ns), "one running driver pod")
    executors = eventually(lambda: pods(cluster, ns, f"handoff.io/name={NAME},app.kubernetes.io/component=executor"),
                           "executor pods", timeout=300, interval=1)
    assert all(e["metadata"]["ownerReferences"][0]["name"] == first["metadata"]["name"] for e in executors)
    # Both JVMs map Spark's classes from the image's class-data archive (Dockerfile; the executors' class path
    # starts as the archive's, docker/entrypoint.sh): a restart does not load them from the jars again.
    running_executor = eventually(lambda: next((e for e in pods(cluster, ns, f"handoff.io/name={NAME},"
                                                                 f"app.kubernetes.io/component=executor")
                                                if running(e)), None), "a running executor pod", timeout=300)
    for pod in (first, running_executor):
        container = pod["spec"]["containers"][0]["name"]  # "driver"; Spark's name for the executor's
        mapped = cluster.kubectl("exec", "-n", ns, pod["metadata"]["name"], "-c", container, "--", "sh", "-c",
                                 "grep -l /opt/handoff/spark-cds.jsa /proc/[0-9]*/maps || true")
        assert mapped.strip(), f"no process of {pod['metadata']['name']} maps /opt/handoff/spark-cds.jsa"
    # The driver's Spark runs its Python processes (planners, source and commit runners) as forks of the driver's
    # fork server, through the image's launcher; the executor runs the same launcher, which there is the real
    # interpreter: its worker daemon is a process of its own, and the records above went through it.
    forks = {}
    for pod in (first, running_executor):
        container = pod["spec"]["containers"][0]["name"]
        out = cluster.kubectl("exec", "-n", ns, pod["metadata"]["name"], "-c", container, "--", "python", "-c",
                              FORKS_IN_POD)
        forks[pod["metadata"]["name"]] = out.split()
    driver_forks, executor_forks = forks[first["metadata"]["name"]], forks[running_executor["metadata"]["name"]]
    assert driver_forks[0] == "servers=1" and int(driver_forks[1].split("=")[1]) >= 1, driver_forks
    assert driver_forks[2] == "launcher=/opt/handoff/bin/fork-python", driver_forks
    assert driver_forks[5] == "untitled_forks=0", driver_forks  # `ps` names each fork's module, not the server
    # ... started by the launcher as the interpreter it was installed with (Spark would have run `python3`)
    assert executor_forks[:2] == ["servers=0", "forks=0"] and executor_forks[3:5] == [
        "worker_daemons=1", "daemon_python=/opt/venv/bin/python"], executor_forks

    # Records keep arriving while the driver pod is force-deleted (no grace: as a node loss would).
    def trickle() -> None:
        for start in range(3000, 6000, 250):
            produce(state["bootstrap"], state["topic"], range(start, start + 250))
            time.sleep(0.5)

    producer = threading.Thread(target=trickle)
    producer.start()
    eventually(lambda: _rows(state) > 3000, "the stream moving on", timeout=300, interval=0.5)
    cluster.kubectl("delete", "pod", "-n", ns, first["metadata"]["name"], "--grace-period=0", "--force")
    producer.join()
    state["produced"] += 3000
    eventually(lambda: _new_driver(cluster, ns, first["metadata"]["name"]), "a new driver pod",
                        timeout=300)
    try:
        eventually(lambda: _rows(state) >= state["produced"], "all 6000 records in the table", timeout=600,
                   interval=2)
    except AssertionError as err:
        raise AssertionError(describe_failure(cluster, ns, err)) from None
    _assert_exactly_once(state)
    assert _new_driver(cluster, ns, first["metadata"]["name"]) is not None  # it is the new pod that resumed


def test_status_and_metrics_come_from_the_running_pods(cluster: Cluster, setup: dict[str, Any]) -> None:
    ns, state = setup["ns"], setup
    driver = eventually(lambda: _driver(cluster, ns), "one running driver pod")["metadata"]["name"]
    # Records for this driver to commit: after the kill above, the old pod (force-deleted, its container still
    # running for a while) can have committed everything before the new one started, and a driver that has
    # committed nothing has no batch to report.
    state["produced"] += produce(state["bootstrap"], state["topic"], range(6000, 6500))
    eventually(lambda: _rows(state) >= state["produced"], "the new records in the table", timeout=600, interval=2)
    table = state["catalog"].load_table(TABLE)
    committed = ledger.resume_offsets(table)[state["topic"]]

    def caught_up() -> dict[str, Any] | None:
        status = _handoff(cluster, ns).get("status", {})
        ready = {c["type"]: c["status"] for c in status.get("conditions", [])}.get("Ready")
        offsets = ((status.get("committed") or {}).get("offsets") or {}).get(state["topic"]) or {}
        # The current driver may have reported batches before these records: wait for a status that has read the
        # table's ledger since.
        done = (ready == "True" and status.get("lag") == 0 and status.get("app", {}).get("driver") == driver
                and (status.get("lastBatch") or {}).get("rows") and status.get("freshness")
                and {int(p): o for p, o in offsets.items()} == committed)
        return status if done else None

    try:
        eventually(caught_up, "status Ready, lag 0, the ledger's offsets, lastBatch and freshness from the current "
                   "driver", timeout=300, interval=2)
    except AssertionError as err:
        raise AssertionError(f"{err}; driver {driver}, the status: {_handoff(cluster, ns).get('status')}") from None
    metrics = cluster.kubectl("get", "--raw", f"/api/v1/namespaces/{ns}/pods/{driver}:9090/proxy/metrics")
    rows = [line for line in metrics.splitlines() if line.startswith("handoff_rows_total{")]
    assert rows and float(rows[0].rsplit(" ", 1)[1]) > 0, metrics[:2000]


def test_a_replay_holds_the_query_in_the_running_driver_pod(cluster: Cluster, setup: dict[str, Any]) -> None:
    """A RollbackAndReplay applied with kubectl: the operator holds the query inside the running driver
    (`handoff_spark.driver.hold`, through the progress ConfigMap the driver's own RBAC lets it read). The same pod
    stops its query at a batch boundary, the table goes back three commits, and the query starts again from the
    ledger in that pod: no new pod, no container restart; the table ends exactly once."""
    ns, state = setup["ns"], setup
    driver = eventually(lambda: _driver(cluster, ns), "one running driver pod")["metadata"]["name"]
    commits = ledger.list_commits(state["catalog"].load_table(TABLE), include_markers=False)
    assert len(commits) >= 4, commits
    cluster.apply({"apiVersion": "handoff.io/v1alpha1", "kind": "ReplayRequest",
                   "metadata": {"name": "rewind", "namespace": ns},
                   "spec": {"handoffRef": {"name": NAME}, "mode": "RollbackAndReplay",
                            "target": {"snapshotId": commits[3].snapshot_id}}})

    def succeeded() -> dict[str, Any] | None:
        status = cluster.get("replayrequest", "rewind", "-n", ns).get("status") or {}
        assert status.get("phase") != "Failed", status
        return status if status.get("phase") == "Succeeded" else None

    try:
        status = eventually(succeeded, "the replay Succeeded", timeout=300, interval=1)
    except AssertionError as err:
        raise AssertionError(describe_failure(cluster, ns, err)) from None
    assert status["progress"]["records"] == status["plan"]["records"] > 0
    stopped = next(step for step in status["steps"] if step["name"] == "DriverStopped")
    assert f"(pod {driver}) stopped its query at a batch boundary" in stopped["message"], stopped
    pod = _driver(cluster, ns)
    assert pod is not None and pod["metadata"]["name"] == driver, "the same driver pod ran through the replay"
    assert all(c.get("restartCount", 0) == 0 for c in pod["status"]["containerStatuses"]), pod["status"]
    log = cluster.kubectl("logs", "-n", ns, driver)
    assert log.count("restarted after the operator lifted its hold rewind ") == 1, log[-3000:]
    metrics = cluster.kubectl("get", "--raw", f"/api/v1/namespaces/{ns}/pods/{driver}:9090/proxy/metrics")
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith(("handoff_query_starts_total{", "handoff_query_held{"))}
    assert {k: v for k, v in samples.items() if 'reason="hold"' in k or k.startswith("handoff_query_held")} \
        == {f'handoff_query_starts_total{{handoff="{ns}/{NAME}",reason="hold"}}': 1.0,
            f'handoff_query_held{{handoff="{ns}/{NAME}"}}': 0.0}, samples
    _assert_exactly_once(state)


def test_deleting_the_handoff_stops_the_driver_and_leaves_no_children(cluster: Cluster,
                                                                       setup: dict[str, Any]) -> None:
    ns = setup["ns"]
    driver = eventually(lambda: _driver(cluster, ns), "one running driver pod")["metadata"]["name"]
    # Follow the driver's log through its end: what it says on SIGTERM shows how it stopped.
    follow = subprocess.Popen(["kubectl", f"--kubeconfig={cluster.kubeconfig}", "logs", "-f", "-n", ns, driver],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    cluster.kubectl("delete", "streamtablehandoff", NAME, "-n", ns, "--wait=true", "--timeout=240s", timeout=260)
    try:
        log, _ = follow.communicate(timeout=120)
    finally:
        follow.kill()
    # Stopped at a batch boundary within the grace period (not cut mid-batch, not killed).
    assert "SIGTERM: finishing the current micro-batch, then stopping" in log, log[-3000:]
    assert "stopping mid-batch" not in log and "stopped" in log.splitlines(), log[-3000:]
    selector = f"handoff.io/name={NAME}"

    def gone() -> bool:
        left = cluster.get("pods,deployments,services,configmaps,serviceaccounts,roles,rolebindings",
                           "-n", ns, "-l", selector)["items"]
        return not left

    eventually(gone, "no pods or children of the deleted handoff", timeout=180, interval=2)
    # What the deleted handoff committed stays exactly once.
    _assert_exactly_once(setup)
