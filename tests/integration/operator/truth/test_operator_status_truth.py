"""Status from the truth: the committed snapshot and offsets come from the table's ledger (an Iceberg
table in a real SQLite catalog, with ledger snapshots written in the contract's format), lag from the
real Kafka broker's end offsets, freshness from the newest committed event time — with the operator
running in-process against the real kube-apiserver."""
from __future__ import annotations

import json
import time
import uuid


import pytest
from confluent_kafka import Producer

from operator_support import (Cluster, Operator, base_spec, eventually, ledger_commit as _commit,
                              sqlite_ledger_table)

pytestmark = [pytest.mark.apiserver, pytest.mark.kafka]


def _produce(bootstrap: str, topic: str, per_partition: dict[int, int]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition, n in per_partition.items():
        for i in range(n):
            producer.produce(topic, json.dumps({"id": i}).encode(), partition=partition)
    assert producer.flush(30) == 0


def test_status_reports_ledger_commit_lag_and_freshness(cluster: Cluster, kafka, tmp_path) -> None:
    bootstrap = kafka.bootstrap
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=2)
    _produce(bootstrap, topic, {0: 6, 1: 4})

    catalog_props, table = sqlite_ledger_table(tmp_path)

    ns = cluster.new_namespace("truth")
    handoff_id = f"{ns}/orders"
    spec = base_spec(bootstrap)
    spec["source"]["topics"] = [topic]
    spec["sink"]["iceberg"]["catalog"]["properties"] = catalog_props
    spec["sink"]["iceberg"]["partitionBy"] = []

    # Another handoff's commit in the same table must not count.
    _commit(table, f"{ns}/someone-else", 0, {topic: {"0": [0, 6], "1": [0, 4]}}, int(time.time() * 1000), 10)
    event_ms = int(time.time() * 1000) - 120_000
    snapshot = _commit(table, handoff_id, 0, {topic: {"0": [0, 3], "1": [0, 1]}}, event_ms, 4)

    op = Operator(cluster.kubeconfig, status_interval=1.0)
    op.start()
    try:
        cluster.create(ns, "orders", spec)

        def committed() -> dict | None:
            status = cluster.get(ns, "orders").get("status") or {}
            return status if (status.get("committed") or {}).get("snapshot") == str(snapshot) \
                and status.get("lag") is not None else None
        status = eventually(committed, "status with the ledger's commit")
        assert status["committed"]["offsets"] == {topic: {"0": 3, "1": 1}}
        assert status["committed"]["batch"] == 0
        assert status["lag"] == (6 - 3) + (4 - 1)
        assert status["freshnessSeconds"] >= 120
        assert status["freshness"].endswith(("m", "s"))

        # More records arrive: lag grows with Kafka's end offsets.
        _produce(bootstrap, topic, {0: 5})
        eventually(lambda: cluster.get(ns, "orders")["status"].get("lag") == 11, "lag 11 after 5 more records")

        # The next batch commits everything: lag 0, the new snapshot and offsets, fresher.
        fresh_ms = int(time.time() * 1000) - 5_000
        snapshot2 = _commit(table, handoff_id, 1, {topic: {"0": [3, 11], "1": [1, 4]}}, fresh_ms, 11)
        status = eventually(lambda: (s := cluster.get(ns, "orders")["status"])["committed"]["snapshot"]
                            == str(snapshot2) and s, "the second commit")
        assert status["committed"]["offsets"] == {topic: {"0": 11, "1": 4}}
        assert status["lag"] == 0
        assert status["freshnessSeconds"] < 120

        # kubectl's printer columns show the same numbers.
        from operator_support import kubectl
        row = kubectl(cluster.kubeconfig, "get", "sth", "-n", ns, "-o", "wide").stdout.splitlines()
        header, values = row[0].split(), row[1].split()
        assert values[header.index("LAG")] == "0"
        assert values[header.index("SNAPSHOT")] == str(snapshot2)
    finally:
        op.stop()


def _bq_sink(bigquery, dataset: str, table: str) -> dict:
    """A CR's spec.sink on the emulator: endpoints set, no credentialsFrom (anonymous)."""
    return {"bigquery": {"project": bigquery.project, "dataset": dataset, "table": table,
                         "restEndpoint": bigquery.rest_endpoint, "grpcEndpoint": bigquery.grpc_endpoint}}


@pytest.mark.bigquery
def test_bigquery_sink_lag_from_the_consumer_group(cluster: Cluster, kafka, bigquery) -> None:
    """While a BigQuery table has no ledger yet (here: not even its dataset), committed offsets are the
    consumer group's, which the data plane commits only after the table commit is durable."""
    from handoff_spark.kafka.offsets import commit_group_offsets

    bootstrap = kafka.bootstrap
    topic = f"clicks-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=2)
    _produce(bootstrap, topic, {0: 5, 1: 5})
    ns = cluster.new_namespace("truth")
    spec = base_spec(bootstrap, sink=_bq_sink(bigquery, f"absent_{uuid.uuid4().hex[:8]}", "clicks"))
    spec["source"]["topics"] = [topic]
    # The first commit of a new group may meet a coordinator that is still loading: retry.
    eventually(lambda: commit_group_offsets(bootstrap, f"handoff-{ns}.clicks", {topic: {0: 4, 1: 2}},
                                            timeout_s=10.0), "group offsets committed")

    op = Operator(cluster.kubeconfig, status_interval=1.0)
    op.start()
    try:
        cluster.create(ns, "clicks", spec)
        status = eventually(lambda: (s := cluster.get(ns, "clicks").get("status") or {}).get("lag") is not None
                            and s, "status with lag")
        assert status["committed"]["offsets"] == {topic: {"0": 4, "1": 2}}
        assert "snapshot" not in status["committed"]
        assert status["lag"] == (5 - 4) + (5 - 2)
    finally:
        op.stop()


@pytest.mark.bigquery
def test_bigquery_sink_status_from_the_table_ledger(cluster: Cluster, kafka, bigquery, tmp_path) -> None:
    """With a ledger row in `<table>__handoff_ledger`, the status is read from BigQuery alone: offsets,
    batch, commit time and freshness are the ledger's, not the consumer group's (committed differently here
    to tell the two apart)."""
    from handoff_spark.bigquery import ledger as bigquery_ledger
    from handoff_spark.kafka.offsets import commit_group_offsets

    from bq_support import bq_config

    bootstrap = kafka.bootstrap
    topic = f"views-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=2)
    _produce(bootstrap, topic, {0: 6, 1: 4})
    ns = cluster.new_namespace("truth")
    dataset = f"ds_{uuid.uuid4().hex[:8]}"
    bigquery.bq_client().create_dataset(f"{bigquery.project}.{dataset}")

    # Rows exactly as the sink records them, through the data plane's own writer; another handoff's row in
    # the same ledger must not count.
    mine = bq_config(tmp_path, bigquery, bootstrap, topic, dataset=dataset, table="views", handoffId=f"{ns}/views")
    other = bq_config(tmp_path, bigquery, bootstrap, topic, dataset=dataset, table="views",
                      handoffId=f"{ns}/someone-else")
    assert bigquery_ledger.record_batch(other, 9, {topic: {"0": [0, 6], "1": [0, 4]}}, 10, 0,
                                        int(time.time() * 1000), int(time.time() * 1_000_000))
    event_ms = int(time.time() * 1000) - 120_000
    commit_us = int(time.time() * 1_000_000) - 1_000_000
    assert bigquery_ledger.record_batch(mine, 3, {topic: {"0": [1, 3], "1": [0, 1]}}, 3, 0, event_ms, commit_us)
    eventually(lambda: commit_group_offsets(bootstrap, f"handoff-{ns}.views", {topic: {0: 5, 1: 4}},
                                            timeout_s=10.0), "group offsets committed")

    spec = base_spec(bootstrap, sink=_bq_sink(bigquery, dataset, "views"))
    spec["source"]["topics"] = [topic]
    op = Operator(cluster.kubeconfig, status_interval=1.0)
    op.start()
    try:
        cluster.create(ns, "views", spec)
        status = eventually(lambda: (s := cluster.get(ns, "views").get("status") or {}).get("lag") is not None
                            and (s.get("committed") or {}).get("batch") is not None and s,
                            "status with the ledger's commit")
        assert status["committed"]["offsets"] == {topic: {"0": 3, "1": 1}}
        assert status["committed"]["batch"] == 3
        assert status["committed"]["snapshot"] == str(commit_us)
        assert status["lag"] == (6 - 3) + (4 - 1)
        assert status["freshnessSeconds"] >= 120

        # The next ledger row moves the status; the group's offsets still say otherwise.
        assert bigquery_ledger.record_batch(mine, 4, {topic: {"0": [3, 6], "1": [1, 4]}}, 6, 0,
                                            int(time.time() * 1000) - 5_000, int(time.time() * 1_000_000))
        status = eventually(lambda: (s := cluster.get(ns, "views")["status"])["committed"]["batch"] == 4 and s,
                            "the second ledger row")
        assert status["committed"]["offsets"] == {topic: {"0": 6, "1": 4}}
        assert status["lag"] == 0
        assert status["freshnessSeconds"] < 120
    finally:
        op.stop()
