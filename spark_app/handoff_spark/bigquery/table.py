"""A BigQuery table's columns through the REST client: read them as `schema.Field`s, write `Field`s as the
client's `SchemaField`s, and add NULLABLE columns to an existing table.

Its own module because both the sink (declared and discovered columns) and the ledger index (a ledger table
made by an older Handoff) grow tables, and the sink imports the ledger; with `add_columns` in the sink the two
imported each other. `schema` stays pure (no client calls); this is where the client calls on a table's schema
live.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

from handoff_spark.bigquery.schema import Field


def fields_of(table: Any) -> list[Field]:
    """The columns of a `google.cloud.bigquery.Table`."""
    return [_field_of(f) for f in table.schema]


def _field_of(f: Any) -> Field:
    return Field(f.name, f.field_type, f.mode or "NULLABLE", tuple(_field_of(s) for s in f.fields or ()))


def schema_fields(fields: Sequence[Field]) -> list[Any]:
    """`Field`s as the client's `SchemaField`s (sub-fields of a RECORD included)."""
    from google.cloud import bigquery

    return [bigquery.SchemaField(f.name, f.type, mode=f.mode, fields=schema_fields(f.fields)) for f in fields]


def add_columns(client: Any, ref: str, fields: list[Field]) -> Any:
    """Add NULLABLE columns (the only kind BigQuery adds to an existing table): tables.patch with the extended
    schema, retried on a concurrent patch; then `ALTER TABLE … ADD COLUMN IF NOT EXISTS` for each.

    On BigQuery the DDL step is a no-op (the patch already added the columns). The emulator keeps table
    metadata and storage apart — a patch changes only the metadata, DDL only the storage — so the pair is
    what makes both agree there; both steps are idempotent."""
    from google.api_core.exceptions import PreconditionFailed

    table = None
    for attempt in range(5):
        table = client.get_table(ref, retry=None)
        have = {f.name.lower() for f in table.schema}
        new = [f for f in fields if f.name.lower() not in have]
        if not new:
            break
        table.schema = list(table.schema) + schema_fields([Field(f.name, f.type, "REPEATED" if f.mode == "REPEATED" else "NULLABLE", f.fields)
                                                                for f in new])
        try:
            table = client.update_table(table, ["schema"], retry=None)
            break
        except PreconditionFailed:
            time.sleep(0.2 * (attempt + 1))
    else:
        raise RuntimeError(f"could not add columns to {ref}: concurrent schema changes")
    for f in fields:
        client.query(f"ALTER TABLE `{ref}` ADD COLUMN IF NOT EXISTS `{f.name}` {f.type}", retry=None).result()
    return client.get_table(ref, retry=None)
