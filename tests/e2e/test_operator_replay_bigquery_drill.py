"""The replay drills on BigQuery, as test_operator_replay_drill.py runs them on Iceberg: the operator (in-process,
real kube-apiserver) runs ReplayRequests while a real driver process (`python -m handoff_spark run`, Spark local
mode) runs the app config the operator rendered, started and stopped as the driver Deployment's replicas say (the
test plays the kubelet). Real Kafka; the table and its ledger index in the test bed's BigQuery emulator.

Each drill ends with rows == distinct (partition, offset) == produced (minus a Rollback's gap, which is the point of
a Rollback): RollbackAndReplay while the producer keeps writing, with the operator killed mid-replay (one
rollback, Succeeded once) and a second replay to the same target; Rollback with its gap; a target older than what
Kafka still holds (Failed before any change). The first drill's driver publishes its progress as in a pod, so the
operator holds its query in place (`handoff_spark.driver.hold`: one process throughout); the second one's driver
publishes but never reads the hold (an image older than the hold), so the operator, after
`replay_hold_ack_seconds` without its word, stops the driver (replicas 0) and starts it again."""
from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from handoff_spark.bigquery import client as bigquery_client, ledger as bigquery_ledger, rollback
from handoff_spark.config import AppConfig
from operator_support import Cluster, Operator, eventually
from replay_drill_support import Kubelet, bigquery_rows, bigquery_spec, committed_to, end_offsets, produce

pytestmark = [pytest.mark.e2e, pytest.mark.apiserver, pytest.mark.kafka, pytest.mark.bigquery]
RR = ("handoff.io", "v1alpha1")
TRANSFORM_SQL = ("SELECT id, ts, upper(region) AS region, _kafka_topic, _kafka_partition, _kafka_offset, "
                 "_kafka_timestamp FROM source")


def _rows(cfg: AppConfig) -> list[tuple[int, int, int]]:
    return [(p, o, i) for p, o, i, _region in bigquery_rows(cfg)]


def _batches(cfg: AppConfig) -> list[Any]:
    return [c for c in bigquery_ledger.list_commits(cfg.sink, cfg.handoff_id) if c.batch_id >= 0]  # type: ignore[arg-type]


def _batches_once_listed(cfg: AppConfig, at_least: int) -> list[Any]:
    """The ledger's batches once at least `at_least` are listed. Drill.caught_up also reads the data table's offsets
    (ledger.resume_offsets), and a batch's ledger row is appended after its data commit (best effort,
    bigquery/ledger.record_batch), so one listing right after may come too soon."""
    def listed() -> list[Any] | None:
        batches = _batches(cfg)
        return batches if len(batches) >= at_least else None

    return eventually(listed, f"{at_least} batches in the ledger", timeout=60)


class Drill:
    """A BigQuery handoff `orders` over a 2-partition topic, its driver run by the test's kubelet."""

    def __init__(self, cluster: Cluster, kafka: Any, bigquery: Any, tmp_path: Path, first: int,
                 publish: bool = False, driver_env: dict[str, str] | None = None, transform: bool = False) -> None:
        self.cluster, self.kafka = cluster, kafka
        self.topic = f"bqreplay-{uuid.uuid4().hex[:6]}"
        kafka.create_topic(self.topic, partitions=2)
        self.produced = 0
        self.produce(first)
        self.ns = cluster.new_namespace("bqreplay")
        over: dict[str, Any] = {}
        if transform:  # Spark carries the records: the SQL upper-cases the region, a dedupe on the order id
            kafka.create_topic(f"{self.topic}-dlq", partitions=1)
            over = {"transform": {"sql": TRANSFORM_SQL}, "dedupe": {"keys": ["id"], "within": "1h"},
                    "eventTime": {"column": "ts", "watermark": "1h"}, "deadLetter": {"topic": f"{self.topic}-dlq"}}
        spec = bigquery_spec(kafka.bootstrap, self.topic, tmp_path, bigquery, **over)
        spec["source"]["maxRecordsPerBatch"] = 250
        cluster.create(self.ns, "orders", spec)
        self.kubelet = Kubelet(cluster, self.ns, "orders", tmp_path, publish=publish, env=driver_env)

    def produce(self, n: int) -> None:
        produce(self.kafka.bootstrap, self.topic, range(self.produced, self.produced + n))
        self.produced += n

    def caught_up(self, cfg: AppConfig) -> None:
        ends = end_offsets(self.kafka.bootstrap, self.topic)
        eventually(lambda: committed_to(cfg, self.topic, ends), "everything committed", timeout=300)

    def request(self, name: str, **spec: Any) -> None:
        self.cluster.custom.create_namespaced_custom_object(*RR, self.ns, "replayrequests", {
            "apiVersion": "handoff.io/v1alpha1", "kind": "ReplayRequest", "metadata": {"name": name},
            "spec": {"handoffRef": {"name": "orders"}, **spec}})

    def status(self, name: str) -> dict[str, Any]:
        return self.cluster.custom.get_namespaced_custom_object(*RR, self.ns, "replayrequests", name).get(
            "status") or {}

    def wait_phase(self, name: str, phase: str, timeout: float = 300) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            status = self.status(name)
            assert phase == "Failed" or status.get("phase") != "Failed", status
            return status if status.get("phase") == phase else None
        return eventually(probe, f"{name} phase {phase}", timeout)

    def events(self, name: str) -> list[str]:
        return [e.reason for e in self.cluster.core.list_namespaced_event(self.ns).items
                if e.involved_object.name == name and e.involved_object.kind == "ReplayRequest"]


class KeepProducing:
    """A producer that keeps writing while a replay runs (ten records at a time until stopped)."""

    def __init__(self, drill: Drill) -> None:
        self.drill, self.stop = drill, threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop.is_set():
            self.drill.produce(10)
            self.stop.wait(0.2)

    def __enter__(self) -> "KeepProducing":
        self.thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop.set()
        self.thread.join(30)


def _assert_exactly_once(drill: Drill, cfg: AppConfig, missing: set[tuple[int, int]] = frozenset()) -> None:
    """rows == distinct (partition, offset) == produced minus `missing` (a Rollback's gap), every id once."""
    rows = _rows(cfg)
    coords = [(p, o) for p, o, _ in rows]
    assert len(coords) == len(set(coords)), "no (partition, offset) twice"
    ends = end_offsets(drill.kafka.bootstrap, drill.topic)
    assert sum(ends.values()) == drill.produced
    expected = {(p, o) for p, end in ends.items() for o in range(end)} - set(missing)
    assert set(coords) == expected and len(rows) == drill.produced - len(missing)
    assert len({i for _, _, i in rows}) == len(rows)


def test_rollback_and_replay_while_producing_survives_an_operator_kill_and_replays_again_to_the_same_target(
        cluster: Cluster, kafka, bigquery, tmp_path: Path) -> None:
    op = Operator(cluster.kubeconfig, status_interval=1.0, delete_grace_seconds=5.0)
    op.start()
    try:
        # The driver publishes its progress, as in a pod: both replays hold its query in place (driver.hold).
        drill = Drill(cluster, kafka, bigquery, tmp_path, first=2000, publish=True)
        with drill.kubelet as kubelet:
            cfg = eventually(kubelet.config, "the rendered app config")
            drill.caught_up(cfg)
            _assert_exactly_once(drill, cfg)
            batches = _batches_once_listed(cfg, 6)
            target = rollback.entry_key(batches[3])     # the newest three batches leave the table

            with KeepProducing(drill):
                drill.request("rewind", mode="RollbackAndReplay", target={"snapshotId": target})
                eventually(lambda: "DriverStopped" in [s["name"] for s in drill.status("rewind").get("steps") or []],
                           "the driver stopped", timeout=120)
                op.stop()     # the operator dies mid-replay and comes back
                op.start()
                status = drill.wait_phase("rewind", "Succeeded")
            names = [s["name"] for s in status["steps"]]
            assert names == ["DriverStopped", "Tagged", "RolledBack", "DriverStarted", "Replayed"], names
            assert status["plan"]["rollbackToSnapshot"] == str(target)
            assert status["progress"]["records"] == status["plan"]["records"] > 0
            # The Event is posted after the status patch that says Succeeded: waited for, then counted (one
            # Succeeded across the operator's kill; a second would be a second Event or a repeat count).
            eventually(lambda: "Succeeded" in drill.events("rewind"), "the Succeeded Event", timeout=30)
            assert drill.events("rewind").count("Succeeded") == 1
            assert kubelet.starts == 1, ("the replay held the query inside the running driver, never its process"
                                         + kubelet.crashes())
            assert "stopped its query at a batch boundary" in status["steps"][0]["message"], status["steps"][0]
            # The undo point: the table and its ledger as they were before the rollback, in snapshot tables.
            undo = status["undoTag"]
            assert undo == f"orders__handoff_undo_{drill.ns.replace('-', '_')}_rewind"
            client = bigquery_client.rest_client(cfg.sink)  # type: ignore[arg-type]
            held = int(list(client.query(f"SELECT COUNT(*) AS n FROM `{bigquery_client.table_ref(cfg.sink, undo)}`"  # type: ignore[arg-type]
                                         ).result())[0]["n"])
            assert held >= 2000
            # What it cost: the rows the rollback deleted, priced as Storage Write API bytes.
            cost = status["plan"]["cost"]
            assert cost["rowsToDelete"] == status["plan"]["records"] and cost["writeApiPricePerGiB"] == 0.025
            assert "estimatedCostUSD" in cost

            drill.caught_up(cfg)
            _assert_exactly_once(drill, cfg)

            # A second replay to the same target: the entry is still in the ledger, the table goes back again.
            drill.request("again", mode="RollbackAndReplay", target={"snapshotId": target})
            again = drill.wait_phase("again", "Succeeded")
            assert again["plan"]["rollbackToSnapshot"] == str(target) and again["plan"]["records"] > 0
            assert kubelet.starts == 1, kubelet.crashes()
            logs = kubelet.logs()
            for name in ("rewind", "again"):
                assert logs.count(f"restarted after the operator lifted its hold {name} ") == 1, logs[-3000:]
            drill.produce(100)
            drill.caught_up(cfg)
            _assert_exactly_once(drill, cfg)
    finally:
        op.stop()


def test_rollback_leaves_its_gap_and_a_target_kafka_no_longer_holds_fails_before_any_change(
        cluster: Cluster, kafka, bigquery, tmp_path: Path) -> None:
    # The driver publishes but never reads the hold (as a driver image older than the hold would): the operator
    # waits replay_hold_ack_seconds for its word, then stops the driver pod instead.
    op = Operator(cluster.kubeconfig, status_interval=1.0, delete_grace_seconds=5.0, replay_hold_ack_seconds=5.0)
    op.start()
    try:
        drill = Drill(cluster, kafka, bigquery, tmp_path, first=1500, publish=True,
                      driver_env={"HANDOFF_HOLD_POLL_SECONDS": "3600"})
        with drill.kubelet as kubelet:
            cfg = eventually(kubelet.config, "the rendered app config")
            drill.caught_up(cfg)
            batches = _batches_once_listed(cfg, 5)

            # Rollback: the newest two batches leave the table for good; the stream goes on after them.
            drill.request("drop", mode="Rollback", target={"snapshotId": rollback.entry_key(batches[2])})
            status = drill.wait_phase("drop", "Succeeded")
            assert [s["name"] for s in status["steps"]] == ["DriverStopped", "Tagged", "RolledBack", "GapRecorded",
                                                            "DriverStarted"]
            assert status["steps"][0]["message"].startswith("driver of orders: the driver pod stopped"), status
            assert "query held by the operator" not in kubelet.logs()
            plan = status["plan"]
            gap = {(int(p), o) for p, start in plan["gapFrom"][drill.topic].items()
                   for o in range(start, plan["gapTo"][drill.topic][p])}
            discarded = {(p, o) for b in batches[:2] for p, (start, end) in b.offsets[drill.topic].items()
                         for o in range(start, end)}
            assert gap and gap == discarded
            marker = bigquery_ledger.list_commits(cfg.sink, cfg.handoff_id)[0]  # type: ignore[arg-type]
            assert marker.kind == "gap"
            drill.produce(300)
            drill.caught_up(cfg)
            _assert_exactly_once(drill, cfg, missing=gap)

            # Kafka's log start moves past the oldest batch (what retention does to old segments): a replay to it
            # cannot re-read, so it fails before anything changes.
            oldest, second = _batches(cfg)[-1], _batches(cfg)[-2]
            starts = {p: se[1] for p, se in second.offsets[drill.topic].items()}   # past what the oldest holds
            admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
            for future in admin.delete_records([TopicPartition(drill.topic, p, o) for p, o in starts.items()]).values():
                future.result(30)
            rows, ledger = _rows(cfg), bigquery_ledger.list_commits(cfg.sink, cfg.handoff_id)  # type: ignore[arg-type]
            drill.request("too-old", mode="RollbackAndReplay", target={"snapshotId": rollback.entry_key(oldest)})
            failed = drill.wait_phase("too-old", "Failed", timeout=60)
            degraded = next(c for c in failed["conditions"] if c["type"] == "Degraded")
            assert degraded["reason"] == "OffsetsDeleted" and "retention" in degraded["message"]
            assert not failed.get("steps") and not failed.get("undoTag")
            assert _rows(cfg) == rows and bigquery_ledger.list_commits(cfg.sink, cfg.handoff_id) == ledger  # type: ignore[arg-type]
            assert not rollback.undo_point_exists(cfg.sink, rollback.undo_name(cfg.sink, drill.ns, "too-old"))  # type: ignore[arg-type]
            assert kubelet.starts == 2, kubelet.crashes()
            assert cluster.apps.read_namespaced_deployment("orders-driver", drill.ns).spec.replicas == 1
    finally:
        op.stop()


def test_rollback_and_replay_with_a_transform_and_a_dedupe_writes_each_order_once_with_its_derivation(
        cluster: Cluster, kafka, bigquery, tmp_path: Path) -> None:
    """Issue 31's replay with a transform, on BigQuery. The rollback leaves the driver's checkpoint, and Spark's
    dedupe state in it, ahead of the table: the driver discards it and rebuilds the window from the ledger up to the
    target, so the replayed orders are written once, each with the SQL's derivation, and orders re-sent within the
    window are still dropped, before the replay and after it."""
    op = Operator(cluster.kubeconfig, status_interval=1.0, delete_grace_seconds=5.0)
    op.start()
    try:
        drill = Drill(cluster, kafka, bigquery, tmp_path, first=1000, publish=True, transform=True)

        def send(ids: range) -> None:  # ids already sent: the same orders again (same event time), in the window
            produce(kafka.bootstrap, drill.topic, ids)
            drill.produced += len(ids)

        def each_order_once(orders: int) -> None:
            rows = bigquery_rows(cfg)
            assert sorted(i for _, _, i, _ in rows) == list(range(orders)), "every order once, none twice"
            assert {r for _, _, _, r in rows} == {"EU", "US", "AP"}, "the SQL's derivation on every row"

        with drill.kubelet as kubelet:
            cfg = eventually(kubelet.config, "the rendered app config")
            send(range(950, 1000))
            drill.caught_up(cfg)
            each_order_once(1000)
            batches = _batches_once_listed(cfg, 4)
            drill.request("rewind", mode="RollbackAndReplay", target={"snapshotId": rollback.entry_key(batches[2])})
            status = drill.wait_phase("rewind", "Succeeded")
            assert status["progress"]["records"] == status["plan"]["records"] > 0
            drill.caught_up(cfg)
            each_order_once(1000)
            logs = kubelet.logs()
            assert "disagrees with the table's ledger and is discarded" in logs, logs[-3000:]
            assert "dedupe window rebuilt from Kafka" in logs, logs[-3000:]
            # New orders spanning less than the 1 h watermark (a minute apart): a batch planned while they are being
            # produced may see one partition's and not yet the other's, and orders further apart than the watermark
            # would then be late, dead letters by design (the full suite's run of c8b35e7: 18 of 100 orders
            # spanning 99 minutes).
            send(range(1000, 1050))
            send(range(1030, 1050))
            drill.caught_up(cfg)
            each_order_once(1050)
            assert kubelet.starts == 1, kubelet.crashes()
    finally:
        op.stop()

