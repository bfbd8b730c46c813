"""The BigQuery ledger index records the Schema Registry writer schemas of each batch (as Iceberg's snapshot
summary `handoff.schemas` does), and a ledger table made before that column existed gets it (NULLABLE) the
next time a row is written: no migration step. Against the emulator."""
from __future__ import annotations

import time
import uuid

import pytest

from handoff_spark.bigquery import client as bigquery_client, ledger as bigquery_ledger

from bq_support import bq_config

pytestmark = pytest.mark.bigquery


def test_ledger_rows_carry_writer_schemas_and_an_old_ledger_table_grows_the_column(bigquery, tmp_path):
    from google.cloud import bigquery as bq

    dataset = f"schemas_{uuid.uuid4().hex[:8]}"
    client = bigquery.bq_client()
    client.create_dataset(f"{bigquery.project}.{dataset}")
    cfg = bq_config(tmp_path, bigquery, "127.0.0.1:9", "orders", dataset=dataset, table="orders",
                    handoffId="ns/orders")
    ref = bigquery_client.table_ref(cfg.sink, bigquery_ledger.ledger_table(cfg.sink))
    old_fields = [f for f in bigquery_ledger._LEDGER_FIELDS if f[0] != "schemas"]
    client.create_table(bq.Table(ref, schema=[bq.SchemaField(n, t, mode=m) for n, t, m in old_fields]))

    ms = int(time.time() * 1000)
    assert bigquery_ledger.record_batch(cfg, 0, {"orders": {"0": [0, 5]}}, 5, 0, ms, ms * 1000)  # json format
    schemas = {"7": ["orders-value:1"], "9": ["orders-value:2"]}
    assert bigquery_ledger.record_batch(cfg, 1, {"orders": {"0": [5, 9]}}, 4, 0, ms, ms * 1000 + 1,
                                        schemas=schemas)
    assert [f.name for f in client.get_table(ref).schema][-1] == "schemas"
    commits = bigquery_ledger.list_commits(cfg.sink, "ns/orders")
    assert [(c.batch_id, c.schemas) for c in commits] == [(1, schemas), (0, None)]
