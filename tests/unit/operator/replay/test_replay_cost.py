"""What a replay costs (pure): the table's measurements turned into bytes to re-read and a money estimate."""
from __future__ import annotations

from handoff_operator.replay.cost import GIB, TableCost, estimate
from handoff_operator.runtime.settings import OperatorSettings


def test_bigquery_rows_to_delete_are_priced_as_storage_write_api_bytes() -> None:
    c = estimate(TableCost(rows_to_delete=1000, bytes_to_delete=GIB, sample_rows=1000, sample_bytes=GIB,
                           billed_writes=True), records_to_reread=2000, price_per_gib=0.025)
    assert c.bytes_to_reread == c.write_api_bytes == 2 * GIB
    assert c.estimated_usd == 0.05
    status = c.status()
    assert status["rowsToDelete"] == 1000 and status["estimatedCostUSD"] == 0.05
    assert status["writeApiPricePerGiB"] == 0.025 and "filesToRewrite" not in status
    assert "USD 0.0500" in c.summary() and "1000 rows (1.0 GiB) to delete" in c.summary()


def test_iceberg_has_files_to_rewrite_and_no_money_estimate() -> None:
    c = estimate(TableCost(files_to_rewrite=3, sample_rows=100, sample_bytes=5000), records_to_reread=100,
                 price_per_gib=0.025)
    assert c.files_to_rewrite == 3 and c.bytes_to_reread == 5000
    assert c.write_api_bytes is None and c.estimated_usd is None
    assert set(c.status()) == {"filesToRewrite", "recordsToReread", "bytesToReread"}


def test_nothing_measured_leaves_the_bytes_unknown() -> None:
    c = estimate(TableCost(billed_writes=True), records_to_reread=10, price_per_gib=1.0)
    assert c.bytes_to_reread is None and c.write_api_bytes == 0 and c.estimated_usd == 0.0


def test_the_price_is_one_operator_setting(monkeypatch) -> None:
    assert OperatorSettings().bigquery_write_price_per_gib == 0.025
    monkeypatch.setenv("HANDOFF_BIGQUERY_WRITE_PRICE_PER_GIB", "0.05")
    assert OperatorSettings().bigquery_write_price_per_gib == 0.05
