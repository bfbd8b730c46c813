"""RollbackAndReplay end to end: the operator (in-process, real kube-apiserver) runs the request while a real
driver process (`python -m handoff_spark run`, Spark local mode) runs the app config the operator rendered
into the ConfigMap `<name>-app`, started and stopped as the driver Deployment's replicas say (the test plays
the kubelet: replicas 1 → a running process, 0 → SIGTERM, the app stops at a batch boundary). Real Kafka, a
real Iceberg table in a SQLite catalog.

Done when: after rolling back the last three snapshots and replaying, the table holds exactly what it held
before (same rows, no duplicates), plus what arrived meanwhile."""
from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kubernetes.client.rest import ApiException

from handoff_spark.iceberg import ledger
from handoff_spark.config import AppConfig
from operator_support import REPO, Cluster, Operator, base_spec, eventually

pytestmark = [pytest.mark.e2e, pytest.mark.apiserver, pytest.mark.kafka]
PY = sys.executable


def produce(bootstrap: str, topic: str, ids: range) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i in ids:
        ts = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(minutes=i)
        producer.produce(topic, key=str(i).encode(), value=json.dumps(
            {"id": i, "ts": ts.isoformat(), "region": ["eu", "us", "ap"][i % 3]}).encode())
    assert producer.flush(30) == 0


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "replay-probe"})
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
    finally:
        consumer.close()


class Kubelet:
    """Runs the driver Deployment as a local process: the rendered app config, Spark in local mode."""

    def __init__(self, cluster: Cluster, ns: str, name: str, workdir: Path) -> None:
        self.cluster, self.ns, self.name, self.workdir = cluster, ns, name, workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def config(self) -> AppConfig:
        cm = self.cluster.core.read_namespaced_config_map(f"{self.name}-app", self.ns)
        rendered = AppConfig.model_validate(json.loads(cm.data["app.json"]))
        return rendered.model_copy(update={"spark_conf": {"spark.master": "local[2]",
                                                          "spark.sql.shuffle.partitions": "2"},
                                           "progress_file": None, "metrics_port": None})

    def _start(self) -> None:
        path = self.workdir / "app.json"
        path.write_text(self.config().to_json())
        log = (self.workdir / f"driver-{self.starts}.log").open("w")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "spark_app"), str(REPO / "hack")]),
               "PYSPARK_PYTHON": PY, "PYSPARK_DRIVER_PYTHON": PY}
        self.proc = subprocess.Popen([PY, "-m", "handoff_spark", "run", "--config", str(path)], stdout=log,
                                     stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=self.workdir)
        self.starts += 1

    def _terminate(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGTERM)   # the app finishes its micro-batch and exits
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                replicas = self.cluster.apps.read_namespaced_deployment(f"{self.name}-driver",
                                                                        self.ns).spec.replicas
            except ApiException as exc:
                if exc.status != 404:
                    raise
                replicas = 0      # not created yet
            if replicas and self.proc is None:
                self._start()
            elif not replicas and self.proc is not None:
                self._terminate()
            elif self.proc is not None and self.proc.poll() is not None:
                self.proc = None          # crashed: restart it, as the kubelet would
            time.sleep(0.5)
        if self.proc is not None:
            self._terminate()

    def __enter__(self) -> "Kubelet":
        self.thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop.set()
        self.thread.join(180)


def _rows(cfg: AppConfig) -> list[tuple[int, int, int]]:
    sink = cfg.sink
    table = ledger.load_table(sink.catalog_name, dict(sink.catalog_properties), sink.table)  # type: ignore[union-attr]
    data = table.scan(selected_fields=("_kafka_partition", "_kafka_offset", "id")).to_arrow()
    return sorted(zip(data["_kafka_partition"].to_pylist(), data["_kafka_offset"].to_pylist(),
                      data["id"].to_pylist()))


def _committed_to(cfg: AppConfig, topic: str, ends: dict[int, int]) -> bool:
    sink = cfg.sink
    try:
        table = ledger.load_table(sink.catalog_name, dict(sink.catalog_properties), sink.table)  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - not created yet
        return False
    at = ledger.resume_offsets(table, handoff_id=cfg.handoff_id).get(topic, {})
    return all(at.get(p, 0) >= e for p, e in ends.items())


def test_rollback_and_replay_of_the_last_three_snapshots_restores_the_table(cluster: Cluster, kafka,
                                                                           tmp_path: Path) -> None:
    topic = f"replay-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=2)
    produce(kafka.bootstrap, topic, range(0, 3000))
    ns = cluster.new_namespace("replay-e2e")
    spec = base_spec(kafka.bootstrap, commitInterval="1s", freshness={"target": "5m"})
    spec["source"].update(topics=[topic], maxRecordsPerBatch=400)
    spec["sink"]["iceberg"].update(catalog={"name": "lake", "properties": {
        "type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/wh"}},
        table="shop.replayed", partitionBy=[])
    spec["schema"] = {"columns": [{"name": "id", "type": "long", "required": True},
                                  {"name": "ts", "type": "timestamp"}, {"name": "region", "type": "string"}],
                      "onIncompatible": "halt"}
    spec["checkpoint"] = {"location": f"file://{tmp_path}/checkpoint"}
    op = Operator(cluster.kubeconfig, status_interval=1.0, delete_grace_seconds=5.0)
    op.start()
    try:
        cluster.create(ns, "orders", spec)
        with Kubelet(cluster, ns, "orders", tmp_path) as kubelet:
            cfg = eventually(lambda: kubelet.config(), "the rendered app config")
            ends = end_offsets(kafka.bootstrap, topic)
            eventually(lambda: _committed_to(cfg, topic, ends), "everything committed", timeout=300)
            before = _rows(cfg)
            assert len(before) == 3000 and len(set(before)) == 3000

            sink = cfg.sink
            table = ledger.load_table(sink.catalog_name, dict(sink.catalog_properties), sink.table)  # type: ignore[union-attr]
            commits = ledger.list_commits(table, cfg.handoff_id)
            assert len(commits) >= 5, len(commits)
            target = commits[3].snapshot_id  # the last three commits are discarded
            cluster.custom.create_namespaced_custom_object("handoff.io", "v1alpha1", ns, "replayrequests", {
                "apiVersion": "handoff.io/v1alpha1", "kind": "ReplayRequest", "metadata": {"name": "last-three"},
                "spec": {"handoffRef": {"name": "orders"}, "mode": "RollbackAndReplay",
                         "target": {"snapshotId": target}}})

            def phase() -> str | None:
                status = cluster.custom.get_namespaced_custom_object(
                    "handoff.io", "v1alpha1", ns, "replayrequests", "last-three").get("status") or {}
                assert status.get("phase") != "Failed", status
                return status if status.get("phase") == "Succeeded" else None
            status = eventually(phase, "the replay Succeeded", timeout=300)
            assert status["plan"]["rollbackToSnapshot"] == str(target)
            assert status["progress"]["records"] == status["plan"]["records"] > 0
            assert kubelet.starts == 2, "the driver was stopped once for the rollback and started again"

            after = _rows(cfg)
            assert after == before, "the table holds exactly what it held before: same rows, no duplicates"

            # The stream goes on: what arrives afterwards lands once.
            produce(kafka.bootstrap, topic, range(3000, 3300))
            ends = end_offsets(kafka.bootstrap, topic)
            eventually(lambda: _committed_to(cfg, topic, ends), "new records committed", timeout=120)
            final = _rows(cfg)
            assert len(final) == len(set(final)) == 3300
            assert sorted(r[2] for r in final) == list(range(3300))
    finally:
        op.stop()
