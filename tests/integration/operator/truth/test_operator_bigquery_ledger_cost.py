"""The operator's BigQuery ledger read against the emulator: the billed SELECT over `__handoff_ledger` runs
only when the ledger table's metadata (tables.get, free) changed since the cached answer, or the answer is
older than the recheck age. Queries are counted from the emulator's own jobs list."""
from __future__ import annotations

import time
import uuid

import pytest

from handoff_operator.truth.bigquery import BoundedCache, ledger_commit
from handoff_spark.bigquery import client as bigquery_client, ledger as bigquery_ledger

from bq_support import bq_config

pytestmark = pytest.mark.bigquery


def _ledger_queries(emulator, ledger_ref: str) -> int:
    return sum(1 for job in emulator.bq_client().list_jobs(all_users=True)
               if ledger_ref in (getattr(job, "query", None) or ""))


def test_status_refresh_queries_the_ledger_only_after_it_changed(bigquery, tmp_path):
    dataset = f"cost_{uuid.uuid4().hex[:8]}"
    bigquery.bq_client().create_dataset(f"{bigquery.project}.{dataset}")
    cfg = bq_config(tmp_path, bigquery, "127.0.0.1:9", "views", dataset=dataset, table="views", handoffId="ns/views")
    other = bq_config(tmp_path, bigquery, "127.0.0.1:9", "views", dataset=dataset, table="views",
                      handoffId="ns/someone-else")
    ref = bigquery_client.table_ref(cfg.sink, bigquery_ledger.ledger_table(cfg.sink))
    cache: BoundedCache = BoundedCache()
    now = [1000.0]

    def refresh():
        return ledger_commit(cfg, cache=cache, clock=lambda: now[0])

    assert refresh() is None  # no ledger table yet: tables.get says so, no query
    assert _ledger_queries(bigquery, ref) == 0

    ms = int(time.time() * 1000)
    assert bigquery_ledger.record_batch(cfg, 0, {"views": {"0": [0, 5]}}, 5, 0, ms, ms * 1000)
    assert refresh().batch_id == 0
    assert _ledger_queries(bigquery, ref) == 1

    for _ in range(3):  # refreshes with no new commit: answered from the cache
        now[0] += 15
        assert refresh().batch_id == 0
    assert _ledger_queries(bigquery, ref) == 1

    assert bigquery_ledger.record_batch(cfg, 1, {"views": {"0": [5, 9]}}, 4, 0, ms, ms * 1000 + 1)
    now[0] += 15
    assert refresh().batch_id == 1  # the new row is seen at the next refresh
    assert _ledger_queries(bigquery, ref) == 2

    # another handoff's row in the same ledger changes the table: one query, this handoff's answer unchanged
    assert bigquery_ledger.record_batch(other, 7, {"views": {"0": [0, 9]}}, 9, 0, ms, ms * 1000 + 2)
    now[0] += 15
    assert refresh().batch_id == 1
    assert _ledger_queries(bigquery, ref) == 3

    # unchanged metadata, but the cached answer is older than the recheck age: read again
    now[0] += 301
    assert refresh().batch_id == 1
    assert _ledger_queries(bigquery, ref) == 4
