"""A Backfill ReplayRequest for a BigQuery handoff, on the real kube-apiserver with the operator in-process, the
test bed's BigQuery emulator and real Kafka: the same controller, plan and Job as Iceberg's
(test_operator_replay.py), the table read through BigQuery's ledger index.

The stream's batch is committed as the driver's sink commits it (the sink's own write and commit, no Spark): it
started at offset 40 of each partition (`startingOffsets: latest`), so the table lacks 0..39. The Job's command
runs here as a real app process (backfill_job_support)."""
from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
from confluent_kafka import Producer

from handoff_spark.bigquery import ledger as bigquery_ledger
from handoff_spark.config import AppConfig

from backfill_job_support import hold_pods, job_of, let_the_job_pod_finish, run_job_command
from bq_common import table_counts
from operator_support import Cluster, Operator, base_spec, eventually
from sink_support import raw_batch, record, write_offsets

pytestmark = [pytest.mark.apiserver, pytest.mark.kafka, pytest.mark.bigquery]
RR = ("handoff.io", "v1alpha1")
COLUMNS = [{"name": "id", "type": "long", "required": True}, {"name": "ts", "type": "timestamp"},
           {"name": "region", "type": "string"}, {"name": "amount", "type": "double"}]
PER_PARTITION, STARTED_AT = 60, 40


@pytest.fixture(scope="module")
def operator(cluster: Cluster) -> Iterator[Operator]:
    op = Operator(cluster.kubeconfig, status_interval=1.0, delete_grace_seconds=5.0)
    op.start()
    try:
        yield op
    finally:
        op.stop()


class Setup:
    """Handoff `orders` into BigQuery over a 2-partition topic of 60 records each; the stream holds 40..59."""

    def __init__(self, cluster: Cluster, kafka: Any, bigquery: Any, tmp_path: Path) -> None:
        from handoff_spark.bigquery import sink

        self.cluster = cluster
        self.topic = f"bqfill-{uuid.uuid4().hex[:6]}"
        kafka.create_topic(self.topic, partitions=2)
        producer = Producer({"bootstrap.servers": kafka.bootstrap})
        for p in (0, 1):
            for i in range(PER_PARTITION):
                producer.produce(self.topic, record(1000 * p + i), partition=p)
        assert producer.flush(30) == 0
        self.ns = cluster.new_namespace("bqfill")
        spec = base_spec(kafka.bootstrap, schema={"columns": COLUMNS, "onIncompatible": "halt"})
        spec["source"].update(topics=[self.topic], startingOffsets="latest")
        spec["sink"] = {"bigquery": {"project": bigquery.project, "dataset": f"bqfill_{uuid.uuid4().hex[:8]}",
                                     "table": "orders", "partitionBy": "ts", "restEndpoint": bigquery.rest_endpoint,
                                     "grpcEndpoint": bigquery.grpc_endpoint}}
        cluster.create(self.ns, "orders", spec)
        eventually(lambda: cluster.driver_pods(self.ns, "orders"), "driver pod")
        rendered = json.loads(cluster.core.read_namespaced_config_map("orders-app", self.ns).data["app.json"])
        self.cfg = AppConfig.model_validate(rendered).model_copy(
            update={"checkpoint_location": str(tmp_path / "stream-checkpoint")})
        # the stream's batch 0, as its driver commits it: rows, then the ledger-index row
        plan = sink.prepare(self.cfg)
        write_offsets(Path(self.cfg.checkpoint_location), 0, {self.topic: {"0": PER_PARTITION, "1": PER_PARTITION}},
                      initial={self.topic: {"0": STARTED_AT, "1": STARTED_AT}})
        msgs = [sink.write_partition(self.cfg, plan, iter([raw_batch(self.topic, p, STARTED_AT, [
            record(1000 * p + i) for i in range(STARTED_AT, PER_PARTITION)])]), p) for p in (0, 1)]
        assert sink.commit_batch(self.cfg, msgs, 0).rows == 2 * (PER_PARTITION - STARTED_AT)
        self.head = bigquery_ledger.latest_commit(self.cfg.sink, self.cfg.handoff_id).snapshot_id

    def request(self, name: str, **spec: Any) -> None:
        self.cluster.custom.create_namespaced_custom_object(*RR, self.ns, "replayrequests", {
            "apiVersion": "handoff.io/v1alpha1", "kind": "ReplayRequest",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {"handoffRef": {"name": "orders"}, "mode": "Backfill", **spec}})

    def status(self, name: str) -> dict[str, Any]:
        return self.cluster.custom.get_namespaced_custom_object(*RR, self.ns, "replayrequests", name).get(
            "status") or {}

    def wait_phase(self, name: str, phase: str, timeout: float = 60) -> dict[str, Any]:
        return eventually(lambda: (s := self.status(name)).get("phase") == phase and s,
                          f"{name} phase {phase} (status: {self.status(name)})", timeout)

    def ready(self, name: str) -> dict[str, Any]:
        return next(c for c in self.status(name)["conditions"] if c["type"] == "Ready")


def _range(start: int, end: int, topic: str) -> dict[str, Any]:
    return {"from": {topic: {"0": start, "1": start}}, "to": {topic: {"0": end, "1": end}}}


def test_bigquery_backfill_is_planned_refused_over_held_offsets_and_run_as_a_job(
        cluster: Cluster, operator: Operator, kafka, bigquery, tmp_path) -> None:
    s = Setup(cluster, kafka, bigquery, tmp_path)
    hold_pods(cluster, s.ns)

    s.request("overlap", **_range(30, 45, s.topic))
    s.wait_phase("overlap", "Failed")
    ready = s.ready("overlap")
    assert ready["reason"] == "BackfillOverlap" and f"{s.topic}[0] 40-45" in ready["message"], ready
    s.request("look", dryRun=True, **_range(0, STARTED_AT, s.topic))
    plan = s.wait_phase("look", "Planned")["plan"]
    assert plan["records"] == 2 * STARTED_AT and plan["headSnapshot"] == str(s.head)
    assert job_of(cluster, s.ns, "overlap") is None and job_of(cluster, s.ns, "look") is None
    assert table_counts(s.cfg) == (40, 40)

    s.request("fill", **_range(0, STARTED_AT, s.topic))
    eventually(lambda: "JobCreated" in [st["name"] for st in s.status("fill").get("steps") or []], "JobCreated")
    job = eventually(lambda: job_of(cluster, s.ns, "fill"), "the backfill Job")
    assert "backfill-fill" in job.spec.template.spec.containers[0].command
    assert len(cluster.driver_pods(s.ns, "orders")) == 1  # the stream's driver keeps running

    run_job_command(cluster, s.ns, job, tmp_path)
    eventually(lambda: (s.status("fill").get("progress") or {}).get("records") == 2 * STARTED_AT, "progress 80")
    assert s.status("fill")["phase"] == "Running", "not Succeeded before the Job itself succeeded"
    let_the_job_pod_finish(cluster, s.ns, "fill")
    status = s.wait_phase("fill", "Succeeded", timeout=120)
    assert [st["name"] for st in status["steps"]] == ["JobCreated", "Backfilled"]
    assert status["progress"] == {"offsets": {s.topic: {"0": STARTED_AT, "1": STARTED_AT}},
                                  "records": 2 * STARTED_AT, "total": 2 * STARTED_AT}

    # every record once; the stream's position untouched; the backfill under its own query
    assert table_counts(s.cfg) == (2 * PER_PARTITION, 2 * PER_PARTITION)
    entries = bigquery_ledger.list_commits(s.cfg.sink, s.cfg.handoff_id)
    assert bigquery_ledger.ends(entries, {}, "handoff") == {s.topic: {0: PER_PARTITION, 1: PER_PARTITION}}
    assert bigquery_ledger.ends(entries, {}, "backfill-fill") == {s.topic: {0: STARTED_AT, 1: STARTED_AT}}
    # and the range is held now: the same Backfill again is refused by its plan
    s.request("again", **_range(0, STARTED_AT, s.topic))
    s.wait_phase("again", "Failed")
    assert s.ready("again")["reason"] == "BackfillOverlap" and "backfill-fill" in s.ready("again")["message"]
