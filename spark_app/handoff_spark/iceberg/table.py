"""Iceberg table plumbing shared by the sink, the ledger and maintenance: catalogs, the table Handoff
creates from a declared schema, partition specs from `partitionBy` strings, and the pure schema-change
planner that decides what evolves, what widens and what is incompatible.

Why separate: the operator imports the ledger (and so this module) without pyspark, and the planner is
plain logic over plain data that tests exercise without any table.
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Iterable

import pyarrow as pa
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import (CommitFailedException, NamespaceAlreadyExistsError, NoSuchTableError,
                                  TableAlreadyExistsError)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import (BucketTransform, DayTransform, HourTransform, IdentityTransform, MonthTransform,
                                  Transform, TruncateTransform, YearTransform)
from pyiceberg.types import (BinaryType, BooleanType, DateType, DecimalType, DoubleType, FloatType, IcebergType,
                             IntegerType, LongType, NestedField, StringType, TimestampType, TimestamptzType)

#: Metadata columns every Handoff table carries: where each row came from (the exactly-once audit trail).
KAFKA_COLUMNS: tuple[tuple[str, IcebergType], ...] = (
    ("_kafka_topic", StringType()),
    ("_kafka_partition", IntegerType()),
    ("_kafka_offset", LongType()),
    ("_kafka_timestamp", TimestamptzType()),
)

#: Streaming commits fail fast and let Handoff decide. PyIceberg's own retry (default: 4 retries, backoff up
#: to 60 s) re-applies a commit on the new base *without* re-checking the ledger, and would re-apply a
#: compaction over files another compaction already replaced; Handoff's callers retry themselves instead
#: (the sink re-checks the ancestry, compaction waits for its next round).
STREAMING_TABLE_PROPERTIES: dict[str, str] = {
    "commit.retry.num-retries": "0",
    "commit.retry.min-wait-ms": "50",
    "commit.retry.max-wait-ms": "2000",
    "commit.retry.total-timeout-ms": "15000",
    # Merge small manifests on append so commit latency stays flat as history grows (see bench/).
    "commit.manifest-merge.enabled": "true",
    "commit.manifest.min-count-to-merge": "50",
    "write.parquet.compression-codec": "zstd",
    # Old metadata.json versions beyond the last 50 are deleted on commit (one per batch otherwise piles up).
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "50",
}

#: The subset `prepare` also adds to an *existing* table that lacks them (an explicit value is never
#: overridden): without them each micro-batch leaves one more metadata.json file and one more manifest in
#: every later manifest list, forever. The commit-retry keys are not among them: they change how every other
#: writer of a table Handoff did not create retries its commits.
HISTORY_BOUNDING_PROPERTIES: tuple[str, ...] = (
    "commit.manifest-merge.enabled",
    "commit.manifest.min-count-to-merge",
    "write.metadata.delete-after-commit.enabled",
    "write.metadata.previous-versions-max",
)

_catalogs: dict[tuple[str, tuple[tuple[str, str], ...]], Catalog] = {}
_catalog_lock = threading.Lock()


def load_catalog_cached(catalog_name: str, catalog_properties: dict[str, str]) -> Catalog:
    """One catalog object per (name, properties) per process: SQL catalogs hold a connection pool, and (as
    `iceberg_catalog.HandoffSqlCatalog`) the parsed metadata that keeps commits cheap as history grows."""
    key = (catalog_name, tuple(sorted(catalog_properties.items())))
    with _catalog_lock:
        cat = _catalogs.get(key)
        if cat is None:
            from .catalog import wrap_sql_catalog
            cat = wrap_sql_catalog(load_catalog(catalog_name, **catalog_properties))
            _catalogs[key] = cat
        return cat


def forget_catalog(catalog_name: str, catalog_properties: dict[str, str]) -> None:
    """Drop a cached catalog (after connection errors, so the next call reconnects)."""
    with _catalog_lock:
        _catalogs.pop((catalog_name, tuple(sorted(catalog_properties.items()))), None)


def load_table(catalog_name: str, catalog_properties: dict[str, str], identifier: str) -> Table:
    return load_catalog_cached(catalog_name, catalog_properties).load_table(identifier)


# ---------------------------------------------------------------------------------------------- types

_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")


def iceberg_type(column_type: str) -> IcebergType:
    """Declared column type (AppConfig) → Iceberg type. Timestamps are UTC instants (timestamptz)."""
    simple: dict[str, IcebergType] = {
        "string": StringType(), "int": IntegerType(), "long": LongType(), "float": FloatType(),
        "double": DoubleType(), "boolean": BooleanType(), "timestamp": TimestamptzType(), "date": DateType(),
        "binary": BinaryType(),
    }
    if column_type in simple:
        return simple[column_type]
    m = _DECIMAL.match(column_type)
    if m:
        return DecimalType(int(m.group(1)), int(m.group(2)))
    raise ValueError(f"unsupported column type {column_type!r}")


def iceberg_type_of_arrow(t: pa.DataType) -> IcebergType | None:
    """Arrow type of a discovered column → Iceberg type, None when Handoff cannot store it as a column."""
    if pa.types.is_boolean(t):
        return BooleanType()
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_int32(t):
        return IntegerType()
    if pa.types.is_int64(t):
        return LongType()
    if pa.types.is_float32(t) or pa.types.is_float16(t):
        return FloatType()
    if pa.types.is_float64(t):
        return DoubleType()
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return StringType()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return BinaryType()
    if pa.types.is_timestamp(t):
        return TimestamptzType() if t.tz else TimestampType()
    if pa.types.is_date(t):
        return DateType()
    if pa.types.is_decimal(t):
        return DecimalType(t.precision, t.scale)
    return None


def is_safe_widening(old: IcebergType, new: IcebergType) -> bool:
    """Iceberg's allowed type promotions (int→long, float→double, decimal precision up, same scale)."""
    if old == new:
        return True
    if isinstance(old, IntegerType) and isinstance(new, LongType):
        return True
    if isinstance(old, FloatType) and isinstance(new, DoubleType):
        return True
    if isinstance(old, DecimalType) and isinstance(new, DecimalType):
        return new.scale == old.scale and new.precision >= old.precision
    return False


# --------------------------------------------------------------------------------------- schema plans

@dataclass(frozen=True)
class SchemaPlan:
    """What it takes to store `wanted` columns in a table with `current` columns."""

    add: tuple[tuple[str, IcebergType], ...] = ()          # new optional columns, sorted by name
    widen: tuple[tuple[str, IcebergType], ...] = ()        # (column, wider type)
    incompatible: tuple[str, ...] = ()                      # human-readable reasons
    ignored: tuple[str, ...] = field(default=())            # new columns not added (evolution=none)

    @property
    def changes_table(self) -> bool:
        return bool(self.add or self.widen)


def plan_schema_changes(current: Schema, wanted: Iterable[tuple[str, IcebergType]], evolution: str) -> SchemaPlan:
    """Decide how a table schema must change to hold `wanted` columns.

    `evolution=compatible`: unknown columns are added as optional, safe widenings are applied. `none`: the table
    never changes; unknown columns are ignored (the table is the contract) and a needed widening is
    incompatible. A narrower incoming type is not a change at all (the value is cast up on write); a type
    that is neither narrower nor a safe widening is always incompatible — never a silent narrowing.
    """
    add: dict[str, IcebergType] = {}
    widen: dict[str, IcebergType] = {}
    incompatible: list[str] = []
    ignored: list[str] = []
    by_name = {f.name: f for f in current.fields}
    for name, typ in wanted:
        existing = by_name.get(name)
        if existing is None:
            if evolution == "compatible":
                prev = add.get(name)
                if prev is None or is_safe_widening(prev, typ):
                    add[name] = typ
                elif not is_safe_widening(typ, prev):
                    incompatible.append(f"new column {name!r} arrives as both {prev} and {typ}")
            else:
                ignored.append(name)
            continue
        old = existing.field_type
        if old == typ or is_safe_widening(typ, old):
            continue  # same or narrower incoming type: cast up on write
        if is_safe_widening(old, typ):
            if evolution == "compatible":
                prev = widen.get(name)
                widen[name] = typ if prev is None or is_safe_widening(prev, typ) else prev
            else:
                incompatible.append(f"column {name!r} is {old} in the table but {typ} arrives "
                                    f"(widening needs schema.evolution=compatible)")
            continue
        incompatible.append(f"column {name!r} is {old} in the table but {typ} arrives "
                            f"(not a safe widening; Iceberg allows int→long, float→double, decimal precision up)")
    return SchemaPlan(add=tuple(sorted(add.items())), widen=tuple(sorted(widen.items())),
                      incompatible=tuple(incompatible), ignored=tuple(sorted(set(ignored))))


def apply_plan_locally(schema: Schema, plan: SchemaPlan, last_column_id: int) -> Schema:
    """The schema the table will have after `plan` (ids assigned in name order, as `update_schema` does when
    the columns are added in that order). Executors write provisional files with it; the driver checks the ids."""
    widen = dict(plan.widen)
    fields = [NestedField(f.field_id, f.name, widen.get(f.name, f.field_type), f.required, f.doc)
              for f in schema.fields]
    next_id = last_column_id
    for name, typ in plan.add:
        next_id += 1
        fields.append(NestedField(next_id, name, typ, required=False))
    return Schema(*fields, schema_id=schema.schema_id + 1, identifier_field_ids=list(schema.identifier_field_ids))


# ------------------------------------------------------------------------------------- partition specs

_TRANSFORM = re.compile(r"^\s*(\w+)\s*\(\s*(?:(\d+)\s*,\s*)?(\w+)\s*\)\s*$")


def parse_partition_field(text: str) -> tuple[str, Transform]:
    """'day(ts)' / 'hour(ts)' / 'month(ts)' / 'year(ts)' / 'bucket(16, id)' / 'truncate(4, s)' / 'region'."""
    text = text.strip()
    if re.fullmatch(r"\w+", text):
        return text, IdentityTransform()
    m = _TRANSFORM.match(text)
    if not m:
        raise ValueError(f"partitionBy entry {text!r}: expected column, day(col), hour(col), month(col), "
                         f"year(col), bucket(N, col) or truncate(N, col)")
    fn, arg, col = m.group(1).lower(), m.group(2), m.group(3)
    simple: dict[str, Transform] = {"day": DayTransform(), "days": DayTransform(), "hour": HourTransform(),
                                    "hours": HourTransform(), "month": MonthTransform(), "year": YearTransform(),
                                    "identity": IdentityTransform()}
    if fn in simple and arg is None:
        return col, simple[fn]
    if fn == "bucket" and arg is not None:
        return col, BucketTransform(int(arg))
    if fn == "truncate" and arg is not None:
        return col, TruncateTransform(int(arg))
    raise ValueError(f"partitionBy entry {text!r}: unknown transform {fn!r}")


def partition_spec(schema: Schema, partition_by: list[str]) -> PartitionSpec:
    fields = []
    for i, text in enumerate(partition_by):
        col, transform = parse_partition_field(text)
        source = schema.find_field(col)  # raises ValueError naming the column
        # Iceberg's conventional names: identity keeps the column name, others get `<col>_<transform>`.
        name = col if isinstance(transform, IdentityTransform) else f"{col}_{str(transform).split('[')[0]}"
        fields.append(PartitionField(source_id=source.field_id, field_id=1000 + i, transform=transform, name=name))
    return PartitionSpec(*fields)


def declared_schema(columns: Iterable, fmt: str = "json") -> Schema:
    """Declared columns (AppConfig.schema_.columns) + the `_kafka_*` metadata columns. Format `raw` stores the
    record's `key` and `value` bytes. All columns are optional in the table: the decoder enforces `required`
    per record (dead letter or halt), and optional columns keep later evolution simple."""
    fields: list[NestedField] = []
    next_id = 0
    raw_cols = [("key", BinaryType()), ("value", BinaryType())] if fmt == "raw" else []
    for col in columns:
        next_id += 1
        fields.append(NestedField(next_id, col.name, iceberg_type(col.type), required=False, doc=col.doc))
    for name, typ in raw_cols:
        if any(f.name == name for f in fields):
            continue
        next_id += 1
        fields.append(NestedField(next_id, name, typ, required=False))
    for name, typ in KAFKA_COLUMNS:
        if any(f.name == name for f in fields):
            continue
        next_id += 1
        fields.append(NestedField(next_id, name, typ, required=False))
    return Schema(*fields)


def ensure_table(catalog: Catalog, identifier: str, schema: Schema, partition_by: list[str],
                 extra_properties: dict[str, str] | None = None) -> Table:
    """Load the table, creating it (and its namespace) from the declared schema when missing. Safe when several
    processes race to create it."""
    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        pass
    namespace = identifier.rsplit(".", 1)[0]
    try:
        catalog.create_namespace(namespace)
    except NamespaceAlreadyExistsError:
        pass
    props = {**STREAMING_TABLE_PROPERTIES, **(extra_properties or {})}
    try:
        return catalog.create_table(identifier, schema=schema, partition_spec=partition_spec(schema, partition_by),
                                    properties=props)
    except TableAlreadyExistsError:
        return catalog.load_table(identifier)


def missing_history_properties(properties: dict[str, str]) -> dict[str, str]:
    """The history-bounding properties a table does not set at all (pure: what `ensure_history_bounded` adds)."""
    return {k: STREAMING_TABLE_PROPERTIES[k] for k in HISTORY_BOUNDING_PROPERTIES if k not in properties}


def ensure_history_bounded(table: Table) -> Table:
    """Add the missing history-bounding properties to an existing table (one metadata commit, only when one is
    missing; values the table already sets stay). Returns the table, refreshed if it changed."""
    missing = missing_history_properties(table.metadata.properties)
    if missing:
        try:
            with table.transaction() as tx:
                tx.set_properties(missing)
        except CommitFailedException:  # another writer moved the table meanwhile: the next start tries again
            table.refresh()
    return table
