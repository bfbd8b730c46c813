"""The drill of issue 35: one operator-managed handoff goes through a spec change, a kill of its driver, a scale-up
from lag, a retention raise, a replay and a bad upgrade's rollback, in that order; then `kubectl handoff timeline`
(the real kubectl running the installed plugin, -o json) must list each, in the order the test made them happen
(checked against the times it took around each step), with its details, among the table's ledger commits with
their snapshot ids.

Real: kube-apiserver + etcd + kube-controller-manager (Deployment → ReplicaSet → pod, garbage collection), the
operator in-process (kopf: the handoff's reconcile, its timeline record, the ReplayRequest controller), Kafka (the
lag the operator scales on, the topic's retention it reads and raises, read back from the broker), an Iceberg
table in a SQLite catalog (the ledger, the replay's undo tag and rollback), and for the scale-up a Spark driver on
this machine as the driver pod (its SparkContext on Spark's Kubernetes backend with the handoff's rendered
sparkConf and the driver ServiceAccount's token, running the driver's executor scaler), which makes the executor
pods and applies the count the operator decides, as in test_operator_scaling_live.py.

Played by the test, as the neighbouring tests play it, and why:
- the kubelet: the driver pods' status through pods/status, Running/Ready, and CrashLoopBackOff after 3 restarts
  for the bad upgrade's driver (test_operator_upgrade_rollback.py). The default spec's checkpoint PVC is never
  bound here, so no node (not kwok's either) runs the pods, and the kill is a real pod deletion the ReplicaSet
  answers with a new pod. The executor pods are scheduled nowhere (no node here runs an executor process): they
  stay Pending, Spark makes them and deletes them when it stops;
- the driver's commits: ledger snapshots written exactly as the sink writes them (operator_support.ledger_commit),
  before the handoff starts and, for the replay, the re-read ranges (test_operator_replay.py);
- the driver's progress record, published by the driver's own ProgressPublisher as the driver pod: the table's
  head as its committed snapshot (what makes a spec good for the upgrade rule), then one busy batch (1 200 rows in
  12 s, over its 10 s commit interval) that gives the operator the per-executor rate it scales on. No batch runs
  without executors that run, so test_operator_scaling_live.py publishes the same kind of recorded batch.

The Spark driver runs only through the scale-up: the replay stops the driver pod it would belong to (its executor
pods are owned by that pod), and the bad upgrade replaces it.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from handoff_spark.driver.publisher import ProgressPublisher
from handoff_testbed.eventually import eventually as _eventually
from operator_support import (IMAGE, NOT_YET, Cluster, base_spec, eventually, ledger_commit, local_driver_conf,
                              operator_running, sqlite_ledger_table, stop_driver, timeline, token_kubeconfig)

pytestmark = [pytest.mark.apiserver, pytest.mark.kafka, pytest.mark.e2e]

NAME = "orders"
PARTITIONS = 4
HOUR_MS = 3_600_000
#: replay.window 2h + replay.maxOutage 1h + the lag's age + 10% margin, rounded up to whole hours by enforce.
RAISED_MS = 4 * HOUR_MS
BROKEN_IMAGE = "registry.test/handoff-spark:broken"
#: ReplayRequest times (creationTimestamp, its steps) have whole seconds: up to this much before the moment.
SECOND_MS = 1000
#: The driver's executor scaler in a SparkSession of the handoff's rendered sparkConf (test_operator_scaling_live.py
#: runs the same): Spark's Kubernetes backend makes the executor pods, owned by the driver pod it is told it runs
#: in; the scaler applies the count the operator writes onto `<name>-progress`. Runs until its stdin closes.
SCALER_DRIVER = textwrap.dedent("""
    import json, sys
    from pyspark.sql import SparkSession
    from handoff_spark.driver.executor_scaler import ExecutorScaler, SparkExecutors
    conf, min_partitions_file = json.loads(sys.argv[1]), sys.argv[2]
    builder = SparkSession.builder.appName("handoff-timeline-drill")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    scaler = ExecutorScaler.from_env(SparkExecutors(spark.sparkContext), min_partitions_file=min_partitions_file,
                                     partitions_per_core=3)
    scaler.start()
    print("driver up", spark.sparkContext.applicationId, flush=True)
    sys.stdin.read()
    scaler.close()
    spark.stop()
""")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _produce(bootstrap: str, topic: str, per_partition: int, start: int = 0) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for partition in range(PARTITIONS):
        for i in range(start, start + per_partition):
            producer.produce(topic, json.dumps({"id": i}).encode(), partition=partition)
    assert producer.flush(60) == 0


def _retention_ms(kafka: Any, topic: str) -> str:
    admin = kafka.admin()  # held: a dropped AdminClient cancels its requests
    (future,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
    return future.result(timeout=30)["retention.ms"].value


def _set_retention_ms(kafka: Any, topic: str, value: int) -> None:
    admin = kafka.admin()
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", str(value), incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def _template_hash(cluster: Cluster, ns: str) -> str:
    return cluster.apps.read_namespaced_deployment(f"{NAME}-driver", ns).spec.template.metadata.annotations[
        "handoff.io/config-hash"]


def _template_image(cluster: Cluster, ns: str) -> str:
    return cluster.apps.read_namespaced_deployment(f"{NAME}-driver", ns).spec.template.spec.containers[0].image


def _pods_of(cluster: Cluster, ns: str, config_hash: str) -> list[Any]:
    pods = cluster.driver_pods(ns, NAME)
    return pods if pods and all(p.metadata.annotations["handoff.io/config-hash"] == config_hash for p in pods) else []


def _recorded(cluster: Cluster, ns: str, reason: str, contains: str) -> dict[str, Any]:
    """Wait until the operator's timeline record holds an entry of `reason` whose message holds `contains`."""
    def entries() -> list[dict[str, Any]]:
        text = (cluster.core.read_namespaced_config_map(f"{NAME}-timeline", ns).data or {}).get("timeline.json")
        return json.loads(text or "[]")

    def probe() -> dict[str, Any] | None:
        return next((e for e in entries() if e["reason"] == reason and contains in e["message"]), None)

    def record() -> str:  # on failure: what the record holds instead
        return "the record: " + "; ".join(f"{e['reason']}: {e['message'][:160]}" for e in entries()[-12:])
    return _eventually(probe, f"a {reason} entry with {contains!r} in the timeline record", timeout=90,
                       retry_on=NOT_YET, context=record)


def _new_driver_pod(cluster: Cluster, ns: str, old: set[str]) -> str:
    """The driver pod the ReplicaSet made after `old` went, played Running and Ready."""
    eventually(lambda: [p for p in cluster.driver_pods(ns, NAME) if p.metadata.name not in old]
               and all(p.metadata.name not in old for p in cluster.driver_pods(ns, NAME)), "a new driver pod")
    return cluster.make_driver_ready(ns, NAME).metadata.name


@contextlib.contextmanager
def _spark_driver(cluster: Cluster, apiserver: Any, ns: str, pod: str, workdir: Path) -> Iterator[Path]:
    """SCALER_DRIVER as driver pod `pod`, authenticated as the driver's ServiceAccount (the rendered Role is what
    lets it make executor pods and read the count). The executor pods are scheduled nowhere (a node selector no
    node has: no node here runs an executor process), so Spark makes them on the way up and they stay Pending.
    Yields its log; ends it (Spark deletes its executor pods) when the block ends."""
    conf, token = local_driver_conf(cluster, apiserver, ns, NAME, pod)
    kubeconfig = token_kubeconfig(apiserver, workdir / "driver.kubeconfig", f"system:serviceaccount:{ns}:{NAME}-driver",
                                  token)
    # Executor pods that never run never register: without a ratio of 0 the session's start would wait for 80 % of
    # them (Spark's default on Kubernetes) for spark.scheduler.maxRegisteredResourcesWaitingTime, 30 s.
    conf.update({"spark.kubernetes.executor.node.selector.handoff.io/no-such-node": "true",
                 "spark.dynamicAllocation.executorIdleTimeout": "1s",
                 "spark.scheduler.minRegisteredResourcesRatio": "0"})
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HANDOFF_PROGRESS_CONFIGMAP": f"{NAME}-progress",
           "HANDOFF_PROGRESS_NAMESPACE": ns, "HANDOFF_SCALE_POLL_SECONDS": "1"}
    log = workdir / "spark-driver.log"
    driver = subprocess.Popen([sys.executable, "-c", SCALER_DRIVER, json.dumps(conf), str(workdir / "min-parts")],
                              stdin=subprocess.PIPE, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True,
                              env=env)
    try:
        yield log
    finally:
        stop_driver(driver)


def _executor_pods(cluster: Cluster, ns: str) -> list[Any]:
    return [p for p in cluster.core.list_namespaced_pod(
        ns, label_selector=f"handoff.io/name={NAME},app.kubernetes.io/component=executor").items
        if p.metadata.deletion_timestamp is None]


class Steps:
    """The drill's steps, each with the wall-clock window (epoch ms) it happened in."""

    def __init__(self) -> None:
        self.windows: dict[str, tuple[int, int]] = {}

    def run(self, name: str, action: Callable[[], Any]) -> Any:
        start = _now_ms()
        result = action()
        self.windows[name] = (start, _now_ms())
        return result

    def next_second(self) -> None:
        """Until the clock has turned to the next whole second after the last step ended: a ReplayRequest's times
        have whole seconds, so a request made in the same second as the step before would sort before it."""
        last = max(end for _, end in self.windows.values())
        eventually(lambda: _now_ms() // 1000 > last // 1000, "the next second", timeout=5)


def _one(rows: list[dict[str, Any]], kind: str, contains: str, window: tuple[int, int]) -> int:
    """The index of the one row of `kind` whose text holds `contains`; it lies in `window`."""
    found = [i for i, r in enumerate(rows) if r["kind"] == kind and contains in r["what"]]
    assert len(found) == 1, (kind, contains, [(r["source"], r["kind"], r["what"]) for r in rows])
    at = rows[found[0]]["timeMs"]
    assert window[0] <= at <= window[1], (kind, at, window, rows[found[0]])
    return found[0]


def test_the_timeline_lists_a_drills_six_steps_in_order_with_their_details(cluster: Cluster, apiserver, kafka,
                                                                             tmp_path: Path) -> None:
    topic = f"drill-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=PARTITIONS, config={"retention.ms": str(24 * HOUR_MS)})
    _produce(kafka.bootstrap, topic, 50)
    props, table = sqlite_ledger_table(tmp_path)
    ns = cluster.new_namespace("drill")
    hid = f"{ns}/{NAME}"

    def commit(batch: int, start: int, end: int) -> int:
        return ledger_commit(table, hid, batch, {topic: {str(p): [start, end] for p in range(PARTITIONS)}},
                             _now_ms(), PARTITIONS * (end - start))
    # What the driver had committed: everything Kafka holds, in three batches.
    snapshots = [commit(b, s, e) for b, (s, e) in enumerate([(0, 20), (20, 40), (40, 50)])]

    spec = base_spec(kafka.bootstrap, replay={"window": "2h", "maxOutage": "1h"}, retention={"mode": "enforce"},
                     scaling={"minExecutors": 1, "maxExecutors": 3, "targetCatchUp": "10s", "cooldown": "5s"})
    spec["source"]["topics"] = [topic]
    spec["sink"]["iceberg"]["catalog"]["properties"] = props
    spec["sink"]["iceberg"]["partitionBy"] = []
    spec["spark"]["executor"]["cores"] = 1
    steps = Steps()

    def status() -> dict[str, Any]:
        return cluster.get(ns, NAME).get("status") or {}

    publishers: list[ProgressPublisher] = []

    def publisher(pod: str) -> ProgressPublisher:
        """The driver's own publisher, as driver pod `pod`."""
        publishers.append(ProgressPublisher(ns, f"{NAME}-progress", api=cluster.api, pod=pod, interval=2.0))
        return publishers[-1]

    # Only the crash loop may roll back here, never the readiness clock.
    # The drill's driver is played by the test and never reads the query hold (as an image older than the hold):
    # after replay_hold_ack_seconds without its word the replay stops the driver pod, the new pod the timeline shows.
    with operator_running(cluster.kubeconfig, status_interval=1.0, retention_check_interval=2.0,
                          upgrade_readiness_timeout=3600.0, delete_grace_seconds=5.0, replay_hold_ack_seconds=2.0):
        try:
            cluster.create(ns, NAME, spec)
            first = cluster.make_driver_ready(ns, NAME).metadata.name
            # Generation 1's driver reports the table's head as its commit: the spec is good.
            first_publisher = publisher(first)
            first_publisher.offer({"handoffId": hid, "batchId": 2, "rows": 40, "dlqRows": 0,
                                   "committedSnapshot": snapshots[-1], "timestampMs": _now_ms()})
            eventually(lambda: status().get("lastGoodGeneration") == 1, "generation 1 good")
            eventually(lambda: status().get("lag") == 0, "nothing waiting in Kafka")
            cluster.wait_condition(ns, NAME, "RetentionSufficient", "True", "Sufficient")
            assert (status().get("executors") or {}).get("desired") == 1

            # 1. A spec change: room for a fourth executor.
            def change_spec() -> None:
                cluster.patch_spec(ns, NAME, {"scaling": {"maxExecutors": 4}})
                _recorded(cluster, ns, "SpecChanged", "generation 2 of the spec (was 1)")
            steps.run("spec", change_spec)

            # 2. The driver pod is killed; its ReplicaSet makes another.
            def kill() -> str:
                cluster.core.delete_namespaced_pod(first, ns)
                pod = _new_driver_pod(cluster, ns, {first})
                _recorded(cluster, ns, "DriverReplaced", f"driver pod {pod} replaced {first}")
                return pod
            second = steps.run("kill", kill)
            first_publisher.close()
            cluster.wait_condition(ns, NAME, "Ready", "True", "Running")

            # 3. Lag: 4 000 records arrive, and the new driver's batch overran its commit interval (1 200 rows in
            # 12 s on one executor: 100/s); clearing the lag within targetCatchUp 10s needs 4 executors. (The
            # batch is reported once the operator has read the whole lag, so it decides on all of it at once.)
            # Spark, as the new driver pod, makes the executor pods: one first, then the operator's count.
            second_publisher = publisher(second)
            with _spark_driver(cluster, apiserver, ns, second, tmp_path) as spark_log:
                try:
                    eventually(lambda: len(_executor_pods(cluster, ns)) == 1, "Spark's first executor pod",
                               timeout=240)
                except AssertionError as exc:
                    raise AssertionError(f"{exc}; Spark driver log: {spark_log.read_text()[-3000:]}") from None

                def scale_up() -> dict[str, Any]:
                    _produce(kafka.bootstrap, topic, 1000, start=50)
                    eventually(lambda: status().get("lag") == 4000, "the lag read from Kafka and the ledger")
                    assert (status().get("executors") or {}).get("desired") == 1  # no busy batch measured yet
                    second_publisher.offer({"handoffId": hid, "batchId": 3, "rows": 1200, "durationMs": 12000,
                                            "inputRowsPerSecond": 100.0, "dlqRows": 0,
                                            "committedSnapshot": snapshots[-1], "timestampMs": _now_ms()})
                    decided = eventually(lambda: (e := status().get("executors") or {}).get("desired") == 4 and e,
                                         "4 executors desired", timeout=90)
                    _recorded(cluster, ns, "ScaledUp", "1 → 4 executors")
                    eventually(lambda: len(_executor_pods(cluster, ns)) == 4, "4 executor pods", timeout=120)
                    return decided
                executors = steps.run("scale", scale_up)
                assert executors["reason"] == "ScaleUp" and "lag 4000" in executors["message"], executors
                assert all(p.metadata.owner_references[0].name == second for p in _executor_pods(cluster, ns))
                assert "executors: " in spark_log.read_text()
            # Generation 2 renders generation 1's app config, which committed: it is the one a failed change goes
            # back to.
            eventually(lambda: status().get("lastGoodGeneration") == 2, "generation 2 good")

            # 4. Someone cuts the topic's retention to an hour, too short for replay.window + maxOutage: the
            # operator (enforce) raises it again, in Kafka.
            def retention() -> None:
                _set_retention_ms(kafka, topic, HOUR_MS)
                eventually(lambda: _retention_ms(kafka, topic) == str(RAISED_MS), "retention.ms raised again")
                _recorded(cluster, ns, "RetentionEnforced", f"{HOUR_MS} → {RAISED_MS}")
            steps.run("retention", retention)
            cluster.wait_condition(ns, NAME, "RetentionSufficient", "True")

            # 5. A ReplayRequest rolls the table back to its first commit and replays the rest.
            steps.next_second()

            def replay() -> tuple[str, int, dict[str, Any]]:
                cluster.custom.create_namespaced_custom_object("handoff.io", "v1alpha1", ns, "replayrequests", {
                    "apiVersion": "handoff.io/v1alpha1", "kind": "ReplayRequest", "metadata": {"name": "rewind"},
                    "spec": {"handoffRef": {"name": NAME}, "mode": "RollbackAndReplay",
                             "target": {"snapshotId": snapshots[0]}}})

                def request() -> dict[str, Any]:
                    got = cluster.custom.get_namespaced_custom_object("handoff.io", "v1alpha1", ns,
                                                                      "replayrequests", "rewind").get("status") or {}
                    assert got.get("phase") != "Failed", got
                    return got
                eventually(lambda: "DriverStarted" in [s["name"] for s in request().get("steps") or []],
                           "the replay's driver started again", timeout=120)
                pod = _new_driver_pod(cluster, ns, {first, second})
                # The new driver re-reads what the rollback removed and commits it, as its sink does.
                replayed = commit(3, 20, 50)
                done = eventually(lambda: (s := request()).get("phase") == "Succeeded" and s, "the replay Succeeded",
                                  timeout=120)
                return pod, replayed, done
            third, replayed, request_status = steps.run("replay", replay)
            second_publisher.close()
            assert [s["name"] for s in request_status["steps"]] == [
                "DriverStopped", "Tagged", "RolledBack", "DriverStarted", "Replayed"]
            assert request_status["plan"]["rollbackToSnapshot"] == str(snapshots[0])

            # 6. A bad upgrade: a new image whose driver crash-loops; the operator goes back to generation 2.
            good_hash = _template_hash(cluster, ns)
            # The whole config's hashes (the pod template's leaves the query's own settings out): the rollback's
            # messages and status name these.
            good_config = status()["app"]["configHash"]
            assert good_config != good_hash

            def upgrade() -> tuple[str, str, str]:
                cluster.patch_spec(ns, NAME, {"spark": {"image": BROKEN_IMAGE}})
                bad = eventually(lambda: (h := _template_hash(cluster, ns)) != good_hash and h, "generation 3 applied")
                (pod,) = eventually(lambda: _pods_of(cluster, ns, bad), "generation 3's driver pod")
                assert pod.spec.containers[0].image == BROKEN_IMAGE
                tried = eventually(lambda: (u := status().get("upgrade") or {}).get("tryingGeneration") == 3
                                   and u["tryingConfigHash"], "generation 3 tried")
                cluster.make_driver_crash(ns, NAME, restarts=3, message="ImportError: cannot import name 'sink'")
                cluster.wait_condition(ns, NAME, "Degraded", "True", "UpgradeRolledBack", timeout=90)
                eventually(lambda: _template_hash(cluster, ns) == good_hash, "the Deployment back on generation 2")
                _recorded(cluster, ns, "UpgradeRolledBack", "generation 3")
                return bad, tried, pod.metadata.name
            bad_hash, bad_config, bad_pod = steps.run("upgrade", upgrade)
            assert _template_image(cluster, ns) == IMAGE
            up = status()["upgrade"]
            assert (up["rolledBackGeneration"], up["rolledBackConfigHash"], up["rolledBackReason"]) == (
                3, bad_config, "CrashLoop") and bad_config != bad_hash
            eventually(lambda: _pods_of(cluster, ns, good_hash), "generation 2's driver pod again")
            last = cluster.make_driver_ready(ns, NAME).metadata.name
            cluster.wait_condition(ns, NAME, "Ready", "True", "Running")
            _recorded(cluster, ns, "DriverReplaced", f"driver pod {last} replaced {bad_pod}")

            # The timeline, as a person reads it: the real kubectl runs the installed plugin (oldest first here).
            rows = timeline(cluster.kubeconfig, ns, NAME)
            w = steps.windows
            changed = _one(rows, "SpecChanged", "generation 2 of the spec (was 1)", w["spec"])
            killed = _one(rows, "DriverReplaced", f"driver pod {second} replaced {first}", w["kill"])
            scaled = _one(rows, "ScaledUp", "1 → 4 executors", w["scale"])
            assert "lag 4000" in rows[scaled]["what"] and "100/s per executor" in rows[scaled]["what"]
            raised = _one(rows, "RetentionEnforced",
                          f"retention.ms of topic {topic} {HOUR_MS} → {RAISED_MS} in Kafka", w["retention"])
            checked = _one(rows, "RetentionChecked", f"RetentionRaised: raised retention.ms of topic {topic} from "
                                                     f"{HOUR_MS} to {RAISED_MS}", w["retention"])
            replay_rows = [i for i, r in enumerate(rows) if r.get("request") == "rewind"]
            assert [rows[i]["kind"] for i in replay_rows] == [
                "ReplayRequested", "DriverStopped", "Tagged", "RolledBack", "DriverStarted", "Replayed", "Succeeded"]
            assert f"ReplayRequest rewind: RollbackAndReplay to {snapshots[0]}" in rows[replay_rows[0]]["what"]
            assert rows[replay_rows[-1]]["what"] == "ReplayRequest rewind: Succeeded"
            for i in replay_rows:
                assert w["replay"][0] - SECOND_MS <= rows[i]["timeMs"] <= w["replay"][1], (rows[i], w["replay"])
            rolled = _one(rows, "UpgradeRolledBack", f"Warning UpgradeRolledBack: generation 3 (config {bad_config}) "
                                                     f"crash-looped", w["upgrade"])
            assert f"running the config of generation 2 ({good_config})" in rows[rolled]["what"]
            assert "ImportError: cannot import name 'sink'" in rows[rolled]["what"]
            # Generation 3's pod ran (and crashed) between the replay's pod and the rollback's.
            upgraded = _one(rows, "DriverReplaced", f"driver pod {bad_pod} replaced {third}", w["upgrade"])
            back = _one(rows, "DriverReplaced", f"driver pod {last} replaced {bad_pod}", (w["upgrade"][0], _now_ms()))
            # A restart shown after the rollback goes back to generation 2's config (it said "to apply generation 3").
            restarts = [r["what"] for r in rows[rolled:] if r["kind"] == "Restarting"]
            assert all(f"restarting the driver with the config of generation 2 ({good_config})" in what
                       for what in restarts), restarts
            # The spec change kept the app config: good at once, without claiming a commit of its own.
            assert any(r["kind"] == "UpgradeSucceeded" and "generation 2 runs the app config of generation 1" in
                       r["what"] for r in rows), [r["what"] for r in rows if r["kind"] == "UpgradeSucceeded"]
            for i in (changed, killed, scaled, raised, checked, rolled):
                assert rows[i]["source"] == "operator", rows[i]
            # In the order they happened.
            assert changed < killed < scaled < min(raised, checked) <= max(raised, checked) < replay_rows[0] \
                <= replay_rows[-1] < upgraded <= rolled <= back, [(r["kind"], r["time"]) for r in rows]
            times = [r["timeMs"] for r in rows]
            assert times == sorted(times)

            # The ledger's commits in the table's history now: the first commit (the rollback's target) and the
            # replayed one, each with its snapshot and how to read the table as of it.
            ledger = [r for r in rows if r["source"] == "ledger"]
            assert [r["snapshot"] for r in ledger if r["kind"] == "batch"] == [snapshots[0], replayed], ledger
            for r in ledger:
                assert r["asOf"] == f"FOR VERSION AS OF {r['snapshot']}"
            first_commit = next(r for r in ledger if r["snapshot"] == snapshots[0])
            assert first_commit["what"].startswith("batch 0 (handoff): 80 rows") and f"{topic}[3] 0→20" in \
                first_commit["what"]
            replay_commit = next(i for i, r in enumerate(rows) if r.get("snapshot") == replayed)
            assert rows.index(first_commit) < changed and replay_rows[0] < replay_commit
            assert w["replay"][0] <= rows[replay_commit]["timeMs"] <= w["replay"][1]
        finally:
            for p in publishers:
                p.close()
            cluster.delete_all_handoffs()
