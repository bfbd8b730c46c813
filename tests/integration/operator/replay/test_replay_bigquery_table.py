"""The BigQuery side of the replay sink contract against the emulator: what it refuses in the plan, with the fix."""
from __future__ import annotations

import uuid

import pytest
from handoff_operator.replay import table as replay_table
from handoff_operator.replay.plan import Failure, Plan
from handoff_spark.config import AppConfig

pytestmark = [pytest.mark.bigquery]


def _config(emulator, dataset: str) -> AppConfig:
    return AppConfig.model_validate({
        "handoffId": "shop/orders", "source": {"bootstrapServers": "127.0.0.1:9", "topics": ["orders"]},
        "sink": {"kind": "bigquery", "project": emulator.project, "dataset": dataset, "table": "orders",
                 "restEndpoint": emulator.rest_endpoint, "grpcEndpoint": emulator.grpc_endpoint},
        "schema": {"columns": [], "onIncompatible": "halt"}, "checkpointLocation": "/nonexistent"})


def test_a_table_that_requires_a_partition_filter_is_refused_with_the_alter_table_that_lifts_it(bigquery) -> None:
    client = bigquery.bq_client()
    dataset = f"rpf_{uuid.uuid4().hex[:8]}"
    client.create_dataset(f"{bigquery.project}.{dataset}")
    cfg = _config(bigquery, dataset)
    assert replay_table.open_table(cfg) is None          # no table yet: nothing to plan against

    # Made as a user makes it: DDL with the option.
    client.query(f"CREATE TABLE `{bigquery.project}.{dataset}.orders` (ts TIMESTAMP, _kafka_topic STRING, "
                 f"_kafka_partition INT64, _kafka_offset INT64) PARTITION BY DATE(ts) "
                 f"OPTIONS (require_partition_filter = TRUE)").result()
    opened = replay_table.open_table(cfg)
    assert opened is not None and opened.kind == "bigquery"
    refused = opened.refusal(Plan("Rollback", head_snapshot=2, target_snapshot=1, gap={"orders": {0: (5, 10)}}))
    assert isinstance(refused, Failure) and refused.reason == "PartitionFilterRequired"
    assert f"ALTER TABLE `{bigquery.project}.{dataset}.orders` SET OPTIONS (require_partition_filter = false)" \
        in refused.message

    plain = f"plain_{uuid.uuid4().hex[:8]}"
    client.create_dataset(f"{bigquery.project}.{plain}")
    client.query(f"CREATE TABLE `{bigquery.project}.{plain}.orders` (ts TIMESTAMP) PARTITION BY DATE(ts)").result()
    assert replay_table.open_table(_config(bigquery, plain)).refusal(Plan("Rollback")) is None  # type: ignore[union-attr]


def test_the_table_level_option_set_through_the_client_is_refused_and_the_suggested_fix_lifts_it(bigquery) -> None:
    """`Table.require_partition_filter`, as the Python client and the API set it today (the emulator learned the
    table-level field, hack/bqemu_launcher.py), is refused like the DDL option; running the ALTER TABLE the message
    suggests lets the plan through."""
    from google.cloud import bigquery as bq

    client = bigquery.bq_client()
    dataset = f"rpf_{uuid.uuid4().hex[:8]}"
    client.create_dataset(f"{bigquery.project}.{dataset}")
    table = bq.Table(f"{bigquery.project}.{dataset}.orders", schema=[
        bq.SchemaField("ts", "TIMESTAMP"), bq.SchemaField("_kafka_topic", "STRING"),
        bq.SchemaField("_kafka_partition", "INT64"), bq.SchemaField("_kafka_offset", "INT64")])
    table.time_partitioning = bq.TimePartitioning(field="ts")
    table = client.create_table(table)
    assert not client.get_table(table.reference).require_partition_filter
    table.require_partition_filter = True
    client.update_table(table, ["require_partition_filter"])
    assert client.get_table(table.reference).require_partition_filter is True

    cfg = _config(bigquery, dataset)
    refused = replay_table.open_table(cfg).refusal(Plan("Rollback"))  # type: ignore[union-attr]
    assert isinstance(refused, Failure) and refused.reason == "PartitionFilterRequired"
    fix = f"ALTER TABLE `{bigquery.project}.{dataset}.orders` SET OPTIONS (require_partition_filter = false)"
    assert fix in refused.message
    client.query(fix).result()
    assert not client.get_table(table.reference).require_partition_filter
    assert replay_table.open_table(cfg).refusal(Plan("Rollback")) is None  # type: ignore[union-attr]
