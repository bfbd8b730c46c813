"""`kubectl handoff` as a person runs it: the real kubectl finds the installed `kubectl-handoff` on PATH and runs
it against the test bed's API server, with the operator in-process, real Kafka and a real Iceberg table (SQLite
catalog) holding ledger commits as the sink writes them. The driver does not run (no pods here): its progress
record is published into `<name>-progress` by the driver's own publisher."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from confluent_kafka import Producer
from prometheus_client import REGISTRY

from handoff_operator.kubectl_plugin.cli import main
from handoff_spark.driver.progress import BatchReport
from handoff_spark.driver.publisher import ProgressPublisher
from operator_support import (Cluster, Operator, base_spec, eventually, ledger_commit, operator_running,
                              sqlite_ledger_table)

pytestmark = [pytest.mark.apiserver, pytest.mark.kafka]


@pytest.fixture(scope="module")
def operator(cluster: Cluster) -> Iterator[Operator]:
    with operator_running(cluster.kubeconfig, status_interval=1.0, delete_grace_seconds=5.0) as op:
        yield op


def plugin(kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`kubectl handoff ...` with the package's scripts on PATH (where pip put kubectl-handoff)."""
    env = {**os.environ, "KUBECONFIG": kubeconfig,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["kubectl", "handoff", *args], capture_output=True, text=True, env=env, timeout=180)


def test_status_ledger_and_replay_through_kubectl(cluster: Cluster, operator: Operator, kafka, tmp_path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(60):
        producer.produce(topic, json.dumps({"id": i}).encode(), partition=i % 2)
    assert producer.flush(30) == 0
    props, table = sqlite_ledger_table(tmp_path)
    ns = cluster.new_namespace("kplug")
    hid = f"{ns}/orders"
    now_ms = int(time.time() * 1000)
    snapshots = [ledger_commit(table, hid, b, {topic: {"0": [s, e], "1": [s, e]}}, now_ms, 2 * (e - s))
                 for b, (s, e) in enumerate([(0, 10), (10, 20), (20, 25)])]
    spec = base_spec(kafka.bootstrap)
    spec["source"]["topics"] = [topic]
    spec["sink"]["iceberg"]["catalog"]["properties"] = props
    spec["sink"]["iceberg"]["partitionBy"] = []
    cluster.create(ns, "orders", spec)
    kubeconfig = cluster.kubeconfig

    # The driver's record, published as the driver does (its own publisher, its own record format).
    eventually(lambda: cluster.core.read_namespaced_config_map("orders-progress", ns), "orders-progress")
    publisher = ProgressPublisher(ns, "orders-progress", api=cluster.api, pod="orders-driver-0")
    publisher.offer(BatchReport(batch_id=2, rows=10, duration_ms=800, start={(topic, 0): 20, (topic, 1): 20},
                                end={(topic, 0): 25, (topic, 1): 25}, lag={(topic, 0): 5, (topic, 1): 5},
                                commit=None, max_event_time_ms=now_ms).record(hid))
    publisher.close()
    # The operator read the table's ledger and Kafka: 2 × (30 - 25) records behind.
    eventually(lambda: (s := cluster.get(ns, "orders").get("status") or {}).get("lag") == 10
               and (s.get("committed") or {}).get("snapshot") == str(snapshots[-1]), "status from the ledger")

    # Through the real kubectl: it finds kubectl-handoff on PATH; KUBECONFIG from the environment.
    out = plugin(kubeconfig, "status", "orders", "-n", ns)
    assert out.returncode == 0, out.stderr
    assert f"StreamTableHandoff {ns}/orders:" in out.stdout and "lag         10 records" in out.stdout
    assert "target 5m" in out.stdout and f"snapshot {snapshots[-1]} batch 2" in out.stdout
    assert "Lag per partition (the driver's report" in out.stdout and "Conditions:" in out.stdout
    out = plugin(kubeconfig, "status", "absent", "-n", ns)
    assert out.returncode == 1 and out.stderr.strip() == (
        f'error: streamtablehandoffs.handoff.io "absent" not found in namespace {ns}'), out.stderr

    # The rest in this process (the same entry point, without a process start per call on a busy machine).
    def run(*args: str) -> tuple[int, str, str]:
        code = main([*args, "-n", ns, "--kubeconfig", kubeconfig])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    code, text, _ = run("status", "orders", "-o", "json")
    doc = json.loads(text)
    assert code == 0 and doc["lag"] == 10 and doc["freshnessTargetSeconds"] == 300
    assert doc["lagPerPartition"] == [{"topic": topic, "partition": 0, "lag": 5},
                                      {"topic": topic, "partition": 1, "lag": 5}]
    assert {c["type"] for c in doc["conditions"]} >= {"Ready", "Progressing"}

    # The ledger, newest first, from the table the resource names.
    code, text, err = run("ledger", "orders", "-o", "yaml")
    assert code == 0, err
    rows = yaml.safe_load(text)
    assert [r["snapshot"] for r in rows] == snapshots[::-1]
    assert rows[0]["offsets"] == {topic: {"0": [20, 25], "1": [20, 25]}} and rows[0]["batch"] == 2
    code, text, _ = run("ledger", "orders", "--limit", "2")
    assert text.splitlines()[0].startswith(f"{snapshots[-1]}  handoff") and f"{topic}[1] 20→25" in text
    assert len(text.splitlines()) == 2

    # A dry-run replay: the request is written, followed to Planned, and its plan printed.
    code, text, err = run("replay", "orders", "--to-snapshot", str(snapshots[0]), "--dry-run")
    assert code == 0, err
    lines = text.splitlines()
    assert lines[0].startswith("replayrequest.handoff.io/orders-replay-") and lines[0].endswith(" created")
    assert any(line.startswith("plan: ") for line in lines) and lines[-1].startswith("phase Planned (DryRun: ")
    code, text, err = run("replay", "orders", "--to-snapshot", str(snapshots[0]), "--dry-run", "-o", "json",
                          "--request-name", "plan-json")
    final = json.loads(text)
    assert code == 0 and final["name"] == "plan-json" and final["status"]["phase"] == "Planned"
    assert final["status"]["plan"]["rollbackToSnapshot"] == str(snapshots[0])
    assert final["status"]["plan"]["records"] == 2 * 15 and "phase Planned" in err
    # A request the operator refuses ends Failed: exit 1, the reason printed.
    code, text, err = run("replay", "orders", "--to-snapshot", "12345", "--mode", "Rollback")
    assert code == 1 and "phase Failed (SnapshotNotFound: " in text, text + err
    # The operator (in this process) counted the ended requests the dashboard and HandoffReplayFailed read. It
    # counts once the status is written, which is what the plugin saw: the count may land a moment later.
    def ended() -> dict[str, float | None]:
        return {phase: REGISTRY.get_sample_value("handoff_replays_total", {"namespace": ns, "phase": phase})
                for phase in ("Planned", "Failed", "Succeeded")}

    eventually(lambda: ended() == {"Planned": 2, "Failed": 1, "Succeeded": None}, "replays counted by phase",
               timeout=30)

    # A crash-looping driver: the restart count the crash-loop alert reads, the failure `status` shows.
    cluster.make_driver_crash(ns, "orders", 4, "boom: the catalog refused the commit")
    eventually(lambda: REGISTRY.get_sample_value("handoff_driver_restarts", {"namespace": ns, "name": "orders"}) == 4,
               "handoff_driver_restarts 4")
    eventually(lambda: (cluster.get(ns, "orders").get("status") or {}).get("app", {}).get("lastFailure"),
               "status.app.lastFailure")
    code, text, _ = run("status", "orders")
    failure = next(line for line in text.splitlines() if line.startswith("  last failure  "))
    assert code == 0 and failure.endswith("boom: the catalog refused the commit"), text
    cluster.delete_all_handoffs()


def test_timeline_merges_the_ledger_the_events_and_the_replays_newest_first(cluster: Cluster, operator: Operator,
                                                                             kafka, tmp_path) -> None:
    """`kubectl handoff timeline`: commits (with their snapshots), the operator's Events (a crash-looping driver) and
    a ReplayRequest, in one list, newest first; `--since` cuts it; an unreachable catalog is a warning, not an end."""
    topic = f"tl-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=1)
    props, table = sqlite_ledger_table(tmp_path)
    ns = cluster.new_namespace("ktl")
    hid = f"{ns}/orders"
    now_ms = int(time.time() * 1000)
    snapshots = [ledger_commit(table, hid, b, {topic: {"0": [s, e]}}, now_ms, e - s)
                 for b, (s, e) in enumerate([(0, 10), (10, 20)])]
    spec = base_spec(kafka.bootstrap)
    spec["source"]["topics"] = [topic]
    spec["sink"]["iceberg"]["catalog"]["properties"] = props
    spec["sink"]["iceberg"]["partitionBy"] = []
    cluster.create(ns, "orders", spec)
    eventually(lambda: cluster.core.read_namespaced_config_map("orders-progress", ns), "orders-progress")
    time.sleep(1.1)  # the crash's Event lands after the commits, on the API server's second-resolution clock
    cluster.make_driver_crash(ns, "orders", 3, "boom: the catalog refused the commit")
    eventually(lambda: any(e.reason == "DriverFailing" for e in cluster.core.list_namespaced_event(ns).items),
               "the DriverFailing Event")
    out = plugin(cluster.kubeconfig, "replay", "orders", "-n", ns, "--to-snapshot", str(snapshots[0]), "--dry-run",
                 "--request-name", "look-back")
    assert out.returncode == 0, out.stderr

    out = plugin(cluster.kubeconfig, "timeline", "orders", "-n", ns, "-o", "json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    times = [r["timeMs"] for r in rows]
    assert times == sorted(times, reverse=True)
    commits = [r for r in rows if r["source"] == "ledger"]
    assert [r["snapshot"] for r in commits] == snapshots[::-1]
    assert commits[0]["what"].startswith("batch 1 (handoff): 10 rows") and f"{topic}[0] 10→20" in commits[0]["what"]
    failing = [r for r in rows if r["kind"] == "DriverFailing"]
    # Once: from the operator's timeline record, which also holds it (the Event is not shown twice).
    assert failing and {r["source"] for r in failing} == {"operator"}, rows
    assert "boom: the catalog refused the commit" in failing[0]["what"]
    assert any(r["kind"] == "DriverStarted" for r in rows), rows
    replays = [r for r in rows if r["source"] == "replay"]
    assert any(r["kind"] == "ReplayRequested" and str(snapshots[0]) in r["what"] and "(dry run)" in r["what"]
               for r in replays), replays
    assert rows.index(failing[0]) < rows.index(commits[0])  # the crash came after the commits

    out = plugin(cluster.kubeconfig, "timeline", "orders", "-n", ns)
    assert out.returncode == 0 and f"[snapshot {snapshots[-1]}]" in out.stdout and "DriverFailing" in out.stdout
    out = plugin(cluster.kubeconfig, "timeline", "orders", "-n", ns, "--limit", "2", "-o", "yaml")
    assert out.returncode == 0 and yaml.safe_load(out.stdout) == rows[:2]
    out = plugin(cluster.kubeconfig, "timeline", "orders", "-n", ns, "--since", "1ms", "-o", "json")
    assert out.returncode == 0 and json.loads(out.stdout) == []
    out = plugin(cluster.kubeconfig, "timeline", "orders", "-n", ns, "--since", "soon")
    assert out.returncode == 1 and "--since 'soon': use a duration such as 90s" in out.stderr
    out = plugin(cluster.kubeconfig, "timeline", "orders", "-n", ns, "-o", "json",
                 "--catalog-property", f"uri=sqlite:///{tmp_path}/absent/none.db")
    assert out.returncode == 0 and "warning: the table's ledger was not read" in out.stderr
    assert all(r["source"] != "ledger" for r in json.loads(out.stdout))

    # Cost: the driver's running totals (published by its own publisher) rise; the operator adds the rise into
    # status.cost, its gauges and kubectl get's Cost column. A checkpoint the driver discarded is a timeline row.
    # A 1 s heartbeat (HANDOFF_PROGRESS_PUBLISH_SECONDS): the second record would otherwise wait for the 15 s one.
    publisher = ProgressPublisher(ns, "orders-progress", api=cluster.api, pod="orders-driver-0", interval=1.0)
    report = BatchReport(batch_id=2, rows=10, duration_ms=800, start={}, end={(topic, 0): 20}, lag={(topic, 0): 0},
                         commit=None, max_event_time_ms=now_ms)
    for kafka_bytes, table_bytes in ((1000, 3 << 20), (2500, 5 << 20)):
        totals = {"records": 10, "kafkaBytes": kafka_bytes, "tableBytes": table_bytes, "writeApiBytes": 0,
                  "files": 2, "snapshots": 2, "rewrittenFiles": 9, "rewrittenBytes": 4096}
        publisher.offer({**report.record(hid), "totals": totals,
                         "checkpointDiscarded": "the checkpoint is ahead of the table's ledger"})
        eventually(lambda: ((cluster.get(ns, "orders").get("status") or {}).get("cost") or {}).get("kafkaBytes")
                   == kafka_bytes, f"status.cost.kafkaBytes {kafka_bytes}")
    publisher.close()
    cost = cluster.get(ns, "orders")["status"]["cost"]
    assert (cost["tableBytes"], cost["files"], cost["today"]["kafkaBytes"]) == (5 << 20, 2, 2500)
    # maintenance rewrites are kept by the API server (the CRD's schema has them) and exported
    assert (cost["rewrittenFiles"], cost["rewrittenBytes"]) == (9, 4096)
    assert REGISTRY.get_sample_value("handoff_cost_rewritten_bytes", {"namespace": ns, "name": "orders"}) == 4096
    assert REGISTRY.get_sample_value("handoff_cost_kafka_read_bytes", {"namespace": ns, "name": "orders"}) == 2500
    wide = subprocess.run(["kubectl", "get", "sth", "orders", "-n", ns, "-o", "wide"], capture_output=True,
                          text=True, env={**os.environ, "KUBECONFIG": cluster.kubeconfig}, timeout=60)
    header, line = wide.stdout.splitlines()[:2]
    assert "COST" in header.split() and "2.4KiB→5.0MiB" in line.split(), wide.stdout
    eventually(lambda: "CheckpointDiscarded" in (cluster.core.read_namespaced_config_map(
        "orders-timeline", ns).data or {}).get("timeline.json", ""), "the checkpoint discard in the record")

    # The API server drops Events after an hour; the operator's record keeps what it decided and saw.
    cluster.core.delete_collection_namespaced_event(ns)
    cluster.patch_spec(ns, "orders", {"freshness": {"target": "7m"}})
    generation = cluster.get(ns, "orders")["metadata"]["generation"]
    eventually(lambda: f"generation {generation} of the spec" in (cluster.core.read_namespaced_config_map(
        "orders-timeline", ns).data or {}).get("timeline.json", ""), "the spec change in the timeline record")
    out = plugin(cluster.kubeconfig, "timeline", "orders", "-n", ns, "-o", "json")
    assert out.returncode == 0, out.stderr
    after = json.loads(out.stdout)
    kept = [r["kind"] for r in after if r["source"] == "operator"]
    assert kept.index("SpecChanged") < kept.index("CheckpointDiscarded") < kept.index("DriverFailing") \
        < kept.index("DriverStarted"), kept
    assert kept.count("CheckpointDiscarded") == 1, kept
    assert not [r for r in after if r["source"] == "event" and r["kind"] == "DriverFailing"]
    record = cluster.core.read_namespaced_config_map("orders-timeline", ns)
    assert [ref.kind for ref in record.metadata.owner_references] == ["StreamTableHandoff"]
    cluster.delete_all_handoffs()
