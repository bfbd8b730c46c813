"""Which Kafka offsets a BigQuery table holds, read from BigQuery alone (no Spark, no checkpoint).

Two sources, with different standing (docs/bigquery-exactly-once.md):
- the data table is the truth: each row carries `_kafka_topic/_kafka_partition/_kafka_offset`, committed
  atomically with the batch that wrote it (`table_offsets`);
- `<table>__handoff_ledger` is an index, one row per committed micro-batch (batch id, exact offset range,
  rows, dead letters, on the DataFrame path late and dropped records, BigQuery commit time, the Schema Registry writer schemas of its rows, the Kafka cluster id
  and topic ids it read, the data table's schema after the commit), written after the data commit. BatchCommitWriteStreams is atomic
  only within one table, so this row can be missing (crash in between; it is written again when the batch is
  replayed and skipped) but never ahead of the data. It also covers ranges whose records all went to the DLQ,
  which leave no rows in the data table, and holds the markers (batch id -1): a `gap` (offsets left out on
  purpose) and an `epoch` (`handoff ledger accept-kafka`: a recreated topic or another cluster accepted).

After an epoch names a topic, only its new incarnation counts: ledger rows recording the epoch's topic id, and
data rows whose `_kafka_topic_id` is that id (the sink stamps it on rows from then on; older rows have none or
another). Before any epoch every row and entry of the topic counts (`ledger.record.incarnations`).

The reading API mirrors `handoff_spark.iceberg.ledger` (Iceberg): `list_commits`, `latest_commit`, `resume_offsets`,
`latest_identity`.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

from handoff_spark.bigquery import client as bigquery_client
from handoff_spark.bigquery.schema import KAFKA_OFFSET, KAFKA_PARTITION, KAFKA_TOPIC, KAFKA_TOPIC_ID, Field
from handoff_spark.bigquery.table import add_columns
from handoff_spark.config import AppConfig, BigQuerySink
from handoff_spark.ledger.record import (BATCH, EPOCH, GAP, Commit, Offsets, column_change, incarnations,
                                         newest_identity, of_incarnation)

log = logging.getLogger(__name__)

LEDGER_SUFFIX = "__handoff_ledger"

_LEDGER_FIELDS = [("handoff_id", "STRING", "REQUIRED"), ("query", "STRING", "REQUIRED"),
                  ("batch_id", "INT64", "REQUIRED"), ("offsets", "STRING", "REQUIRED"),
                  ("rows", "INT64", "REQUIRED"), ("dlq_rows", "INT64", "REQUIRED"),
                  ("max_event_time_ms", "INT64", "NULLABLE"), ("commit_time_us", "INT64", "NULLABLE"),
                  ("recorded_at", "TIMESTAMP", "REQUIRED"),
                  # added later: a ledger table made before them gets them (NULLABLE) the next time a row is written
                  ("schemas", "STRING", "NULLABLE"),
                  # the entry's kind (batch | gap | epoch; NULL: batch, or gap for batch id -1) and why (markers),
                  # and the Kafka identity it read: cluster id, {topic: topic id} as JSON
                  ("kind", "STRING", "NULLABLE"), ("reason", "STRING", "NULLABLE"),
                  ("kafka_cluster_id", "STRING", "NULLABLE"), ("topic_ids", "STRING", "NULLABLE"),
                  # the DataFrame path's counts (NULL on the fused path, or when the read tasks' counts were not
                  # on the driver's machine): records at or below the watermark line (dead letters or kept), and
                  # records the transform filtered or the dedupe dropped (Iceberg's handoff.late-rows and
                  # handoff.dropped-rows)
                  ("late_rows", "INT64", "NULLABLE"), ("dropped_rows", "INT64", "NULLABLE"),
                  # the data table's schema after the batch's commit (BigQuery has no schema ids): its fingerprint
                  # on every batch row (`schema.fingerprint`), and its columns as JSON [[name, type], ...] on the
                  # rows where the driver process recording them had not recorded that schema yet (its first row,
                  # and each after a change): what the timeline's `schema` rows are made from (`schema_changes`)
                  ("schema_id", "STRING", "NULLABLE"), ("table_columns", "STRING", "NULLABLE")]
_ARROW_TYPES = {"STRING": "string", "INT64": "int64"}


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


def _has_batch(client: Any, sink: BigQuerySink, handoff_id: str, query: str, batch_id: int, offsets: str,
               topic_ids: str | None) -> bool:
    """Whether the ledger holds this batch's row: same query, batch id, offsets and topic ids (a fresh
    checkpoint, or one after a recreated topic, counts batch ids from 0 again)."""
    from google.cloud import bigquery

    ref = bigquery_client.table_ref(sink, ledger_table(sink))
    job = client.query(f"SELECT COUNT(*) AS n FROM `{ref}` WHERE handoff_id = @h AND query = @q AND batch_id = @b "
                       f"AND offsets = @o AND IFNULL(topic_ids, '') = @k",
                       job_config=bigquery.QueryJobConfig(query_parameters=[
                           bigquery.ScalarQueryParameter("h", "STRING", handoff_id),
                           bigquery.ScalarQueryParameter("q", "STRING", query),
                           bigquery.ScalarQueryParameter("b", "INT64", batch_id),
                           bigquery.ScalarQueryParameter("o", "STRING", offsets),
                           bigquery.ScalarQueryParameter("k", "STRING", topic_ids or "")]), retry=None)
    return int(list(job.result())[0]["n"]) > 0


def _append(cfg: AppConfig, row: dict[str, Any], only_if_missing: bool = False) -> bool:
    """Append one ledger row through the `_default` stream (the ledger table made or grown first). False: not
    written, because `only_if_missing` found the batch's row already there."""
    import pyarrow as pa

    from handoff_spark.bigquery.append import RetryPolicy, StreamWriter

    sink = cfg.sink
    assert isinstance(sink, BigQuerySink)
    client = bigquery_client.rest_client(sink)
    _ensure_ledger(client, sink)
    if only_if_missing and _has_batch(client, sink, cfg.handoff_id, cfg.query_name, row["batch_id"], row["offsets"],
                                      row.get("topic_ids")):
        return False
    schema = pa.schema([pa.field(n, pa.timestamp("us", "UTC") if t == "TIMESTAMP" else getattr(pa, _ARROW_TYPES[t])(),
                                 m != "REQUIRED") for n, t, m in _LEDGER_FIELDS])
    table = pa.Table.from_pylist([{"handoff_id": cfg.handoff_id, "query": cfg.query_name,
                                   "recorded_at": dt.datetime.now(dt.timezone.utc), **row}], schema=schema)
    writer = StreamWriter(bigquery_client.write_client(sink), bigquery_client.table_path(sink, ledger_table(sink)),
                          schema, pending=False, retry=RetryPolicy(max_attempts=4, max_seconds=2.0))
    writer.write(table)
    writer.close()
    return True


def _identity_columns(kafka: dict[str, Any] | None) -> dict[str, Any]:
    """`{"cluster": id, "topics": {topic: id}}` (the checkpoint's `kafka-identity.json`) as the ledger's columns."""
    topics = (kafka or {}).get("topics") or None
    return {"kafka_cluster_id": (kafka or {}).get("cluster") or None,
            "topic_ids": json.dumps(topics, separators=(",", ":"), sort_keys=True) if topics else None}


#: (ledger table, handoff id, schema fingerprint) whose columns this process has written to a ledger row: a later
#: row of the same schema carries the fingerprint alone. Per handoff, because the timeline reads one handoff's rows.
_recorded_schemas: set[tuple[str, str, str]] = set()


def _table_schema(sink: BigQuerySink) -> tuple[str, dict[str, str]]:
    """(fingerprint, {name: type}) of the data table's columns as they are now (tables.get)."""
    from handoff_spark.bigquery.schema import column_types, fingerprint
    from handoff_spark.bigquery.table import fields_of

    columns = column_types(fields_of(bigquery_client.rest_client(sink).get_table(bigquery_client.table_ref(sink),
                                                                                 retry=None)))
    return fingerprint(columns), columns


def record_batch(cfg: AppConfig, batch_id: int, offsets: dict[str, dict[str, list[int]]], rows: int,
                 dlq_rows: int, max_event_time_ms: int | None, commit_time_us: int | None,
                 only_if_missing: bool = False, schemas: dict[str, list[str]] | None = None,
                 kafka: dict[str, Any] | None = None, late_rows: int | None = None,
                 dropped_rows: int | None = None) -> bool:
    """Append the batch's ledger row through the `_default` stream. Best effort: a failure is logged and
    returns False — correctness never depends on this table. `schemas`: the registry writer schemas of the
    batch's rows, {"<schema id>": ["<subject>:<version>", ...]} (Iceberg's `handoff.schemas`); `kafka`: the
    Kafka identity the batch was read from, `{"cluster": id, "topics": {topic: id}}` (Iceberg's
    `handoff.kafka`), which the driver compares with Kafka's at the next start. `late_rows`, `dropped_rows`: the
    DataFrame path's counts (`sink.commit_batch(frames=True)`), None elsewhere.

    The row also records the data table's schema as it is after the commit (`schema_id`, `table_columns`): the
    sink adds columns under `schema.evolution` (declared ones at start, discovered ones by the write tasks) and
    BigQuery keeps no schema history, so this is where a batch's schema change is written down. Read after the
    commit, so a column another writer added in between is attributed to this batch."""
    sink = cfg.sink
    assert isinstance(sink, BigQuerySink)
    try:
        schema_id, columns = _table_schema(sink)
    except Exception as exc:  # noqa: BLE001 — the row without a schema (no timeline schema row) beats no row
        log.warning("batch %s: could not read the table's schema for the ledger row: %s", batch_id, exc)
        schema_id, columns = None, {}
    key = (bigquery_client.table_ref(sink, ledger_table(sink)), cfg.handoff_id, schema_id or "")
    new_schema = schema_id is not None and key not in _recorded_schemas
    try:
        written = _append(cfg, {"batch_id": batch_id, "offsets": json.dumps(offsets, separators=(",", ":")), "rows": rows,
                      "dlq_rows": dlq_rows, "max_event_time_ms": max_event_time_ms, "commit_time_us": commit_time_us,
                      "schemas": json.dumps(schemas, separators=(",", ":"), sort_keys=True) if schemas else None,
                      "kind": BATCH, "late_rows": late_rows, "dropped_rows": dropped_rows,
                      "schema_id": schema_id,
                      "table_columns": json.dumps(list(columns.items()), separators=(",", ":")) if new_schema else None,
                      **_identity_columns(kafka)}, only_if_missing=only_if_missing)
        if written and new_schema:
            _recorded_schemas.add(key)
        return True
    except Exception:  # noqa: BLE001 — the ledger is an index, not the truth
        log.warning("batch %s: could not record the ledger row (the data commit stands)", batch_id, exc_info=True)
        return False


def record_marker(cfg: AppConfig, ranges: dict[str, dict[str, list[int]]], kind: str, reason: str,
                  kafka: dict[str, Any] | None = None) -> None:
    """Record a marker of `cfg`'s query: a ledger row with batch id -1 and no rows that moves the ledger end on
    purpose, a `gap` or an `epoch` (Iceberg's `record_marker`). Unlike batch rows it carries a decision nothing
    else records, so a failure raises. The caller stops the handoff's driver first."""
    if kind not in (GAP, EPOCH):
        raise ValueError(f"marker kind must be {GAP} or {EPOCH}, not {kind!r}")
    _append(cfg, {"batch_id": -1, "offsets": json.dumps(ranges, separators=(",", ":"), sort_keys=True),
                  "rows": 0, "dlq_rows": 0, "kind": kind, "reason": reason[:2000] or None,
                  **_identity_columns(kafka)})


def record_gap(cfg: AppConfig, ranges: dict[str, dict[str, list[int]]], reason: str = "") -> bool:
    """Record offsets deliberately left out of the table (a Rollback that must not bring discarded data back):
    a `gap` marker, so `resume_offsets` moves past the range. It records the Kafka identity the ledger follows
    now, so after an `epoch` the gap counts for the topic's new incarnation. False: not recorded, which must stop
    the caller (nothing else records it)."""
    sink = cfg.sink
    assert isinstance(sink, BigQuerySink)
    try:
        cluster, topics = latest_identity(sink, cfg.handoff_id, cfg.query_name)
        record_marker(cfg, ranges, GAP, reason, {"cluster": cluster, "topics": topics})
        return True
    except Exception:  # noqa: BLE001 — reported to the caller, which must not go on
        log.warning("could not record the gap %s", ranges, exc_info=True)
        return False


# ------------------------------------------------------------------------------------------ reading

def incarnation_filter(current: dict[str, str], stamped: bool = True) -> tuple[str, list[Any]]:
    """A WHERE condition (and its query parameters) keeping the data rows of each topic's incarnation: for a topic
    an epoch names (`current`, `ledger.record.incarnations`), rows whose `_kafka_topic_id` is its id; every row of
    other topics. ("", []) without epochs: the column need not exist then. `stamped` False: the table has no
    `_kafka_topic_id` yet (the sink adds it at the first start after the epoch), so no row of those topics is
    of their new incarnation."""
    from google.cloud import bigquery

    if not current:
        return "", []
    params: list[Any] = []
    names, kept = [], []
    for i, (topic, tid) in enumerate(sorted(current.items())):
        params += [bigquery.ScalarQueryParameter(f"et{i}", "STRING", topic)]
        names.append(f"@et{i}")
        if stamped:
            params.append(bigquery.ScalarQueryParameter(f"ei{i}", "STRING", tid))
            kept.append(f"({KAFKA_TOPIC} = @et{i} AND {KAFKA_TOPIC_ID} = @ei{i})")
    return f"({KAFKA_TOPIC} NOT IN ({', '.join(names)})" + "".join(f" OR {k}" for k in kept) + ")", params


def table_offsets(sink: BigQuerySink, client: Any | None = None, current: dict[str, str] | None = None) -> Offsets:
    """`{topic: {partition: max offset + 1}}` of the rows in the data table — the ground truth; of a topic an
    epoch names (`current`), its new incarnation's rows only."""
    from google.cloud import bigquery

    client = client or bigquery_client.rest_client(sink)
    ref = bigquery_client.table_ref(sink)
    stamped = bool(current) and KAFKA_TOPIC_ID in {f.name for f in client.get_table(ref, retry=None).schema}
    where, params = incarnation_filter(current or {}, stamped)
    sql = (f"SELECT {KAFKA_TOPIC} AS t, {KAFKA_PARTITION} AS p, MAX({KAFKA_OFFSET}) AS m, COUNT(*) AS n "
           f"FROM `{ref}` {'WHERE ' + where if where else ''} GROUP BY 1, 2")
    out: Offsets = {}
    rows = client.query(sql, job_config=bigquery.QueryJobConfig(query_parameters=params), retry=None).result()
    for row in rows:
        out.setdefault(row["t"], {})[int(row["p"])] = int(row["m"]) + 1
    return out


def list_commits(sink: BigQuerySink, handoff_id: str | None = None, client: Any | None = None) -> list[Commit]:
    """Ledger rows, newest batch first (empty if the ledger table does not exist yet)."""
    return _select(sink, handoff_id, client)


def _select(sink: BigQuerySink, handoff_id: str | None, client: Any | None, where: tuple[str, ...] = (),
            params: tuple[Any, ...] = (), tail: str = "") -> list[Commit]:
    """The ledger rows of `handoff_id` (all: None) that match `where`, as entries newest first."""
    from google.api_core.exceptions import NotFound
    from google.cloud import bigquery

    client = client or bigquery_client.rest_client(sink)
    ref = bigquery_client.table_ref(sink, ledger_table(sink))
    conds, args = list(where), list(params)
    if handoff_id is not None:
        conds.append("handoff_id = @h")
        args.append(bigquery.ScalarQueryParameter("h", "STRING", handoff_id))
    sql = f"SELECT * FROM `{ref}`" + (" WHERE " + " AND ".join(conds) if conds else "") + (" " + tail if tail else "")
    try:
        rows = list(client.query(sql, job_config=bigquery.QueryJobConfig(query_parameters=args), retry=None).result())
    except NotFound:
        return []
    commits: dict[tuple[Any, ...], Commit] = {}
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
                   kind=r.get("kind") or (GAP if batch_id < 0 else BATCH), reason=r.get("reason") or None,
                   kafka_cluster_id=r.get("kafka_cluster_id") or None,
                   topic_ids=json.loads(r["topic_ids"]) if r.get("topic_ids") else None,
                   schemas=json.loads(r["schemas"]) if r.get("schemas") else None,
                   late_rows=None if r.get("late_rows") is None else int(r["late_rows"]),
                   dropped_rows=None if r.get("dropped_rows") is None else int(r["dropped_rows"]),
                   schema_id=r.get("schema_id") or None,
                   columns=dict(json.loads(r["table_columns"])) if r.get("table_columns") else None)
        # At-least-once index: a row written twice is one entry (first row wins). Markers all have batch id -1,
        # and a fresh checkpoint (or a recreated topic's) counts batches from 0 again: the key says which.
        key = (c.handoff_id, c.query, c.batch_id, c.kind, r["offsets"], r.get("topic_ids"))
        commits.setdefault(key, c)
    return sorted(commits.values(), key=lambda c: (c.timestamp_ms, c.batch_id), reverse=True)


def schema_changes(commits: list[Commit]) -> list[dict[str, Any] | None]:
    """For each entry of `commits` (newest first), what its commit changed in the table's columns since the
    entry before it that recorded a schema (`ledger.record.column_change`, the shape of Iceberg's
    `schema_change`), None when nothing changed or it cannot be told: a marker, a row without a schema (an older
    Handoff), or a schema whose columns no remaining row carries. The columns of a fingerprint are on some row
    (`record_batch`), not on each; any row carrying them will do, since the fingerprint is of the columns. Pure."""
    known = {c.schema_id: c.columns for c in commits if c.schema_id is not None and c.columns}
    out: list[dict[str, Any] | None] = []
    for i, c in enumerate(commits):
        older = next((o.schema_id for o in commits[i + 1:] if o.schema_id is not None), None)
        if c.schema_id is None or older is None or older == c.schema_id \
                or c.schema_id not in known or older not in known:
            out.append(None)
            continue
        out.append(column_change(known[older], known[c.schema_id], older, c.schema_id))
    return out


def latest_commit(sink: BigQuerySink, handoff_id: str | None = None, client: Any | None = None) -> Commit | None:
    """The newest micro-batch (gap rows, batch id -1, are not commits of data)."""
    return next((c for c in list_commits(sink, handoff_id, client) if c.batch_id >= 0), None)


def commit_for_offset(sink: BigQuerySink, topic: str, partition: int, offset: int,
                      handoff_id: str | None = None, client: Any | None = None) -> Commit | None:
    for c in list_commits(sink, handoff_id, client):
        if c.covers(topic, partition, offset):
            return c
    return None


def _columns(sink: BigQuerySink, client: Any) -> set[str]:
    """The ledger table's column names (tables.get, no query; empty if it does not exist yet)."""
    from google.api_core.exceptions import NotFound

    try:
        table = client.get_table(bigquery_client.table_ref(sink, ledger_table(sink)), retry=None)
    except NotFound:
        return set()
    return {f.name.lower() for f in table.schema}


#: Rows read for `latest_identity`: the newest one usually names the cluster and every topic; older ones are read
#: only for a topic the newer ones did not name.
_IDENTITY_ROWS = 200


def latest_identity(sink: BigQuerySink, handoff_id: str, query: str, client: Any | None = None
                    ) -> tuple[str | None, dict[str, str]]:
    """(Kafka cluster id, {topic: topic id}) as the newest entries of `query` that recorded them say (Iceberg's
    rule, `ledger.record.newest_identity`); (None, {}) for a ledger written before it recorded identities. Reads
    only the newest rows that recorded one."""
    from google.cloud import bigquery

    client = client or bigquery_client.rest_client(sink)
    if "topic_ids" not in _columns(sink, client):
        return None, {}
    rows = _select(sink, handoff_id, client,
                   ("query = @q", "(kafka_cluster_id IS NOT NULL OR topic_ids IS NOT NULL)"),
                   (bigquery.ScalarQueryParameter("q", "STRING", query),),
                   f"ORDER BY COALESCE(commit_time_us, UNIX_MICROS(recorded_at)) DESC LIMIT {_IDENTITY_ROWS}")
    return newest_identity(rows)


def epochs(sink: BigQuerySink, handoff_id: str | None = None, client: Any | None = None) -> list[Commit]:
    """The `epoch` markers, newest first (a few rows at most: one per accepted recreation)."""
    client = client or bigquery_client.rest_client(sink)
    if "kind" not in _columns(sink, client):
        return []
    return _select(sink, handoff_id, client, (f"kind = '{EPOCH}'",))


def ends(commits: list[Commit], current: dict[str, str], query: str | None = None) -> Offsets:
    """The highest end per partition of `commits` (of `query`, if given), each topic's current incarnation only
    (`current`, `ledger.record.incarnations`). Pure."""
    out: Offsets = {}
    for c in commits:
        if query is not None and c.query != query:
            continue
        for topic, parts in c.end_offsets.items():
            if not of_incarnation(c, topic, current):
                continue
            for p, end in parts.items():
                out.setdefault(topic, {})[p] = max(out.get(topic, {}).get(p, 0), end)
    return out


def resume_offsets(sink: BigQuerySink, handoff_id: str | None = None, client: Any | None = None) -> Offsets:
    """Where a query writing this table must resume: past every offset in the data table, and past the
    ranges the ledger records (which include batches whose records all went to the DLQ, and markers); of a
    topic an epoch names, its new incarnation's rows and entries only."""
    client = client or bigquery_client.rest_client(sink)
    commits = list_commits(sink, handoff_id, client)
    current = incarnations(commits)
    out = table_offsets(sink, client, current)
    for topic, parts in ends(commits, current).items():
        for p, end in parts.items():
            out.setdefault(topic, {})[p] = max(out.get(topic, {}).get(p, 0), end)
    return out


__all__ = ["Commit", "LEDGER_SUFFIX", "ledger_table", "record_batch", "record_marker", "record_gap", "table_offsets",
           "incarnation_filter", "list_commits", "schema_changes", "latest_commit", "latest_identity", "epochs", "commit_for_offset", "ends",
           "resume_offsets"]
