"""`kubectl handoff ledger` of a BigQuery handoff shows each entry's Kafka cluster id and topic ids, as it does for
Iceberg: the resource on the test bed's API server, its ledger index in the BigQuery emulator (rows written by the
sink's own ledger writer: a batch, then the epoch `handoff ledger accept-kafka` records)."""
from __future__ import annotations

import json
import time
import uuid

import pytest

from handoff_operator.kubectl_plugin.cli import main
from handoff_spark.bigquery import ledger as bigquery_ledger
from handoff_spark.config import AppConfig
from operator_support import Cluster, base_spec

pytestmark = [pytest.mark.apiserver, pytest.mark.bigquery]


def test_kubectl_handoff_ledger_shows_the_bigquery_ledgers_kafka_identity(cluster: Cluster, bigquery, tmp_path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    ns = cluster.new_namespace("kbq")
    dataset = f"kbq_{uuid.uuid4().hex[:8]}"
    bigquery.bq_client().create_dataset(f"{bigquery.project}.{dataset}")
    sink = {"project": bigquery.project, "dataset": dataset, "table": "views",
            "restEndpoint": bigquery.rest_endpoint, "grpcEndpoint": bigquery.grpc_endpoint}
    spec = base_spec(sink={"bigquery": sink})
    spec["source"]["topics"] = ["views"]
    cluster.create(ns, "views", spec)
    cfg = AppConfig.model_validate({"handoffId": f"{ns}/views", "source": {"bootstrapServers": "127.0.0.1:9",
                                                                         "topics": ["views"]},
                                    "sink": {"kind": "bigquery", **sink},
                                    "schema": {"columns": [], "onIncompatible": "halt"},
                                    "checkpointLocation": str(tmp_path / "checkpoint")})
    ms = int(time.time() * 1000) - 5000
    assert bigquery_ledger.record_batch(cfg, 0, {"views": {"0": [0, 5]}}, 5, 0, ms, ms * 1000,
                                        kafka={"cluster": "cluster-1", "topics": {"views": "topic-a"}})
    bigquery_ledger.record_marker(cfg, {"views": {"0": [0, 0]}}, bigquery_ledger.EPOCH, "topic recreated",
                                  {"cluster": "cluster-1", "topics": {"views": "topic-b"}})

    code = main(["ledger", "views", "-o", "json", "-n", ns, "--kubeconfig", cluster.kubeconfig])
    out = capsys.readouterr()
    assert code == 0, out.err
    rows = json.loads(out.out)
    assert [(r["kind"], r["batch"], r["kafkaCluster"], r["topicIds"]) for r in rows] == [
        ("epoch", -1, "cluster-1", {"views": "topic-b"}), ("batch", 0, "cluster-1", {"views": "topic-a"})]
    assert rows[0]["reason"] == "topic recreated" and rows[0]["offsets"] == {"views": {"0": [0, 0]}}
    code = main(["ledger", "views", "-n", ns, "--kubeconfig", cluster.kubeconfig])
    text = capsys.readouterr().out
    assert code == 0 and "EPOCH" in text.splitlines()[0] and "(topic recreated)" in text.splitlines()[0]

    # `kubectl handoff timeline`: the batch's row names its batch id and BigQuery commit time, and the clause
    # that reads the table as of it.
    code = main(["timeline", "views", "-o", "json", "-n", ns, "--kubeconfig", cluster.kubeconfig])
    out = capsys.readouterr()
    assert code == 0, out.err
    [batch] = [r for r in json.loads(out.out) if r["source"] == "ledger" and r["kind"] == "batch"]
    commit_us = ms * 1000
    assert batch["what"].startswith("batch 0 (") and batch["snapshot"] == commit_us
    assert batch["asOf"] == f"FOR SYSTEM_TIME AS OF TIMESTAMP_MICROS({commit_us})"
    assert batch["commitTime"] == time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}000Z"
