"""The app config: the contract between the operator (which renders it from a StreamTableHandoff) and
the Spark driver (which runs it). Kept free of pyspark imports so the operator can use it.

Field names are camelCase on the wire (as in the CR), snake_case in Python.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

# The column-type grammar, as the CRD's models need it too (`handoff_operator.models` validates `spec.schema` with
# the decoder's own grammar, through this module rather than the decoder's): its pattern for the CRD schema, and
# the canonical spelling a declared type is stored in.
from handoff_spark.decode.column_types import PATTERN as COLUMN_TYPE_PATTERN, canonical


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid",
                              frozen=True)


#: A declared column type (grammar in `column_types`: primitives, decimal(p,s), fixed[n], struct<…>, list<…>,
#: map<string,…>), checked and stored in its canonical spelling.
ColumnType = Annotated[str, Field(max_length=4096), AfterValidator(canonical)]  # the parser says what is wrong


class Column(_Model):
    """One declared column. `required` columns reject records that lack them (DLQ or halt)."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    type: ColumnType
    required: bool = False
    doc: str | None = None


#: Defaults of `RecordLimits` (the CR's `spec.schema.limits` repeats them).
DEFAULT_MAX_DEPTH = 64
DEFAULT_MAX_VALUE_BYTES = 8 * 1024 * 1024
#: The deepest nesting a limit may allow: Python's JSON parser recurses once a level within the interpreter's
#: recursion limit (1,000 frames, a Spark worker already uses some), and the C decoder's bound is the same.
MAX_DEPTH_LIMIT = 512
MAX_VALUE_BYTES_LIMIT = 256 * 1024 * 1024


class RecordLimits(_Model):
    """What one record may be before it is a dead letter (reason `too-deep` / `too-large`), whatever it holds.

    Why explicit limits: a single record must never stop a hand-off. Without them a value nested thousands of
    levels deep exhausted the per-record parser's recursion and failed the whole batch on every restart. The
    default value size keeps every row appendable to BigQuery (its Storage Write API takes at most 10 MB per
    request)."""

    max_depth: int = Field(default=DEFAULT_MAX_DEPTH, ge=1, le=MAX_DEPTH_LIMIT,
                           description="Containers (objects, arrays) nested in one another, the value's own "
                                       "object counting as 1.")
    max_value_bytes: int = Field(default=DEFAULT_MAX_VALUE_BYTES, ge=1, le=MAX_VALUE_BYTES_LIMIT,
                                 description="Bytes of one record's value.")


class SchemaPolicy(_Model):
    """What to do when records or the table drift from the declared schema.

    `evolution=compatible` adds new optional columns / widens types on the commit path; `none` never
    changes the table. Incompatible records (or changes) either halt the query with a clear error or go
    to the dead-letter topic (`onIncompatible`). Never a silent narrowing.
    """

    columns: list[Column] = Field(default_factory=list)
    evolution: Literal["compatible", "none"] = "compatible"
    on_incompatible: Literal["halt", "deadLetter"] = "deadLetter"
    event_time_column: str | None = Field(
        default=None, description="Column holding the event time used for freshness; default: Kafka timestamp.")
    limits: RecordLimits = Field(default_factory=RecordLimits)


SourceFormat = Literal["json", "raw", "avro", "protobuf", "jsonSchema"]
REGISTRY_FORMATS = ("avro", "protobuf", "jsonSchema")


_IDENT = r"^[A-Za-z_][A-Za-z0-9_]*$"


class Lookup(_Model):
    """A table of the handoff's catalog, joinable in `transform.sql` under `name` (enrichment)."""

    name: str = Field(pattern=_IDENT, description="The name the SQL uses, e.g. customers.")
    table: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$",
                       description="The catalog table, e.g. crm.customers.")


class Transform(_Model):
    """Spark SQL over each micro-batch's decoded records, run by Spark (`source`: the declared columns plus
    `_kafka_topic`, `_kafka_partition`, `_kafka_offset`, `_kafka_timestamp`). Its output must fit the declared
    schema; it must be deterministic (a replay drops and derives what the first run did)."""

    sql: str = Field(min_length=1, max_length=65536,
                     description="e.g. SELECT id, upper(customer) AS customer, amount FROM source WHERE amount > 0")
    lookups: list[Lookup] = Field(default_factory=list)


class Dedupe(_Model):
    """Business-key deduplication: a record whose keys were seen within `withinSeconds` (of event time: the
    event-time column, else the Kafka timestamp) is dropped; the drop is counted."""

    keys: list[str] = Field(min_length=1)
    within_seconds: float = Field(gt=0)


class EventTime(_Model):
    """The event-time column, the watermark's delay, and what happens to a record older than the watermark."""

    column: str = Field(pattern=_IDENT)
    watermark_seconds: float = Field(default=0.0, ge=0)
    late_records: Literal["deadLetter", "keep"] = "deadLetter"


class SchemaRegistry(_Model):
    """A Confluent-compatible Schema Registry (values framed as magic byte 0 + 4-byte schema id)."""

    url: str = Field(description="Base URL of the Confluent REST API, e.g. http://registry:8081")
    # `user:password` for HTTP basic auth; resolved from a Secret by the operator.
    basic_auth_user_info: str | None = None


class KafkaSource(_Model):
    bootstrap_servers: str
    topics: list[str] = Field(min_length=1)
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    format: SourceFormat = "json"
    schema_registry: SchemaRegistry | None = None
    max_records_per_batch: int | None = Field(default=None, gt=0)
    min_partitions: int | None = Field(
        default=None, gt=0, description="Split large offset ranges so a batch runs at least this many tasks "
                                        "(Spark's Kafka minPartitions). Default: 3 × the cores the executors have now.")
    # Extra librdkafka settings (security etc.); secrets arrive already resolved by the operator.
    properties: dict[str, str] = Field(default_factory=dict)
    # What to do when the offset to resume from was deleted by retention: fail loudly, or skip
    # to the earliest available offset and record the gap in the ledger.
    on_offset_out_of_range: Literal["fail", "earliest"] = "fail"
    consumer_group: str | None = Field(
        default=None, description="Group whose offsets are committed after each durable table commit "
                                  "(for lag tools). Default: handoff-<handoffId>.")


class IcebergSink(_Model):
    kind: Literal["iceberg"] = "iceberg"
    catalog_name: str = "handoff"
    catalog_properties: dict[str, str] = Field(default_factory=dict)
    table: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$",
                       description="namespace.table")
    partition_by: list[str] = Field(default_factory=list, description="e.g. ['day(ts)', 'bucket(16, id)', 'region']")
    auto_create: bool = True
    commit_retries: int = Field(default=5, ge=0)


class BigQuerySink(_Model):
    kind: Literal["bigquery"] = "bigquery"
    project: str
    dataset: str
    table: str
    write_mode: Literal["exactlyOnce", "atLeastOnce"] = "exactlyOnce"
    credentials_file: str | None = None
    # Endpoints override for emulators/tests; None = Google's.
    rest_endpoint: str | None = None
    grpc_endpoint: str | None = None
    partition_by: str | None = Field(default=None, description="time-partitioning column (DAY)")
    cluster_by: list[str] = Field(default_factory=list)
    auto_create: bool = True
    # Storage Write API tuning (defaults suit real BigQuery; the benchmark and drills vary them). Requests are
    # cut at this many rows / bytes (BigQuery's cap is 10 MB), with up to `max_inflight` pipelined per stream.
    append_format: Literal["arrow", "proto"] = "arrow"
    max_rows_per_request: int = Field(default=10_000, gt=0)
    max_request_bytes: int = Field(default=9 * 1024 * 1024, ge=1024, le=10_000_000)
    max_inflight: int = Field(default=16, gt=0, le=1000)


class Maintenance(_Model):
    """Table upkeep done by the driver between batches."""

    expire_older_than_seconds: int | None = Field(
        default=None, description="Replay window: snapshots older than this may be expired (never newer).")
    every_batches: int = Field(default=50, gt=0)
    compact: bool = True
    orphan_min_age_seconds: int = Field(
        default=600, ge=0, description="Unreferenced data files younger than this are never swept (in-flight writes).")


class BackfillRange(_Model):
    """A bounded re-read `[from, to)` per partition, committed under its own ledger query (`AppConfig.query_name`)
    so the stream's own position does not move. Only the named partitions are read."""

    from_: dict[str, dict[int, int]] = Field(alias="from")
    to: dict[str, dict[int, int]]

    def ranges(self) -> dict[tuple[str, int], tuple[int, int]]:
        return {(t, p): (start, self.to[t][p]) for t, parts in self.from_.items() for p, start in parts.items()}


class AppConfig(_Model):
    handoff_id: str = Field(description="namespace/name of the StreamTableHandoff; recorded in every commit")
    query_name: str = "handoff"
    source: KafkaSource
    sink: Annotated[IcebergSink | BigQuerySink, Field(discriminator="kind")]
    schema_: SchemaPolicy = Field(default_factory=SchemaPolicy, alias="schema")
    dead_letter_topic: str | None = None
    trigger_interval_seconds: float = Field(default=10.0, ge=0)
    checkpoint_location: str
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    progress_file: str | None = Field(default=None, description="JSON progress record rewritten after each batch")
    maintenance: Maintenance = Field(default_factory=Maintenance)
    spark_conf: dict[str, str] = Field(default_factory=dict)
    backfill: BackfillRange | None = Field(default=None, description="set for a Backfill run (its own query)")
    transform: Transform | None = None
    dedupe: Dedupe | None = None
    event_time: EventTime | None = None

    @model_validator(mode="after")
    def _registry_needed(self) -> "AppConfig":
        if self.source.format in REGISTRY_FORMATS and self.source.schema_registry is None:
            raise ValueError(f"source.format={self.source.format} needs source.schemaRegistry.url")
        return self

    @model_validator(mode="after")
    def _dlq_needed(self) -> "AppConfig":
        if self.schema_.on_incompatible == "deadLetter" and not self.dead_letter_topic:
            raise ValueError("schema.onIncompatible=deadLetter needs deadLetterTopic; set one or use halt")
        return self

    @model_validator(mode="after")
    def _late_needs_a_dead_letter_topic(self) -> "AppConfig":
        if self.transform is not None and not self.dead_letter_topic:
            raise ValueError("transform needs deadLetterTopic (a record the SQL fails on becomes a dead letter with "
                             "reason transform-error, never a stopped stream); set one")
        if self.event_time is not None and self.event_time.late_records == "deadLetter" and not self.dead_letter_topic:
            raise ValueError("eventTime.lateRecords=deadLetter needs deadLetterTopic; set one or use keep")
        if self.dedupe is not None and self.event_time is None and not self.dead_letter_topic:
            raise ValueError("dedupe needs deadLetterTopic (a record older than the window's watermark is a dead "
                             "letter with reason late); set one")
        if self.dedupe is not None and self.event_time is not None:
            if self.event_time.late_records == "keep":
                raise ValueError("eventTime.lateRecords=keep cannot be checked with a dedupe (a late record's key "
                                 "may have left the window); use deadLetter")
            if self.event_time.watermark_seconds > self.dedupe.within_seconds:
                raise ValueError("eventTime.watermark is longer than dedupe.within; make it at most dedupe.within")
        return self

    @property
    def frame_path(self) -> bool:
        """Records become Spark rows (a transform, a dedupe or event time is set): the DataFrame path."""
        return self.transform is not None or self.dedupe is not None or self.event_time is not None

    @property
    def consumer_group(self) -> str:
        return self.source.consumer_group or f"handoff-{self.handoff_id.replace('/', '.')}"

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)

    @classmethod
    def load(cls, path: str | Path) -> "AppConfig":
        return cls.model_validate(json.loads(Path(path).read_text()))
