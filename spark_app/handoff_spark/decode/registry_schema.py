"""Schema Registry schemas (Avro, JSON Schema, Protobuf) → Handoff column types. Pure: no registry calls.

Why its own module: the mapping from registry schemas to the column types of `column_types.py` lives here
alone, so both follow each other in one place.

Mapping (each top-level field becomes a column; nested values become nested columns):
* scalars: Avro int→int, long→long, float, double, boolean, string, bytes→binary, enum→string,
  fixed→fixed[n]; JSON Schema integer→long, number→double, boolean, string; Protobuf int32/sint32/sfixed32→int,
  int64/uint32/uint64/... →long, float, double, bool→boolean, string, bytes→binary, enum→string (its name);
* logical types: Avro timestamp-millis/-micros→timestamptz (UTC instants), local-timestamp-millis/-micros→
  timestamp (Handoff stores it like timestamptz: the wall-clock value as if UTC), date→date,
  time-millis/-micros→time, uuid→uuid, decimal(p,s)→decimal(p,s); JSON Schema string formats date-time→
  timestamptz, date→date, uuid→uuid; Protobuf google.protobuf.Timestamp→timestamptz;
* nested: Avro record, JSON Schema object with `properties`, Protobuf message → `struct<…>`; Avro array,
  JSON Schema array with one `items` schema, Protobuf repeated field → `list<…>`; Avro map, JSON Schema object
  with only `additionalProperties: {schema}`, Protobuf map field → `map<string,…>` (Protobuf integer/bool
  map keys become their decimal text);
* a nullable union (`["null", T]`, JSON `type: [T, "null"]`, proto3 `optional`) is T;
* what has no column type stays a `string` holding the value as JSON text (its path in `Field.json_paths`):
  unions of two or more non-null branches, recursive types (an Avro record or Protobuf message that contains
  itself), empty records/messages, JSON Schema values without a single type (oneOf/anyOf, untyped, tuple
  arrays), JSON Schema objects whose property names are not column names (`[A-Za-z_][A-Za-z0-9_]*`, unique
  ignoring case).
Every column and nested field derived here is optional (nullable): evolution is the registry's business, and a
field a later schema version drops must not turn the next records into dead letters. Keys a JSON Schema
object's `properties` do not describe are not stored.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from handoff_spark.decode.column_types import ColumnType, ListOf, MapOf, Primitive, Struct, StructField, parse_type

_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_STRING = Primitive("string")

Path = tuple[str, ...]


@dataclass(frozen=True)
class Field:
    """One top-level field of a writer schema as a column. `json_paths`: positions inside the value (`walk()`
    paths: field names, `element`, `value`; `()` is the whole value) stored as JSON text."""

    name: str
    type: str
    json_paths: tuple[Path, ...] = ()

    @property
    def json(self) -> bool:
        """The whole value is JSON text."""
        return () in self.json_paths


class _Typed:
    """A mapped type plus the JSON-text positions under it (relative paths)."""

    def __init__(self, t: ColumnType, json_paths: tuple[Path, ...] = ()):
        self.t, self.json_paths = t, json_paths

    def under(self, step: str) -> tuple[Path, ...]:
        return tuple((step, *p) for p in self.json_paths)


_JSON_TEXT = _Typed(_STRING, ((),))


def _struct(fields: list[tuple[str, _Typed]]) -> _Typed:
    """A struct of `fields`, or JSON text when the names cannot be struct field names (or there are none)."""
    names = [n for n, _ in fields]
    if not fields or not all(_NAME.match(n) for n in names) or len({n.lower() for n in names}) != len(names):
        return _JSON_TEXT
    return _Typed(Struct(tuple(StructField(n, f.t) for n, f in fields)),
                  tuple(p for n, f in fields for p in f.under(n)))


def _list(element: _Typed) -> _Typed:
    return _Typed(ListOf(element.t), element.under("element"))


def _map(value: _Typed) -> _Typed:
    return _Typed(MapOf(_STRING, value.t), value.under("value"))


def _field(name: str, typed: _Typed) -> Field:
    return Field(name, str(typed.t), typed.json_paths)


# ------------------------------------------------------------------------------------------------ Avro
_AVRO_PRIMITIVES = {"int": "int", "long": "long", "float": "float", "double": "double", "boolean": "boolean",
                    "string": "string", "bytes": "binary"}
_AVRO_LOGICAL = {"timestamp-millis": "timestamptz", "timestamp-micros": "timestamptz",
                 "local-timestamp-millis": "timestamp", "local-timestamp-micros": "timestamp", "date": "date",
                 "time-millis": "time", "time-micros": "time", "uuid": "uuid"}


class _AvroNames:
    """Named types (record/enum/fixed) seen so far, by full and short name; records being defined are
    `None` (a reference to one of them is recursion)."""

    def __init__(self) -> None:
        self.types: dict[str, _Typed | None] = {}

    def full(self, t: dict[str, Any], namespace: str) -> tuple[str, str]:
        name = str(t.get("name", ""))
        ns = t.get("namespace", namespace) or ""
        full = name if "." in name or not ns else f"{ns}.{name}"
        return full, full.rsplit(".", 1)[0] if "." in full else ""

    def define(self, full: str, typed: _Typed | None) -> None:
        self.types[full] = typed
        self.types.setdefault(full.rsplit(".", 1)[-1], typed) if typed is not None else None

    def lookup(self, name: str, namespace: str) -> _Typed | None:
        for key in (f"{namespace}.{name}" if namespace and "." not in name else name, name):
            if key in self.types:
                return self.types[key] or _JSON_TEXT  # None: a record referring to itself
        return None


def _avro(t: Any, names: _AvroNames, namespace: str) -> _Typed:
    if isinstance(t, list):
        branches = [b for b in t if b != "null"]
        return _avro(branches[0], names, namespace) if len(branches) == 1 else _JSON_TEXT
    if isinstance(t, str):
        if t in _AVRO_PRIMITIVES:
            return _Typed(parse_type(_AVRO_PRIMITIVES[t]))
        return names.lookup(t, namespace) or _JSON_TEXT  # "null", or a name this schema never defined
    logical, base = t.get("logicalType"), t.get("type")
    if logical == "decimal" and base in ("bytes", "fixed"):
        typed = _Typed(parse_type(f"decimal({int(t['precision'])},{int(t.get('scale', 0))})"))
    elif logical in _AVRO_LOGICAL and not (logical == "uuid" and base not in ("string", "fixed")):
        typed = _Typed(parse_type(_AVRO_LOGICAL[logical]))
    elif base == "record":
        full, ns = names.full(t, namespace)
        names.define(full, None)
        typed = _struct([(f["name"], _avro(f["type"], names, ns)) for f in t.get("fields", [])])
    elif base == "enum":
        typed = _Typed(_STRING)
    elif base == "fixed":
        typed = _Typed(Primitive("fixed", length=int(t["size"])))
    elif base == "array":
        return _list(_avro(t["items"], names, namespace))
    elif base == "map":
        return _map(_avro(t["values"], names, namespace))
    else:
        return _avro(base, names, namespace)  # {"type": "long"} and the like; unknown logical types
    if base in ("record", "enum", "fixed"):
        names.define(names.full(t, namespace)[0], typed)
    return typed


def avro_fields(schema: str | dict[str, Any]) -> list[Field]:
    """Columns of an Avro record schema (its top-level fields)."""
    doc = json.loads(schema) if isinstance(schema, str) else schema
    if not isinstance(doc, dict) or doc.get("type") != "record":
        raise ValueError("an Avro value schema must be a record to become table columns")
    names = _AvroNames()
    full, ns = names.full(doc, "")
    names.define(full, None)
    return [_field(f["name"], _avro(f["type"], names, ns)) for f in doc["fields"]]


# ----------------------------------------------------------------------------------------- JSON Schema
_JSON_FORMATS = {"date-time": "timestamptz", "date": "date", "uuid": "uuid"}


def _json_schema(prop: Any, depth: int = 0) -> _Typed:
    if not isinstance(prop, dict) or depth > 32:
        return _JSON_TEXT
    t = prop.get("type")
    if isinstance(t, list):
        branches = [b for b in t if b != "null"]
        t = branches[0] if len(branches) == 1 else None
    if t in ("integer", "number", "boolean"):
        return _Typed(parse_type({"integer": "long", "number": "double", "boolean": "boolean"}[t]))
    if t == "string":
        return _Typed(parse_type(_JSON_FORMATS.get(prop.get("format", ""), "string")))
    if t == "array" and isinstance(prop.get("items"), dict):
        return _list(_json_schema(prop["items"], depth + 1))
    if t == "object" and isinstance(prop.get("properties"), dict) and prop["properties"]:
        return _struct([(n, _json_schema(p, depth + 1)) for n, p in prop["properties"].items()])
    if t == "object" and isinstance(prop.get("additionalProperties"), dict):
        return _map(_json_schema(prop["additionalProperties"], depth + 1))
    return _JSON_TEXT  # unions, $ref, tuple arrays, free-form objects, untyped


def json_schema_fields(schema: str | dict[str, Any]) -> list[Field]:
    """Columns of an object JSON Schema (its `properties`)."""
    doc = json.loads(schema) if isinstance(schema, str) else schema
    props = doc.get("properties") if isinstance(doc, dict) else None
    if not isinstance(props, dict):
        raise ValueError("a JSON Schema value schema must be an object with properties to become table columns")
    return [_field(name, _json_schema(p)) for name, p in props.items()]


# -------------------------------------------------------------------------------------------- Protobuf
# google.protobuf.FieldDescriptor.TYPE_* numbers (stable in descriptor.proto).
_PROTO_SCALARS = {1: "double", 2: "float", 3: "long", 4: "long", 5: "int", 6: "long", 7: "long", 8: "boolean",
                  9: "string", 12: "binary", 13: "long", 14: "string", 15: "int", 16: "long", 17: "int",
                  18: "long"}
_PROTO_MESSAGE = 11


def _proto_single(f: Any, open_messages: tuple[str, ...]) -> _Typed:
    """A field's type ignoring `repeated`."""
    if f.type != _PROTO_MESSAGE:
        return _Typed(parse_type(_PROTO_SCALARS.get(f.type, "string")))
    return _proto_message(f.message_type, open_messages)


def _proto_message(m: Any, open_messages: tuple[str, ...]) -> _Typed:
    if m.full_name == "google.protobuf.Timestamp":
        return _Typed(parse_type("timestamptz"))
    if m.full_name in open_messages:
        return _JSON_TEXT  # recursive message
    return _struct([(f.name, _proto_field(f, open_messages + (m.full_name,))) for f in m.fields])


def _proto_field(f: Any, open_messages: tuple[str, ...]) -> _Typed:
    if f.is_repeated and f.type == _PROTO_MESSAGE and f.message_type.GetOptions().map_entry:
        return _map(_proto_single(f.message_type.fields_by_name["value"], open_messages))
    if f.is_repeated:
        return _list(_proto_single(f, open_messages))
    return _proto_single(f, open_messages)


def protobuf_fields(descriptor: Any) -> list[Field]:
    """Columns of a Protobuf message descriptor (`google.protobuf.descriptor.Descriptor`)."""
    return [_field(f.name, _proto_field(f, (descriptor.full_name,))) for f in descriptor.fields]


# ------------------------------------------------------------------------------------------ fitting
_WIDER = {("int", "long"), ("float", "double"), ("timestamp", "timestamptz"), ("timestamptz", "timestamp"),
          ("fixed", "binary"), ("uuid", "string")}


def _fits_primitive(w: Primitive, c: Primitive) -> bool:
    if w == c or (w.name, c.name) in _WIDER:
        return True
    return w.name == c.name == "decimal" and w.scale == c.scale and w.precision <= c.precision


def merged(writer: str | ColumnType, column: str | ColumnType, add_fields: bool) -> ColumnType | None:
    """The type a `column` needs to hold a writer field's values: the column's own type, plus (`add_fields`)
    the struct fields only the writer has, appended (a new optional nested field of a later schema version).
    None when some value would not fit without loss. Lossless promotions: Iceberg's (int→long, float→double,
    decimal precision up at the same scale), and fixed→binary, uuid→string (its text); `timestamp` and
    `timestamptz` are both UTC instants in Handoff."""
    w = parse_type(writer) if isinstance(writer, str) else writer
    c = parse_type(column) if isinstance(column, str) else column
    if isinstance(w, Primitive) and isinstance(c, Primitive):
        return c if _fits_primitive(w, c) else None
    if isinstance(w, ListOf) and isinstance(c, ListOf):
        element = merged(w.element, c.element, add_fields)
        return None if element is None else ListOf(element)
    if isinstance(w, MapOf) and isinstance(c, MapOf):
        value = merged(w.value, c.value, add_fields)
        return None if value is None else MapOf(c.key, value)
    if isinstance(w, Struct) and isinstance(c, Struct):
        have = {f.name: f.type for f in w.fields}
        fields = []
        for f in c.fields:
            if f.name not in have:
                fields.append(f)  # the writer lacks it: null
                continue
            sub = merged(have.pop(f.name), f.type, add_fields)
            if sub is None:
                return None
            fields.append(StructField(f.name, sub))
        if add_fields:
            fields += [StructField(n, t) for n, t in have.items()]
        return Struct(tuple(fields))
    return None


def fits(writer_type: str, column_type: str) -> bool:
    """Can values of a writer field of `writer_type` be stored in a column of `column_type` without loss?
    (Struct fields the column lacks are not stored: the caller adds them under evolution=compatible.)"""
    return merged(writer_type, column_type, False) is not None


def widest(a: str, b: str) -> str | None:
    """One type holding the values of both (two writer versions of a field the columns do not declare)."""
    out = merged(b, a, True) or merged(a, b, True)
    return None if out is None else str(out)
