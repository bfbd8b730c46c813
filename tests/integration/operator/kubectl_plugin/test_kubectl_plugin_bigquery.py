"""`kubectl handoff ledger` of a BigQuery handoff shows each entry's Kafka cluster id and topic ids, as it does for
Iceberg: the resource on the test bed's API server, its ledger index in the BigQuery emulator (rows written by the
sink's own ledger writer: a batch, then the epoch `handoff ledger accept-kafka` records)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

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

def _plugin(kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`kubectl handoff ...` through the real kubectl, the package's scripts on PATH (where pip put kubectl-handoff)."""
    env = {**os.environ, "KUBECONFIG": kubeconfig,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["kubectl", "handoff", *args], capture_output=True, text=True, env=env, timeout=180)


@pytest.mark.kafka
def test_kubectl_handoff_replay_plans_prices_and_rolls_back_a_bigquery_table(cluster: Cluster, kafka, bigquery,
                                                                            tmp_path) -> None:
    """`kubectl handoff replay` (the real kubectl, the plugin on PATH) against a BigQuery handoff, the operator
    in-process: a dry run prints the plan with its cost, a Rollback runs to Succeeded and the table loses exactly
    the rows past the target (batches committed by the sink's own write/commit path)."""
    from confluent_kafka import Producer

    from handoff_spark.bigquery import client as bigquery_client, rollback, sink as bigquery_sink
    from operator_support import eventually, operator_running
    from sink_support import raw_batch, record, write_offsets

    ns = cluster.new_namespace("kbqr")
    topic = f"kbqr-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for p in (0, 1):
        for i in range(40):
            producer.produce(topic, json.dumps({"id": i}).encode(), partition=p)
    assert producer.flush(30) == 0
    sink = {"project": bigquery.project, "dataset": f"kbqr_{uuid.uuid4().hex[:8]}", "table": "orders",
            "restEndpoint": bigquery.rest_endpoint, "grpcEndpoint": bigquery.grpc_endpoint}
    cfg = AppConfig.model_validate({
        "handoffId": f"{ns}/orders", "source": {"bootstrapServers": kafka.bootstrap, "topics": [topic]},
        "sink": {"kind": "bigquery", **sink},
        "schema": {"columns": [{"name": "id", "type": "long", "required": True}], "onIncompatible": "halt"},
        "checkpointLocation": str(tmp_path / "checkpoint")})
    plan = bigquery_sink.prepare(cfg)
    for b in range(4):   # four batches of 10 + 10 records
        write_offsets(tmp_path / "checkpoint", b, {topic: {"0": 10 * b + 10, "1": 10 * b + 10}},
                      initial={topic: {"0": 0, "1": 0}} if b == 0 else None)
        msgs = [bigquery_sink.write_partition(cfg, plan, iter([raw_batch(topic, p, 10 * b,
                                                                         [record(i) for i in range(10)])]), b)
                for p in (0, 1)]
        assert not bigquery_sink.commit_batch(cfg, msgs, b).skipped
    batches = [c for c in bigquery_ledger.list_commits(cfg.sink, cfg.handoff_id) if c.batch_id >= 0]
    target = rollback.entry_key(batches[2])      # batch 1: the table keeps offsets < 20
    spec = base_spec(kafka.bootstrap, sink={"bigquery": sink})
    spec["source"]["topics"] = [topic]
    spec["schema"] = {"columns": [{"name": "id", "type": "long", "required": True}], "onIncompatible": "halt"}
    with operator_running(cluster.kubeconfig, status_interval=1.0, delete_grace_seconds=5.0):
        cluster.create(ns, "orders", spec)
        eventually(lambda: cluster.driver_pods(ns, "orders"), "driver pod")

        dry = _plugin(cluster.kubeconfig, "replay", "orders", "-n", ns, "--to-snapshot", str(target), "--dry-run")
        assert dry.returncode == 0, dry.stdout + dry.stderr
        plan_line = next(line for line in dry.stdout.splitlines() if line.startswith("plan: "))
        assert f"to {target}" in plan_line and "re-read 40 records" in plan_line
        assert "cost: 40 rows" in plan_line and "USD" in plan_line and "Storage Write API" in plan_line
        assert dry.stdout.splitlines()[-1].startswith("phase Planned (DryRun: ")

        done = _plugin(cluster.kubeconfig, "replay", "orders", "-n", ns, "--to-snapshot", str(target),
                      "--mode", "Rollback", "--request-name", "drop", "--timeout", "120")
        assert done.returncode == 0, done.stdout + done.stderr
        steps = [line.split(":")[0] for line in done.stdout.splitlines() if line.startswith("step ")]
        assert steps == ["step DriverStopped", "step Tagged", "step RolledBack", "step GapRecorded",
                         "step DriverStarted"], done.stdout
        assert done.stdout.splitlines()[-1].startswith("phase Succeeded")
    client = bigquery_client.rest_client(cfg.sink)
    rows = client.query(f"SELECT _kafka_partition AS p, MAX(_kafka_offset) AS m, COUNT(*) AS n "
                        f"FROM `{bigquery_client.table_ref(cfg.sink)}` GROUP BY 1 ORDER BY 1").result()
    assert [(r["p"], r["m"], r["n"]) for r in rows] == [(0, 19, 20), (1, 19, 20)]
    entries = bigquery_ledger.list_commits(cfg.sink, cfg.handoff_id)
    assert entries[0].kind == "gap" and entries[0].offsets == {topic: {0: (20, 40), 1: (20, 40)}}
    assert bigquery_ledger.resume_offsets(cfg.sink, cfg.handoff_id) == {topic: {0: 40, 1: 40}}
    assert rollback.undo_point_exists(cfg.sink, rollback.undo_name(cfg.sink, ns, "drop"))
