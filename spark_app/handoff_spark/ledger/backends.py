"""A handoff's ledger where each backend keeps it, for readers outside the driver: the operator's status and
replay steps, `handoff ledger` and `kubectl handoff ledger` (all through `handoff_spark.ledger`).

Why one module in front of the backends: the operator must not depend on how the sinks lay out their modules,
and must not import pyspark, nor the client library of a backend it does not use. So every function here imports
its backend when called: pyiceberg for Iceberg (`iceberg.ledger`, `iceberg.table`), google-cloud for BigQuery
(`bigquery.client`, `bigquery.ledger`), confluent-kafka for a consumer group (`kafka.offsets`). None of them
imports pyspark. Importing this module imports nothing but the ledger's record.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from handoff_spark.ledger.record import BATCH, Commit, Offsets, incarnations

if TYPE_CHECKING:
    from handoff_spark.bigquery.client import CredentialChoice
    from handoff_spark.config import AppConfig, BigQuerySink


# ------------------------------------------------------------------------------------------------ Iceberg

def iceberg_catalog(catalog_name: str, catalog_properties: dict[str, str]) -> Any:
    """The process's cached PyIceberg catalog for (name, properties) (`iceberg.table.load_catalog_cached`)."""
    from handoff_spark.iceberg.table import load_catalog_cached

    return load_catalog_cached(catalog_name, catalog_properties)


def forget_iceberg_catalog(catalog_name: str, catalog_properties: dict[str, str]) -> None:
    """Drop the cached catalog after a connection error, so the next call reconnects."""
    from handoff_spark.iceberg.table import forget_catalog

    forget_catalog(catalog_name, catalog_properties)


def iceberg_table(catalog_name: str, catalog_properties: dict[str, str], identifier: str) -> Any:
    """The table, freshly loaded through the cached catalog (raises pyiceberg's NoSuchTableError if absent)."""
    from handoff_spark.iceberg.table import load_table

    return load_table(catalog_name, catalog_properties, identifier)


def iceberg_latest_commit(table: Any, handoff_id: str | None = None) -> Commit | None:
    """The newest micro-batch of `handoff_id` in the table's current ancestry (None: none yet)."""
    from handoff_spark.iceberg import ledger

    return ledger.latest_commit(table, handoff_id)


def iceberg_ancestry(metadata: Any) -> Iterator[tuple[Any, Commit | None]]:
    """The current ancestry, newest first: each snapshot with its ledger entry (None: not written by Handoff)."""
    from handoff_spark.iceberg import ledger

    for snapshot in ledger.ancestry(metadata):
        yield snapshot, ledger.commit_of(snapshot)


def iceberg_resume_offsets(table: Any, handoff_id: str, query: str) -> Offsets:
    """Where `query` of `handoff_id` stands now: the next offset per partition (markers included)."""
    from handoff_spark.iceberg import ledger

    return ledger.resume_offsets(table, handoff_id=handoff_id, query=query)


def iceberg_record_gap(table: Any, handoff_id: str, query: str, ranges: dict[str, dict[str, list[int]]],
                       reason: str) -> int:
    """Record offsets deliberately left out of the table (a marker snapshot without data); its snapshot id."""
    from handoff_spark.iceberg import ledger

    return ledger.record_gap(table, handoff_id, query, ranges, reason)


# ------------------------------------------------------------------------------------------------ BigQuery

def bigquery_credential_choice(sink: BigQuerySink, key_json: str | None, file_exists: bool) -> CredentialChoice:
    """How to authenticate to the sink's BigQuery, in the driver's order (`bigquery.client.credential_choice`).
    Pure."""
    from handoff_spark.bigquery.client import credential_choice

    return credential_choice(sink, key_json, file_exists)


def bigquery_credentials(sink: BigQuerySink, key_json: str | None = None,
                         choice: CredentialChoice | None = None) -> Any:
    """The sink's credentials, by the same path the driver takes (`bigquery.client.credentials`)."""
    from handoff_spark.bigquery.client import credentials

    return credentials(sink, key_json, choice)


def bigquery_ledger_ref(sink: BigQuerySink) -> str:
    """`project.dataset.table` of the sink's ledger index table (`<table>__handoff_ledger`)."""
    from handoff_spark.bigquery.client import table_ref
    from handoff_spark.bigquery.ledger import ledger_table

    return table_ref(sink, ledger_table(sink))


def bigquery_latest_commit(sink: BigQuerySink, handoff_id: str | None = None, client: Any | None = None
                           ) -> Commit | None:
    """The newest micro-batch of `handoff_id` in the ledger index (one SELECT; None: no table or row yet)."""
    from handoff_spark.bigquery import ledger

    return ledger.latest_commit(sink, handoff_id, client=client)


def bigquery_list_commits(sink: BigQuerySink, handoff_id: str | None = None, client: Any | None = None
                          ) -> list[Commit]:
    """The ledger index's entries (of `handoff_id`; all: None), newest first."""
    from handoff_spark.bigquery import ledger

    return ledger.list_commits(sink, handoff_id, client)


def bigquery_resume_offsets(sink: BigQuerySink, handoff_id: str, client: Any | None = None) -> Offsets:
    """Where the handoff's stream resumes on this table: past every row and every ledger entry (what the driver
    reads at start)."""
    from handoff_spark.bigquery import ledger

    return ledger.resume_offsets(sink, handoff_id, client)


def bigquery_query_ends(sink: BigQuerySink, handoff_id: str, query: str, client: Any | None = None) -> Offsets:
    """The ledger end of one query (a Backfill's own) per partition, each topic's current incarnation only."""
    from handoff_spark.bigquery import ledger

    commits = ledger.list_commits(sink, handoff_id, client)
    return ledger.ends(commits, incarnations(commits), query)


def bigquery_record_gap(cfg: AppConfig, ranges: dict[str, dict[str, list[int]]], reason: str) -> bool:
    """Record offsets deliberately left out of the table as a `gap` marker of `cfg`'s query (False: not recorded)."""
    from handoff_spark.bigquery import ledger

    return ledger.record_gap(cfg, ranges, reason)


def bigquery_rollback_steps() -> Any:
    """`handoff_spark.bigquery.rollback`: a table's undo point (snapshot tables), the one-transaction delete past a
    ledger entry, and what it weighs (imported when a BigQuery replay runs)."""
    from handoff_spark.bigquery import rollback

    return rollback


# ------------------------------------------------------------------------------------------------ Kafka

def committed_group_offsets(bootstrap_servers: str, group: str, partitions: list[tuple[str, int]],
                            properties: dict[str, str] | None = None) -> Offsets:
    """The consumer group's committed offsets, which the driver commits only after the table commit is durable
    (partitions without a commit are left out)."""
    from handoff_spark.kafka.offsets import committed_group_offsets as committed

    return committed(bootstrap_servers, group, partitions, properties)


# ------------------------------------------------------------------------------------------------ either

def list_commits(cfg: AppConfig) -> list[Commit]:
    """The handoff's ledger entries (all queries), newest first: Iceberg snapshots or BigQuery's ledger index."""
    return _commits_and_table(cfg)[0]


def _commits_and_table(cfg: AppConfig) -> tuple[list[Commit], Any]:
    """The ledger entries and, for Iceberg, the table they were read from (None for BigQuery)."""
    from handoff_spark.config import IcebergSink

    sink = cfg.sink
    if isinstance(sink, IcebergSink):
        from handoff_spark.iceberg import ledger

        table = iceberg_table(sink.catalog_name, dict(sink.catalog_properties), sink.table)
        return ledger.list_commits(table, handoff_id=cfg.handoff_id), table
    from handoff_spark.bigquery import ledger as bigquery_ledger

    return bigquery_ledger.list_commits(sink, handoff_id=cfg.handoff_id), None


def entries(cfg: AppConfig, limit: int | None = None) -> list[dict[str, Any]]:
    """The handoff's ledger entries (all queries), newest first, as plain dicts. An entry written with a different
    table schema than the entry before it says what changed (`schemaChange`: the timeline's schema rows): on
    Iceberg from the snapshots' schema ids and the table metadata's schemas; on BigQuery, which has no schema
    history, from the schema each ledger-index row recorded (`schemaId` is its fingerprint there,
    `bigquery.ledger.schema_changes`)."""
    commits, table = _commits_and_table(cfg)
    bigquery_changes: list[dict[str, Any] | None] = []
    if table is None:
        from handoff_spark.bigquery import ledger as bigquery_ledger

        bigquery_changes = bigquery_ledger.schema_changes(commits)
    out = []
    for i, c in enumerate(commits[:limit]):
        older = commits[i + 1] if i + 1 < len(commits) else None
        change = bigquery_changes[i] if table is None else None
        if table is not None and older is not None and isinstance(c.schema_id, int) \
                and isinstance(older.schema_id, int) and c.schema_id != older.schema_id:
            from handoff_spark.iceberg import ledger

            change = ledger.schema_change(table, older.schema_id, c.schema_id)
        out.append({"kind": c.kind, "snapshot": c.snapshot_id, "query": c.query, "batch": c.batch_id,
                    "timestampMs": c.timestamp_ms, "rows": c.rows, "deadLetters": c.dlq_rows,
                    "offsets": {t: {str(p): list(se) for p, se in parts.items()} for t, parts in c.offsets.items()},
                    "kafkaCluster": c.kafka_cluster_id, "topicIds": c.topic_ids, "reason": c.reason,
                    # the DataFrame path's counts (None elsewhere)
                    "lateRows": c.late_rows, "droppedRows": c.dropped_rows,
                    "schemaId": c.schema_id, "schemaChange": change})
    return out


def format_entries(rows: list[dict[str, Any]]) -> str:
    """`entries` as text, one line per entry. Pure."""
    lines = []
    for r in rows:
        ranges = " ".join(f"{t}[{p}] {se[0]}→{se[1]}" for t, parts in sorted(r["offsets"].items())
                          for p, se in sorted(parts.items(), key=lambda kv: int(kv[0])))
        what = f"batch {r['batch']}" if r["kind"] == BATCH else r["kind"].upper()
        line = f"{r['snapshot']}  {r['query']:<10} {what:<10} rows {r['rows']:<8} {ranges}"
        if r.get("reason"):
            line += f"  ({r['reason']})"
        lines.append(line)
    return "\n".join(lines) if lines else "(no ledger entries yet)"

