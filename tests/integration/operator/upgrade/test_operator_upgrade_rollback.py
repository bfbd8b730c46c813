"""Rollback of a failed upgrade, with the operator in-process against the real kube-apiserver and
controller-manager (Deployment → ReplicaSet → pod).

Real: the API server and controller-manager, the operator, Kafka, the SQLite Iceberg catalog, and the driver
that proves generation 1 good: the data plane's own entry point (`python -m handoff_spark run`) fed with the app config the operator rendered into `<name>-app` (only the Spark placement
swapped for local mode and the pod's paths for temporary ones), committing to the table and publishing its
progress record into `<name>-progress` as the driver pod, with a real token of the driver's ServiceAccount
(so the rendered Role is what allows it).

Played by the test: the kubelet (the test bed has none for these pods). It writes the driver pods' status
through pods/status, as a kubelet would: Running/Ready for a driver of generation 1, and for generation 2's
driver a container in CrashLoopBackOff after 3 restarts. The crash itself is not real; what the operator
reads to decide (the pod's container status and config-hash annotation) is exactly what it reads in a
cluster.

The other two tests (two changes in a row; readiness timeout and operator restart) need no Spark: the driver is
played by the driver's real progress publisher (`handoff_spark.driver.publisher`, as the driver pod, with its
ServiceAccount's token) publishing progress records that name committed snapshots, the config it runs and one it
refused; the records' numbers are the test's, not a table's."""
from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
from confluent_kafka import Producer

from handoff_spark.driver.publisher import ProgressPublisher
from kubernetes import config as kube_config
from operator_support import (REPO, Cluster, Operator, base_spec, driver_kubeconfig, eventually, first_index,
                              ledger_commit, operator_running, sqlite_ledger_table, timeline)

pytestmark = [pytest.mark.apiserver, pytest.mark.kafka]
NAME = "orders"
RECORDS = 200


def _produce(bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    start = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    for i in range(RECORDS):
        doc = {"id": i, "created_at": (start + dt.timedelta(seconds=i)).isoformat()}
        producer.produce(topic, json.dumps(doc).encode(), partition=i % 2)
    assert producer.flush(30) == 0


def _hash(obj: Any) -> str:
    return obj.metadata.annotations["handoff.io/config-hash"]


def _template_hash(cluster: Cluster, ns: str) -> str:
    return cluster.apps.read_namespaced_deployment(f"{NAME}-driver", ns).spec.template.metadata.annotations[
        "handoff.io/config-hash"]


def _pods_of(cluster: Cluster, ns: str, config_hash: str) -> list[Any]:
    pods = cluster.driver_pods(ns, NAME)
    return pods if pods and all(_hash(p) == config_hash for p in pods) else []


@contextlib.contextmanager
def _driver(cluster: Cluster, apiserver: Any, ns: str, pod: Any, tmp_path: Path) -> Iterator[subprocess.Popen]:
    """The driver of the pod `pod`, as the operator rendered it, running here (streaming, as in the pod)
    until the block ends; then SIGTERM, and it stops at a batch boundary."""
    rendered = json.loads(cluster.core.read_namespaced_config_map(f"{NAME}-app", ns).data["app.json"])
    config = {**rendered, "checkpointLocation": str(tmp_path / "checkpoint"),
              "progressFile": str(tmp_path / "progress.json"), "metricsPort": 0,
              "sparkConf": {"spark.master": "local[2]"}}
    (tmp_path / "app.json").write_text(json.dumps(config))
    (container,) = pod.spec.containers
    env = {e.name: e.value for e in container.env if e.value is not None}
    env.update({"HANDOFF_DRIVER_POD_NAME": pod.metadata.name,  # the kubelet expands $(POD_NAME)
                "KUBECONFIG": driver_kubeconfig(cluster, apiserver, ns, pod.spec.service_account_name),
                "PYTHONPATH": os.pathsep.join([str(REPO / "spark_app"), str(REPO / "hack")]),
                "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable})
    env.pop("PYSPARK_SUBMIT_ARGS", None)  # pod-only JVM settings ($(POD_NAME), k8s driver pod name)
    with (tmp_path / "driver.log").open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "handoff_spark", "run", "--config", str(tmp_path / "app.json")],
                                env={**os.environ, **env}, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            yield proc
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(180) == 0, (tmp_path / "driver.log").read_text()[-3000:]
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _published(cluster: Cluster, ns: str, proc: subprocess.Popen, log: Path) -> dict[str, Any] | None:
    assert proc.poll() is None, log.read_text()[-3000:]
    text = (cluster.core.read_namespaced_config_map(f"{NAME}-progress", ns).data or {}).get("progress.json")
    return json.loads(text) if text else None


def test_crash_looping_spec_change_goes_back_to_the_last_spec_that_committed(cluster: Cluster, apiserver, kafka,
                                                                             tmp_path: Path) -> None:
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=2)
    _produce(kafka.bootstrap, topic)
    spec = base_spec(kafka.bootstrap)
    spec["source"]["topics"] = [topic]
    spec["sink"]["iceberg"]["catalog"]["properties"] = {
        "type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/warehouse"}
    ns = cluster.new_namespace("upgrade")
    # Only the crash loop may trigger a rollback here, never the readiness clock.
    with operator_running(cluster.kubeconfig, status_interval=1.0, upgrade_readiness_timeout=3600.0):
        try:
            cluster.create(ns, NAME, spec)
            v1_pod = cluster.make_driver_ready(ns, NAME)
            v1_hash = _hash(v1_pod)
            cluster.wait_condition(ns, NAME, "Ready", "True", "Running")
            # Running is not good yet: nothing committed.
            status = cluster.get(ns, NAME)["status"]
            assert status["upgrade"]["tryingGeneration"] == 1 and "lastGoodGeneration" not in status

            # Generation 1's driver commits what Kafka holds: the spec is good.
            with _driver(cluster, apiserver, ns, v1_pod, tmp_path) as proc:
                record = eventually(lambda: _published(cluster, ns, proc, tmp_path / "driver.log"),
                                    "the driver's progress record", timeout=300)
                assert record["driverPod"] == v1_pod.metadata.name and record["committedSnapshot"]
                status = eventually(lambda: (s := cluster.get(ns, NAME)["status"]).get("lastGoodGeneration") == 1
                                    and s, "generation 1 marked good")
            v1_config = status["app"]["configHash"]  # the whole config's (the pod template's leaves the query's out)
            assert status["upgrade"]["lastGoodConfigHash"] == v1_config != v1_hash
            assert "tryingGeneration" not in status["upgrade"]
            stored = cluster.core.read_namespaced_config_map(f"{NAME}-last-good", ns)
            assert json.loads(stored.data["spec.json"]) == cluster.get(ns, NAME)["spec"]
            assert (stored.data["generation"], stored.data["configHash"]) == ("1", v1_config)
            assert [r.kind for r in stored.metadata.owner_references] == ["StreamTableHandoff"]
            eventually(lambda: (cluster.get(ns, NAME)["status"].get("committed") or {}).get("offsets")
                       == {topic: {"0": RECORDS // 2, "1": RECORDS // 2}}, "the ledger's commit in the status")
            # The timeline names the commit's snapshot and how to read the table as of it (issue 35). (Later
            # the spec names generation 2's table, whose ledger is empty, so it is checked now.)
            rows = timeline(cluster.kubeconfig, ns, NAME)
            commit = next((i for i, r in enumerate(rows) if r["source"] == "ledger"
                           and r["snapshot"] == record["committedSnapshot"]), None)
            assert commit is not None, rows
            assert rows[commit]["asOf"] == f"FOR VERSION AS OF {record['committedSnapshot']}"
            assert first_index(rows, "DriverStarted", v1_pod.metadata.name) < commit

            # Generation 2 changes the app config (another table, among others); its driver crash-loops. While
            # it is tried, the status reads its table: nothing committed there, every record waits.
            cluster.patch_spec(ns, NAME, {"commitInterval": "20s", "sink": {"iceberg": {"table": "shop.orders_v2"}}})
            v2_hash = eventually(lambda: (h := _template_hash(cluster, ns)) != v1_hash and h, "generation 2 applied")
            eventually(lambda: _pods_of(cluster, ns, v2_hash), "generation 2's driver pod")
            # The whole config's hash (the pod template's leaves the query's own settings out: driver.query_config).
            v2_config = eventually(lambda: (u := cluster.get(ns, NAME)["status"].get("upgrade") or {})
                                   .get("tryingGeneration") == 2 and u["tryingConfigHash"], "generation 2 tried")
            eventually(lambda: cluster.get(ns, NAME)["status"].get("lag") == RECORDS, "lag of generation 2's table")
            cluster.make_driver_crash(ns, NAME, restarts=3, message="Py4JJavaError: NoSuchMethodError")

            # Back to generation 1's config; the user's spec is left as it is.
            cond = cluster.wait_condition(ns, NAME, "Degraded", "True", "UpgradeRolledBack")
            assert "generation 2" in cond["message"] and "generation 1" in cond["message"]
            assert "CrashLoopBackOff" in cond["message"] and "NoSuchMethodError" in cond["message"]
            eventually(lambda: _template_hash(cluster, ns) == v1_hash, "the Deployment back on generation 1's config")
            app = json.loads(cluster.core.read_namespaced_config_map(f"{NAME}-app", ns).data["app.json"])
            assert app["triggerIntervalSeconds"] == 10 and app["sink"]["table"] == "shop.orders"
            # The status reads what runs again: generation 1's table, where everything is committed.
            eventually(lambda: cluster.get(ns, NAME)["status"].get("lag") == 0, "lag of generation 1's table")
            cr = cluster.get(ns, NAME)
            assert cr["spec"]["commitInterval"] == "20s" and cr["metadata"]["generation"] == 2
            up = cr["status"]["upgrade"]
            assert (up["rolledBackGeneration"], up["rolledBackConfigHash"], up["rolledBackReason"]) == (
                2, v2_config, "CrashLoop")
            assert cr["status"]["lastGoodGeneration"] == 1
            events = [e for e in cluster.events(ns, NAME) if e.reason == "UpgradeRolledBack"]
            assert len(events) == 1 and events[0].type == "Warning" and "generation 2" in events[0].message

            # Generation 1's config runs again: Ready, and still Degraded (the spec asks for something else).
            eventually(lambda: _pods_of(cluster, ns, v1_hash), "generation 1's driver pod again")
            cluster.make_driver_ready(ns, NAME)
            cluster.wait_condition(ns, NAME, "Ready", "True", "Running")
            status = cluster.get(ns, NAME)["status"]
            assert status["phase"] == "Degraded" and _template_hash(cluster, ns) == v1_hash
            assert cluster.condition(ns, NAME, "Degraded")["reason"] == "UpgradeRolledBack"

            # Generation 3 is tried afresh (a change of the pod: what its source does with offsets retention deleted).
            cluster.patch_spec(ns, NAME, {"commitInterval": "30s", "source": {"onOffsetOutOfRange": "earliest"}})
            v3_hash = eventually(lambda: (h := _template_hash(cluster, ns)) not in (v1_hash, v2_hash) and h,
                                 "generation 3 applied")
            status = eventually(lambda: (s := cluster.get(ns, NAME)["status"])["upgrade"].get("tryingGeneration")
                                == 3 and s, "generation 3 tried")
            assert status["upgrade"]["tryingConfigHash"] not in (v2_config, v3_hash)
            assert "rolledBackGeneration" not in status["upgrade"] and status["lastGoodGeneration"] == 1
            eventually(lambda: (c := cluster.condition(ns, NAME, "Degraded"))["observedGeneration"] == 3
                       and c["reason"] != "UpgradeRolledBack", "no rollback reported for generation 3")

            # The timeline, oldest first (issue 35): generation 1's driver, the spec change, generation 2's driver and
            # its crash, the rollback, the next spec change.
            rows = timeline(cluster.kubeconfig, ns, NAME)
            started = first_index(rows, "DriverStarted", v1_pod.metadata.name)
            changed = first_index(rows, "SpecChanged", "generation 2 of the spec (was 1)")
            rolled = first_index(rows, "UpgradeRolledBack", "generation 2")
            assert started < changed < rolled < first_index(rows, "SpecChanged", "generation 3")
            assert rows[rolled]["source"] == "operator" and "NoSuchMethodError" in rows[rolled]["what"]
            assert changed < first_index(rows, "DriverReplaced") < rolled
        finally:
            cluster.delete_all_handoffs()


def _publish(cluster: Cluster, apiserver: Any, ns: str, pod: Any, record: dict[str, Any]) -> None:
    """Publish `record` into `<name>-progress` as the driver of `pod` does: its real progress publisher, with its
    ServiceAccount's token (the record's numbers are the test's)."""
    (container,) = pod.spec.containers
    env = {e.name: e.value for e in container.env if e.value is not None}
    env["HANDOFF_DRIVER_POD_NAME"] = pod.metadata.name
    api = kube_config.new_client_from_config(config_file=driver_kubeconfig(
        cluster, apiserver, ns, pod.spec.service_account_name))
    errors: list[BaseException] = []
    publisher = ProgressPublisher.from_env(env, api=api, on_error=errors.append)
    assert publisher is not None
    publisher.offer({"handoffId": f"{ns}/{NAME}", "batchId": 0, "rows": 100, "dlqRows": 0,
                     "offsets": {"orders": {"0": 100}}, "degradedReason": None, **record})
    publisher.close()
    assert not errors, errors


def test_a_change_applied_before_the_tried_one_was_seen_committing_rolls_back_to_the_tried_one(
        cluster: Cluster, apiserver) -> None:
    """Two in-place changes seconds apart (the real-node drill applied a refused schema right after the change
    before it committed): generation 2's driver runs it and commits, but the spec changes to generation 3 before
    the operator saw that commit. The operator makes generation 2 (its copy stored when it started being tried)
    the last good spec, so the refused generation 3 is rolled back to generation 2, not to generation 1. The
    operator is stopped while generation 2 commits and generation 3 is applied, so the order is certain."""
    ns = cluster.new_namespace("upgrade")
    op = Operator(cluster.kubeconfig, status_interval=1.0)
    op.start()

    def status() -> dict[str, Any]:
        return cluster.get(ns, NAME).get("status") or {}

    def query_config() -> str:
        cm = cluster.core.read_namespaced_config_map(f"{NAME}-progress", ns)
        return (cm.metadata.annotations or {}).get("handoff.io/query-config") or ""

    sql = {v: f"SELECT id, created_at, '{v}' AS note FROM source" for v in ("v1", "v2", "v3")}
    try:
        cluster.create(ns, NAME, base_spec(transform={"sql": sql["v1"]}, deadLetter={"topic": "orders-dlq"}))
        pod = cluster.make_driver_ready(ns, NAME)
        now_ms = int(dt.datetime.now(dt.timezone.utc).timestamp() * 1000)
        h1 = eventually(lambda: (status().get("app") or {}).get("configHash"), "generation 1's config")
        _publish(cluster, apiserver, ns, pod, {"configHash": h1, "configSinceMs": now_ms, "committedSnapshot": 1})
        eventually(lambda: status().get("lastGoodGeneration") == 1, "generation 1 good")

        cluster.patch_spec(ns, NAME, {"transform": {"sql": sql["v2"]}})
        h2 = eventually(lambda: (u := status().get("upgrade") or {}).get("tryingGeneration") == 2
                        and u.get("tryingConfigHash"), "generation 2 tried")
        assert h2 != h1 and sql["v2"] in query_config()
        assert [p.metadata.name for p in cluster.driver_pods(ns, NAME)] == [pod.metadata.name]  # in place
        op.stop()
        # Generation 2 commits and generation 3 is applied while no operator looks.
        _publish(cluster, apiserver, ns, pod, {"configHash": h2, "configSinceMs": now_ms + 1000,
                                               "committedSnapshot": 2})
        cluster.patch_spec(ns, NAME, {"transform": {"sql": sql["v3"]}})
        op.start()
        eventually(lambda: status().get("lastGoodGeneration") == 2, "generation 2 marked good after generation 3")
        h3 = eventually(lambda: (h := (status().get("app") or {}).get("configHash")) not in (h1, h2) and h,
                        "generation 3's config")
        assert sql["v3"] in query_config()
        events = [e.message for e in cluster.events(ns, NAME) if e.reason == "UpgradeSucceeded"]
        assert any(f"generation 2 (config {h2}) committed a batch" in m and "generation 3 is tried next" in m
                   for m in events), events

        # The running driver refuses generation 3: back to generation 2's query, not generation 1's.
        _publish(cluster, apiserver, ns, pod, {"configHash": h2, "configSinceMs": now_ms + 1000,
                                               "committedSnapshot": 2, "configRefusedHash": h3,
                                               "configRefused": "TransformInvalid: spec.transform.sql: no"})
        up = eventually(lambda: (u := status().get("upgrade") or {}).get("rolledBackGeneration") == 3 and u,
                        "generation 3 rolled back")
        assert (up["rolledBackReason"], up["lastGoodConfigHash"]) == ("TransformInvalid", h2), up
        assert "running the config of generation 2" in up["message"], up
        eventually(lambda: sql["v2"] in query_config(), "generation 2's query config for the driver again")
        assert sql["v1"] not in query_config()
        cluster.delete_all_handoffs()
    finally:
        op.stop()


def test_a_change_applied_right_after_the_tried_one_committed_is_read_from_the_ledger_first(
        cluster: Cluster, apiserver, kafka, tmp_path: Path) -> None:
    """The second change comes right after the first change's batch reached the table, before the driver's record
    said so (it publishes just after the commit): the spec change's own reconcile reads the table's ledger, as a
    status refresh does, and marks the first change good from its commit there. Status refreshes are 10 minutes
    apart here, so only that reconcile can have read the ledger."""
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=1)
    props, table = sqlite_ledger_table(tmp_path)
    ns = cluster.new_namespace("upgrade")
    sql = {v: f"SELECT id, created_at, '{v}' AS note FROM source" for v in ("v1", "v2", "v3")}
    spec = base_spec(kafka.bootstrap, transform={"sql": sql["v1"]}, deadLetter={"topic": f"{topic}-dlq"})
    spec["source"]["topics"] = [topic]
    spec["sink"]["iceberg"]["catalog"]["properties"] = props
    spec["sink"]["iceberg"]["partitionBy"] = []
    op = Operator(cluster.kubeconfig, status_interval=600.0)
    op.start()

    def status() -> dict[str, Any]:
        return cluster.get(ns, NAME).get("status") or {}

    try:
        cluster.create(ns, NAME, spec)
        pod = cluster.make_driver_ready(ns, NAME)
        now_ms = int(dt.datetime.now(dt.timezone.utc).timestamp() * 1000)
        h1 = eventually(lambda: (status().get("app") or {}).get("configHash"), "generation 1's config")
        _publish(cluster, apiserver, ns, pod, {"configHash": h1, "configSinceMs": now_ms, "committedSnapshot": 1})
        op.stop()
        op.start()  # its first status refresh comes at once and reads the record; the next one in 10 minutes
        eventually(lambda: status().get("lastGoodGeneration") == 1, "generation 1 good")
        cluster.patch_spec(ns, NAME, {"transform": {"sql": sql["v2"]}})
        h2 = eventually(lambda: (u := status().get("upgrade") or {}).get("tryingGeneration") == 2
                        and u.get("tryingConfigHash"), "generation 2 tried")
        # The driver runs generation 2 (its record says so, no commit of it yet); then a batch of it commits.
        since = int(dt.datetime.now(dt.timezone.utc).timestamp() * 1000)
        _publish(cluster, apiserver, ns, pod, {"configHash": h2, "configSinceMs": since, "committedSnapshot": None})
        eventually(lambda: ((cluster.core.read_namespaced_config_map(f"{NAME}-progress", ns).data or {})
                            .get("progress.json") or "").find(h2) >= 0, "the driver's record of generation 2")
        time.sleep(1.5)  # the commit must come clearly after the driver started running generation 2
        ledger_commit(table, f"{ns}/{NAME}", 0, {topic: {"0": [0, 5]}}, since, 5)
        cluster.patch_spec(ns, NAME, {"transform": {"sql": sql["v3"]}})
        eventually(lambda: status().get("lastGoodGeneration") == 2, "generation 2 marked good from the ledger")
        assert (status().get("upgrade") or {}).get("lastGoodConfigHash") == h2
        cluster.delete_all_handoffs()
    finally:
        op.stop()


def test_a_spec_whose_driver_never_gets_ready_is_rolled_back_after_its_readiness_timeout(
        cluster: Cluster, apiserver, tmp_path: Path) -> None:
    ns = cluster.new_namespace("upgrade")
    op = Operator(cluster.kubeconfig, status_interval=1.0)
    op.start()
    try:
        cluster.create(ns, NAME, base_spec(upgrade={"readinessTimeout": "3s"}))
        v1_pod = cluster.make_driver_ready(ns, NAME)
        v1_hash = _hash(v1_pod)
        # Generation 1's driver reports a committed batch into <name>-progress.
        _publish(cluster, apiserver, ns, v1_pod, {"committedSnapshot": 4242})
        eventually(lambda: cluster.get(ns, NAME)["status"].get("lastGoodGeneration") == 1, "generation 1 good")

        # Generation 2's driver never becomes ready (the pod stays Pending: no kubelet plays it).
        v1_config = cluster.get(ns, NAME)["status"]["app"]["configHash"]
        cluster.patch_spec(ns, NAME, {"commitInterval": "20s", "source": {"onOffsetOutOfRange": "earliest"}})
        v2_hash = eventually(lambda: (h := _template_hash(cluster, ns)) != v1_hash and h, "generation 2 applied")
        cond = cluster.wait_condition(ns, NAME, "Degraded", "True", "UpgradeRolledBack")
        assert "generation 2" in cond["message"] and "did not commit a batch within 3s" in cond["message"]
        assert "is not ready" in cond["message"]
        eventually(lambda: _template_hash(cluster, ns) == v1_hash, "the Deployment back on generation 1's config")
        up = cluster.get(ns, NAME)["status"]["upgrade"]
        assert (up["rolledBackGeneration"], up["rolledBackReason"]) == (2, "ReadinessTimeout")
        assert up["rolledBackConfigHash"] not in (v1_config, v2_hash)  # generation 2's whole config

        # An operator restart keeps running the last good config (the state is in the status and the
        # last good spec in <name>-last-good).
        op.stop()
        op.start()
        eventually(lambda: _pods_of(cluster, ns, v1_hash), "generation 1's driver pod again")
        cluster.make_driver_ready(ns, NAME)
        cluster.wait_condition(ns, NAME, "Ready", "True", "Running")
        assert _template_hash(cluster, ns) == v1_hash
        assert cluster.condition(ns, NAME, "Degraded")["reason"] == "UpgradeRolledBack"
        assert cluster.get(ns, NAME)["spec"]["commitInterval"] == "20s"
        cluster.delete_all_handoffs()
    finally:
        op.stop()
