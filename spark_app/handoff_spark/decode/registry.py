"""Schema Registry formats (`source.format: avro | protobuf | jsonSchema`) → rows, dead letters, schema ids.

Values are in the Confluent wire format: magic byte 0, the writer schema's 4-byte big-endian id, then the
payload (Protobuf: a varint list of message indexes first). Each writer schema is fetched once per process by
id with confluent-kafka's `SchemaRegistryClient` and kept (ids are immutable in a registry). Decoding is direct
— fastavro's `schemaless_reader` on the parsed writer schema, the Protobuf message class built from the
writer's FileDescriptorProto, `json.loads` + the writer's JSON Schema validator — because confluent-kafka's
per-record deserializers add a subject lookup and rule machinery per call (bench/spark/decode/decode_formats.py measures
both: fastavro direct was the faster, see docs/design/data-plane-contract.md).

Never silent: a record without the magic byte (`no-schema-id`), with an id the registry does not know
(`unknown-schema`), whose payload does not decode with its writer schema (`undecodable`), whose writer field
does not fit the declared column type (`type-mismatch`), or that lacks a required column (`missing-required`)
is a dead letter (or halts, per `schema.onIncompatible`), like a bad JSON record.

Columns: the declared ones (filled by `registry_columns` from the subject's latest schema when the spec omits
them), then under `evolution=compatible` every writer field not declared, typed from the writer schema (so a
new optional field of a compatible version becomes a new table column through the same path as a new JSON
field, even when all its values are null); a field a version adds inside a record grows that struct column in
the batch (the Iceberg sink then adds the nested field). Nested values (struct/list/map) are built by
`pa.array` from the decoded dicts and lists with `decode.arrow_type`, after `_shaper` fixes what Arrow would not
take as it is.
"""
from __future__ import annotations

import base64
import datetime as dt
import decimal
import io
import json
import struct
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, cast

import pyarrow as pa

from handoff_spark.decode import registry_schema as rs
from handoff_spark.config import SchemaPolicy, SchemaRegistry
from handoff_spark.decode.column_types import ColumnType, ListOf, MapOf, Primitive, Struct, parse_type, walk
from handoff_spark.decode.records import (DeadLetter, Reason, SchemaIncompatible, arrow_or_culprits, arrow_type,
                                          assemble_table, value_converter)

MAGIC = 0


class FrameError(ValueError):
    """The value is not in the Confluent wire format."""


def parse_frame(value: bytes) -> tuple[int, int]:
    """(schema id, payload start) of a Confluent-framed value."""
    if len(value) < 5 or value[0] != MAGIC:
        raise FrameError("value does not start with the Schema Registry magic byte 0 and a 4-byte schema id")
    return struct.unpack_from(">I", value, 1)[0], 5


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise FrameError("truncated Protobuf message-index list")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos  # zigzag
        shift += 7


def protobuf_message_indexes(value: bytes, pos: int) -> tuple[list[int], int]:
    """The message-index path after the schema id (`[0]` = the first message, written as a single 0)."""
    count, pos = _read_varint(value, pos)
    if count == 0:
        return [0], pos
    if count < 0 or count > 100:
        raise FrameError(f"implausible Protobuf message-index count {count}")
    indexes = []
    for _ in range(count):
        i, pos = _read_varint(value, pos)
        indexes.append(i)
    return indexes, pos


# ------------------------------------------------------------------------------------- writer schemas
def _json_default(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(v).decode()
    if isinstance(v, (dt.datetime, dt.date)):
        return v.isoformat()
    if isinstance(v, (decimal.Decimal, uuid.UUID)):
        return str(v)
    raise TypeError(f"{type(v).__name__} is not JSON serializable")


def _as_json_text(v: Any) -> Any:
    return None if v is None else json.dumps(v, separators=(",", ":"), default=_json_default)


def _key_text(k: Any) -> str:
    """A map key as text (Protobuf maps may have integer or bool keys; JSON spells booleans lower-case)."""
    return ("true" if k else "false") if isinstance(k, bool) else str(k)


def _uuid_bytes(v: Any) -> Any:
    """An Avro uuid (fastavro: `uuid.UUID`; a uuid on `fixed` may come as its 16 bytes) → a uuid column's bytes."""
    return v.bytes if isinstance(v, uuid.UUID) else uuid.UUID(v).bytes if isinstance(v, str) else v


def _uuid_text(v: Any) -> Any:
    """An Avro uuid → its canonical text, for a declared `string` column."""
    if isinstance(v, (bytes, bytearray)) and len(v) == 16:
        return str(uuid.UUID(bytes=bytes(v)))
    return str(v)


def _shaper(target: ColumnType, writer: rs.Field, native: bool) -> Callable[[Any], Any] | None:
    """How one decoded value of `writer` becomes what `pa.array(…, arrow_type(target))` takes (None: as it is).
    Native values (Avro, Protobuf: datetimes, Decimals, bytes, dicts, lists) mostly are already; this fixes
    JSON-text positions, UUIDs (bytes for a uuid column, text for a string one) and map keys (text). JSON
    Schema values are JSON, so after the JSON-text positions they go through decode.py's own per-value
    converter (ISO timestamps, dates, UUID strings, integer ranges; a bad one raises)."""
    json_paths = frozenset(writer.json_paths)
    writer_types = dict(walk(parse_type(writer.type)))

    def build(t: ColumnType, path: rs.Path) -> Callable[[Any], Any] | None:
        if path in json_paths:
            return _as_json_text
        if isinstance(t, Struct):
            subs = [(f.name, s) for f in t.fields if (s := build(f.type, path + (f.name,))) is not None]
            if not subs:
                return None

            def struct(v: dict[str, Any]) -> dict[str, Any]:
                out = dict(v)
                for name, sub in subs:
                    x = out.get(name)
                    if x is not None:
                        out[name] = sub(x)
                return out
            return struct
        if isinstance(t, ListOf):
            element = build(t.element, path + ("element",))
            return None if element is None else lambda v: [None if x is None else element(x) for x in v]
        if isinstance(t, MapOf):
            value = build(t.value, path + ("value",))
            if value is None and not native:
                return None
            if value is None:
                return lambda v: {_key_text(k): x for k, x in v.items()}
            return lambda v: {_key_text(k): None if x is None else value(x) for k, x in v.items()}
        if native and writer_types.get(path) == Primitive("uuid"):
            return _uuid_bytes if t == Primitive("uuid") else _uuid_text
        return None

    shape = build(target, ())
    if native:
        return shape
    convert = value_converter(target)
    return convert if shape is None else lambda v: convert(shape(v))


@dataclass
class WriterSchema:
    """One registry schema id, ready to decode: `decode(value, payload start)` → dict of top-level fields."""

    schema_id: int
    fields: list[rs.Field]
    decode: Callable[[bytes, int], dict[str, Any]]
    versions: list[tuple[str, int]] = field(default_factory=list)
    #: values are Python natives (Avro, Protobuf), not JSON (JSON Schema)
    native: bool = True


def _avro_writer(schema_id: int, schema_str: str) -> WriterSchema:
    from fastavro import parse_schema, schemaless_reader

    parsed = parse_schema(json.loads(schema_str))

    def decode(value: bytes, pos: int) -> dict[str, Any]:
        record = schemaless_reader(io.BytesIO(memoryview(value)[pos:]), parsed, None)
        if not isinstance(record, dict):
            raise ValueError("Avro value is not a record")
        return record

    return WriterSchema(schema_id, rs.avro_fields(schema_str), decode)


def _json_schema_writer(schema_id: int, schema_str: str) -> WriterSchema:
    from jsonschema.validators import validator_for

    doc = json.loads(schema_str)
    validator = validator_for(doc)(doc)

    def decode(value: bytes, pos: int) -> dict[str, Any]:
        record = json.loads(memoryview(value)[pos:].tobytes())
        error = next(iter(validator.iter_errors(record)), None)
        if error is not None:
            raise ValueError(f"does not match JSON Schema {schema_id}: {error.message[:200]}")
        if not isinstance(record, dict):
            raise ValueError("JSON value is not an object")
        return record

    return WriterSchema(schema_id, rs.json_schema_fields(doc), decode, native=False)


def _protobuf_writer(schema_id: int, schema_str: str) -> WriterSchema:
    """The registry returns the schema as a base64 FileDescriptorProto when asked for `format=serialized`
    (what confluent-kafka's serializers register). Schemas that import other files (references) are not
    resolved yet: their records are `undecodable` dead letters, never dropped."""
    from google.protobuf import descriptor_pb2, descriptor_pool, timestamp_pb2
    from google.protobuf.message_factory import GetMessageClass

    fdp = descriptor_pb2.FileDescriptorProto()
    fdp.ParseFromString(base64.standard_b64decode(schema_str.encode("ascii")))
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.AddSerializedFile(fdp.SerializeToString())
    fd = pool.FindFileByName(fdp.name)
    top = list(fd.message_types_by_name.values())
    ordered = [fd.message_types_by_name[m.name] for m in fdp.message_type]

    def descriptor_at(indexes: list[int]) -> Any:
        desc = ordered[indexes[0]]
        for i in indexes[1:]:
            desc = desc.nested_types[i]
        return desc

    classes: dict[tuple[int, ...], Any] = {}

    def to_python(msg: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in msg.DESCRIPTOR.fields:
            v = getattr(msg, f.name)
            if f.is_repeated:
                out[f.name] = [_proto_value(f, x) for x in v] if f.message_type is None or not \
                    f.message_type.GetOptions().map_entry else {k: _proto_value(f.message_type.fields_by_name["value"], x)
                                                                for k, x in v.items()}
            elif f.type == 11:
                out[f.name] = _proto_value(f, v) if msg.HasField(f.name) else None
            elif f.has_presence and not msg.HasField(f.name):
                out[f.name] = None
            else:
                out[f.name] = _proto_value(f, v)
        return out

    def _proto_value(f: Any, v: Any) -> Any:
        if f.type == 11:
            if f.message_type.full_name == "google.protobuf.Timestamp":
                return v.ToDatetime(tzinfo=dt.timezone.utc)
            return to_python(v)
        if f.type == 14:
            ev = f.enum_type.values_by_number.get(v)
            return ev.name if ev is not None else v
        return v

    def decode(value: bytes, pos: int) -> dict[str, Any]:
        indexes, pos = protobuf_message_indexes(value, pos)
        if indexes != [0]:
            # The columns are the first message's fields; another message's values would land in the wrong
            # columns (or none), so they are dead letters rather than silently emptied rows.
            raise ValueError(f"message index path {indexes} names {descriptor_at(indexes).full_name}; the "
                             f"columns come from the schema's first message {ordered[0].full_name}: put the "
                             f"value message first in its .proto file")
        key = tuple(indexes)
        cls = classes.get(key)
        if cls is None:
            cls = classes[key] = GetMessageClass(descriptor_at(indexes))
        msg = cls()
        msg.ParseFromString(memoryview(value)[pos:].tobytes())
        return to_python(msg)

    if not top:
        raise ValueError("Protobuf schema has no message")
    return WriterSchema(schema_id, rs.protobuf_fields(ordered[0]), decode)


_WRITERS = {"avro": _avro_writer, "jsonSchema": _json_schema_writer, "protobuf": _protobuf_writer}
_REGISTRY_TYPES = {"avro": "AVRO", "jsonSchema": "JSON", "protobuf": "PROTOBUF"}


class UnknownSchema(LookupError):
    """The registry has no schema with this id (or one of another format)."""


class SchemaCache:
    """Writer schemas by id for one registry; shared by the tasks of an executor process."""

    def __init__(self, registry: SchemaRegistry, fmt: str) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        conf: dict[str, Any] = {"url": registry.url}
        if registry.basic_auth_user_info:
            conf["basic.auth.user.info"] = registry.basic_auth_user_info
        self.client = SchemaRegistryClient(conf)
        self.fmt = fmt
        self._by_id: dict[int, WriterSchema | UnknownSchema] = {}
        self._lock = threading.Lock()

    def get(self, schema_id: int) -> WriterSchema:
        found = self._by_id.get(schema_id)
        if found is None:
            found = self._fetch(schema_id)
            with self._lock:
                self._by_id[schema_id] = found
        if isinstance(found, UnknownSchema):
            raise found
        return found

    def _fetch(self, schema_id: int) -> WriterSchema | UnknownSchema:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            schema = self.client.get_schema(schema_id, fmt="serialized" if self.fmt == "protobuf" else None)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                return UnknownSchema(f"schema id {schema_id} is not in the registry ({exc.error_message})")
            raise  # registry down or refusing: fail the task (retried), never dead-letter good records
        kind = schema.schema_type or "AVRO"
        if kind != _REGISTRY_TYPES[self.fmt]:
            return UnknownSchema(f"schema id {schema_id} is {kind}, the source format is {self.fmt}")
        try:
            writer = _WRITERS[self.fmt](schema_id, schema.schema_str)
        except Exception as exc:  # noqa: BLE001 - a schema this decoder cannot use: its records are dead letters
            return UnknownSchema(f"schema id {schema_id} cannot be used: {exc}")
        try:
            writer.versions = sorted((v.subject, v.version) for v in self.client.get_schema_versions(schema_id))
        except SchemaRegistryError:
            writer.versions = []
        return writer


_caches: dict[tuple[str, str | None, str], SchemaCache] = {}
_caches_lock = threading.Lock()


def schema_cache(registry: SchemaRegistry, fmt: str) -> SchemaCache:
    key = (registry.url, registry.basic_auth_user_info, fmt)
    with _caches_lock:
        cache = _caches.get(key)
        if cache is None:
            cache = _caches[key] = SchemaCache(registry, fmt)
        return cache


# ------------------------------------------------------------------------------------------- decoding
@dataclass(frozen=True)
class SchemaUse:
    """A writer schema the batch's table rows were written with (for the ledger)."""

    schema_id: int
    versions: tuple[tuple[str, int], ...]


def decode_registry_batch(raw: pa.Table, policy: SchemaPolicy, fmt: str, registry: SchemaRegistry,
                          cache: SchemaCache | None = None) -> tuple[pa.Table, list[DeadLetter], list[SchemaUse]]:
    """Decode one raw batch of framed values. Returns (table, dead letters, writer schemas of the rows)."""
    cache = cache or schema_cache(registry, fmt)
    values = raw.column("value").to_pylist()
    topics, partitions, offsets = raw.column("topic"), raw.column("partition"), raw.column("offset")
    declared = {c.name: c for c in policy.columns}
    compatible = policy.evolution == "compatible"
    required = [c for c in policy.columns if c.required]
    records: list[dict[str, Any]] = []
    # The batch's column types: declared ones grown by struct fields a writer adds (compatible), then the
    # writer fields not declared (compatible), typed from the writer schemas.
    batch_types: dict[str, str] = {c.name: c.type for c in policy.columns}
    extra_types: dict[str, str] = {}
    misfit: dict[int, str | None] = {}  # schema id → why its fields do not fit the columns (None: they fit)
    shapers: dict[int, list[tuple[str, Callable[[Any], Any]]]] = {}
    used: dict[int, WriterSchema] = {}
    keep: list[int] = []
    dead: list[DeadLetter] = []

    def reject(i: int, reason: str, detail: str) -> None:
        dead.append(DeadLetter(i, topics[i].as_py(), partitions[i].as_py(), offsets[i].as_py(),
                               cast(Reason, reason), detail))

    def take(writer: WriterSchema) -> str | None:
        """Fit a writer schema to the batch's columns (growing them); why it does not fit, or None."""
        grown: dict[str, str] = {}
        extra: dict[str, str] = {}
        shaping: list[tuple[str, Callable[[Any], Any]]] = []
        for f in writer.fields:
            col = declared.get(f.name)
            if col is not None:
                fit = rs.merged(f.type, batch_types[f.name], compatible)
                if fit is None:
                    return f"{f.name}: writer schema {writer.schema_id} has {f.type}, the column is {col.type}"
                grown[f.name] = str(fit)
            elif compatible:
                seen = extra_types.get(f.name)
                both = f.type if seen is None else rs.widest(seen, f.type)
                if both is None:
                    return f"{f.name}: writer schema {writer.schema_id} has {f.type}, this batch has {seen}"
                extra[f.name], fit = both, parse_type(f.type)
            else:
                continue  # evolution=none: not stored
            shape = _shaper(fit, f, writer.native)
            if shape is not None:
                shaping.append((f.name, shape))
        batch_types.update(grown)
        extra_types.update(extra)
        shapers[writer.schema_id] = shaping
        return None

    max_bytes = policy.limits.max_value_bytes
    for i, value in enumerate(values):
        if value is None:
            reject(i, "null-value", "record value is null (tombstone)")
            continue
        if len(value) > max_bytes:
            reject(i, "too-large", f"value is {len(value)} bytes, over schema.limits.maxValueBytes={max_bytes}")
            continue
        try:
            schema_id, pos = parse_frame(value)
        except FrameError as exc:
            reject(i, "no-schema-id", str(exc))
            continue
        try:
            writer = cache.get(schema_id)
        except UnknownSchema as exc:
            reject(i, "unknown-schema", str(exc))
            continue
        if schema_id not in misfit:
            misfit[schema_id] = take(writer)
        if misfit[schema_id] is not None:
            reject(i, "type-mismatch", cast(str, misfit[schema_id]))
            continue
        try:
            record = writer.decode(value, pos)
        except Exception as exc:  # noqa: BLE001 - any decoder error means this record's bytes are bad
            reject(i, "undecodable", f"payload does not decode with writer schema {schema_id}: "
                                     f"{type(exc).__name__}: {str(exc)[:200]}")
            continue
        if not isinstance(record, dict):
            reject(i, "undecodable", f"writer schema {schema_id}: the payload is not a record")
            continue
        missing = next((c.name for c in required if record.get(c.name) is None), None)
        if missing is not None:
            reject(i, "missing-required", f"{missing}: required column is missing or null")
            continue
        try:
            for name, shape in shapers[schema_id]:
                v = record.get(name)
                if v is not None:
                    record[name] = shape(v)
        except Exception as exc:  # noqa: BLE001 - e.g. a JSON Schema date-time string that is not ISO-8601
            reject(i, "undecodable", f"writer schema {schema_id}: {name}: {str(exc)[:200]}")
            continue
        keep.append(i)
        records.append(record)
        used.setdefault(schema_id, writer)
    batch_policy = policy.model_copy(update={"columns": [c.model_copy(update={"type": batch_types[c.name]})
                                                         for c in policy.columns]})
    wanted = [(c.name, c.type) for c in batch_policy.columns] + list(extra_types.items())
    built: dict[str, pa.Array] = {}
    while len(built) < len(wanted):  # nested values are assembled by Arrow from dicts and lists
        name, typ = wanted[len(built)]
        arr = arrow_or_culprits([r.get(name) for r in records], arrow_type(typ), name)
        if isinstance(arr, pa.Array):
            built[name] = arr
            continue
        for pos in sorted(arr, reverse=True):  # values Arrow refuses: their records are dead letters
            dead.append(DeadLetter(keep[pos], topics[keep[pos]].as_py(), partitions[keep[pos]].as_py(),
                                   offsets[keep[pos]].as_py(), "unconvertible", arr[pos]))
            del keep[pos], records[pos]
        built.clear()
    dead.sort(key=lambda d: d.index)
    if dead and policy.on_incompatible == "halt":
        first = dead[0]
        raise SchemaIncompatible(
            f"record {first.topic}[{first.partition}]@{first.offset} cannot be decoded: {first.reason}: "
            f"{first.detail} ({len(dead)} such record(s) in this batch). schema.onIncompatible=halt stops the "
            f"hand-off instead of skipping it. Fix: correct the producer or the registry's schema, or set "
            f"spec.schema.onIncompatible=deadLetter with spec.deadLetter.topic to divert such records.")
    columns = {c.name: built[c.name] for c in batch_policy.columns}
    extras = {name: built[name] for name in extra_types}
    table = assemble_table(columns, batch_policy, extras, raw, pa.array(keep, pa.int64()))
    uses = [SchemaUse(sid, tuple(w.versions)) for sid, w in sorted(used.items())]
    return table, dead, uses


# ------------------------------------------------------------------------------------ driver: columns
def subject_for(topic: str) -> str:
    """Confluent's default TopicNameStrategy for record values."""
    return f"{topic}-value"


def registry_columns(cfg: Any) -> Any:
    """The AppConfig with `schema.columns` taken from the registry (latest version of `<topic>-value` of each
    topic, fields in order, first topic wins on a name clash) when the spec declares none; unchanged otherwise.
    Runs on the driver before the table is created, so the table starts with the registry's columns."""
    from handoff_spark.config import Column

    if cfg.source.format not in _WRITERS or cfg.schema_.columns:
        return cfg
    assert cfg.source.schema_registry is not None
    cache = schema_cache(cfg.source.schema_registry, cfg.source.format)
    columns: dict[str, Column] = {}
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    for topic in cfg.source.topics:
        try:
            latest = cache.client.get_latest_version(subject_for(topic))
            writer = cache.get(latest.schema_id)
        except (SchemaRegistryError, UnknownSchema) as exc:
            raise ValueError(f"source.schemaRegistry: no usable schema for subject {subject_for(topic)!r} "
                             f"({exc}); register the topic's value schema first or declare spec.schema.columns"
                             ) from exc
        for f in writer.fields:
            columns.setdefault(f.name, Column(name=f.name, type=f.type))
    if not columns:
        raise ValueError(f"the registry's latest schemas for {', '.join(map(subject_for, cfg.source.topics))} "
                         f"have no fields; declare spec.schema.columns")
    schema = cfg.schema_.model_copy(update={"columns": list(columns.values())})
    return cfg.model_copy(update={"schema_": schema})
