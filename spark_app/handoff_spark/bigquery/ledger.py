"""Which Kafka offsets a BigQuery table holds, read from BigQuery alone (no Spark, no checkpoint).

Two sources, with different standing (docs/bigquery-exactly-once.md):
- the data table is the truth: each row carries `_kafka_topic/_kafka_partition/_kafka_offset`, committed
  atomically with the batch that wrote it (`table_offsets`);
- `<table>__handoff_ledger` is an index, one row per committed micro-batch (batch id, exact offset range,
  rows, dead letters, BigQuery commit time, the Schema Registry writer schemas of its rows), written after
  the data commit. BatchCommitWriteStreams is atomic
  only within one table, so this row can be missing (crash in between; it is written again when the batch is
  replayed and skipped) but never ahead of the data. It also covers ranges whose records all went to the DLQ,
  which leave no rows in the data table.

The reading API mirrors `handoff_spark.iceberg.ledger` (Iceberg): `list_commits`, `latest_commit`, `resume_offsets`.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

from handoff_spark.bigquery import client as bigquery_client
from handoff_spark.bigquery.schema import KAFKA_OFFSET, KAFKA_PARTITION, KAFKA_TOPIC, Field
from handoff_spark.bigquery.table import add_columns
from handoff_spark.config import AppConfig, BigQuerySink
from handoff_spark.ledger.record import BATCH, GAP, Commit, Offsets

log = logging.getLogger(__name__)

LEDGER_SUFFIX = "__handoff_ledger"

_LEDGER_FIELDS = [("handoff_id", "STRING", "REQUIRED"), ("query", "STRING", "REQUIRED"),
                  ("batch_id", "INT64", "REQUIRED"), ("offsets", "STRING", "REQUIRED"),
                  ("rows", "INT64", "REQUIRED"), ("dlq_rows", "INT64", "REQUIRED"),
                  ("max_event_time_ms", "INT64", "NULLABLE"), ("commit_time_us", "INT64", "NULLABLE"),
                  ("recorded_at", "TIMESTAMP", "REQUIRED"),
                  # added later: a ledger table made before it gets it (NULLABLE) the next time a row is written
                  ("schemas", "STRING", "NULLABLE")]


def ledger_table(sink: BigQuerySink) -> str:
    return f"{sink.table}{LEDGER_SUFFIX}"


def _ensure_ledger(client: Any, sink: BigQuerySink) -> None:
    from google.api_core.exceptions import Conflict, NotFound
    from google.cloud import bigquery

    ref = bigquery_client.table_ref(sink, ledger_table(sink))
    try:
        table = client.get_table(ref, retry=None)
    except NotFound:
        table = bigquery.Table(ref, schema=[bigquery.SchemaField(n, t, mode=m) for n, t, m in _LEDGER_FIELDS])
        try:
            client.create_table(table, retry=None)
        except Conflict:
            pass
        return
    have = {f.name.lower() for f in table.schema}
    missing = [Field(n, t, m) for n, t, m in _LEDGER_FIELDS if n not in have]
    if missing:  # a ledger made by an older Handoff: grow it (NULLABLE columns only), no migration step
        add_columns(client, ref, missing)


def _has_batch(client: Any, sink: BigQuerySink, handoff_id: str, query: str, batch_id: int) -> bool:
    from google.cloud import bigquery

    ref = bigquery_client.table_ref(sink, ledger_table(sink))
    job = client.query(f"SELECT COUNT(*) AS n FROM `{ref}` WHERE handoff_id = @h AND query = @q AND batch_id = @b",
                       job_config=bigquery.QueryJobConfig(query_parameters=[
                           bigquery.ScalarQueryParameter("h", "STRING", handoff_id),
                           bigquery.ScalarQueryParameter("q", "STRING", query),
                           bigquery.ScalarQueryParameter("b", "INT64", batch_id)]), retry=None)
    return int(list(job.result())[0]["n"]) > 0


def record_batch(cfg: AppConfig, batch_id: int, offsets: dict[str, dict[str, list[int]]], rows: int,
                 dlq_rows: int, max_event_time_ms: int | None, commit_time_us: int | None,
                 only_if_missing: bool = False, schemas: dict[str, list[str]] | None = None) -> bool:
    """Append the batch's ledger row through the `_default` stream. Best effort: a failure is logged and
    returns False — correctness never depends on this table. `schemas`: the registry writer schemas of the
    batch's rows, {"<schema id>": ["<subject>:<version>", ...]} (Iceberg's `handoff.schemas`)."""
    import pyarrow as pa

    from handoff_spark.bigquery.append import RetryPolicy, StreamWriter

    sink = cfg.sink
    assert isinstance(sink, BigQuerySink)
    try:
        client = bigquery_client.rest_client(sink)
        _ensure_ledger(client, sink)
        if only_if_missing and _has_batch(client, sink, cfg.handoff_id, cfg.query_name, batch_id):
            return True
        schema = pa.schema([pa.field("handoff_id", pa.string(), False), pa.field("query", pa.string(), False),
                            pa.field("batch_id", pa.int64(), False), pa.field("offsets", pa.string(), False),
                            pa.field("rows", pa.int64(), False), pa.field("dlq_rows", pa.int64(), False),
                            pa.field("max_event_time_ms", pa.int64()), pa.field("commit_time_us", pa.int64()),
                            pa.field("recorded_at", pa.timestamp("us", "UTC"), False),
                            pa.field("schemas", pa.string())])
        row = pa.Table.from_pylist([{
            "handoff_id": cfg.handoff_id, "query": cfg.query_name, "batch_id": batch_id,
            "offsets": json.dumps(offsets, separators=(",", ":")), "rows": rows, "dlq_rows": dlq_rows,
            "max_event_time_ms": max_event_time_ms, "commit_time_us": commit_time_us,
            "recorded_at": dt.datetime.now(dt.timezone.utc),
            "schemas": json.dumps(schemas, separators=(",", ":"), sort_keys=True) if schemas else None}],
            schema=schema)
        writer = StreamWriter(bigquery_client.write_client(sink), bigquery_client.table_path(sink, ledger_table(sink)),
                              schema, pending=False, retry=RetryPolicy(max_attempts=4, max_seconds=2.0))
        writer.write(row)
        writer.close()
        return True
    except Exception:  # noqa: BLE001 — the ledger is an index, not the truth
        log.warning("batch %s: could not record the ledger row (the data commit stands)", batch_id, exc_info=True)
        return False


def record_gap(cfg: AppConfig, ranges: dict[str, dict[str, list[int]]]) -> bool:
    """Record offsets deliberately left out of the table (a Rollback that must not bring discarded data back):
    a ledger row with batch id -1 and no rows, so `resume_offsets` moves past the range. Unlike batch rows this
    one carries the decision, so a False return must stop the caller (nothing else records it)."""
    return record_batch(cfg, -1, ranges, 0, 0, None, None)


# ------------------------------------------------------------------------------------------ reading

def table_offsets(sink: BigQuerySink, client: Any | None = None) -> Offsets:
    """`{topic: {partition: max offset + 1}}` of the rows in the data table — the ground truth."""
    client = client or bigquery_client.rest_client(sink)
    ref = bigquery_client.table_ref(sink)
    sql = (f"SELECT {KAFKA_TOPIC} AS t, {KAFKA_PARTITION} AS p, MAX({KAFKA_OFFSET}) AS m, COUNT(*) AS n "
           f"FROM `{ref}` GROUP BY 1, 2")
    out: Offsets = {}
    for row in client.query(sql, retry=None).result():
        out.setdefault(row["t"], {})[int(row["p"])] = int(row["m"]) + 1
    return out


def list_commits(sink: BigQuerySink, handoff_id: str | None = None, client: Any | None = None) -> list[Commit]:
    """Ledger rows, newest batch first (empty if the ledger table does not exist yet)."""
    from google.api_core.exceptions import NotFound
    from google.cloud import bigquery

    client = client or bigquery_client.rest_client(sink)
    ref = bigquery_client.table_ref(sink, ledger_table(sink))
    where, params = "", []
    if handoff_id is not None:
        where = "WHERE handoff_id = @h"
        params = [bigquery.ScalarQueryParameter("h", "STRING", handoff_id)]
    try:
        rows = client.query(f"SELECT * FROM `{ref}` {where}",
                            job_config=bigquery.QueryJobConfig(query_parameters=params), retry=None).result()
        rows = list(rows)
    except NotFound:
        return []
    commits: dict[tuple[str, str, int], Commit] = {}
    for r in rows:
        raw = json.loads(r["offsets"])
        recorded = r["recorded_at"]
        commit_us = None if r["commit_time_us"] is None else int(r["commit_time_us"])
        batch_id = int(r["batch_id"])
        c = Commit(snapshot_id=commit_us,
                   timestamp_ms=commit_us // 1000 if commit_us else
                   int(recorded.timestamp() * 1000) if recorded is not None else 0,
                   handoff_id=r["handoff_id"], query=r["query"], batch_id=batch_id,
                   offsets={t: {int(p): (int(se[0]), int(se[1])) for p, se in parts.items()} for t, parts in raw.items()},
                   rows=int(r["rows"]), dlq_rows=int(r["dlq_rows"]),
                   max_event_time_ms=None if r["max_event_time_ms"] is None else int(r["max_event_time_ms"]),
                   kind=GAP if batch_id < 0 else BATCH,
                   schemas=json.loads(r["schemas"]) if r.get("schemas") else None)
        commits.setdefault((c.handoff_id, c.query, c.batch_id), c)  # at-least-once index: first row wins
    return sorted(commits.values(), key=lambda c: (c.timestamp_ms, c.batch_id), reverse=True)


def latest_commit(sink: BigQuerySink, handoff_id: str | None = None, client: Any | None = None) -> Commit | None:
    """The newest micro-batch (gap rows, batch id -1, are not commits of data)."""
    return next((c for c in list_commits(sink, handoff_id, client) if c.batch_id >= 0), None)


def commit_for_offset(sink: BigQuerySink, topic: str, partition: int, offset: int,
                      handoff_id: str | None = None, client: Any | None = None) -> Commit | None:
    for c in list_commits(sink, handoff_id, client):
        if c.covers(topic, partition, offset):
            return c
    return None


def resume_offsets(sink: BigQuerySink, handoff_id: str | None = None, client: Any | None = None) -> Offsets:
    """Where a query writing this table must resume: past every offset in the data table, and past the
    ranges the ledger records (which include batches whose records all went to the DLQ)."""
    client = client or bigquery_client.rest_client(sink)
    out = table_offsets(sink, client)
    for c in list_commits(sink, handoff_id, client):
        for topic, parts in c.end_offsets.items():
            for p, end in parts.items():
                out.setdefault(topic, {})[p] = max(out.get(topic, {}).get(p, 0), end)
    return out


__all__ = ["Commit", "LEDGER_SUFFIX", "ledger_table", "record_batch", "record_gap", "table_offsets", "list_commits",
           "latest_commit", "commit_for_offset", "resume_offsets"]
