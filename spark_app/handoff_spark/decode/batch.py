"""One entry point for both sinks: a raw batch → (table, dead letters, writer schemas), whatever the format.

Why: `json`/`raw` decode in `decode.records`; the Schema Registry formats in `decode.registry`, which also report
the writer schema ids the rows were written with, for the ledger (`handoff.schemas`)."""
from __future__ import annotations

import time
from collections.abc import Iterable

import pyarrow as pa

from handoff_spark.config import REGISTRY_FORMATS, AppConfig
from handoff_spark.decode.records import DeadLetter, decode_batch


def decode_source(raw: pa.Table, cfg: AppConfig) -> tuple[pa.Table, list[DeadLetter], dict[str, list[str]]]:
    """Decode per `cfg.source.format`; the third item is {schema id: ["subject:version", ...]} ({} for json/raw)."""
    fmt = cfg.source.format
    if fmt not in REGISTRY_FORMATS:
        table, dead = decode_batch(raw, cfg.schema_, fmt)  # type: ignore[arg-type]
        return table, dead, {}
    from handoff_spark.decode.registry import decode_registry_batch

    assert cfg.source.schema_registry is not None
    table, dead, uses = decode_registry_batch(raw, cfg.schema_, fmt, cfg.source.schema_registry)
    return table, dead, {str(u.schema_id): [f"{s}:{v}" for s, v in u.versions] for u in uses}


#: Rows decoded at a time while a task is still reading (`decode_while_reading`).
CHUNK_ROWS = 50_000


def decode_while_reading(batches: Iterable[pa.RecordBatch], cfg: AppConfig
                         ) -> tuple[pa.Table | None, pa.Table, list[DeadLetter], dict[str, list[str]], float]:
    """Read a task's raw batches and decode them: (raw, decoded, dead letters, writer schemas, seconds decoding).
    `raw` is None when there were no records.

    Why: the fused write task read all its records, then decoded them; while it decoded, its consumer was done,
    so nothing was fetched, and while it read, the task waited on the broker with CPU to spare (a reader's own CPU
    is ~40 % of its wall time here). Decoding each `CHUNK_ROWS` as they arrive lets librdkafka's fetch thread
    prefetch the next records meanwhile (docs/benchmarks.md, "Throughput").

    The result is the one `decode_source` gives on the whole batch: chunks are kept only while every one of them
    decodes cleanly (no dead letter, no error) to the same schema; otherwise the whole batch is decoded again at
    the end by `decode_source`, which then yields the dead letters (indexed in the whole batch) or raises the
    error exactly as before. JSON only: Schema Registry formats and `raw` decode the whole batch."""
    chunked = cfg.source.format == "json"
    collected: list[pa.RecordBatch] = []
    parts: list[pa.Table] = []
    pending: list[pa.RecordBatch] = []
    pending_rows = 0
    decode_s = 0.0

    def decode_pending() -> bool:
        """Decode the pending chunk; False when it did not decode cleanly to the chunks' schema."""
        nonlocal pending, pending_rows, decode_s
        t = time.perf_counter()
        try:
            table, dead = decode_batch(pa.Table.from_batches(pending), cfg.schema_, "json")
        except Exception:  # noqa: BLE001 - decoded again below, which raises it where it always did
            return False
        finally:
            decode_s += time.perf_counter() - t
            pending, pending_rows = [], 0
        if dead or (parts and table.schema != parts[0].schema):
            return False
        parts.append(table)
        return True

    for b in batches:
        if not b.num_rows:
            continue
        collected.append(b)
        if chunked:
            pending.append(b)
            pending_rows += b.num_rows
            if pending_rows >= CHUNK_ROWS:
                chunked = decode_pending()
    if not collected:
        return None, pa.table({}), [], {}, decode_s
    if chunked and pending:
        chunked = decode_pending()
    raw = pa.Table.from_batches(collected)
    if chunked and parts:
        return raw, pa.concat_tables(parts), [], {}, decode_s
    t = time.perf_counter()
    decoded, dead, schemas = decode_source(raw, cfg)
    return raw, decoded, dead, schemas, decode_s + time.perf_counter() - t
