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
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table import Table
from pyiceberg.transforms import (BucketTransform, DayTransform, HourTransform, IdentityTransform, MonthTransform,
                                  Transform, TruncateTransform, YearTransform)
from pyiceberg.types import (BinaryType, BooleanType, DateType, DecimalType, DoubleType, FixedType, FloatType,
                             IcebergType, IntegerType, ListType, LongType, MapType, NestedField, StringType,
                             StructType, TimestampType, TimestamptzType, TimeType, UUIDType)

from handoff_spark.contract import KAFKA_OFFSET, KAFKA_PARTITION, KAFKA_TIMESTAMP, KAFKA_TOPIC
from handoff_spark.decode.column_types import ColumnType, ListOf, MapOf, Struct, parse_type

#: Metadata columns every Handoff table carries: where each row came from (the exactly-once audit trail).
KAFKA_COLUMNS: tuple[tuple[str, IcebergType], ...] = (
    (KAFKA_TOPIC, StringType()),
    (KAFKA_PARTITION, IntegerType()),
    (KAFKA_OFFSET, LongType()),
    (KAFKA_TIMESTAMP, TimestamptzType()),
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
            from handoff_spark.iceberg.catalog import wrap_sql_catalog
            cat = wrap_sql_catalog(_load_catalog_once_created(catalog_name, catalog_properties))
            _catalogs[key] = cat
        return cat


def _load_catalog_once_created(catalog_name: str, catalog_properties: dict[str, str]) -> Catalog:
    """`load_catalog`, again when a SQL catalog's first use raced another process's: PyIceberg's SqlCatalog creates
    its tables when a probe finds none, so two processes opening a new catalog database at once (the driver and
    `handoff ledger show`, the demo's checks) can both probe, and the second CREATE TABLE fails with "already
    exists". The tables are there then, so opening it again succeeds."""
    for attempt in range(3):
        try:
            return load_catalog(catalog_name, **catalog_properties)
        except Exception as exc:
            if attempt == 2 or type(exc).__name__ not in ("OperationalError", "ProgrammingError", "IntegrityError") \
                    or "already exists" not in str(exc).lower():
                raise
    raise AssertionError("unreachable")


def forget_catalog(catalog_name: str, catalog_properties: dict[str, str]) -> None:
    """Drop a cached catalog (after connection errors, so the next call reconnects)."""
    with _catalog_lock:
        _catalogs.pop((catalog_name, tuple(sorted(catalog_properties.items()))), None)


def load_table(catalog_name: str, catalog_properties: dict[str, str], identifier: str) -> Table:
    return load_catalog_cached(catalog_name, catalog_properties).load_table(identifier)


# ---------------------------------------------------------------------------------------------- types

class _Ids:
    """Field ids for nested types built here. Catalogs assign fresh ids when a table is created, and the sink
    compares types by structure (`same_structure`), so these only have to be unique within one schema."""

    def __init__(self, start: int = 0):
        self.last = start

    def __call__(self) -> int:
        self.last += 1
        return self.last


def iceberg_type(column_type: str | ColumnType, ids: _Ids | None = None) -> IcebergType:
    """Declared column type (AppConfig) → Iceberg type. `timestamp` and `timestamptz` are UTC instants
    (timestamptz); nested fields, list elements and map values are optional."""
    t = parse_type(column_type) if isinstance(column_type, str) else column_type
    ids = ids or _Ids(10_000)
    if isinstance(t, Struct):
        return StructType(*[NestedField(ids(), f.name, iceberg_type(f.type, ids), required=False) for f in t.fields])
    if isinstance(t, ListOf):
        return ListType(ids(), iceberg_type(t.element, ids), element_required=False)
    if isinstance(t, MapOf):
        return MapType(ids(), iceberg_type(t.key, ids), ids(), iceberg_type(t.value, ids), value_required=False)
    if t.name == "decimal":
        if t.precision > 38:
            raise ValueError(f"column type {t}: Iceberg decimals hold at most 38 digits")
        return DecimalType(t.precision, t.scale)
    if t.name == "fixed":
        return FixedType(t.length)
    return _ICEBERG_PRIMITIVES[t.name]


_ICEBERG_PRIMITIVES: dict[str, IcebergType] = {
    "string": StringType(), "int": IntegerType(), "long": LongType(), "float": FloatType(), "double": DoubleType(),
    "boolean": BooleanType(), "timestamp": TimestamptzType(), "timestamptz": TimestamptzType(), "date": DateType(),
    "time": TimeType(), "uuid": UUIDType(), "binary": BinaryType()}


def iceberg_type_of_arrow(t: pa.DataType, ids: _Ids | None = None) -> IcebergType | None:
    """Arrow type of a decoded column → Iceberg type, None when Handoff cannot store it as a column."""
    ids = ids or _Ids(10_000)
    if pa.types.is_struct(t):
        fields = []
        for i in range(t.num_fields):
            sub = iceberg_type_of_arrow(t.field(i).type, ids)
            if sub is None:
                return None
            fields.append(NestedField(ids(), t.field(i).name, sub, required=False))
        return StructType(*fields)
    if pa.types.is_map(t):
        key, value = iceberg_type_of_arrow(t.key_type, ids), iceberg_type_of_arrow(t.item_type, ids)
        return None if key is None or value is None else MapType(ids(), key, ids(), value, value_required=False)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        element = iceberg_type_of_arrow(t.value_type, ids)
        return None if element is None else ListType(ids(), element, element_required=False)
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
    if pa.types.is_fixed_size_binary(t):
        return FixedType(t.byte_width)  # a uuid column's values too (`fits_into` accepts them)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return BinaryType()
    if pa.types.is_timestamp(t):
        return TimestamptzType() if t.tz else TimestampType()
    if pa.types.is_time(t):
        return TimeType()
    if pa.types.is_date(t):
        return DateType()
    if pa.types.is_decimal(t):
        return DecimalType(t.precision, t.scale)
    return None


def same_structure(a: IcebergType, b: IcebergType) -> bool:
    """Equal types ignoring nested field ids (a type built from a batch has no ids of the table's)."""
    if isinstance(a, StructType) and isinstance(b, StructType):
        return len(a.fields) == len(b.fields) and all(
            x.name == y.name and same_structure(x.field_type, y.field_type) for x, y in zip(a.fields, b.fields))
    if isinstance(a, ListType) and isinstance(b, ListType):
        return same_structure(a.element_type, b.element_type)
    if isinstance(a, MapType) and isinstance(b, MapType):
        return same_structure(a.key_type, b.key_type) and same_structure(a.value_type, b.value_type)
    return a == b


def fits_into(incoming: IcebergType, table: IcebergType) -> bool:
    """Values of `incoming` can be written into a `table` column as they are or cast up: the same type, a safe
    widening, or for nested types a struct whose fields all exist in the table's struct and fit (missing ones
    are null), lists and maps whose parts fit."""
    if isinstance(incoming, StructType) and isinstance(table, StructType):
        have = {f.name: f.field_type for f in table.fields}
        return all(f.name in have and fits_into(f.field_type, have[f.name]) for f in incoming.fields)
    if isinstance(incoming, ListType) and isinstance(table, ListType):
        return fits_into(incoming.element_type, table.element_type)
    if isinstance(incoming, MapType) and isinstance(table, MapType):
        return fits_into(incoming.key_type, table.key_type) and fits_into(incoming.value_type, table.value_type)
    if isinstance(incoming, FixedType) and isinstance(table, UUIDType):
        return len(incoming) == 16
    if incoming.is_primitive and table.is_primitive:
        return is_safe_widening(incoming, table)
    return False


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

#: A top-level column name, or the path of a field inside a struct column (`("addr", "zip")`; a list's
#: element struct is `element`, a map's value struct `value`, as Iceberg names them).
ColumnPath = str | tuple[str, ...]


def dotted(name: ColumnPath) -> str:
    """The name `Schema.find_field` takes."""
    return name if isinstance(name, str) else ".".join(name)


def new_nested_fields(table: IcebergType, incoming: IcebergType,
                      path: tuple[str, ...]) -> list[tuple[tuple[str, ...], IcebergType]] | None:
    """Fields `incoming` has inside structs that `table` lacks (their paths and types), when everything else
    fits; None when something does not fit (a changed nested type)."""
    if isinstance(table, StructType) and isinstance(incoming, StructType):
        have = {f.name: f.field_type for f in table.fields}
        out: list[tuple[tuple[str, ...], IcebergType]] = []
        for f in incoming.fields:
            if f.name not in have:
                out.append((path + (f.name,), f.field_type))
                continue
            sub = new_nested_fields(have[f.name], f.field_type, path + (f.name,))
            if sub is None:
                return None
            out += sub
        return out
    if isinstance(table, ListType) and isinstance(incoming, ListType):
        return new_nested_fields(table.element_type, incoming.element_type, path + ("element",))
    if isinstance(table, MapType) and isinstance(incoming, MapType):
        if not fits_into(incoming.key_type, table.key_type):
            return None
        return new_nested_fields(table.value_type, incoming.value_type, path + ("value",))
    return [] if fits_into(incoming, table) else None


@dataclass(frozen=True)
class SchemaPlan:
    """What it takes to store `wanted` columns in a table with `current` columns."""

    add: tuple[tuple[ColumnPath, IcebergType], ...] = ()   # new optional columns / nested fields, sorted by name
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
    add: dict[ColumnPath, IcebergType] = {}
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
        if same_structure(old, typ) or fits_into(typ, old):
            continue  # same or narrower incoming type: cast up on write (nested: missing fields are null)
        nested = new_nested_fields(old, typ, (name,)) if not old.is_primitive else None
        if nested:
            if evolution == "compatible":
                for sub_path, sub_type in nested:
                    add.setdefault(sub_path, sub_type)
            else:
                incompatible.append(f"column {name!r} gains nested field(s) "
                                    f"{', '.join(dotted(p) for p, _ in nested)} (needs schema.evolution=compatible)")
            continue
        if is_safe_widening(old, typ):
            if evolution == "compatible":
                prev = widen.get(name)
                widen[name] = typ if prev is None or is_safe_widening(prev, typ) else prev
            else:
                incompatible.append(f"column {name!r} is {old} in the table but {typ} arrives "
                                    f"(widening needs schema.evolution=compatible)")
            continue
        incompatible.append(f"column {name!r} is {old} in the table but {typ} arrives "
                            f"(not a safe widening; Iceberg allows int→long, float→double, decimal precision up, "
                            f"and new optional fields inside a struct)")
    return SchemaPlan(add=tuple(sorted(add.items(), key=lambda kv: dotted(kv[0]))), widen=tuple(sorted(widen.items())),
                      incompatible=tuple(incompatible), ignored=tuple(sorted(set(ignored))))


def apply_plan_locally(schema: Schema, plan: SchemaPlan, last_column_id: int) -> Schema:
    """The schema the table will have after `plan` (ids assigned in plan order, as `update_schema` does when
    the columns are added in that order: the field's id, then fresh ids inside its type). Executors write
    provisional files with it; the driver checks the ids (and rewrites a file by name if they differ)."""
    widen = dict(plan.widen)
    counter = _Ids(last_column_id)
    nested: dict[tuple[str, ...], list[NestedField]] = {}
    top: list[NestedField] = []
    for name, typ in plan.add:
        field_id = counter()
        field = NestedField(field_id, name if isinstance(name, str) else name[-1],
                            assign_fresh_schema_ids(typ, counter) if not typ.is_primitive else typ, required=False)
        if isinstance(name, str):
            top.append(field)
        else:
            nested.setdefault(name[:-1], []).append(field)

    def grow(t: IcebergType, path: tuple[str, ...]) -> IcebergType:
        if isinstance(t, StructType):
            return StructType(*[NestedField(f.field_id, f.name, grow(f.field_type, path + (f.name,)), f.required,
                                            f.doc) for f in t.fields], *nested.get(path, []))
        if isinstance(t, ListType):
            return ListType(t.element_id, grow(t.element_type, path + ("element",)), t.element_required)
        if isinstance(t, MapType):
            return MapType(t.key_id, t.key_type, t.value_id, grow(t.value_type, path + ("value",)), t.value_required)
        return t

    fields = [NestedField(f.field_id, f.name, grow(widen.get(f.name, f.field_type), (f.name,)), f.required, f.doc)
              for f in schema.fields]
    return Schema(*fields, *top, schema_id=schema.schema_id + 1,
                  identifier_field_ids=list(schema.identifier_field_ids))


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
    columns = list(columns)
    fields: list[NestedField] = []
    next_id = 0
    raw_cols = [("key", BinaryType()), ("value", BinaryType())] if fmt == "raw" else []
    nested_ids = _Ids(len(columns) + len(raw_cols) + len(KAFKA_COLUMNS))
    for col in columns:
        next_id += 1
        fields.append(NestedField(next_id, col.name, iceberg_type(col.type, nested_ids), required=False,
                                  doc=col.doc))
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
