"""Schema Registry schemas (Avro, JSON Schema, Protobuf) → Handoff column types. Pure: no registry calls.

Why its own module: the column type system is growing (struct/list/map, timestamptz, uuid ...); the mapping
from registry schemas lives here alone so it follows that change in one place.

Mapping (top-level fields only become columns):
* scalars map to their column type (Avro int→int, long→long, float, double, boolean, string, bytes/fixed→binary,
  enum→string; JSON Schema integer→long, number→double, boolean, string; Protobuf int32/sint32/sfixed32→int,
  int64/uint32/... →long, float, double, bool, string, bytes→binary, enum→string);
* logical types: Avro timestamp-millis/-micros→timestamp, date→date, decimal(p,s)→decimal(p,s), uuid→string;
  JSON Schema string with format date-time→timestamp, date→date; Protobuf google.protobuf.Timestamp→timestamp;
* a nullable union (`["null", T]`, JSON `type: [T, "null"]`, proto3 `optional`) is T;
* nested records, arrays, maps and other unions become a `string` column holding the value as JSON text
  (`Field.json`): the column types have no struct/list/map yet.
Every column derived here is optional (nullable): evolution is the registry's business, and a field a later
schema version drops must not turn the next records into dead letters.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")


@dataclass(frozen=True)
class Field:
    """One top-level field of a writer schema as a column: `json` = the value is stored as JSON text."""

    name: str
    type: str
    json: bool = False


# ------------------------------------------------------------------------------------------------ Avro
_AVRO_PRIMITIVES = {"int": "int", "long": "long", "float": "float", "double": "double", "boolean": "boolean",
                    "string": "string", "bytes": "binary"}


def _avro_type(t: Any) -> tuple[str, bool]:
    if isinstance(t, list):
        branches = [b for b in t if b != "null"]
        if len(branches) == 1:
            return _avro_type(branches[0])
        return "string", True
    if isinstance(t, str):
        if t in _AVRO_PRIMITIVES:
            return _AVRO_PRIMITIVES[t], False
        return "string", True  # a named type defined elsewhere (record/enum/fixed): JSON text
    logical = t.get("logicalType")
    base = t.get("type")
    if logical in ("timestamp-millis", "timestamp-micros", "local-timestamp-millis", "local-timestamp-micros"):
        return "timestamp", False
    if logical == "date":
        return "date", False
    if logical == "decimal" and base in ("bytes", "fixed"):
        return f"decimal({int(t['precision'])},{int(t.get('scale', 0))})", False
    if logical == "uuid":
        return "string", False
    if base == "enum":
        return "string", False
    if base == "fixed":
        return "binary", False
    if base in _AVRO_PRIMITIVES:
        return _AVRO_PRIMITIVES[base], False
    return "string", True  # record, array, map


def avro_fields(schema: str | dict[str, Any]) -> list[Field]:
    """Columns of an Avro record schema (its top-level fields)."""
    doc = json.loads(schema) if isinstance(schema, str) else schema
    if not isinstance(doc, dict) or doc.get("type") != "record":
        raise ValueError("an Avro value schema must be a record to become table columns")
    return [Field(f["name"], *_avro_type(f["type"])) for f in doc["fields"]]


# ----------------------------------------------------------------------------------------- JSON Schema
_JSON_SCHEMA_SCALARS = {"integer": "long", "number": "double", "boolean": "boolean"}
_JSON_SCHEMA_STRING_FORMATS = {"date-time": "timestamp", "date": "date"}


def _json_schema_type(prop: dict[str, Any]) -> tuple[str, bool]:
    t = prop.get("type")
    if isinstance(t, list):
        branches = [b for b in t if b != "null"]
        t = branches[0] if len(branches) == 1 else None
    if not isinstance(t, str):
        return "string", True  # unions, untyped
    if t in _JSON_SCHEMA_SCALARS:
        return _JSON_SCHEMA_SCALARS[t], False
    if t == "string":
        return _JSON_SCHEMA_STRING_FORMATS.get(prop.get("format"), "string"), False
    return "string", True  # object, array


def json_schema_fields(schema: str | dict[str, Any]) -> list[Field]:
    """Columns of an object JSON Schema (its `properties`)."""
    doc = json.loads(schema) if isinstance(schema, str) else schema
    props = doc.get("properties") if isinstance(doc, dict) else None
    if not isinstance(props, dict):
        raise ValueError("a JSON Schema value schema must be an object with properties to become table columns")
    return [Field(name, *_json_schema_type(p if isinstance(p, dict) else {})) for name, p in props.items()]


# -------------------------------------------------------------------------------------------- Protobuf
# google.protobuf.FieldDescriptor.TYPE_* numbers (stable in descriptor.proto).
_PROTO_SCALARS = {1: "double", 2: "float", 3: "long", 4: "long", 5: "int", 6: "long", 7: "long", 8: "boolean",
                  9: "string", 12: "binary", 13: "long", 14: "string", 15: "int", 16: "long", 17: "int",
                  18: "long"}
_PROTO_MESSAGE = 11


def protobuf_fields(descriptor: Any) -> list[Field]:
    """Columns of a Protobuf message descriptor (`google.protobuf.descriptor.Descriptor`)."""
    out = []
    for f in descriptor.fields:
        repeated = f.is_repeated  # maps are repeated entries too
        if f.type == _PROTO_MESSAGE and not repeated:
            if f.message_type.full_name == "google.protobuf.Timestamp":
                out.append(Field(f.name, "timestamp"))
            else:
                out.append(Field(f.name, "string", True))
        elif repeated:
            out.append(Field(f.name, "string", True))
        else:
            out.append(Field(f.name, _PROTO_SCALARS.get(f.type, "string")))
    return out


# ------------------------------------------------------------------------------------------ fitting
_WIDER = {("int", "long"), ("float", "double")}


def fits(writer_type: str, column_type: str) -> bool:
    """Can values of a writer field of `writer_type` be stored in a column of `column_type` without loss?
    (Iceberg's own promotions, plus decimal precision growth at the same scale.)"""
    if writer_type == column_type or (writer_type, column_type) in _WIDER:
        return True
    wm, cm = _DECIMAL.match(writer_type), _DECIMAL.match(column_type)
    if wm and cm:
        return int(wm.group(2)) == int(cm.group(2)) and int(wm.group(1)) <= int(cm.group(1))
    return False
