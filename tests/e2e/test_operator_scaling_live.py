"""Executors follow Kafka lag live: the operator (in-process, real kube-apiserver) decides from the real
broker's end offsets and the table's ledger (an Iceberg table in a real SQLite catalog), writes its desired
count onto the `<name>-progress` ConfigMap, and a driver running Spark's own Kubernetes backend applies it
with the handoff's executor_scaler, authenticated as the driver's ServiceAccount (the rendered Role is what
lets it read the count). Spark creates and removes the executor pods; the driver process, its SparkContext
and the driver pod never restart.

What is not real here, and why: the executor pods are scheduled nowhere (a node selector no node has), since
kwok cannot run an executor process; they stay Pending, so Spark's allocator creates them on the way up and
deletes the surplus on the way down (its executorIdleTimeout is lowered to 1 s for that; killExecutors of
registered executors, the production path down, cannot run without real executors). For the same reason no
batch runs, so the driver's progress record (the per-executor rate the operator needs) is a recorded one:
12 000 rows in 12 s on 1 executor, a batch that overran its 10 s commit interval (one within it would say the
executor keeps up, and the rule would not scale up on it)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from confluent_kafka import Producer

from operator_support import (Cluster, Operator, base_spec, eventually, ledger_commit, local_driver_conf,
                              sqlite_ledger_table, stop_driver, token_kubeconfig)

pytestmark = [pytest.mark.apiserver, pytest.mark.kafka, pytest.mark.e2e]

DRIVER = textwrap.dedent("""
    import json, sys, time
    from pyspark.sql import SparkSession
    from handoff_spark.driver.executor_scaler import ExecutorScaler, SparkExecutors
    from handoff_spark.driver.publisher import ProgressPublisher
    conf, min_partitions_file = json.loads(sys.argv[1]), sys.argv[2]
    builder = SparkSession.builder.appName("handoff-scaling-probe")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    publisher = ProgressPublisher.from_env()
    publisher.offer({"batchId": 7, "rows": 12000, "durationMs": 12000, "inputRowsPerSecond": 1000.0,
                     "timestampMs": int(time.time() * 1000)})
    scaler = ExecutorScaler.from_env(SparkExecutors(spark.sparkContext), min_partitions_file=min_partitions_file,
                                     partitions_per_core=3)
    scaler.start()
    print("driver up", spark.sparkContext.applicationId, flush=True)
    sys.stdin.read()          # until the test closes stdin
    scaler.close()
    publisher.close()
    spark.stop()
""")
SELECTOR = "handoff.io/name=orders,app.kubernetes.io/component=executor"


def _produce(bootstrap: str, topic: str, per_partition: int, partitions: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for partition in range(partitions):
        for i in range(per_partition):
            producer.produce(topic, json.dumps({"id": i}).encode(), partition=partition)
    assert producer.flush(60) == 0


def test_a_lag_spike_scales_executors_up_and_the_drain_down_in_steps_live(cluster: Cluster, apiserver, kafka,
                                                                           tmp_path) -> None:
    topic, partitions = f"orders-{uuid.uuid4().hex[:6]}", 4
    kafka.create_topic(topic, partitions=partitions)
    catalog_props, table = sqlite_ledger_table(tmp_path)

    ns = cluster.new_namespace("scale")
    spec = base_spec(kafka.bootstrap, checkpoint={"location": "file:///mnt/checkpoints/orders"},
                     scaling={"minExecutors": 1, "maxExecutors": 4, "targetCatchUp": "10s", "cooldown": "5s"})
    spec["source"]["topics"] = [topic]
    spec["sink"]["iceberg"]["catalog"]["properties"] = catalog_props
    spec["sink"]["iceberg"]["partitionBy"] = []
    spec["spark"]["executor"]["cores"] = 1
    op = Operator(cluster.kubeconfig, status_interval=1.0)
    op.start()
    driver = None
    try:
        cluster.create(ns, "orders", spec)
        cluster.wait_condition(ns, "orders", "Ready", "True", timeout=90)  # kwok runs the driver pod
        (driver_pod,) = cluster.driver_pods(ns, "orders")
        conf, token = local_driver_conf(cluster, apiserver, ns, "orders", driver_pod.metadata.name)
        assert conf["spark.dynamicAllocation.enabled"] == "false" and conf["spark.executor.instances"] == "1"
        kubeconfig = token_kubeconfig(apiserver, tmp_path / "driver.kubeconfig",
                                      f"system:serviceaccount:{ns}:orders-driver", token)
        conf.update({
            # Executor pods stay Pending (see the module docstring) and Spark drops surplus ones after 1 s.
            "spark.kubernetes.executor.node.selector.handoff.io/no-such-node": "true",
            "spark.dynamicAllocation.executorIdleTimeout": "1s",
            # Pending executors never register: without a ratio of 0 the session's start would wait for 80 % of
            # them (Spark's default on Kubernetes) for spark.scheduler.maxRegisteredResourcesWaitingTime, 30 s.
            "spark.scheduler.minRegisteredResourcesRatio": "0",
        })
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HANDOFF_PROGRESS_CONFIGMAP": "orders-progress",
               "HANDOFF_PROGRESS_NAMESPACE": ns, "HANDOFF_SCALE_POLL_SECONDS": "1",
               "HANDOFF_PROGRESS_PUBLISH_SECONDS": "2"}
        log_path = tmp_path / "driver.log"
        driver = subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(conf), str(tmp_path / "min-parts")],
                                  stdin=subprocess.PIPE, stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
                                  text=True, env=env)

        def executor_pods() -> list:
            return [p for p in cluster.core.list_namespaced_pod(ns, label_selector=SELECTOR).items
                    if p.metadata.deletion_timestamp is None]

        def executors() -> dict:
            return (cluster.get(ns, "orders").get("status") or {}).get("executors") or {}

        # Before the spike: minExecutors, one executor pod, and the operator has measured a quiet topic.
        eventually(lambda: len(executor_pods()) == 1, "Spark's first executor pod", timeout=240)
        try:
            # The driver's first progress record has to be published (its API client set up on a busy
            # machine) and read by a refresh before the operator has a rate to decide from.
            eventually(lambda: executors().get("reason") == "Steady", "a steady decision", timeout=180)
        except AssertionError as exc:
            progress = cluster.core.read_namespaced_config_map("orders-progress", ns).data
            raise AssertionError(f"{exc}: status {cluster.get(ns, 'orders').get('status')}; progress ConfigMap "
                                 f"{progress}; driver log tail {log_path.read_text()[-3000:]}") from None
        assert executors()["desired"] == 1

        # The spike: 40 000 records, a 10 s targetCatchUp at 1 000/s per executor → maxExecutors (4) at once.
        _produce(kafka.bootstrap, topic, 10_000, partitions)
        status = eventually(lambda: (e := executors()).get("desired") == 4 and e, "desired 4 after the spike")
        assert status["reason"] == "ScaleUp" and status["lastScaleTime"]
        pods = eventually(lambda: p if len(p := executor_pods()) == 4 else None, "4 executor pods", timeout=120)
        assert all(p.metadata.owner_references[0].name == driver_pod.metadata.name for p in pods)

        # The drain: the table commits everything; down in bounded steps 4 → 2 → 1, a cooldown apart.
        ledger_commit(table, f"{ns}/orders", 0, {topic: {str(p): [0, 10_000] for p in range(partitions)}},
                      int(time.time() * 1000), 40_000)
        seen: list[int] = []

        def drained() -> bool:
            desired = executors().get("desired")
            if not seen or seen[-1] != desired:
                seen.append(desired)
            return desired == 1
        eventually(drained, "desired back to minExecutors", timeout=120)
        assert seen == [4, 2, 1], seen
        eventually(lambda: len(executor_pods()) == 1, "executor pods removed down to 1", timeout=120)
        reasons = [e.reason for e in cluster.events(ns, "orders")]
        assert reasons.count("ScaledDown") == 2 and "ScaledUp" in reasons

        # Never restarted: the same driver pod, the same driver process, no restart counted.
        (after,) = cluster.driver_pods(ns, "orders")
        assert after.metadata.uid == driver_pod.metadata.uid
        assert driver.poll() is None
        log = log_path.read_text()
        assert log.count("driver up") == 1 and "executors: " in log
        assert int((cluster.get(ns, "orders")["status"].get("app") or {}).get("restarts") or 0) == 0
    finally:
        stop_driver(driver)
        cluster.delete_all_handoffs()
        op.stop()
