"""The driver's health report reaches the status: the operator (in-process) against the real
kube-apiserver creates the empty `<name>-progress` ConfigMap and tells the driver about it in the pod's
env; the driver's publisher (in-process, authenticated as the driver's own ServiceAccount with a real
TokenRequest token, so the rendered Role is what allows it) publishes a progress record whose sink met
quota trouble; the operator turns it into Degraded=True reason SinkDegraded and clears it when the next
record is clean. The record comes through the driver's own path: the BigQuery sink's append stats →
last-commit.json → app.ProgressReporter → publisher. Truth sources are real too (Kafka topic, SQLite
Iceberg catalog), so nothing else makes the handoff Degraded."""
from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kubernetes import config
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from handoff_spark.driver.app import ProgressReporter
from handoff_spark.bigquery.append import AppendStats
from handoff_spark.bigquery.sink import CommitResult, degraded_reason
from handoff_spark.config import AppConfig
from handoff_spark.driver.publisher import ProgressPublisher
from handoff_spark.sink.common import write_last_commit
from operator_support import Cluster, base_spec, driver_kubeconfig, eventually, operator_running

pytestmark = [pytest.mark.apiserver, pytest.mark.kafka]


def _spec(kafka, tmp_path) -> dict[str, Any]:
    topic = f"clicks-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(30)
    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/wh"}
    catalog = SqlCatalog("lake", **{k: v for k, v in props.items() if k != "type"})
    catalog.create_namespace("shop")
    catalog.create_table("shop.orders", Schema(NestedField(1, "id", LongType(), required=False)))
    spec = base_spec(kafka.bootstrap)
    spec["source"]["topics"] = [topic]
    spec["sink"]["iceberg"]["catalog"]["properties"] = props
    spec["sink"]["iceberg"]["partitionBy"] = []
    return spec


class _Query:
    """What ProgressReporter.poll reads of a streaming query: its last and recent progress (Spark's JSON shape)."""

    def __init__(self) -> None:
        self.recentProgress: list[dict[str, Any]] = []

    @property
    def lastProgress(self) -> dict[str, Any] | None:
        return self.recentProgress[-1] if self.recentProgress else None


def _batch(reporter: ProgressReporter, query: _Query, batch: int, stats: AppendStats) -> None:
    """One finished BigQuery micro-batch as the driver sees it: the sink's commit wrote last-commit.json
    (degraded_reason from its append stats), Spark reports progress, the app's reporter polls."""
    cfg = reporter.cfg
    write_last_commit(cfg.checkpoint_location, CommitResult(
        batch_id=batch, snapshot_id=1_700_000_000_000_000 + batch, skipped=False, rows=500, dlq_rows=0,
        offsets={"t": {"0": [batch * 500, batch * 500 + 500]}}, commit_latency_ms=80.0, attempts=1,
        group_offsets_committed=True, append_retries=dict(stats.retries), append_errors=dict(stats.errors),
        degraded_reason=degraded_reason(stats)))
    query.recentProgress.append({
        "batchId": batch, "numInputRows": 500, "processedRowsPerSecond": 200.0,
        "durationMs": {"triggerExecution": 2500},
        "sources": [{"startOffset": json.dumps({"t": {"0": batch * 500}}),
                     "endOffset": json.dumps({"t": {"0": batch * 500 + 500}})}]})
    reporter.poll(query)


def test_driver_report_drives_degraded(cluster: Cluster, apiserver, kafka, tmp_path) -> None:
    ns = cluster.new_namespace("report")
    cluster.create(ns, "clicks", _spec(kafka, tmp_path))
    # A report counts for 10 s after it was published; the driver here republishes every second.
    with operator_running(cluster.kubeconfig, status_interval=1.0, driver_report_max_age=10.0):
        try:
            # The operator creates the ConfigMap empty and owned, and grants the driver exactly it.
            cm = eventually(lambda: cluster.core.read_namespaced_config_map("clicks-progress", ns),
                            "the progress ConfigMap")
            assert not cm.data
            assert [r.kind for r in cm.metadata.owner_references] == ["StreamTableHandoff"]
            pod = cluster.make_driver_ready(ns, "clicks")
            cluster.wait_condition(ns, "clicks", "Ready", "True", "Running")
            cluster.wait_condition(ns, "clicks", "Degraded", "False", "AsExpected")

            # The driver's env as the operator rendered it (the kubelet would expand $(POD_NAME)).
            dep = cluster.apps.read_namespaced_deployment("clicks-driver", ns)
            env = {e.name: e.value for e in dep.spec.template.spec.containers[0].env if e.value is not None}
            env["HANDOFF_DRIVER_POD_NAME"] = pod.metadata.name
            env["HANDOFF_PROGRESS_PUBLISH_SECONDS"] = "1"
            driver_api = config.new_client_from_config(
                config_file=driver_kubeconfig(cluster, apiserver, ns, dep.spec.template.spec.service_account_name))
            errors: list[BaseException] = []
            publisher = ProgressPublisher.from_env(env, api=driver_api, on_error=errors.append)
            assert publisher is not None
            # The driver's progress path (app.ProgressReporter) with the rendered app config; its sink kind
            # BigQuery (the sink that reports degradedReason) and a local checkpoint.
            rendered = json.loads(cluster.core.read_namespaced_config_map("clicks-app", ns).data["app.json"])
            cfg = AppConfig.model_validate({
                **rendered, "checkpointLocation": f"file://{tmp_path}/checkpoint", "progressFile": None,
                "sink": {"kind": "bigquery", "project": "p", "dataset": "d", "table": "clicks"}})
            reporter, query = ProgressReporter(cfg, None, lambda _line: None, publisher), _Query()
            try:
                _batch(reporter, query, 7, AppendStats(requests=9, retries={"RESOURCE_EXHAUSTED": 3}))
                cond = cluster.wait_condition(ns, "clicks", "Degraded", "True", "SinkDegraded")
                assert "BigQueryResourceExhausted" in cond["message"] and "batch 7" in cond["message"]
                status = cluster.get(ns, "clicks")["status"]
                assert status["phase"] == "Degraded"
                assert status["lastBatch"] == {"id": 7, "rows": 500, "durationMs": 2500,
                                               "inputRowsPerSecond": 200.0, "deadLetters": 0,
                                               "at": status["lastBatch"]["at"],
                                               "degradedReason": "BigQueryResourceExhausted"}
                # kopf posts the Event after it patches the status: waited for, not assumed already there.
                eventually(lambda: any(e.reason == "SinkDegraded" and e.type == "Warning"
                                       for e in cluster.events(ns, "clicks")), "the SinkDegraded Warning Event")

                # The operator re-applies its children on every refresh and never takes the driver's field.
                cm = cluster.core.read_namespaced_config_map("clicks-progress", ns)
                assert json.loads(cm.data["progress.json"])["driverPod"] == pod.metadata.name
                owners = {m.manager: json.dumps(m.fields_v1) for m in cm.metadata.managed_fields}
                assert "progress.json" in owners["handoff-driver"]
                assert "f:data" not in owners["handoff-operator"]

                # The next batch is clean: published at once (state change), Degraded clears.
                _batch(reporter, query, 8, AppendStats(requests=3))
                cluster.wait_condition(ns, "clicks", "Degraded", "False", "AsExpected")
                status = eventually(lambda: (s := cluster.get(ns, "clicks")["status"])["phase"] == "Running"
                                    and s, "phase Running")
                assert status["lastBatch"]["id"] == 8 and "degradedReason" not in status["lastBatch"]

                # No new batch: the driver still republishes (heartbeat), so the report stays live.
                def published_at() -> int:
                    cm = cluster.core.read_namespaced_config_map("clicks-progress", ns)
                    return json.loads(cm.data["progress.json"])["publishedAtMs"]
                first = published_at()
                eventually(lambda: published_at() > first, "a heartbeat publish without a new batch")

                # Trouble again, then the driver goes silent without clearing it (hung, or cut off from the
                # API server): once the report is older than the max age, Degraded no longer says so.
                _batch(reporter, query, 9, AppendStats(requests=5, retries={"UNAVAILABLE": 2}))
                cond = cluster.wait_condition(ns, "clicks", "Degraded", "True", "SinkDegraded")
                assert "BigQueryUnavailable" in cond["message"]
                assert errors == []
            finally:
                publisher.close()
                driver_api.close()
            cluster.wait_condition(ns, "clicks", "Degraded", "False", "AsExpected")
            assert "lastBatch" not in cluster.get(ns, "clicks")["status"]
            assert cluster.get(ns, "clicks")["status"]["phase"] == "Running"

            # Publishing into a ConfigMap that is not there only counts an error; offer() never raises.
            admin_api = config.new_client_from_config(config_file=cluster.kubeconfig)
            missing = ProgressPublisher(ns, "nobody-progress", api=admin_api, on_error=errors.append)
            missing.offer({"batchId": 0, "degradedReason": None})
            eventually(lambda: errors, "the failed publish reported")
            missing.close()
            admin_api.close()
            assert getattr(errors[0], "status", None) == 404
        finally:
            cluster.delete_all_handoffs()
