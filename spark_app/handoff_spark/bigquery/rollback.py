"""Rolling a BigQuery table back to a ledger entry (a ReplayRequest's table steps; docs/bigquery-exactly-once.md,
"Rollback").

BigQuery keeps no snapshot history Handoff could point a table back at, but every row carries its Kafka coordinates
and the ledger index has a row per batch: rolling back to an entry is deleting the data rows at or past the entry's
offsets (the "cut", per partition) and the ledger rows of the query recorded after it. Both deletes run in ONE
multi-statement transaction (`BEGIN TRANSACTION; DELETE …; DELETE …; COMMIT TRANSACTION`): BigQuery commits DML on
several tables of one project atomically, so a crash leaves the table either as it was or rolled back, never half.
Each DELETE is a predicate over offsets and ledger keys, so running the transaction again after it committed
deletes nothing (idempotent: an operator restarted between the commit and its status write repeats it harmlessly).

Before it, the undo point: `CREATE SNAPSHOT TABLE <undo> CLONE <table>` of the data table and of its ledger
(`<undo>__handoff_ledger`, the ledger's naming), a read-only, zero-copy copy that BigQuery keeps until it is
dropped (no expiration is set), unlike time travel's 2-7 day window.

What BigQuery refuses, and what this module reports so the caller can wait or refuse with the fix
(`dml_refusal`): DML over rows still in the streaming (write-optimised) buffer, concurrent-mutation
serialization errors and DML rate quotas (all transient: try again later), and a table with
`require_partition_filter` (permanent: the DELETE has no partition filter, `partition_filter_refusal`).

The ledger key of an entry is `COALESCE(commit_time_us, UNIX_MILLIS(recorded_at) * 1000)`: a batch's commit time
in µs (`Commit.snapshot_id`), or for a marker (no commit time) its recording time in ms × 1000, as `entry_key`
computes it from a `Commit`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from handoff_spark.bigquery import client as bigquery_client
from handoff_spark.bigquery.ledger import LEDGER_SUFFIX, ledger_table
from handoff_spark.bigquery.schema import KAFKA_OFFSET, KAFKA_PARTITION, KAFKA_TOPIC
from handoff_spark.config import BigQuerySink
from handoff_spark.ledger.record import Commit, Offsets

KEY_SQL = "COALESCE(commit_time_us, UNIX_MILLIS(recorded_at) * 1000)"
UNDO_PREFIX = "handoff_undo_"


def entry_key(commit: Commit) -> int:
    """The ledger key of `commit` (module docstring): what `KEY_SQL` computes for its row."""
    return commit.snapshot_id if commit.snapshot_id is not None else commit.timestamp_ms * 1000


def undo_name(sink: BigQuerySink, namespace: str, request: str) -> str:
    """The undo point's table name, beside the data table: `<table>__handoff_undo_<namespace>_<request>` (BigQuery
    table names take letters, digits and underscores; a ReplayRequest's name may have '-' and '.')."""
    clean = f"{namespace}_{request}".replace("-", "_").replace(".", "_")
    return f"{sink.table}__{UNDO_PREFIX}{clean}"[:1024]


@dataclass(frozen=True)
class TableInfo:
    """What `tables.get` says about the data table that matters to a rollback (free: no query)."""

    exists: bool
    require_partition_filter: bool = False
    partition_field: str | None = None
    num_rows: int = 0
    num_bytes: int = 0


def table_info(sink: BigQuerySink, client: Any | None = None) -> TableInfo:
    from google.api_core.exceptions import NotFound

    client = client or bigquery_client.rest_client(sink)
    try:
        table = client.get_table(bigquery_client.table_ref(sink), retry=None)
    except NotFound:
        return TableInfo(False)
    tp = table.time_partitioning
    # The table-level option, or its older place inside timePartitioning (still read by BigQuery; the emulator
    # keeps it only there), read from the resource: the client's property for it warns that it is deprecated.
    old_place = (table.to_api_repr().get("timePartitioning") or {}).get("requirePartitionFilter")
    required = bool(table.require_partition_filter) or str(old_place).lower() == "true"
    return TableInfo(True, required, tp.field if tp is not None else None,
                     int(table.num_rows or 0), int(table.num_bytes or 0))


def _literal(value: str) -> str:
    """A string literal for the rollback's script. The script inlines its values: BigQuery takes query parameters in
    a multi-statement script, the emulator does not pass them into one. Every value is a Kafka topic name, a
    handoff id (namespace/name) or a ledger query name, none of which may hold a quote or a backslash; anything
    else is refused rather than escaped."""
    if any(c in value for c in "'\\\n`"):
        raise ValueError(f"{value!r}: a quote, backslash or newline cannot be in a topic, handoff or query name")
    return f"'{value}'"


def _cut_condition(cut: Offsets) -> str:
    """`(topic, partition, offset >= cut)` for every partition of `cut`, as one OR'ed condition."""
    conds = [f"({KAFKA_TOPIC} = {_literal(topic)} AND {KAFKA_PARTITION} = {int(partition)} "
             f"AND {KAFKA_OFFSET} >= {int(offset)})"
             for topic, parts in sorted(cut.items()) for partition, offset in sorted(parts.items())]
    return ("(" + " OR ".join(conds) + ")") if conds else "FALSE"


#: BigQuery's logical size of a value by column type (its "data size calculation"): what storage and the
#: Storage Write API count. STRING/BYTES are 2 + their bytes; nested and JSON values are sized by their JSON text.
_FIXED_SIZE = {"INT64": 8, "INTEGER": 8, "FLOAT64": 8, "FLOAT": 8, "NUMERIC": 16, "BIGNUMERIC": 32, "BOOL": 1,
               "BOOLEAN": 1, "DATE": 8, "DATETIME": 8, "TIME": 8, "TIMESTAMP": 8, "GEOGRAPHY": 16}


def _size_sql(field: Any) -> str:
    name = f"`{field.name}`"
    if field.mode == "REPEATED" or field.field_type in ("RECORD", "STRUCT", "JSON"):
        size = f"BYTE_LENGTH(TO_JSON_STRING({name}))"
    elif field.field_type in ("STRING", "BYTES"):
        size = f"2 + BYTE_LENGTH({name})"
    else:
        size = str(_FIXED_SIZE.get(field.field_type, 8))
    return f"IF({name} IS NULL, 0, {size})"


def rows_past(sink: BigQuerySink, cut: Offsets, client: Any | None = None) -> tuple[int, int]:
    """(rows, logical bytes) of the data rows a rollback to `cut` deletes: one query over the rows past the cut
    (clustered on the Kafka coordinates, so it reads those rows, not the table), each value sized as BigQuery
    sizes it (`_FIXED_SIZE`). `tables.get`'s numBytes would be free, but leaves out the streaming buffer, where the
    newest rows (the ones a rollback usually deletes) are."""
    client = client or bigquery_client.rest_client(sink)
    from google.api_core.exceptions import NotFound

    try:
        table = client.get_table(bigquery_client.table_ref(sink), retry=None)
    except NotFound:
        return 0, 0
    if not cut:
        return 0, 0
    size = " + ".join(_size_sql(f) for f in table.schema) or "0"
    sql = (f"SELECT COUNT(*) AS n, SUM({size}) AS b FROM `{bigquery_client.table_ref(sink)}` "
           f"WHERE {_cut_condition(cut)}")
    row = list(client.query(sql, retry=None).result())[0]
    return int(row["n"]), int(row["b"] or 0)


def create_undo_point(sink: BigQuerySink, name: str, client: Any | None = None) -> bool:
    """`CREATE SNAPSHOT TABLE` of the data table and of its ledger as `name` and `name__handoff_ledger`, unless they
    exist (True: created now). A snapshot of that name that exists is taken as ours (the name carries the request's
    namespace and name, and the step runs before anything is deleted)."""
    from google.api_core.exceptions import Conflict, NotFound

    client = client or bigquery_client.rest_client(sink)
    created = False
    for source, target in ((sink.table, name), (ledger_table(sink), f"{name}{LEDGER_SUFFIX}")):
        try:
            client.get_table(bigquery_client.table_ref(sink, target), retry=None)
            continue
        except NotFound:
            pass
        try:
            client.get_table(bigquery_client.table_ref(sink, source), retry=None)
        except NotFound:
            continue  # no ledger table yet: nothing to keep
        try:
            client.query(f"CREATE SNAPSHOT TABLE {_quoted(sink, target)} CLONE {_quoted(sink, source)}",
                         retry=None).result()
        except Conflict:
            continue  # made meanwhile by an earlier attempt of the same step
        created = True
    return created


def _quoted(sink: BigQuerySink, table: str) -> str:
    """`project`.`dataset`.`table`, each part quoted on its own: valid BigQuery, and the form the emulator's
    snapshot DDL parser reads (it does not take one quoted `project.dataset.table`, nor IF NOT EXISTS)."""
    return f"`{sink.project}`.`{sink.dataset}`.`{table}`"


def undo_point_exists(sink: BigQuerySink, name: str, client: Any | None = None) -> bool:
    from google.api_core.exceptions import NotFound

    client = client or bigquery_client.rest_client(sink)
    try:
        client.get_table(bigquery_client.table_ref(sink, name), retry=None)
        return True
    except NotFound:
        return False


def rollback(sink: BigQuerySink, handoff_id: str, query: str, cut: Offsets, target_key: int,
             client: Any | None = None) -> None:
    """Delete, in one transaction, the data rows at or past `cut` and the ledger rows of `handoff_id`/`query` whose
    key is past `target_key`. Idempotent (module docstring). Raises BigQuery's error as is (`dml_refusal` says
    whether it is worth waiting for)."""
    client = client or bigquery_client.rest_client(sink)
    sql = (f"BEGIN TRANSACTION;\n"
           f"DELETE FROM `{bigquery_client.table_ref(sink)}` WHERE {_cut_condition(cut)};\n"
           f"DELETE FROM `{bigquery_client.table_ref(sink, ledger_table(sink))}` "
           f"WHERE handoff_id = {_literal(handoff_id)} AND query = {_literal(query)} "
           f"AND {KEY_SQL} > {int(target_key)};\n"
           f"COMMIT TRANSACTION;")
    client.query(sql, retry=None).result()


#: Substrings of BigQuery's error messages for DML it refuses for now (wait, then run it again).
_TRANSIENT = ("streaming buffer", "write-optimized", "write optimized", "could not serialize access",
              "concurrent update", "too many dml", "rate limit", "quota exceeded", "exceeded rate limits")


def dml_refusal(exc: BaseException) -> str | None:
    """Why BigQuery refused the rollback's DML for now (rows in the streaming buffer, a concurrent mutation, a DML
    quota), or None for any other error. Pure."""
    text = str(exc).lower()
    return str(exc)[:500] if any(t in text for t in _TRANSIENT) else None


__all__ = ["KEY_SQL", "TableInfo", "entry_key", "undo_name", "table_info", "rows_past", "create_undo_point",
           "undo_point_exists", "rollback", "dml_refusal"]
