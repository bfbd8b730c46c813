"""BigQuery table schema for a handoff: declared columns → BigQuery fields → Arrow, and the checks BigQuery
itself would make on a row before accepting it.

Why our own checks: BigQuery rejects a row whose REQUIRED field is null and an append that names a field the
table does not have; the emulator the tests run against does neither. The sink must behave the same on both,
so the rules live here, applied to every batch before it is appended, and the rejected rows go to the DLQ
with the same kind of message BigQuery would give.

Pure functions over plain data (field tuples, Arrow tables); no client calls.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ..config import Column

# Metadata columns every handoff table carries: the Kafka coordinates make the table its own offset ledger
# (see docs/bigquery-exactly-once.md); `_handoff_batch_id` says which micro-batch committed the row.
KAFKA_TOPIC = "_kafka_topic"
KAFKA_PARTITION = "_kafka_partition"
KAFKA_OFFSET = "_kafka_offset"
KAFKA_TIMESTAMP = "_kafka_timestamp"
BATCH_ID = "_handoff_batch_id"


@dataclass(frozen=True)
class Field:
    """One top-level BigQuery column (nested RECORDs are not produced by Handoff)."""

    name: str
    type: str  # BigQuery standard type name: STRING, INT64, FLOAT64, BOOL, TIMESTAMP, DATE, BYTES, NUMERIC, …
    mode: str = "NULLABLE"  # NULLABLE | REQUIRED | REPEATED


METADATA_FIELDS: tuple[Field, ...] = (
    Field(KAFKA_TOPIC, "STRING", "REQUIRED"),
    Field(KAFKA_PARTITION, "INT64", "REQUIRED"),
    Field(KAFKA_OFFSET, "INT64", "REQUIRED"),
    Field(KAFKA_TIMESTAMP, "TIMESTAMP", "NULLABLE"),
    Field(BATCH_ID, "INT64", "NULLABLE"),
)

_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")

# Legacy names the REST API may return for the same types.
_CANONICAL = {"INTEGER": "INT64", "FLOAT": "FLOAT64", "BOOLEAN": "BOOL"}


def canonical_type(bq_type: str) -> str:
    upper = bq_type.upper()
    return _CANONICAL.get(upper, upper)


def bq_type(column_type: str) -> str:
    """Declared column type (the CR's vocabulary) → BigQuery type."""
    simple = {"string": "STRING", "int": "INT64", "long": "INT64", "float": "FLOAT64", "double": "FLOAT64",
              "boolean": "BOOL", "timestamp": "TIMESTAMP", "date": "DATE", "binary": "BYTES"}
    if column_type in simple:
        return simple[column_type]
    match = _DECIMAL.match(column_type)
    if match:
        precision, scale = int(match.group(1)), int(match.group(2))
        # NUMERIC holds 29 integer digits and 9 fractional ones; anything wider needs BIGNUMERIC.
        return "NUMERIC" if scale <= 9 and precision - scale <= 29 else "BIGNUMERIC"
    raise ValueError(f"column type {column_type!r} has no BigQuery mapping")


def declared_fields(columns: Sequence[Column]) -> list[Field]:
    """The table a handoff creates: declared columns (all NULLABLE — `required` is enforced by decode, and
    BigQuery cannot add a REQUIRED column to an existing table, so declaring it REQUIRED would make the
    first and a later schema differ) followed by the metadata columns."""
    fields = [Field(c.name, bq_type(c.type), "NULLABLE") for c in columns]
    names = {f.name for f in fields}
    return fields + [f for f in METADATA_FIELDS if f.name not in names]


def arrow_type(field: Field) -> pa.DataType:
    """The Arrow type BigQuery's Arrow ingestion expects for a field."""
    t = canonical_type(field.type)
    mapping: dict[str, pa.DataType] = {
        "STRING": pa.string(), "INT64": pa.int64(), "FLOAT64": pa.float64(), "BOOL": pa.bool_(),
        "TIMESTAMP": pa.timestamp("us", tz="UTC"), "DATE": pa.date32(), "BYTES": pa.binary(),
        "NUMERIC": pa.decimal128(38, 9), "BIGNUMERIC": pa.decimal256(76, 38), "JSON": pa.string(),
        "DATETIME": pa.timestamp("us"), "TIME": pa.time64("us"),
    }
    try:
        base = mapping[t]
    except KeyError:
        raise ValueError(f"BigQuery type {field.type} of {field.name!r} is not supported by the sink") from None
    return pa.list_(base) if field.mode == "REPEATED" else base


def arrow_schema(fields: Iterable[Field]) -> pa.Schema:
    return pa.schema([pa.field(f.name, arrow_type(f), nullable=f.mode != "REQUIRED") for f in fields])


@dataclass(frozen=True)
class SchemaPlan:
    """What to do with the table before writing. `add` are new NULLABLE columns (compatible evolution);
    `conflicts` are declared columns whose type differs from the table's (breaking: never changed by us)."""

    add: tuple[Field, ...]
    conflicts: tuple[tuple[str, str, str], ...]  # (column, declared type, table type)


# Widenings BigQuery performs itself on write (an INT64 value into a FLOAT64/NUMERIC column), so a declared
# narrower type against a wider table column is not a conflict.
_WRITE_COMPATIBLE = {("INT64", "FLOAT64"), ("INT64", "NUMERIC"), ("INT64", "BIGNUMERIC"), ("NUMERIC", "BIGNUMERIC")}


def plan_schema(table_fields: Sequence[Field], wanted: Sequence[Field]) -> SchemaPlan:
    """Compare the table with the columns the handoff writes."""
    have = {f.name.lower(): f for f in table_fields}
    add: list[Field] = []
    conflicts: list[tuple[str, str, str]] = []
    for f in wanted:
        existing = have.get(f.name.lower())
        if existing is None:
            add.append(Field(f.name, f.type, "NULLABLE"))
            continue
        declared, actual = canonical_type(f.type), canonical_type(existing.type)
        if declared != actual and (declared, actual) not in _WRITE_COMPATIBLE:
            conflicts.append((f.name, declared, actual))
    return SchemaPlan(tuple(add), tuple(conflicts))


@dataclass(frozen=True)
class Rejected:
    """A row BigQuery would refuse (or did refuse), with the reason that goes into the DLQ record."""

    index: int
    reason: str


def conform(table: pa.Table, table_fields: Sequence[Field], dropped: Iterable[str] = ()) -> tuple[pa.Table, list[Rejected]]:
    """Shape a decoded batch for the table and find the rows BigQuery would reject.

    - columns the table does not have raise `UnknownColumns` (BigQuery fails the whole append; schema
      evolution must add them first — the caller decides, per `schema.evolution`);
    - `dropped` columns (breaking conflicts under onIncompatible=deadLetter) are removed; a row with a value in
      one of them is rejected, so no value is silently lost;
    - a null in a REQUIRED column rejects the row (BigQuery: "missing required field");
    - values are cast to the column's Arrow type; a row whose value cannot be cast is rejected.
    Returns (conformed table without the rejected rows, rejected rows by index into `table`).
    """
    by_name = {f.name.lower(): f for f in table_fields}
    dropped_l = {d.lower() for d in dropped}
    unknown = [n for n in table.column_names if n.lower() not in by_name and n.lower() not in dropped_l]
    if unknown:
        raise UnknownColumns(unknown)
    n = table.num_rows
    bad = [""] * n

    def flag(mask: pa.Array | pa.ChunkedArray, reason: str) -> None:
        for i, hit in enumerate(mask.to_pylist()):
            if hit and not bad[i]:
                bad[i] = reason

    for name in table.column_names:
        if name.lower() in dropped_l:
            flag(pc.is_valid(table.column(name)), f"column {name!r}: type conflicts with the table; value not written")

    columns: list[pa.ChunkedArray | pa.Array] = []
    present = {c.lower(): c for c in table.column_names}
    for f in table_fields:
        want = arrow_type(f)
        src = present.get(f.name.lower())
        if src is None:
            col: pa.ChunkedArray | pa.Array = pa.nulls(n, type=want)
        else:
            col = table.column(src)
            if col.type != want:
                col = _cast_rowwise(col, want, f, flag)
        if f.mode == "REQUIRED":
            flag(pc.is_null(col), f"missing required field {f.name} (REQUIRED in the BigQuery table)")
        columns.append(col)
    conformed = pa.Table.from_arrays(columns, schema=arrow_schema(table_fields).with_metadata(None))
    rejected = [Rejected(i, r) for i, r in enumerate(bad) if r]
    if rejected:
        keep = pa.array([i for i, r in enumerate(bad) if not r], type=pa.int64())
        conformed = conformed.take(keep)
    return conformed, rejected


def _cast_rowwise(col: pa.ChunkedArray, want: pa.DataType, field: Field, flag) -> pa.Array:
    """Cast a column; if the whole-column cast fails, cast value by value and flag the failures."""
    try:
        return pc.cast(col, want)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    values = col.to_pylist()
    out: list[object] = []
    failed: list[bool] = []
    for v in values:
        if v is None:
            out.append(None)
            failed.append(False)
            continue
        try:
            out.append(pc.cast(pa.array([v]), want)[0].as_py())
            failed.append(False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            out.append(None)
            failed.append(True)
    flag(pa.array(failed), f"field {field.name}: value does not fit BigQuery type {field.type}")
    return pa.array(out, type=want)


class UnknownColumns(ValueError):
    """The batch has columns the BigQuery table lacks (BigQuery rejects such an append outright)."""

    def __init__(self, names: Sequence[str]):
        super().__init__(f"columns not in the BigQuery table: {', '.join(names)}")
        self.names = list(names)
