"""The BigQuery ledger index records the Schema Registry writer schemas of each batch (as Iceberg's snapshot
summary `handoff.schemas` does), and a ledger table made before that column existed gets it (NULLABLE) the
next time a row is written: no migration step. Against the emulator."""
from __future__ import annotations

import time

import pytest

from handoff_spark.bigquery import ledger as bigquery_ledger

from bq_support import old_ledger_table

pytestmark = pytest.mark.bigquery


def test_ledger_rows_carry_writer_schemas_and_an_old_ledger_table_grows_the_column(bigquery, tmp_path):
    cfg, ref = old_ledger_table(bigquery, tmp_path, without=("schemas",))
    client = bigquery.bq_client()

    ms = int(time.time() * 1000)
    assert bigquery_ledger.record_batch(cfg, 0, {"orders": {"0": [0, 5]}}, 5, 0, ms, ms * 1000)  # json format
    schemas = {"7": ["orders-value:1"], "9": ["orders-value:2"]}
    assert bigquery_ledger.record_batch(cfg, 1, {"orders": {"0": [5, 9]}}, 4, 0, ms, ms * 1000 + 1,
                                        schemas=schemas)
    assert [f.name for f in client.get_table(ref).schema][-1] == "schemas"
    commits = bigquery_ledger.list_commits(cfg.sink, "ns/orders")
    assert [(c.batch_id, c.schemas) for c in commits] == [(1, schemas), (0, None)]
