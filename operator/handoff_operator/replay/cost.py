"""What a replay will cost, for the plan (and so for `dryRun`): pure arithmetic over what the table measured.

The table (`table.ReplayTable.cost`) says what leaves it: rows and bytes to delete (BigQuery), data files the
discarded snapshots added (Iceberg, `filesToRewrite`: the re-read writes that much again), and whether writes are
billed per byte (BigQuery's Storage Write API). The re-read's size comes from the table too: Kafka tells offsets,
not bytes, for a range, so the bytes to re-read are estimated as records × the table's bytes per row of the
discarded range (a row is what a record becomes; a good estimate when the re-read writes the same rows again).
BigQuery's row bytes are measured over the rows to delete, each value sized as BigQuery sizes it.

The money estimate is the Storage Write API bytes × the operator's price setting
(`OperatorSettings.bigquery_write_price_per_gib`, chart value `bigqueryWritePricePerGiB`; default the public list
price, USD 0.025 per GiB, before the monthly free tier). Iceberg writes are not billed per byte: no estimate.
"""
from __future__ import annotations

from dataclasses import dataclass

GIB = 1024 ** 3
DEFAULT_WRITE_PRICE_PER_GIB = 0.025


@dataclass(frozen=True)
class TableCost:
    """What the table measured for a plan. `rows_per_byte` inputs: `sample_rows`/`sample_bytes` of rows like the
    ones to re-read (the discarded range, or the whole table when nothing is discarded)."""

    rows_to_delete: int | None = None
    bytes_to_delete: int | None = None
    files_to_rewrite: int | None = None
    sample_rows: int = 0
    sample_bytes: int = 0
    billed_writes: bool = False       # writes billed per byte (BigQuery's Storage Write API)


@dataclass(frozen=True)
class Cost:
    rows_to_delete: int | None
    bytes_to_delete: int | None
    files_to_rewrite: int | None
    records_to_reread: int
    bytes_to_reread: int | None       # estimate (module docstring)
    write_api_bytes: int | None       # bytes the re-read appends through a per-byte-billed API
    price_per_gib: float | None
    estimated_usd: float | None

    def status(self) -> dict[str, object]:
        """As `status.plan.cost` holds it (absent fields left out)."""
        out = {"rowsToDelete": self.rows_to_delete, "bytesToDelete": self.bytes_to_delete,
               "filesToRewrite": self.files_to_rewrite, "recordsToReread": self.records_to_reread,
               "bytesToReread": self.bytes_to_reread, "writeApiBytes": self.write_api_bytes,
               "writeApiPricePerGiB": self.price_per_gib, "estimatedCostUSD": self.estimated_usd}
        return {k: v for k, v in out.items() if v is not None}

    def summary(self) -> str:
        parts = []
        if self.rows_to_delete is not None:
            parts.append(f"{self.rows_to_delete} rows ({_size(self.bytes_to_delete or 0)}) to delete")
        if self.files_to_rewrite is not None:
            parts.append(f"{self.files_to_rewrite} data files to rewrite")
        if self.records_to_reread:
            parts.append(f"{self.records_to_reread} records (~{_size(self.bytes_to_reread or 0)}) to re-read "
                         f"from Kafka")
        if self.estimated_usd is not None and self.write_api_bytes:
            parts.append(f"~{_size(self.write_api_bytes)} through the Storage Write API, about "
                         f"USD {self.estimated_usd:.4f} at {self.price_per_gib}/GiB")
        return "; ".join(parts)


def _size(n: int) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def estimate(table: TableCost, records_to_reread: int, price_per_gib: float) -> Cost:
    """The cost of a plan that re-reads `records_to_reread` records from a table that measured `table`."""
    per_row = table.sample_bytes / table.sample_rows if table.sample_rows else None
    reread = int(per_row * records_to_reread) if per_row is not None else None
    write = (reread or 0) if table.billed_writes else None
    money = round(write / GIB * price_per_gib, 6) if write is not None else None
    return Cost(table.rows_to_delete, table.bytes_to_delete, table.files_to_rewrite, records_to_reread, reread,
                write, price_per_gib if table.billed_writes else None, money)
