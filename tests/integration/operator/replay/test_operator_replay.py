"""ReplayRequest on the real kube-apiserver with the operator in-process, a real Iceberg table (SQLite catalog)
and real Kafka. The driver does not run here (kwok-less pods): where a replay needs the stream to re-read,
the test commits the re-read ranges as the driver's sink would (the contract's ledger snapshots);
test_operator_replay_drill.py runs a real driver process. A Backfill's Job is created by the operator and
run by the test bed's Job controller; its container command runs here as a real app process (Spark local
mode) against the same Kafka and table."""
from __future__ import annotations

import json
import time
import uuid
from typing import Any, Iterator

import pyarrow as pa
import pytest
from prometheus_client import REGISTRY
from confluent_kafka import Producer
from kubernetes import client
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from backfill_job_support import hold_pods, job_of, let_the_job_pod_finish, run_job_command
from operator_support import Cluster, Operator, base_spec, eventually

pytestmark = [pytest.mark.apiserver, pytest.mark.kafka]
RR = ("handoff.io", "v1alpha1")


@pytest.fixture(scope="module")
def operator(cluster: Cluster) -> Iterator[Operator]:
    op = Operator(cluster.kubeconfig, status_interval=1.0, delete_grace_seconds=5.0)
    op.start()
    try:
        yield op
    finally:
        op.stop()


class Setup:
    """A handoff `orders` over a 2-partition topic and a table holding five ledger commits."""

    def __init__(self, cluster: Cluster, kafka: Any, tmp_path: Any, schema: dict[str, Any] | None = None) -> None:
        self.cluster, self.kafka = cluster, kafka
        self.topic = f"orders-{uuid.uuid4().hex[:6]}"
        kafka.create_topic(self.topic, partitions=2)
        producer = Producer({"bootstrap.servers": kafka.bootstrap})
        for p in (0, 1):
            for i in range(60):
                producer.produce(self.topic, json.dumps({"id": i}).encode(), partition=p)
        assert producer.flush(30) == 0
        props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/wh"}
        catalog = SqlCatalog("lake", **{k: v for k, v in props.items() if k != "type"})
        catalog.create_namespace("shop")
        self.table = catalog.create_table("shop.orders", Schema(NestedField(1, "id", LongType(), required=False)))
        self.ns = cluster.new_namespace("replay")
        self.handoff_id = f"{self.ns}/orders"
        self.batch = 0
        self.snapshots = [self.commit({0: (10 * i, 10 * i + 10), 1: (5 * i, 5 * i + 5)}) for i in range(5)]
        spec = base_spec(kafka.bootstrap)
        spec["source"]["topics"] = [self.topic]
        spec["sink"]["iceberg"]["catalog"]["properties"] = props
        spec["sink"]["iceberg"]["partitionBy"] = []
        if schema is not None:
            spec["schema"] = schema
        cluster.create(self.ns, "orders", spec)
        eventually(lambda: cluster.driver_pods(self.ns, "orders"), "driver pod")

    def commit(self, ranges: dict[int, tuple[int, int]]) -> int:
        """A micro-batch as the sink records it (docs/design/data-plane-contract.md)."""
        rows = sum(e - s for s, e in ranges.values())
        self.table.append(pa.table({"id": pa.array(range(rows), pa.int64())}), snapshot_properties={
            "handoff.id": self.handoff_id, "handoff.query": "handoff", "handoff.batch-id": str(self.batch),
            "handoff.offsets": json.dumps({self.topic: {str(p): list(r) for p, r in ranges.items()}}),
            "handoff.rows": str(rows), "handoff.dlq-rows": "0",
            "handoff.max-event-time-ms": str(int(time.time() * 1000))})
        self.batch += 1
        self.table.refresh()
        return self.table.current_snapshot().snapshot_id

    def request(self, name: str, **spec: Any) -> None:
        self.cluster.custom.create_namespaced_custom_object(*RR, self.ns, "replayrequests", {
            "apiVersion": "handoff.io/v1alpha1", "kind": "ReplayRequest",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {"handoffRef": {"name": "orders"}, **spec}})

    def get(self, name: str) -> dict[str, Any]:
        return self.cluster.custom.get_namespaced_custom_object(*RR, self.ns, "replayrequests", name)

    def wait_phase(self, name: str, phase: str, timeout: float = 60) -> dict[str, Any]:
        return eventually(lambda: (s := self.get(name).get("status") or {}).get("phase") == phase and s,
                          f"{name} phase {phase} (status: {(self.get(name).get('status') or {})})", timeout)

    def wait_step(self, name: str, step: str) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            status = self.get(name).get("status") or {}
            return status if step in [st["name"] for st in status.get("steps") or []] else None
        return eventually(probe, f"{name} step {step}")

    def events(self, name: str) -> list[str]:
        return [e.reason for e in self.cluster.core.list_namespaced_event(self.ns).items
                if e.involved_object.name == name and e.involved_object.kind == "ReplayRequest"]

    def current(self) -> int:
        self.table.refresh()
        return self.table.current_snapshot().snapshot_id

    def replicas(self) -> int:
        return self.cluster.apps.read_namespaced_deployment("orders-driver", self.ns).spec.replicas


def _failed(setup: Setup, name: str, reason: str, **spec: Any) -> dict[str, Any]:
    setup.request(name, **spec)
    status = setup.wait_phase(name, "Failed")
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == reason, degraded
    assert reason in eventually(lambda: setup.events(name), f"a {reason} Event")
    return status


def test_dry_run_plans_and_changes_nothing_and_refusals_change_nothing(cluster: Cluster, operator: Operator,
                                                                       kafka, tmp_path) -> None:
    s = Setup(cluster, kafka, tmp_path)
    head = s.current()
    s.request("plan-only", mode="RollbackAndReplay", target={"snapshotId": s.snapshots[1]}, dryRun=True)
    status = s.wait_phase("plan-only", "Planned")
    plan = status["plan"]
    assert plan["headSnapshot"] == str(head) and plan["rollbackToSnapshot"] == str(s.snapshots[1])
    assert plan["discardedSnapshots"] == 3 and plan["records"] == 30 + 15
    assert plan["replayFrom"] == {s.topic: {"0": 20, "1": 10}} and plan["replayTo"] == {s.topic: {"0": 50, "1": 25}}
    # What it costs: the three discarded snapshots' data files are written again; no money estimate on Iceberg.
    cost = plan["cost"]
    assert cost["filesToRewrite"] == 3 and cost["recordsToReread"] == 45 and cost["bytesToReread"] > 0
    assert "estimatedCostUSD" not in cost and "3 data files to rewrite" in plan["summary"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and ready["reason"] == "DryRun" and "45 records" in ready["message"]
    assert "DryRun" in s.events("plan-only")

    # Each refusal ends Failed with its reason before anything changes.
    _failed(s, "expired", "SnapshotNotFound", mode="RollbackAndReplay", target={"snapshotId": 12345})
    _failed(s, "too-old", "TargetExpired", mode="Rollback", target={"timestamp": "2001-01-01T00:00:00Z"})
    _failed(s, "no-tag", "TagNotFound", mode="Rollback", target={"tag": "nope"})
    _failed(s, "at-head", "NothingToRollBack", mode="Rollback", target={"snapshotId": head})
    _failed(s, "overlap", "BackfillOverlap", mode="Backfill", **{"from": {s.topic: {"0": 5, "1": 0}},
                                                                "to": {s.topic: {"0": 15, "1": 0}}})
    _failed(s, "not-there", "OffsetsNotWritten", mode="Backfill", **{"from": {s.topic: {"0": 50, "1": 25}},
                                                                    "to": {s.topic: {"0": 90, "1": 25}}})
    missing = {"handoffRef": {"name": "absent"}}
    s.cluster.custom.create_namespaced_custom_object(*RR, s.ns, "replayrequests", {
        "apiVersion": "handoff.io/v1alpha1", "kind": "ReplayRequest", "metadata": {"name": "absent"},
        "spec": {**missing, "mode": "Rollback", "target": {"snapshotId": head}}})
    # Backfill: planned over a range the table lacks (it runs as a Job: the backfill tests below).
    fill = {"from": {s.topic: {"0": 50}}, "to": {s.topic: {"0": 60}}}
    s.request("fill-plan", mode="Backfill", dryRun=True, **fill)
    assert s.wait_phase("fill-plan", "Planned")["plan"]["records"] == 10
    assert not client.BatchV1Api(cluster.api).list_namespaced_job(s.ns).items
    status = s.wait_phase("absent", "Failed")
    assert next(c for c in status["conditions"] if c["type"] == "Degraded")["reason"] == "HandoffNotFound"

    assert s.current() == head and not s.table.metadata.refs.keys() - {"main"}
    assert s.replicas() == 1
    assert not (cluster.get(s.ns, "orders")["metadata"].get("annotations") or {}).get("handoff.io/replay")


def test_rollback_and_replay_survives_an_operator_restart_and_rolls_back_once(cluster: Cluster, operator: Operator,
                                                                             kafka, tmp_path) -> None:
    s = Setup(cluster, kafka, tmp_path)
    head, target = s.current(), s.snapshots[1]
    s.request("rewind", mode="RollbackAndReplay", target={"snapshotId": target})

    # No driver publishes here, so the driver pod is stopped (held at 0 replicas) and its query hold is set too,
    # for a driver pod that would start meanwhile; the handoff shows Replaying.
    s.wait_step("rewind", "DriverStopped")
    assert s.replicas() == 0
    assert _query_hold(cluster, s.ns) == "rewind"
    eventually(lambda: cluster.get(s.ns, "orders")["status"].get("phase") == "Replaying", "handoff Replaying")

    # The operator dies mid-replay and comes back.
    operator.stop()
    operator.start()
    status = s.wait_step("rewind", "DriverStarted")
    assert s.replicas() == 1
    assert s.current() == target
    assert status["undoTag"] == f"handoff-undo-{s.ns}-rewind"
    assert s.table.metadata.refs[status["undoTag"]].snapshot_id == head

    # A second request for the same handoff is refused while this one runs.
    _failed(s, "second", "AnotherReplayRunning", mode="Rollback", target={"snapshotId": s.snapshots[0]})
    assert s.current() == target

    # The driver re-reads the discarded ranges (as its sink commits them); progress follows the ledger.
    s.commit({0: (20, 35), 1: (10, 12)})
    eventually(lambda: (s.get("rewind")["status"].get("progress") or {}).get("records") == 15 + 2, "progress 17")
    assert s.get("rewind")["status"]["phase"] == "Running"
    s.commit({0: (35, 50), 1: (12, 25)})
    status = s.wait_phase("rewind", "Succeeded")
    assert status["progress"]["records"] == status["progress"]["total"] == 45
    labels = {"namespace": s.ns, "name": "orders", "mode": "RollbackAndReplay"}
    # and in the handoff's status.cost, since counting began and today (the CRD keeps the fields)
    cost = _rereads_counted(cluster, s.ns, labels)
    assert REGISTRY.get_sample_value("handoff_cost_reread_records_total", labels) == 45
    assert REGISTRY.get_sample_value("handoff_cost_reread_bytes_total", labels) == \
        status["plan"]["cost"]["bytesToReread"] > 0
    assert (cost["rereadRecords"], cost["rereadBytes"]) == (45, status["plan"]["cost"]["bytesToReread"])
    today = cost["today"]
    assert (today["rereadRecords"], today["rereadBytes"]) == (cost["rereadRecords"], cost["rereadBytes"])
    assert [st["name"] for st in status["steps"]] == ["DriverStopped", "Tagged", "RolledBack", "DriverStarted",
                                                      "Replayed"]
    # Rolled back exactly once: the target became current once after the head, never again.
    log = [e.snapshot_id for e in s.table.metadata.snapshot_log]
    assert log[log.index(head):].count(target) == 1
    for reason in ("Planned", "StoppingDriver", "DriverStopped", "Tagged", "RolledBack", "DriverStarted",
                   "Succeeded"):
        assert reason in s.events("rewind"), (reason, s.events("rewind"))
    handoff = cluster.get(s.ns, "orders")
    assert not {"handoff.io/replay", "handoff.io/replay-hold"} & set(handoff["metadata"].get("annotations") or {})
    assert _query_hold(cluster, s.ns) is None
    eventually(lambda: cluster.get(s.ns, "orders")["status"].get("phase") != "Replaying", "handoff not Replaying")


def _query_hold(cluster: Cluster, ns: str) -> str | None:
    cm = cluster.core.read_namespaced_config_map("orders-progress", ns)
    return (cm.metadata.annotations or {}).get("handoff.io/query-hold")


def test_a_request_that_ends_without_its_claim_or_is_deleted_mid_run_leaves_no_hold(cluster: Cluster,
                                                                                     operator: Operator, kafka,
                                                                                     tmp_path) -> None:
    """The claim sets the driver's query hold before the handoff's annotations: a request that ends in between (an
    operator killed there, then the request refused) must lift it, as a request deleted mid-run lifts both."""
    s = Setup(cluster, kafka, tmp_path)
    eventually(lambda: _query_hold(cluster, s.ns) is None, "the progress ConfigMap")
    # What an operator killed between the hold and the claim leaves behind, then the request is refused.
    cluster.core.patch_namespaced_config_map("orders-progress", s.ns, {"metadata": {"annotations": {
        "handoff.io/query-hold": "stranded"}}})
    _failed(s, "stranded", "SnapshotNotFound", mode="RollbackAndReplay", target={"snapshotId": 12345})
    eventually(lambda: _query_hold(cluster, s.ns) is None, "the stranded hold lifted")

    s.request("dropped", mode="RollbackAndReplay", target={"snapshotId": s.snapshots[1]})
    s.wait_step("dropped", "DriverStopped")
    assert _query_hold(cluster, s.ns) == "dropped" and s.replicas() == 0
    cluster.custom.delete_namespaced_custom_object(*RR, s.ns, "replayrequests", "dropped")

    def released() -> bool:
        annotations = cluster.get(s.ns, "orders")["metadata"].get("annotations") or {}
        return (_query_hold(cluster, s.ns) is None and s.replicas() == 1
                and not {"handoff.io/replay", "handoff.io/replay-hold"} & set(annotations))
    eventually(released, "both holds lifted and the driver back", 60)


def test_rollback_discards_for_good_and_the_stream_goes_on_from_where_it_was(cluster: Cluster, operator: Operator,
                                                                              kafka, tmp_path) -> None:
    from handoff_spark.iceberg import ledger

    s = Setup(cluster, kafka, tmp_path)
    head, target = s.current(), s.snapshots[2]
    rows_at_target = s.table.scan(snapshot_id=target).to_arrow().num_rows
    s.request("drop-bad", mode="Rollback", target={"snapshotId": target})
    status = s.wait_phase("drop-bad", "Succeeded")
    assert status["plan"]["gapFrom"] == {s.topic: {"0": 30, "1": 15}}
    assert status["plan"]["gapTo"] == {s.topic: {"0": 50, "1": 25}}
    assert [st["name"] for st in status["steps"]] == ["DriverStopped", "Tagged", "RolledBack", "GapRecorded",
                                                      "DriverStarted"]
    s.table.refresh()
    # The discarded rows are gone, and the ledger records their offsets as a deliberate gap: the stream's
    # position is where it was, so a restarted driver never re-reads them.
    assert s.table.scan().to_arrow().num_rows == rows_at_target
    gap = ledger.list_commits(s.table, s.handoff_id)[0]
    assert gap.kind == ledger.GAP and gap.offsets == {s.topic: {0: (30, 50), 1: (15, 25)}}
    assert "drop-bad" in (gap.reason or "")
    assert ledger.resume_offsets(s.table, handoff_id=s.handoff_id, query="handoff") == {s.topic: {0: 50, 1: 25}}
    assert s.table.metadata.refs[status["undoTag"]].snapshot_id == head
    assert s.replicas() == 1


# ------------------------------------------------------------------------------------------------ Backfill
# How a Backfill Job runs in these tests (pods held by a quota, its command run here): backfill_job_support.

def _rereads_counted(cluster: Cluster, ns: str, labels: dict[str, str]) -> dict[str, Any]:
    """The handoff's status.cost once a finished request's re-read is in it. The operator counts it right after it
    writes the request's final phase (never before: an operator that died in between would count it twice), so a
    reader that saw `Succeeded` waits a moment for the figures."""
    def counted() -> dict[str, Any] | None:
        cost = (cluster.get(ns, "orders").get("status") or {}).get("cost") or {}
        metric = REGISTRY.get_sample_value("handoff_cost_reread_records_total", labels)
        return cost if cost.get("rereadRecords") and metric else None

    return eventually(counted, "the re-read in status.cost and the metric", timeout=30)


def test_backfill_runs_as_a_job_beside_the_stream_and_fills_the_range_once(cluster: Cluster, operator: Operator,
                                                                          kafka, tmp_path) -> None:
    from handoff_spark.iceberg import ledger

    s = Setup(cluster, kafka, tmp_path, schema={"columns": [{"name": "id", "type": "long"}]})
    hold_pods(cluster, s.ns)
    rows_before = s.table.scan().to_arrow().num_rows
    fill = {"from": {s.topic: {"0": 50, "1": 25}}, "to": {s.topic: {"0": 60, "1": 60}}}
    s.request("fill", mode="Backfill", **fill)
    status = s.wait_step("fill", "JobCreated")
    job = eventually(lambda: job_of(cluster, s.ns, "fill"), "the backfill Job")
    assert job.metadata.owner_references[0].kind == "ReplayRequest"
    assert job.metadata.owner_references[0].uid == s.get("fill")["metadata"]["uid"]
    assert job.spec.template.metadata.labels["app.kubernetes.io/component"] == "backfill"
    assert "--query" in job.spec.template.spec.containers[0].command
    # The stream's driver keeps running; the handoff is not claimed.
    assert s.replicas() == 1 and len(cluster.driver_pods(s.ns, "orders")) == 1
    assert not (cluster.get(s.ns, "orders")["metadata"].get("annotations") or {}).get("handoff.io/replay")

    # An operator restarted mid-backfill adopts the Job: never a second one.
    operator.stop()
    operator.start()
    eventually(lambda: next(c["reason"] for c in s.get("fill")["status"]["conditions"] if c["type"] == "Ready")
               == "Backfilling", "Backfilling")
    assert job_of(cluster, s.ns, "fill").metadata.uid == job.metadata.uid

    run_job_command(cluster, s.ns, job, tmp_path)
    eventually(lambda: (s.get("fill")["status"].get("progress") or {}).get("records") == 45, "progress 45")
    assert s.get("fill")["status"]["phase"] == "Running", "not Succeeded before the Job itself succeeded"
    let_the_job_pod_finish(cluster, s.ns, "fill")
    status = s.wait_phase("fill", "Succeeded", timeout=120)
    assert [st["name"] for st in status["steps"]] == ["JobCreated", "Backfilled"]
    # The re-read is counted for the handoff's cost (the in-process operator's registry): the 45 records.
    # A Backfill Job publishes no totals: its re-read is in the handoff's status.cost only through the request.
    labels = {"namespace": s.ns, "name": "orders", "mode": "Backfill"}
    cost = _rereads_counted(cluster, s.ns, labels)
    assert REGISTRY.get_sample_value("handoff_cost_reread_records_total", labels) == 45
    assert cost["rereadRecords"] == cost["today"]["rereadRecords"] == 45
    assert status["progress"] == {"offsets": {s.topic: {"0": 60, "1": 60}}, "records": 45, "total": 45}
    for reason in ("Planned", "JobCreated", "Backfilling", "Succeeded"):
        eventually(lambda: reason in s.events("fill"), f"a {reason} Event ({s.events('fill')})")
    assert job_of(cluster, s.ns, "fill").metadata.uid == job.metadata.uid

    # The table holds the backfilled range exactly once; the stream's own position is untouched.
    s.table.refresh()
    data = s.table.scan().to_arrow()
    keyed = sorted((p, o) for p, o in zip(data["_kafka_partition"].to_pylist(), data["_kafka_offset"].to_pylist())
                   if p is not None)
    assert keyed == [(0, o) for o in range(50, 60)] + [(1, o) for o in range(25, 60)]
    assert data.num_rows == rows_before + 45
    assert ledger.resume_offsets(s.table, handoff_id=s.handoff_id, query="handoff") == {s.topic: {0: 50, 1: 25}}
    assert ledger.resume_offsets(s.table, handoff_id=s.handoff_id, query="backfill-fill") == {
        s.topic: {0: 60, 1: 60}}
    assert s.replicas() == 1


def test_a_failed_backfill_job_fails_the_request_and_deleting_the_request_deletes_the_job(
        cluster: Cluster, operator: Operator, kafka, tmp_path) -> None:
    s = Setup(cluster, kafka, tmp_path)
    hold_pods(cluster, s.ns)
    s.request("doomed", mode="Backfill", **{"from": {s.topic: {"0": 50}}, "to": {s.topic: {"0": 60}}})
    s.wait_step("doomed", "JobCreated")
    job = eventually(lambda: job_of(cluster, s.ns, "doomed"), "the backfill Job")
    # The Job controller fails the Job (its deadline passes with no pod having succeeded).
    client.BatchV1Api(cluster.api).patch_namespaced_job(job.metadata.name, s.ns,
                                                        {"spec": {"activeDeadlineSeconds": 1}})
    status = s.wait_phase("doomed", "Failed", timeout=120)
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "BackfillJobFailed" and "DeadlineExceeded" in degraded["message"]
    assert job.metadata.name in degraded["message"] and "backfill-doomed" in degraded["message"]
    # Until the Event itself lands (an earlier Event alone made a non-empty list: CI saw ['Planned', 'JobCreated']).
    eventually(lambda: "BackfillJobFailed" in s.events("doomed"), "a BackfillJobFailed Event")
    assert s.replicas() == 1

    cluster.custom.delete_namespaced_custom_object(*RR, s.ns, "replayrequests", "doomed")
    eventually(lambda: job_of(cluster, s.ns, "doomed") is None, "the Job deleted with its request", 60)
