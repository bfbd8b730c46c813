"""Executor-side helpers both table sinks (Iceberg, BigQuery) need, kept in one place so a fix lands once
(the sub-millisecond event-time cast was fixed in one sink and not the other before they shared this)."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc


def task_batch_id() -> int | None:
    """The micro-batch id a write task belongs to: Spark sets it as a job-local property that executors read
    through the task context (used by the fault hooks and the per-batch bookkeeping)."""
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        value = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
        return int(value) if value is not None else None
    except Exception:  # noqa: BLE001 - outside a Spark task (tests, driver)
        return None


def max_event_time_ms(tbl: pa.Table, column: str | None) -> int | None:
    """Newest event time in the batch, in epoch ms: the declared event-time column, else the Kafka timestamp.

    The max is taken in the column's own unit and converted afterwards: a *safe* µs→ms cast raises on
    sub-millisecond values, which ISO timestamps with microseconds produce."""
    name = column if column and column in tbl.column_names else "_kafka_timestamp"
    if name not in tbl.column_names or tbl.num_rows == 0:
        return None
    col = tbl.column(name)
    if not pa.types.is_timestamp(col.type):
        return None
    m = pc.max(col)
    if not m.is_valid:
        return None
    value = m.cast(pa.int64()).as_py()
    per_ms = {"s": None, "ms": 1, "us": 1_000, "ns": 1_000_000}[col.type.unit]
    return value * 1000 if per_ms is None else value // per_ms
