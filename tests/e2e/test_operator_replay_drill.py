"""RollbackAndReplay end to end: the operator (in-process, real kube-apiserver) runs the request while a real
driver process (`python -m handoff_spark run`, Spark local mode) runs the app config the operator rendered
into the ConfigMap `<name>-app`, started and stopped as the driver Deployment's replicas say (the test plays
the kubelet: replicas 1 → a running process, 0 → SIGTERM, the app stops at a batch boundary). Real Kafka, a
real Iceberg table in a SQLite catalog.

The driver publishes its progress into the handoff's progress ConfigMap, as in a pod, so the operator holds its
query in place (`handoff_spark.driver.hold`): the same process stops its query, waits, and starts it again from
the rolled-back table's ledger. (The BigQuery replay drills run drivers that do not publish: the pod path.)

Done when: after rolling back the last three snapshots and replaying, the table holds exactly what it held
before (same rows, no duplicates), plus what arrived meanwhile, and the driver process was never restarted."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from handoff_spark.iceberg import ledger
from handoff_spark.config import AppConfig
from operator_support import Cluster, eventually
from replay_drill_support import committed_to, end_offsets, iceberg_spec, local_handoff, produce

pytestmark = [pytest.mark.e2e, pytest.mark.apiserver, pytest.mark.kafka]


def _rows(cfg: AppConfig) -> list[tuple[int, int, int]]:
    sink = cfg.sink
    table = ledger.load_table(sink.catalog_name, dict(sink.catalog_properties), sink.table)  # type: ignore[union-attr]
    data = table.scan(selected_fields=("_kafka_partition", "_kafka_offset", "id")).to_arrow()
    return sorted(zip(data["_kafka_partition"].to_pylist(), data["_kafka_offset"].to_pylist(),
                      data["id"].to_pylist()))


def test_rollback_and_replay_of_the_last_three_snapshots_restores_the_table(cluster: Cluster, kafka,
                                                                           tmp_path: Path) -> None:
    topic = f"replay-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=2)
    produce(kafka.bootstrap, topic, range(0, 3000))
    ns = cluster.new_namespace("replay-e2e")
    spec = iceberg_spec(kafka.bootstrap, topic, tmp_path, "shop.replayed")
    with local_handoff(cluster, ns, spec, tmp_path, kafka.bootstrap, topic) as (kubelet, cfg):
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
        assert kubelet.starts == 1, ("the replay held the query inside the running driver, never its process"
                                     + kubelet.crashes())
        stopped = next(step for step in status["steps"] if step["name"] == "DriverStopped")
        assert "stopped its query at a batch boundary" in stopped["message"], stopped
        logs = kubelet.logs()
        assert "query held by the operator (last-three)" in logs, logs[-3000:]
        assert logs.count("restarted after the operator lifted its hold last-three") == 1, logs[-3000:]

        after = _rows(cfg)
        assert after == before, "the table holds exactly what it held before: same rows, no duplicates"

        # The stream goes on: what arrives afterwards lands once.
        produce(kafka.bootstrap, topic, range(3000, 3300))
        ends = end_offsets(kafka.bootstrap, topic)
        eventually(lambda: committed_to(cfg, topic, ends), "new records committed", timeout=120)
        final = _rows(cfg)
        assert len(final) == len(set(final)) == 3300
        assert sorted(r[2] for r in final) == list(range(3300))
