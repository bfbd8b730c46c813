"""BigQuery table schema for a handoff: declared columns → BigQuery fields → Arrow, and the checks BigQuery
itself would make on a row before accepting it.

Why our own checks: BigQuery rejects a row whose REQUIRED field is null and an append that names a field the
table does not have; the emulator the tests run against does neither. The sink must behave the same on both,
so the rules live here, applied to every batch before it is appended, and the rejected rows go to the DLQ
with the same kind of message BigQuery would give.

Pure functions over plain data (field tuples, Arrow tables); no client calls.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from handoff_spark.contract import KAFKA_OFFSET, KAFKA_PARTITION, KAFKA_TIMESTAMP, KAFKA_TOPIC
from handoff_spark.decode.column_types import ColumnType, ListOf, MapOf, Primitive, Struct, parse_type
from handoff_spark.config import Column

# Metadata columns every handoff table carries: the Kafka coordinates (`contract.KAFKA_*`) make the table its
# own offset ledger (see docs/bigquery-exactly-once.md); `_handoff_batch_id` says which micro-batch committed
# the row.
BATCH_ID = "_handoff_batch_id"
# The Kafka topic id of a row, only on rows written after an `epoch` marker accepted a recreated topic (or another
# cluster): the new topic's offsets start again, so (topic, partition, offset) alone no longer names one record.
# Added to a table when its ledger first holds an epoch (not part of METADATA_FIELDS): a table whose topics were
# never recreated never gets it, and rows before the epoch keep it NULL (docs/bigquery-exactly-once.md, "Kafka
# identity").
KAFKA_TOPIC_ID = "_kafka_topic_id"


@dataclass(frozen=True)
class Field:
    """One BigQuery column; a RECORD (STRUCT) carries its sub-fields in `fields`."""

    name: str
    type: str  # BigQuery standard type name: STRING, INT64, FLOAT64, BOOL, TIMESTAMP, DATE, BYTES, NUMERIC, RECORD…
    mode: str = "NULLABLE"  # NULLABLE | REQUIRED | REPEATED
    fields: tuple["Field", ...] = ()


METADATA_FIELDS: tuple[Field, ...] = (
    Field(KAFKA_TOPIC, "STRING", "REQUIRED"),
    Field(KAFKA_PARTITION, "INT64", "REQUIRED"),
    Field(KAFKA_OFFSET, "INT64", "REQUIRED"),
    Field(KAFKA_TIMESTAMP, "TIMESTAMP", "NULLABLE"),
    Field(BATCH_ID, "INT64", "NULLABLE"),
)

TOPIC_ID_FIELD = Field(KAFKA_TOPIC_ID, "STRING", "NULLABLE")

# Legacy names the REST API may return for the same types.
_CANONICAL = {"INTEGER": "INT64", "FLOAT": "FLOAT64", "BOOLEAN": "BOOL", "STRUCT": "RECORD"}


def canonical_type(bq_type: str) -> str:
    upper = bq_type.upper()
    return _CANONICAL.get(upper, upper)


def bq_type(column_type: str) -> str:
    """Declared primitive column type (the CR's vocabulary) → BigQuery type (nested ones: `bq_field`)."""
    t = parse_type(column_type)
    if not isinstance(t, Primitive):
        return "RECORD"
    if t.name == "decimal":
        # NUMERIC holds 29 integer digits and 9 fractional ones; anything wider needs BIGNUMERIC.
        return "NUMERIC" if t.scale <= 9 and t.precision - t.scale <= 29 else "BIGNUMERIC"
    return _BQ_PRIMITIVES[t.name]


# `uuid` and `fixed[n]` are decoded to their bytes (16 / n), which BigQuery stores as BYTES.
_BQ_PRIMITIVES = {"string": "STRING", "int": "INT64", "long": "INT64", "float": "FLOAT64", "double": "FLOAT64",
                  "boolean": "BOOL", "timestamp": "TIMESTAMP", "timestamptz": "TIMESTAMP", "date": "DATE",
                  "time": "TIME", "uuid": "BYTES", "fixed": "BYTES", "binary": "BYTES"}


def bq_field(name: str, column_type: str | ColumnType, mode: str = "NULLABLE") -> Field:
    """A declared column (any type) as a BigQuery field: struct → RECORD, list<T> → T REPEATED, map<K,V> →
    REPEATED RECORD<key, value> (BigQuery has no map type). BigQuery cannot repeat a repeated field, so a list
    of lists (or of maps) has no mapping."""
    t = parse_type(column_type) if isinstance(column_type, str) else column_type
    if isinstance(t, Struct):
        return Field(name, "RECORD", mode, tuple(bq_field(f.name, f.type) for f in t.fields))
    if isinstance(t, (ListOf, MapOf)):
        if mode == "REPEATED":
            raise ValueError(f"column {name!r}: BigQuery cannot hold a list of lists or maps ({t})")
        if isinstance(t, MapOf):
            return Field(name, "RECORD", "REPEATED", (bq_field("key", t.key, "REQUIRED"), bq_field("value", t.value)))
        return bq_field(name, t.element, "REPEATED")
    return Field(name, bq_type(str(t)), mode)


def declared_fields(columns: Sequence[Column]) -> list[Field]:
    """The table a handoff creates: declared columns (all NULLABLE — `required` is enforced by decode, and
    BigQuery cannot add a REQUIRED column to an existing table, so declaring it REQUIRED would make the
    first and a later schema differ) followed by the metadata columns."""
    fields = [bq_field(c.name, c.type) for c in columns]
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
        base = pa.struct([pa.field(f.name, arrow_type(f), nullable=f.mode != "REQUIRED") for f in field.fields]) \
            if t == "RECORD" else mapping[t]
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
            add.append(Field(f.name, f.type, "REPEATED" if f.mode == "REPEATED" else "NULLABLE", f.fields))
            continue
        declared, actual = _shape(f), _shape(existing)
        if declared != actual and (declared, actual) not in _WRITE_COMPATIBLE:
            conflicts.append((f.name, declared, actual))
    return SchemaPlan(tuple(add), tuple(conflicts))


def _shape(f: Field) -> str:
    """A field's type as one comparable string: `INT64`, `RECORD<a INT64, b STRING REPEATED>` (names in
    lower case, as BigQuery compares them). A RECORD that gains a sub-field is a conflict: BigQuery can add
    one, Handoff does not yet."""
    inner = "" if not f.fields else "<" + ", ".join(
        f"{s.name.lower()} {_shape(s)}{' REPEATED' if s.mode == 'REPEATED' else ''}" for s in f.fields) + ">"
    return canonical_type(f.type) + inner


def column_types(fields: Sequence[Field]) -> dict[str, str]:
    """A table's top-level columns as {name: type}, in table order, the type as BigQuery says it (`INT64`,
    `RECORD<a INT64, b STRING REPEATED>`) with the mode when it is not NULLABLE (`STRING REQUIRED`, `INT64
    REPEATED`): what a BigQuery ledger row records of the table's schema, and the vocabulary of its timeline
    `schema` rows (Iceberg's say `long`, `string`: each backend's own words)."""
    return {f.name: _shape(f) + ("" if f.mode in ("", "NULLABLE") else f" {f.mode}") for f in fields}


#: Hex digits of `fingerprint`: 48 bits, a collision between two schemas of one table is not a concern.
FINGERPRINT_DIGITS = 12


def fingerprint(columns: dict[str, str]) -> str:
    """The identity of a table schema ({name: type}, `column_types`): the first 12 hex digits of the SHA-256 of
    its columns in order. BigQuery has no schema ids (Iceberg's `schemaId`); a fingerprint needs no counter kept
    anywhere, is the same for every writer that sees the same columns, and names the schema again if a table
    comes back to it."""
    import hashlib
    import json

    text = json.dumps(list(columns.items()), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:FINGERPRINT_DIGITS]


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
