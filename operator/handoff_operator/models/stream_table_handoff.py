"""StreamTableHandoff (`sth`): one Kafka-topics → table pipeline, run as a Spark Structured Streaming
job the operator manages. The spec says *what* should land *where* and under which guarantees; the
status reports what is committed (snapshot + exact offsets), how far behind it is, and why.

Every cross-field rule exists twice on purpose: as a CEL rule in the CRD (`x-kubernetes-validations`,
so `kubectl apply` refuses a bad object with a clear message) and as a pydantic validator (so the
operator, `handoff run -f` and tests get the same answer without an API server).
"""
from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from handoff_spark.config import (COLUMN_TYPE_PATTERN, DEFAULT_MAX_DEPTH, DEFAULT_MAX_VALUE_BYTES, MAX_DEPTH_LIMIT,
                                  MAX_VALUE_BYTES_LIMIT, canonical)

from handoff_operator.models.common import (AGE_COLUMN, CONDITIONS_FIELD_SCHEMA, PHASE_COLUMN, Condition, CustomResource, Duration,
                     CpuQuantity, DNS_SUBDOMAIN_PATTERN, MemoryQuantity, OffsetsMap, PropertyFrom, SecretKeyRef,
                     SnapshotId, SpecModel,
                     StatusModel, cpu_millis, cpu_quantity, quantity_to_bytes,
                     TopicName, parse_duration)
from handoff_operator.models.pod import PodOptions


# The column-type grammar lives in the data plane (`handoff_spark.decode.column_types`, re-exported by its public
# `handoff_spark.config`) so the CRD can never drift from it. A structural schema cannot express the nested grammar,
# so the CRD checks the words (a regular over-approximation, `COLUMN_TYPE_PATTERN`, in the CRD only) and the
# validator parses (a bad type is refused with one line naming the position and the fix).
ColumnType = Annotated[str, Field(max_length=4096, json_schema_extra={"pattern": COLUMN_TYPE_PATTERN},
                                  examples=["string", "long", "timestamptz", "decimal(10,2)", "fixed[16]",
                                            "struct<city:string,zip:string>", "list<long>", "map<string,double>"]),
                       AfterValidator(canonical)]

IDENTIFIER_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
TABLE_IDENTIFIER_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$"
PARTITION_TRANSFORM_PATTERN = (r"^(?:[A-Za-z_][A-Za-z0-9_]*|(?:identity|year|month|day|hour|void)"
                               r"\([A-Za-z_][A-Za-z0-9_]*\)|(?:bucket|truncate)\(\s*[0-9]+\s*,\s*"
                               r"[A-Za-z_][A-Za-z0-9_]*\))$")

# Client properties the data plane owns: setting them would break exactly-once (offsets are committed
# by the sink after the table commit, transactions are read committed) or point at another cluster.
RESERVED_KAFKA_PROPERTIES = ("bootstrap.servers", "group.id", "enable.auto.commit",
                             "enable.auto.offset.store", "isolation.level", "auto.offset.reset")
# Client properties that are credentials: they belong in a Secret (propertiesFrom), never in the CR.
SECRET_KAFKA_PROPERTIES = ("sasl.password", "sasl.jaas.config", "sasl.oauthbearer.client.secret",
                           "ssl.key.password", "ssl.keystore.password", "ssl.key.pem",
                           "ssl.truststore.password")
# Spark settings the operator sets itself (placement, image, executor count, checkpoint).
RESERVED_SPARK_CONF = ("spark.master", "spark.submit.deployMode", "spark.kubernetes.namespace",
                       "spark.kubernetes.container.image", "spark.kubernetes.driver.pod.name",
                       "spark.executor.instances", "spark.sql.streaming.checkpointLocation")
RESERVED_SPARK_CONF_PREFIXES = ("spark.dynamicAllocation.",)
# Catalog properties that are credentials.
SECRET_CATALOG_PROPERTIES = ("credential", "token", "s3.secret-access-key", "s3.session-token",
                             "gcs.oauth2.token", "adls.account-key", "adls.sas-token")


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _forbid_keys(props: dict[str, str], keys: tuple[str, ...], why: str) -> dict[str, str]:
    bad = sorted(k for k in props if k in keys)
    if bad:
        raise ValueError(f"{', '.join(bad)}: {why}")
    return props


# ---------------------------------------------------------------------------------------------------
# Source


class SchemaRegistrySpec(SpecModel):
    """A Schema Registry with the Confluent REST API (Confluent, Apicurio's ccompat API, Karapace ...)."""

    url: str = Field(pattern=r"^https?://[^\s/]+(/\S*)?$", max_length=512,
                     description="Base URL of the registry's Confluent-compatible API, e.g. "
                                 "http://schema-registry:8081 or http://apicurio:8080/apis/ccompat/v7.")
    credentials_from: SecretKeyRef | None = Field(
        default=None, description="Secret key holding `user:password` for HTTP basic auth; omit for none.")


class KafkaSourceSpec(SpecModel):
    """Where records come from. Offsets are tracked by Handoff (in the table's commits and Spark's
    checkpoint), not by a consumer group; the group only mirrors committed offsets for lag tools."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": f"!has(self.properties) || self.properties.all(k, !(k in {_cel_list(RESERVED_KAFKA_PROPERTIES)}))",
         "message": "source.properties must not set " + ", ".join(RESERVED_KAFKA_PROPERTIES)
                    + " (Handoff manages them for exactly-once)"},
        {"rule": f"!has(self.properties) || self.properties.all(k, !(k in {_cel_list(SECRET_KAFKA_PROPERTIES)}))",
         "message": "credentials in source.properties: put them in a Secret and use source.propertiesFrom"},
        {"rule": "!has(self.format) || !(self.format in ['avro', 'protobuf', 'jsonSchema']) || has(self.schemaRegistry)",
         "message": "source.format avro, protobuf and jsonSchema need source.schemaRegistry.url"},
    ]})

    bootstrap_servers: str = Field(min_length=1, max_length=4096,
                                   description="Kafka bootstrap servers, comma-separated host:port list. A change "
                                               "restarts the query in the running driver at a batch boundary (no pod "
                                               "restart), once a broker answers there with the cluster and topic ids "
                                               "the table's ledger records (else the driver refuses it: "
                                               "SourceInvalid).")
    topics: list[TopicName] = Field(min_length=1, max_length=100,
                                    json_schema_extra={"x-kubernetes-list-type": "set"},
                                    description="Topics to read (at least one, no duplicates). A change restarts "
                                                "the query in the running driver at a batch boundary (no pod "
                                                "restart), once Kafka has every topic under the id the table's "
                                                "ledger records (else the driver refuses it: SourceInvalid). An added "
                                                "topic starts at startingOffsets; a removed one keeps its offsets in "
                                                "the ledger and resumes there if added back.")
    starting_offsets: Literal["earliest", "latest"] = Field(
        default="earliest", description="Where a new handoff, or a topic added to it, starts reading; a partition "
                                        "the table's ledger has resumes from the ledger, and a new partition of a "
                                        "topic already read starts at its earliest offset. A change restarts the "
                                        "query in the running driver.")
    format: Literal["json", "raw", "avro", "protobuf", "jsonSchema"] = Field(
        default="json", description="json: decode values into the declared columns; raw: keep key/value bytes; "
                                    "avro, protobuf, jsonSchema: values in the Confluent wire format (magic byte + "
                                    "schema id), decoded with the writer schema from schemaRegistry; columns come "
                                    "from the registry's latest schema of <topic>-value when schema.columns is empty "
                                    "(records/messages/objects → struct, arrays/repeated → list, maps → "
                                    "map<string,…>, timestamp-millis/-micros → timestamptz; unions of several "
                                    "types → JSON text; docs/design/data-plane-contract.md has the table).")
    schema_registry: SchemaRegistrySpec | None = Field(
        default=None, description="The Schema Registry for format avro, protobuf or jsonSchema.")
    max_records_per_batch: int | None = Field(
        default=None, ge=1, le=1_000_000_000,
        description="Upper bound on records per micro-batch (admission control while catching up). A change "
                    "restarts the query in the running driver at a batch boundary (no pod restart).")
    min_partitions: int | None = Field(
        default=None, ge=1, le=100_000,
        description="Split large offset ranges so a micro-batch runs at least this many Spark tasks (Spark's "
                    "Kafka minPartitions), for topics with fewer partitions than executor cores. "
                    "Default: 3 × the cores the executors have now (followed as executors are added or "
                    "removed). A change restarts the query in the running driver at a batch boundary (no pod "
                    "restart).")
    consumer_group: str | None = Field(
        default=None, min_length=1, max_length=255,
        description="Group that mirrors committed offsets for lag tools. Default: handoff-<namespace>.<name>. A "
                    "change restarts the query in the running driver at a batch boundary (no pod restart); the next "
                    "commit commits to the new group, and the old group keeps the offsets it had.")
    on_offset_out_of_range: Literal["fail", "earliest"] = Field(
        default="fail", description="When the offset to resume from was deleted by Kafka retention: "
                                    "fail (halt, data was lost upstream) or earliest (skip ahead, record the gap). "
                                    "A change restarts the driver pod: a driver halted on deleted offsets has "
                                    "exited, and a new pod brings the fix at once.")
    properties: dict[str, Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict, max_length=64,
        description="Extra librdkafka client settings (e.g. security.protocol). No credentials: "
                    "use propertiesFrom.")
    properties_from: list[PropertyFrom] = Field(
        default_factory=list, max_length=16,
        description="Client settings read from Secrets (credentials such as sasl.password).")

    @model_validator(mode="after")
    def _check_properties(self) -> "KafkaSourceSpec":
        if self.format in ("avro", "protobuf", "jsonSchema") and self.schema_registry is None:
            raise ValueError(f"source.format={self.format} needs source.schemaRegistry.url")
        _forbid_keys(self.properties, RESERVED_KAFKA_PROPERTIES,
                     "Handoff manages these for exactly-once; remove them from source.properties")
        _forbid_keys(self.properties, SECRET_KAFKA_PROPERTIES,
                     "credentials in source.properties: put them in a Secret and use source.propertiesFrom")
        return self


# ---------------------------------------------------------------------------------------------------
# Sinks


class IcebergCatalogSpec(SpecModel):
    """A PyIceberg catalog (REST, SQL, Glue, Hive ...) given by its PyIceberg properties."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": f"!has(self.properties) || self.properties.all(k, !(k in {_cel_list(SECRET_CATALOG_PROPERTIES)}))",
         "message": "credentials in catalog.properties: put them in a Secret and use catalog.propertiesFrom"},
    ]})

    name: str = Field(default="handoff", min_length=1, max_length=63, pattern=IDENTIFIER_PATTERN,
                      description="Catalog name (as PyIceberg knows it).")
    properties: dict[str, Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict, max_length=64,
        description="PyIceberg catalog properties, e.g. type: rest, uri, warehouse, s3.endpoint.")
    properties_from: list[PropertyFrom] = Field(
        default_factory=list, max_length=16,
        description="Catalog properties read from Secrets (tokens, S3 keys).")

    @model_validator(mode="after")
    def _check_properties(self) -> "IcebergCatalogSpec":
        _forbid_keys(self.properties, SECRET_CATALOG_PROPERTIES,
                     "credentials in catalog.properties: put them in a Secret and use catalog.propertiesFrom")
        return self


class IcebergSinkSpec(SpecModel):
    """Commit each micro-batch as one Iceberg snapshot that records its exact Kafka offsets."""

    catalog: IcebergCatalogSpec = Field(default_factory=IcebergCatalogSpec,
                                        description="Catalog holding the table.")
    table: str = Field(pattern=TABLE_IDENTIFIER_PATTERN, max_length=512,
                       description="Table identifier namespace.table (nested namespaces allowed: a.b.table).")
    partition_by: list[Annotated[str, Field(pattern=PARTITION_TRANSFORM_PATTERN, max_length=128)]] = Field(
        default_factory=list, max_length=16,
        description="Partition spec for a table Handoff creates, e.g. ['day(ts)', 'bucket(16, id)', 'region'].")
    auto_create: bool = Field(default=True, description="Create the namespace and table if missing.")


class BigQuerySinkSpec(SpecModel):
    """Write through the BigQuery Storage Write API (pending streams committed atomically per batch)."""

    project: str = Field(min_length=1, max_length=128, pattern=r"^[a-z][-a-z0-9.:]*[a-z0-9]$",
                         description="Google Cloud project id.")
    dataset: str = Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z0-9_]+$", description="Dataset id.")
    table: str = Field(min_length=1, max_length=1024, pattern=r"^[\w-]+$", description="Table id.")
    write_mode: Literal["exactlyOnce", "atLeastOnce"] = Field(
        default="exactlyOnce", description="exactlyOnce: pending streams + atomic batch commit with the "
                                           "offsets ledger; atLeastOnce: the _default stream (cheaper, may duplicate on replay).")
    credentials_from: SecretKeyRef | None = Field(
        default=None, description="Secret key holding a service-account JSON key; omit to use "
                                  "Workload Identity / application default credentials.")
    partition_by: str | None = Field(default=None, pattern=IDENTIFIER_PATTERN, max_length=300,
                                     description="Column for DAY time-partitioning of a table Handoff creates.")
    cluster_by: list[Annotated[str, Field(pattern=IDENTIFIER_PATTERN, max_length=300)]] = Field(
        default_factory=list, max_length=4, description="Clustering columns (at most 4).")
    auto_create: bool = Field(default=True, description="Create the table if missing.")
    rest_endpoint: str | None = Field(
        default=None, pattern=r"^https?://[^\s/]+(/\S*)?$", max_length=512,
        description="BigQuery REST API endpoint (tables, queries) instead of Google's, e.g. an emulator "
                    "http://bigquery-emulator:9050. With an endpoint set and no credentialsFrom, requests are "
                    "anonymous. The operator also reads the table's offsets ledger through it for the status.")
    grpc_endpoint: str | None = Field(
        default=None, pattern=r"^(http://)?[^\s/:]+:[0-9]{1,5}$", max_length=512,
        description="Storage Write API endpoint host:port instead of bigquerystorage.googleapis.com:443; "
                    "dialed as a plaintext gRPC channel (an emulator), so not for TLS endpoints.")


class SinkSpec(SpecModel):
    """The table to write: exactly one of iceberg or bigquery."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "has(self.iceberg) != has(self.bigquery)",
         "message": "set exactly one of sink.iceberg or sink.bigquery"},
    ]})

    iceberg: IcebergSinkSpec | None = Field(default=None, description="Apache Iceberg table.")
    bigquery: BigQuerySinkSpec | None = Field(default=None, description="BigQuery table.")

    @model_validator(mode="after")
    def _exactly_one(self) -> "SinkSpec":
        if (self.iceberg is None) == (self.bigquery is None):
            raise ValueError("set exactly one of sink.iceberg or sink.bigquery")
        return self

    @property
    def kind(self) -> Literal["iceberg", "bigquery"]:
        return "iceberg" if self.iceberg is not None else "bigquery"


# ---------------------------------------------------------------------------------------------------
# Schema


class ColumnSpec(SpecModel):
    """One declared column of the table."""

    name: str = Field(pattern=IDENTIFIER_PATTERN, max_length=128, description="Column name (JSON field name).")
    type: ColumnType = Field(description="string, int, long, float, double, boolean, date, time, timestamp, "
                                         "timestamptz (both UTC instants), uuid, binary, decimal(p,s), fixed[n], "
                                         "or nested: struct<name:type,...>, list<type>, map<string,type>.")
    required: bool = Field(default=False, description="Records without this field are incompatible "
                                                      "(dead-lettered or halting, per onIncompatible).")
    doc: str | None = Field(default=None, max_length=1024, description="Column comment in the table.")


class RecordLimitsSpec(SpecModel):
    """What one record may be before it is a dead letter (or, under onIncompatible=halt, stops the hand-off naming
    it): a single record must never fail a batch, so the decoder refuses what it cannot safely take."""

    max_depth: int = Field(
        default=DEFAULT_MAX_DEPTH, ge=1, le=MAX_DEPTH_LIMIT,
        description="Objects and arrays nested in one another, the record's own object counting as 1 "
                    "(deeper: reason too-deep).")
    max_value_bytes: int = Field(
        default=DEFAULT_MAX_VALUE_BYTES, ge=1, le=MAX_VALUE_BYTES_LIMIT,
        description="Bytes of one record's value (larger: reason too-large). The default, 8 MiB, keeps every "
                    "row appendable to BigQuery (10 MB per Storage Write API request).")


class SchemaSpec(SpecModel):
    """The declared columns and what happens when records or the table drift from them."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "!has(self.eventTimeColumn) || has(self.columns) && self.columns.exists(c, c.name == self.eventTimeColumn "
                 "&& (c.type == 'timestamp' || c.type == 'timestamptz'))",
         "message": "schema.eventTimeColumn must name a declared column of type timestamp or timestamptz"},
    ]})

    columns: list[ColumnSpec] = Field(
        default_factory=list, max_length=500,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        description="Declared columns (unique names). Kafka metadata columns _kafka_* are added automatically.")
    evolution: Literal["compatible", "none"] = Field(
        default="compatible", description="compatible: add new optional columns and widen types; none: never "
                                          "change the table.")
    on_incompatible: Literal["halt", "deadLetter"] = Field(
        default="halt", description="halt: stop with an error naming the record; deadLetter: send the "
                                    "record to deadLetter.topic and go on.")
    event_time_column: str | None = Field(
        default=None, pattern=IDENTIFIER_PATTERN, max_length=128,
        description="Timestamp column used to measure freshness; default: the Kafka record timestamp. "
                    "eventTime.column supersedes it (when both are set they must name the same column).")
    limits: RecordLimitsSpec = Field(
        default_factory=RecordLimitsSpec,
        description="Limits on one record (nesting depth, value size); a record past them is a dead letter "
                    "(under onIncompatible=halt the handoff stops, naming it).")

    @model_validator(mode="after")
    def _check(self) -> "SchemaSpec":
        names = [c.name for c in self.columns]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate column names: {', '.join(dupes)}")
        if self.event_time_column is not None and not any(
                c.name == self.event_time_column and c.type in ("timestamp", "timestamptz") for c in self.columns):
            raise ValueError("schema.eventTimeColumn must name a declared column of type timestamp or timestamptz")
        return self


# ---------------------------------------------------------------------------------------------------
# Operations


class DeadLetterSpec(SpecModel):
    """Where incompatible records go (with headers naming the reason and their source offset)."""

    topic: TopicName = Field(description="Dead-letter topic (created if missing). Changing it restarts the query in "
                                         "the running driver at a batch boundary (no pod restart); the next query's "
                                         "dead letters go to the new topic.")


class FreshnessSpec(SpecModel):
    """How stale the table may get before the handoff is reported Degraded."""

    target: Duration = Field(default="5m", description="Freshness objective: now minus the newest "
                                                       "committed record's event time.")


class ReplaySpec(SpecModel):
    """How far back a ReplayRequest may reach, which drives table snapshot expiry and Kafka retention checks."""

    window: Duration = Field(default="7d", description="Snapshots (and their offsets) kept for rollback/replay; "
                                                       "older snapshots may be expired. Changing it restarts the "
                                                       "query in the running driver at a batch boundary (no pod "
                                                       "restart).")
    max_outage: Duration = Field(default="1d", description="Longest outage the handoff must survive without "
                                                           "losing data: Kafka retention must cover it.")


class RetentionSpec(SpecModel):
    """What to do when a topic's Kafka retention is shorter than replay.window + replay.maxOutage + the
    handoff's lag age + 10% (condition RetentionSufficient; docs/operator.md, "Retention")."""

    mode: Literal["audit", "enforce"] = Field(
        default="audit", description="audit: report the RetentionSufficient condition; enforce: also raise the "
                                     "topics' retention.ms (never lower it), in the Strimzi KafkaTopic when one "
                                     "manages the topic.")


class ScalingSpec(SpecModel):
    """Executor autoscaling on backlog: enough executors to clear the lag within targetCatchUp."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "self.minExecutors <= self.maxExecutors",
         "message": "scaling.minExecutors must be <= scaling.maxExecutors"},
    ]})

    min_executors: int = Field(default=1, ge=0, le=1000, description="Fewest executors (0: driver only).")
    max_executors: int = Field(default=4, ge=1, le=1000, description=(
        "Most executors. With a transform, dedupe or event time it also sizes the query's shuffle when it starts "
        "without a checkpoint: maxExecutors × spark.executor.cores partitions (at most 200; a dedupe's state "
        "keeps that split for the checkpoint's life; spark.sparkConf's spark.sql.shuffle.partitions wins)."))
    target_catch_up: Duration = Field(default="5m", description="Scale so the current lag would be cleared "
                                                                "within this time.")
    cooldown: Duration = Field(default="2m", description=(
        "Executors are removed only this long after the last change, and only to the highest count "
        "recommended over this window; adding executors never waits."))

    @model_validator(mode="after")
    def _bounds(self) -> "ScalingSpec":
        if self.min_executors > self.max_executors:
            raise ValueError("scaling.minExecutors must be <= scaling.maxExecutors")
        return self


#: Spark's floor under a factor-sized memory overhead (spark.{driver,executor}.minMemoryOverhead's default), in MiB.
MIN_MEMORY_OVERHEAD_MIB = 384
#: The overhead factor when none is given: the driver pod is sized by the operator for a PySpark driver (its Python
#: process and the native Kafka reader beside the JVM), as Spark sizes a Python driver pod in
#: cluster mode; executor pods are sized by Spark itself, which in client mode uses its JVM default.
DEFAULT_OVERHEAD_FACTOR = {"driver": 0.4, "executor": 0.1}
_OVERHEAD_RULES = [
    {"rule": "!(has(self.memoryOverhead) && has(self.memoryOverheadFactor))",
     "message": "set memoryOverhead or memoryOverheadFactor, not both", "fieldPath": ".memoryOverheadFactor"},
    {"rule": "!has(self.coreRequest) || !isQuantity(self.coreRequest) || (has(self.coreLimit) ? "
             "(!isQuantity(self.coreLimit) || quantity(self.coreRequest).compareTo(quantity(self.coreLimit)) <= 0) : "
             "quantity(self.coreRequest).asApproximateFloat() <= double(self.cores))",
     "message": "coreRequest must not exceed coreLimit (default: cores); raise coreLimit or lower coreRequest",
     "fieldPath": ".coreRequest"},
]


class PodResources(SpecModel):
    """Cores and memory of a Spark role's pods, as Kubernetes and Spark both see them.

    Why four more fields than cores and memory: a pod's memory is the JVM heap plus an overhead (Python workers,
    off-heap buffers, the JVM's own native memory), and a platform team sizes both, as with Spark's
    spark.{driver,executor}.memoryOverhead; its CPU request may be below its limit (or below the task slots, on a
    small node). The operator renders them into the driver Deployment and tells Spark the same numbers, so a
    container's requests and limits never disagree with what Spark believes it has."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": _OVERHEAD_RULES})

    cores: int = Field(default=1, ge=1, le=64, description="CPU cores (Spark's task slots).")
    memory: MemoryQuantity = Field(default="1Gi", description="JVM heap as a Kubernetes quantity.")
    core_request: CpuQuantity | None = Field(
        default=None, description="CPU the pod requests, a Kubernetes quantity (e.g. 500m); default: cores, or "
                                  "coreLimit when that is lower. Spark's tasks still use `cores` slots.")
    core_limit: CpuQuantity | None = Field(
        default=None, description="CPU limit of the pod, a Kubernetes quantity (e.g. 2); default: cores.")
    memory_overhead: MemoryQuantity | None = Field(
        default=None, description="Memory beyond the JVM heap (Python workers, off-heap and native memory), a "
                                  "Kubernetes quantity; the pod's memory request and limit are memory + "
                                  "memoryOverhead. Default: memoryOverheadFactor × memory, at least 384Mi.")
    memory_overhead_factor: float | None = Field(
        default=None, ge=0.01, le=1, description="The overhead as a fraction of memory when memoryOverhead is not "
                                              "given (at least 384Mi).")

    @model_validator(mode="after")
    def _resources_agree(self) -> "PodResources":
        if self.memory_overhead is not None and self.memory_overhead_factor is not None:
            raise ValueError("set memoryOverhead or memoryOverheadFactor, not both")
        if self.core_request is not None and cpu_millis(self.core_request) > self.limit_millis():
            raise ValueError(f"coreRequest {self.core_request} must not exceed coreLimit (default: cores) "
                             f"{cpu_quantity(self.limit_millis())}; raise coreLimit or lower coreRequest")
        return self

    def limit_millis(self) -> int:
        return cpu_millis(self.core_limit) if self.core_limit is not None else self.cores * 1000

    def request_millis(self) -> int:
        if self.core_request is not None:
            return cpu_millis(self.core_request)
        return min(self.cores * 1000, self.limit_millis())

    def heap_mib(self) -> int:
        return -(-quantity_to_bytes(self.memory) // (1 << 20))

    def overhead_mib(self, role: Literal["driver", "executor"]) -> int:
        """Memory beyond the heap, as Spark computes it: the given overhead, else max(384Mi, factor × heap)."""
        if self.memory_overhead is not None:
            return -(-quantity_to_bytes(self.memory_overhead) // (1 << 20))
        factor = self.memory_overhead_factor or DEFAULT_OVERHEAD_FACTOR[role]
        return max(MIN_MEMORY_OVERHEAD_MIB, int(self.heap_mib() * factor))


class DriverSpec(PodResources):
    """The Spark driver pod: cores, memory and its pod options."""

    cores: int = Field(default=1, ge=1, le=64, description="CPU cores of the driver.")
    memory: MemoryQuantity = Field(default="1Gi", description="JVM heap as a Kubernetes quantity, e.g. 1Gi; the pod "
                                                              "gets memory + memoryOverhead.")
    pod: PodOptions | None = Field(default=None, description="Pod options of the driver only, laid over "
                                                             "spec.spark.pod (the driver's wins; see spec.spark.pod "
                                                             "for how each field merges).")


class ExecutorSpec(PodResources):
    """Cores, memory and pod options of each Spark executor pod."""

    cores: int = Field(default=1, ge=1, le=64, description="CPU cores (task slots) per executor.")
    memory: MemoryQuantity = Field(default="2Gi", description="JVM heap as a Kubernetes quantity, e.g. 2Gi; Spark "
                                                              "sizes the pod memory + memoryOverhead.")
    pod: PodOptions | None = Field(default=None, description="Pod options of the executors only, laid over "
                                                             "spec.spark.pod (the executors' wins), rendered as "
                                                             "Spark's executor pod template.")


#: Hosts an Ingress rule accepts: a DNS subdomain, or one with a leading `*.` wildcard label.
UI_INGRESS_HOST_PATTERN = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
#: The UI's path under the host: plain URL characters, and with pathType ImplementationSpecific the regular-expression
#: characters a controller's rewrite needs (ingress-nginx: `/spark/orders(/|$)(.*)`). Its literal part before any of
#: those goes to the driver's JVM command line (`spark.ui.proxyBase`, through PYSPARK_SUBMIT_ARGS, which pyspark
#: splits like a shell would), so no spaces, quotes or backslashes.
UI_INGRESS_PLAIN_PATH_PATTERN = r"^/[A-Za-z0-9._~/-]*$"
UI_INGRESS_PATH_PATTERN = r"^/[A-Za-z0-9._~/()|$*+?^{}\[\]-]*$"
_UI_PATH_REGEX_CHARS = re.compile(r"[()|$*+?^{}\[\]]")


def _check_ui_host(host: str) -> str:
    if not re.match(UI_INGRESS_HOST_PATTERN, host):
        raise ValueError(f"{host!r} is not a host name: use lower-case letters, digits, '-' and '.', e.g. "
                         f"orders-ui.spark.example.com (a leading '*.' is allowed)")
    return host


def _check_ui_path(path: str) -> str:
    if not re.match(UI_INGRESS_PATH_PATTERN, path):
        raise ValueError(f"{path!r} is not a usable UI path: start it with '/' and use letters, digits, '/._~-' "
                         f"(and a regex's '()|$*+?^{{}}[]' with pathType ImplementationSpecific), e.g. /spark/orders")
    return path


# The CRD carries the patterns (json_schema_extra); the validators say the fix.
UiHost = Annotated[str, Field(min_length=1, max_length=253, json_schema_extra={"pattern": UI_INGRESS_HOST_PATTERN}),
                   AfterValidator(_check_ui_host)]
UiPath = Annotated[str, Field(min_length=1, max_length=1024, json_schema_extra={"pattern": UI_INGRESS_PATH_PATTERN}),
                   AfterValidator(_check_ui_path)]
UI_INGRESS_REGEX_NEEDS_IMPLEMENTATION_SPECIFIC = (
    "spark.ui.ingress.path with regular-expression characters needs pathType: ImplementationSpecific (a Prefix path "
    "is plain, e.g. /spark/orders)")
UI_INGRESS_NEEDS_SERVICE = ("spark.ui.ingress needs the UI Service it points to: remove spark.ui.service: false "
                            "(or remove spark.ui.ingress)")


class SparkUiIngressTls(SpecModel):
    """TLS of the UI's Ingress: the certificate Secret (in the handoff's namespace) the ingress controller serves
    for the host. Set it and `kubectl handoff status` prints an https:// URL."""

    secret_name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN,
                             description="Secret of type kubernetes.io/tls holding the host's certificate and key, "
                                         "e.g. one cert-manager issues (see annotations).")


class SparkUiIngressSpec(SpecModel):
    """An Ingress `<name>-ui` (networking.k8s.io/v1, owned by the handoff) in front of the UI Service, for clusters
    whose ingress controller should publish the running driver's UI. Opt-in: the UI can kill jobs and shows the
    configuration, so exposing it is the platform's decision (put authentication in front with `annotations`)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": f"self.pathType != 'Prefix' || self.path.matches('{UI_INGRESS_PLAIN_PATH_PATTERN}')",
         "message": UI_INGRESS_REGEX_NEEDS_IMPLEMENTATION_SPECIFIC},
    ]})

    host: UiHost = Field(description="Host name the UI is served at, e.g. orders-ui.spark.example.com.")
    path: UiPath = Field(
        default="/", description="Path under the host, default /. Another path, e.g. /spark/orders, is also given to "
                                 "the driver as spark.ui.proxyBase (its links then start with it; changing it restarts "
                                 "the driver), and the ingress controller must strip it before the request reaches "
                                 "Spark (which serves at /): say so in annotations, e.g. ingress-nginx's "
                                 "rewrite-target with a regex path such as /spark/orders(/|$)(.*) (pathType "
                                 "ImplementationSpecific; proxyBase is the part before the regex).")
    path_type: Literal["Prefix", "ImplementationSpecific"] = Field(
        default="Prefix", description="Ingress pathType: Prefix (the UI's pages are under the path), or "
                                      "ImplementationSpecific for a controller's own path syntax, e.g. a regex "
                                      "with ingress-nginx's rewrite-target.")
    ingress_class_name: str | None = Field(default=None, min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN,
                                           description="IngressClass of the controller to serve it; default: the "
                                                       "cluster's default IngressClass.")
    annotations: dict[str, Annotated[str, Field(max_length=4096)]] | None = Field(
        default=None, max_length=64, description="Annotations of the Ingress: the controller's settings "
                                                 "(authentication, rewrite, cert-manager issuer).")
    tls: SparkUiIngressTls | None = Field(default=None, description="Serve the host over TLS with this "
                                                                    "certificate Secret; omit for plain HTTP.")

    @model_validator(mode="after")
    def _check_path_type(self) -> "SparkUiIngressSpec":
        if self.path_type == "Prefix" and _UI_PATH_REGEX_CHARS.search(self.path):
            raise ValueError(UI_INGRESS_REGEX_NEEDS_IMPLEMENTATION_SPECIFIC)
        return self

    def proxy_base(self) -> str | None:
        """What the driver's links must start with (spark.ui.proxyBase): the path's literal part (before any regex
        character) without its trailing `/`, or None at the root, where Spark's own links already work."""
        match = _UI_PATH_REGEX_CHARS.search(self.path)
        base = (self.path[:match.start()] if match else self.path).rstrip("/")
        return base or None

    def url(self) -> str:
        """Where a browser opens the UI: https when the Ingress has TLS; the path's literal part."""
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{self.host}{self.proxy_base() or ''}/"


class SparkUiSpec(SpecModel):
    """The Spark UI of the running driver (port 4040): the operator gives it a Service of its own, `<name>-ui`
    (ClusterIP, port 4040, owned by the handoff), to port-forward to, and on request an Ingress to it. Only a running
    driver has a UI: a stopped or restarted driver's is gone (Spark's history server is not part of Handoff)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "!has(self.ingress) || !has(self.service) || self.service",
         "message": UI_INGRESS_NEEDS_SERVICE},
    ]})

    service: bool | None = Field(default=None, description="false: no Service `<name>-ui` (the driver still serves "
                                                           "its UI; the headless Service `<name>-driver` names it "
                                                           "too). Default true.")
    ingress: SparkUiIngressSpec | None = Field(
        default=None, description="An Ingress `<name>-ui` to the UI Service (needs the Service: not with "
                                  "service: false). Removing it deletes the Ingress.")

    @model_validator(mode="after")
    def _check_ingress(self) -> "SparkUiSpec":
        if self.ingress is not None and self.service is False:
            raise ValueError(UI_INGRESS_NEEDS_SERVICE)
        return self


class SparkSpec(SpecModel):
    """How the Spark driver and executors run."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": f"!has(self.sparkConf) || self.sparkConf.all(k, !(k in {_cel_list(RESERVED_SPARK_CONF)}) && "
                 f"!k.startsWith('{RESERVED_SPARK_CONF_PREFIXES[0]}'))",
         "message": "spark.sparkConf must not set " + ", ".join(RESERVED_SPARK_CONF + tuple(
             p + "*" for p in RESERVED_SPARK_CONF_PREFIXES)) + " (the operator sets them)"},
    ]})

    image: str | None = Field(default=None, max_length=1024,
                              description="Container image with the Handoff Spark app; default: the operator's image.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None, description="Pull policy for the Spark pods.")
    driver: DriverSpec = Field(default_factory=DriverSpec, description="Driver pod resources and options.")
    executor: ExecutorSpec = Field(default_factory=ExecutorSpec,
                                   description="Resources and pod options of each executor pod.")
    pod: PodOptions | None = Field(default=None, description="Pod options of the driver and the executors "
                                                             "(scheduling, pull secrets, labels, environment, "
                                                             "volumes, security contexts); driver.pod and "
                                                             "executor.pod override them per role.")
    ui: SparkUiSpec | None = Field(default=None, description="The running driver's Spark UI: a Service "
                                                              "`<name>-ui` on port 4040 unless ui.service is false, "
                                                              "and an Ingress to it when ui.ingress is set.")
    spark_conf: dict[str, Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict, max_length=128,
        description="Extra Spark configuration (spark.* keys). It overrides the operator's defaults, e.g. "
                    "speculative copies of straggler tasks (`spark.speculation: \"false\"` turns them off).")
    service_account_name: str | None = Field(
        default=None, max_length=253, description="Service account of the Spark pods; default: one the "
                                                  "operator creates with just the rights the driver needs.")

    @model_validator(mode="after")
    def _check_conf(self) -> "SparkSpec":
        bad = sorted(k for k in self.spark_conf
                     if k in RESERVED_SPARK_CONF or k.startswith(RESERVED_SPARK_CONF_PREFIXES))
        if bad:
            raise ValueError(f"spark.sparkConf must not set {', '.join(bad)} (the operator sets them)")
        return self

    def ui_service(self) -> bool:
        """Whether the operator gives the driver's UI its own Service (`<name>-ui`)."""
        return self.ui is None or self.ui.service is not False

    def ui_ingress(self) -> SparkUiIngressSpec | None:
        """The UI's Ingress, when the spec asks for one (spec.spark.ui.ingress)."""
        return self.ui.ingress if self.ui is not None else None

    def driver_pod(self) -> PodOptions:
        """The driver's pod options: spec.spark.pod with spec.spark.driver.pod laid over it."""
        return (self.pod or PodOptions()).overlaid(self.driver.pod or PodOptions())

    def executor_pod(self) -> PodOptions:
        """The executors' pod options: spec.spark.pod with spec.spark.executor.pod laid over it."""
        return (self.pod or PodOptions()).overlaid(self.executor.pod or PodOptions())


class CheckpointSpec(SpecModel):
    """Where Spark's checkpoint lives. It is a cache of progress, not the source of truth: the table's
    commits are, so a lost checkpoint (a deleted volume, S3 or GCS prefix alike) is rebuilt from the table's
    ledger."""

    location: str | None = Field(default=None, max_length=2048,
                                 description="Checkpoint path: file:///<path> on a volume mounted into the "
                                             "driver, s3a://<bucket>/<prefix> on S3 or an S3-compatible "
                                             "store, or gs://<bucket>/<prefix> on Google Cloud Storage (then "
                                             "no volume is created); default: a PersistentVolumeClaim the "
                                             "operator creates. Other stores (s3://, abfs://, hdfs://) are "
                                             "refused: the image ships only the S3A and GCS connectors.")
    storage_size: Annotated[str, Field(pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$", max_length=32)] = Field(
        default="1Gi", description="Size of the checkpoint volume when no location is given.")
    storage_class_name: str | None = Field(default=None, max_length=253,
                                           description="StorageClass of the checkpoint volume.")
    credentials_secret: str | None = Field(
        default=None, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", max_length=253,
        description="A Secret in the handoff's namespace with the store's credentials. s3a://: keys "
                    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and optionally AWS_SESSION_TOKEN), given to "
                    "the driver and its executors as environment variables. gs://: key key.json, a service "
                    "account key, mounted into the driver and its executors "
                    "(GOOGLE_APPLICATION_CREDENTIALS). Default: the pods' own identity (AWS web identity or "
                    "instance role; GKE workload identity).")
    endpoint: str | None = Field(
        default=None, pattern=r"^https?://[^\s/]+/?$", max_length=512,
        description="s3a://: the S3 endpoint URL of a store that is not AWS S3 (MinIO, Ceph, ...), e.g. "
                    "http://minio.storage:9000; default: AWS S3 in region. gs://: the storage API's root URL "
                    "when it is not Google's (a private endpoint, an emulator such as fake-gcs-server), e.g. "
                    "http://fake-gcs.storage:4443; default: Google Cloud Storage.")
    anonymous: bool | None = Field(
        default=None, description="gs:// only: send requests without credentials (an emulator such as "
                                  "fake-gcs-server); not with credentialsSecret.")
    path_style_access: bool | None = Field(
        default=None, description="s3a:// only: address buckets as <endpoint>/<bucket> instead of "
                                  "<bucket>.<endpoint> (most S3-compatible stores need true).")
    region: str | None = Field(default=None, pattern=r"^[a-z0-9-]+$", max_length=64,
                               description="s3a:// only: the bucket's region. Default: us-east-1.")


class UpgradeSpec(SpecModel):
    """What the operator does when a spec change breaks the driver (docs/operator.md, "Rollback of a failed
    upgrade"). A spec counts as good once its driver has committed a batch; the user's spec is never
    rewritten, the operator only runs the last good app config until the spec changes again."""

    readiness_timeout: Duration | None = Field(
        default=None, description="How long the driver of a changed spec may take to commit its first batch "
                                  "while records wait (or to become ready) before the operator goes back to "
                                  "the last good spec. Default: the operator's "
                                  "HANDOFF_UPGRADE_READINESS_TIMEOUT (5m).")
    auto_rollback: bool = Field(
        default=True, description="Go back to the last spec whose driver committed a batch when a changed "
                                  "spec's driver crash-loops or misses readinessTimeout (Degraded=True reason "
                                  "UpgradeRolledBack); false: keep trying the new spec.")


class LookupSpec(SpecModel):
    """A table of the handoff's Iceberg catalog the SQL can join (enrichment)."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128,
                      description="The name the SQL uses for it, e.g. customers.")
    table: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$", max_length=512,
                       description="The catalog table, e.g. crm.customers. Read when the query starts and again when it changes.")


class TransformSpec(SpecModel):
    """Spark SQL that Spark runs over each micro-batch's decoded records, on the executors."""

    sql: str = Field(min_length=1, max_length=65536, description=(
        "A SELECT over the view `source`: the declared columns plus _kafka_topic, _kafka_partition, _kafka_offset "
        "and _kafka_timestamp. The output must keep those four columns (e.g. SELECT *, … or name them), fit "
        "schema.columns, and be deterministic (a replay must drop and derive what the first run did). "
        "Example: SELECT id, ts, upper(customer) AS customer, amount, region, _kafka_topic, _kafka_partition, "
        "_kafka_offset, _kafka_timestamp FROM source WHERE amount >= 5. A SQL Spark cannot plan, or an output "
        "that does not fit, stops the driver before it writes anything: Degraded, reason TransformInvalid. "
        "Changing the SQL or the lookups of a running handoff (or its dedupe or eventTime) restarts its query in the "
        "running driver at a batch boundary (no pod restart), after the new config passed the same check; one that "
        "fails it is refused, the driver keeps running the one before, and the handoff goes back to the last good "
        "spec (Degraded, reason UpgradeRolledBack, status.upgrade.rolledBackReason TransformInvalid; without a last "
        "good spec or with upgrade.autoRollback false: Degraded, reason TransformInvalid). Adding or removing the "
        "transform does too (the query switches between the fused path and Spark rows on a checkpoint started "
        "afresh from the table's ledger). A record the SQL fails on (e.g. an ANSI cast of a malformed value) is sent to deadLetter.topic with reason "
        "transform-error and the stream goes on (so a transform needs deadLetter.topic)."))
    lookups: list[LookupSpec] = Field(default_factory=list, max_length=16, description=(
        "Iceberg tables of the sink's catalog joinable in the SQL under their name (unique, not `source`), e.g. "
        "[{name: customers, table: crm.customers}] for ... FROM source s JOIN customers c ON s.customer_id = c.id. "
        "Each is read when the query starts; the driver checks the tables every 10 s and, when one changed, "
        "restarts the query at a batch boundary to join the new content. Iceberg sink only (BigQuery lookups "
        "are not built)."))


class DedupeSpec(SpecModel):
    """Business-key deduplication, by Spark (dropDuplicatesWithinWatermark; its state in RocksDB, off the heap, in
    the checkpoint). Changing keys or within, or adding or removing the dedupe, restarts the query in the running
    driver (new keys: the window is rebuilt from the table's ledger)."""

    keys: list[str] = Field(min_length=1, max_length=16, description=(
        "Columns of the business key, after the transform if one is set, e.g. [order_id]. A null key is a key "
        "like any other (as in SQL DISTINCT); a row whose required key (schema.columns required: true) the transform "
        "left null is sent to deadLetter.topic with reason transform-error."))
    within: Duration = Field(description=(
        "The window, in event time (eventTime.column, else the Kafka timestamp): a record whose keys were seen "
        "this recently is dropped and counted (ledger handoff.dropped-rows; BigQuery: dropped_rows; metric "
        "handoff_duplicates_dropped). It is also the delay of Spark's watermark; without eventTime, a record "
        "whose Kafka timestamp is this far behind the newest one of an earlier batch is late: a dead letter "
        "with reason late. Example: 1h."))


class EventTimeSpec(SpecModel):
    """The event-time column, its watermark and the late-record policy (supersedes schema.eventTimeColumn).
    Changing them, or adding or removing eventTime, restarts the query in the running driver."""

    column: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128, description=(
        "A column of type timestamp (of the SQL's output when a transform is set); the watermark and the "
        "dedupe's window are measured on it, and freshness too (it supersedes schema.eventTimeColumn). "
        "Example: created_at."))
    watermark: Duration = Field(default="0s", description=(
        "How far behind the newest event time of an earlier batch a record may be and still be on time; a "
        "record at or beyond it is late. 0s (the default): any record older than that newest event time is "
        "late. At most dedupe.within when a dedupe is set. Example: 30s."))
    late_records: Literal["deadLetter", "keep"] = Field(default="deadLetter", description=(
        "What happens to a late record: deadLetter (sent to deadLetter.topic with reason late, not written) or "
        "keep (written like the others; not allowed with a dedupe). Counted either way in the ledger "
        "(handoff.late-rows; BigQuery: late_rows)."))


class StreamTableHandoffSpec(SpecModel):
    """Desired state of a StreamTableHandoff."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "!has(self.schema) || !has(self.schema.onIncompatible) || "
                 "self.schema.onIncompatible != 'deadLetter' || has(self.deadLetter)",
         "message": "schema.onIncompatible=deadLetter needs deadLetter.topic"},
        {"rule": "!has(self.deadLetter) || !(self.deadLetter.topic in self.source.topics)",
         "message": "deadLetter.topic must not be one of source.topics"},
    ]})

    source: KafkaSourceSpec = Field(description="The Kafka topics to read.")
    sink: SinkSpec = Field(description="The table to write (exactly one of iceberg or bigquery).")
    schema_: SchemaSpec = Field(default_factory=SchemaSpec, alias="schema",
                                description="Declared columns and drift policy. A change restarts the query in the "
                                            "running driver at a batch boundary (no pod restart), after the table "
                                            "took it as a start would (a column added, a type widened); one the "
                                            "table cannot take is refused and the query before runs on (Degraded, "
                                            "reason UpgradeRolledBack or SchemaIncompatible).")
    dead_letter: DeadLetterSpec | None = Field(default=None, description="Dead-letter topic for incompatible records.")
    commit_interval: Duration = Field(default="10s", description="How often a micro-batch is committed to "
                                                                 "the table (the trigger interval). A change "
                                                                 "restarts the query in the running driver at a "
                                                                 "batch boundary (no pod restart).")
    freshness: FreshnessSpec = Field(default_factory=FreshnessSpec, description="Freshness objective.")
    replay: ReplaySpec = Field(default_factory=ReplaySpec, description="Replay window and outage tolerance.")
    retention: RetentionSpec = Field(default_factory=RetentionSpec, description="Kafka retention policy checks.")
    scaling: ScalingSpec = Field(default_factory=ScalingSpec, description="Executor autoscaling.")
    spark: SparkSpec = Field(default_factory=SparkSpec, description="Spark driver/executor settings.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Spark checkpoint storage.")
    upgrade: UpgradeSpec = Field(default_factory=UpgradeSpec,
                                 description="Automatic rollback of a spec change whose driver fails.")
    transform: TransformSpec | None = Field(default=None, description=(
        "Spark SQL over each micro-batch's records before the table (filter, derive, cast, enrich). With any of "
        "transform, dedupe or eventTime, records travel as Spark rows (the DataFrame path) and the driver checks "
        "the pipeline before it starts. Iceberg and BigQuery sinks (lookups: Iceberg only)."))
    dedupe: DedupeSpec | None = Field(default=None, description=(
        "Drop records whose business key was seen within a window, by Spark (withWatermark + "
        "dropDuplicatesWithinWatermark). The keys seen are kept in the checkpoint; a driver that starts without "
        "one (lost or discarded) first re-reads from Kafka the records the table's ledger committed within the "
        "window, as far back as Kafka still holds them, to rebuild the keys without writing them again. Needs "
        "deadLetter.topic.  Iceberg and BigQuery sinks. Example: {keys: [order_id], within: 1h}. Changing keys or "
        "within, or adding or removing the dedupe, restarts the query in the running driver (new keys: the window "
        "is rebuilt as above)."))
    event_time: EventTimeSpec | None = Field(default=None, description=(
        "Event time: the column, Spark's watermark on it and what happens to late records. Iceberg and BigQuery "
        "sinks. Example: {column: created_at, watermark: 30s, lateRecords: deadLetter}. Changing it, or "
        "adding or removing it, restarts the query in the running driver."))
    suspend: bool = Field(default=False, description="Stop the Spark app (after the current batch commits) "
                                                     "and keep everything else; resume by setting false.")

    @model_validator(mode="after")
    def _cross_field(self) -> "StreamTableHandoffSpec":
        if self.schema_.on_incompatible == "deadLetter" and self.dead_letter is None:
            raise ValueError("schema.onIncompatible=deadLetter needs deadLetter.topic")
        if self.dead_letter is not None and self.dead_letter.topic in self.source.topics:
            raise ValueError("deadLetter.topic must not be one of source.topics")
        # Duration comparisons live here only: CEL's duration() has no days, and "7d" is how people
        # say replay windows.
        if self.transform is not None and self.dead_letter is None:
            raise ValueError("transform needs deadLetter.topic (a record the SQL fails on becomes a dead letter "
                             "with reason transform-error, never a stopped stream); set one")
        if self.event_time is not None and self.event_time.late_records == "deadLetter" and self.dead_letter is None:
            raise ValueError("eventTime.lateRecords=deadLetter needs deadLetter.topic; set one or use keep")
        if self.dedupe is not None:
            if self.dead_letter is None:
                raise ValueError("dedupe needs deadLetter.topic (records older than the window's watermark are "
                                 "dead letters with reason late); set one")
            if self.event_time is not None and self.event_time.late_records == "keep":
                raise ValueError("eventTime.lateRecords=keep cannot be checked with a dedupe (a late record's key "
                                 "may have left the window); use deadLetter")
            if self.event_time is not None and \
                    parse_duration(self.event_time.watermark) > parse_duration(self.dedupe.within):
                raise ValueError("eventTime.watermark must be at most dedupe.within")
        if self.transform is not None and self.transform.lookups and self.sink.iceberg is None:
            raise ValueError("transform.lookups need sink.iceberg (they are tables of its catalog; BigQuery "
                             "lookups are not built); remove them or write to Iceberg")
        if self.event_time is not None and self.schema_.event_time_column not in (None, self.event_time.column):
            raise ValueError("schema.eventTimeColumn differs from eventTime.column; remove schema.eventTimeColumn "
                             "(eventTime supersedes it)")
        if self.replay_max_outage_seconds > self.replay_window_seconds:
            raise ValueError("replay.maxOutage must not exceed replay.window")
        if self.freshness_target_seconds < self.commit_interval_seconds:
            raise ValueError("freshness.target must be at least commitInterval (a table cannot be "
                             "fresher than its commit interval)")
        return self

    @property
    def frame_path(self) -> bool:
        """Records become Spark rows (a transform, a dedupe or event time): the DataFrame path (the app config's
        `frame_path`, handoff_spark.config)."""
        return self.transform is not None or self.dedupe is not None or self.event_time is not None

    # Parsed views of the duration strings, for the reconcile logic.
    @property
    def commit_interval_seconds(self) -> float:
        return parse_duration(self.commit_interval)

    @property
    def freshness_target_seconds(self) -> float:
        return parse_duration(self.freshness.target)

    @property
    def replay_window_seconds(self) -> float:
        return parse_duration(self.replay.window)

    @property
    def replay_max_outage_seconds(self) -> float:
        return parse_duration(self.replay.max_outage)

    @property
    def target_catch_up_seconds(self) -> float:
        return parse_duration(self.scaling.target_catch_up)

    @property
    def scaling_cooldown_seconds(self) -> float:
        return parse_duration(self.scaling.cooldown)

    @property
    def upgrade_readiness_timeout_seconds(self) -> float | None:
        """None: the operator's default applies."""
        timeout = self.upgrade.readiness_timeout
        return parse_duration(timeout) if timeout is not None else None


# ---------------------------------------------------------------------------------------------------
# Status

HandoffPhase = Literal["Pending", "Starting", "Running", "Replaying", "Suspended", "Degraded", "Failed"]


class AppStatus(StatusModel):
    """The Spark application as the operator last saw it."""

    driver: str | None = Field(default=None, description="Driver pod name.")
    restarts: int = Field(default=0, ge=0, description="Times the operator restarted the driver.")
    last_start: datetime | None = Field(default=None, description="When the current driver was started.")
    last_failure: str | None = Field(default=None, max_length=4096, description="Why the driver last failed.")
    config_hash: str | None = Field(default=None, max_length=128,
                                    description="Hash of the rendered app config the driver runs.")


class CommittedStatus(StatusModel):
    """The newest durable table commit and the exact offsets it contains (end exclusive)."""

    snapshot: SnapshotId | None = Field(default=None, description="Iceberg snapshot id (Iceberg sinks).")
    batch: int | None = Field(default=None, ge=0, description="Spark micro-batch id of the commit.")
    offsets: OffsetsMap = Field(default_factory=dict)
    at: datetime | None = Field(default=None, description="When the commit happened.")


class ExecutorsStatus(StatusModel):
    current: int = Field(default=0, ge=0, description="Executors running now.")
    desired: int = Field(default=0, ge=0, description="Executors the autoscaler wants.")
    last_scale_time: datetime | None = Field(default=None, description="When executors were last changed.")
    reason: str | None = Field(default=None, max_length=64,
                               description="Why desired is what it is: ScaleUp, ScaleDown, Bounds, Steady, "
                                           "Cooldown, Stabilizing or NoMeasurement.")
    message: str | None = Field(default=None, max_length=1024,
                                description="The numbers behind the reason (lag, input rate, per-executor rate).")


class LastBatchStatus(StatusModel):
    """The driver's own report of its newest micro-batch (published into the ConfigMap `<name>-progress`;
    shown only while the current driver keeps publishing). Committed progress is `committed`, from the
    table's ledger."""

    id: int | None = Field(default=None, ge=0, description="Spark micro-batch id.")
    rows: int | None = Field(default=None, ge=0, description="Kafka records read in the batch.")
    duration_ms: int | None = Field(default=None, ge=0, description="Wall time of the batch in milliseconds.")
    input_rows_per_second: float | None = Field(default=None, ge=0, description="Records read per second.")
    dead_letters: int | None = Field(default=None, ge=0, description="Records sent to the dead-letter topic.")
    at: datetime | None = Field(default=None, description="When the batch finished.")
    degraded_reason: str | None = Field(
        default=None, max_length=128,
        description="Trouble the sink met in the batch (BigQueryResourceExhausted, BigQueryUnavailable), or the "
                    "table's service not answering at the driver's start, which it waits for (CatalogUnavailable, "
                    "BigQueryUnavailable); Degraded=True reason SinkDegraded while set.")


class CostFigures(StatusModel):
    """What the handoff's committed batches read and wrote, summed (the driver's running totals, `handoff.cost`)."""

    records: int = Field(default=0, ge=0, description="Kafka records read into committed batches.")
    kafka_bytes: int = Field(default=0, ge=0, description="Bytes of those records' keys and values read from Kafka.")
    table_bytes: int = Field(default=0, ge=0,
                             description="Bytes the commits added to the table: Iceberg's data files, BigQuery's "
                                         "Storage Write API appends.")
    write_api_bytes: int = Field(default=0, ge=0, description="Bytes appended through BigQuery's Storage Write API.")
    files: int = Field(default=0, ge=0, description="Data files the commits added (Iceberg).")
    snapshots: int = Field(default=0, ge=0, description="Table commits made (Iceberg snapshots, BigQuery batches).")
    rewritten_files: int = Field(default=0, ge=0, description="Data files the driver's table upkeep rewrote (Iceberg "
                                                              "compaction: the small files it replaced).")
    rewritten_bytes: int = Field(default=0, ge=0, description="Bytes that upkeep wrote in their place (maintenance "
                                                              "rewrites, beside tableBytes).")
    reread_records: int = Field(default=0, ge=0, description="Records that finished RollbackAndReplay and Backfill "
                                                             "requests re-read from Kafka (a RollbackAndReplay's are "
                                                             "also in records; a Backfill Job's only here).")
    reread_bytes: int = Field(default=0, ge=0, description="Those requests' byte estimate of their re-reads "
                                                           "(records × the table's bytes per row).")


class CostDay(CostFigures):
    """The figures of one UTC day."""

    date: str = Field(max_length=10, description="The UTC day, YYYY-MM-DD.")


class CostDriver(CostFigures):
    """The running totals the current driver last published: the base its next report's rise is taken from."""

    pod: str | None = Field(default=None, max_length=253, description="The driver pod that published them.")


class CostStatus(CostFigures):
    """What this handoff read and wrote since the operator first counted it, today's share, and the Storage Write
    API's money estimate (docs/observability.md, "Cost"). Counted from the driver's published totals (re-reads of
    a RollbackAndReplay are in them), and rereadRecords/rereadBytes from each finished RollbackAndReplay and
    Backfill request."""

    since: datetime | None = Field(default=None, description="When counting began (the first report counted).")
    write_api_cost: float | None = Field(
        default=None, ge=0, description="writeApiBytes in GiB times the operator's HANDOFF_BIGQUERY_WRITE_PRICE_PER_GIB "
                                        "(list price, no free tier taken off).")
    today: CostDay | None = Field(default=None, description="The current UTC day's figures.")
    days: list[CostDay] | None = Field(default=None, max_length=7,
                                       description="The 7 UTC days before today that had figures, newest first "
                                                   "(longer history: Prometheus, delta(handoff_cost_*[1d])).")
    driver: CostDriver | None = Field(default=None, description="The current driver's last published totals.")
    summary: str | None = Field(default=None, max_length=64,
                                description="Bytes read from Kafka → written to the table, e.g. '1.2GiB→310MiB' "
                                            "(kubectl get's Cost column).")


class TopicRetentionStatus(StatusModel):
    """One topic's retention against the handoff's needs (see docs/operator.md, "Retention")."""

    topic: TopicName = Field(description="Kafka topic.")
    sufficient: bool = Field(description="Retention covers the need.")
    need_seconds: float = Field(ge=0, description="replay.window + replay.maxOutage + lag age + 10% margin.")
    have_seconds: float | None = Field(default=None, ge=0, description="How long the topic keeps records: "
                                       "the shorter of retention.ms and retention.bytes at the current write "
                                       "rate; absent = unlimited.")
    headroom_seconds: float | None = Field(default=None, description="have - need (negative: too short); "
                                           "absent = unlimited.")
    limited_by: Literal["retention.ms", "retention.bytes"] | None = Field(
        default=None, description="The setting that limits have.")
    lag_age_seconds: float = Field(default=0, ge=0, description="Age of the oldest record not yet committed.")
    cleanup_policy: str = Field(default="delete", max_length=64, description="The topic's cleanup.policy.")


class LostRangeStatus(StatusModel):
    """Offsets Kafka deleted before the handoff read them (end exclusive)."""

    topic: TopicName = Field(description="Kafka topic.")
    partition: int = Field(ge=0, description="Partition.")
    from_offset: int = Field(ge=0, description="First lost offset: the ledger's next offset.")
    to_offset: int = Field(ge=0, description="Kafka's earliest offset when the loss was seen (exclusive).")


class RetentionStatus(StatusModel):
    """The retention check (every HANDOFF_RETENTION_CHECK_INTERVAL) and data loss (every refresh)."""

    checked_at: datetime | None = Field(default=None, description="When the topics' configs were last read.")
    headroom_seconds: float | None = Field(default=None, description="The smallest headroom over the topics "
                                           "(negative: retention too short); absent = unlimited.")
    topics: list[TopicRetentionStatus] = Field(default_factory=list, max_length=100,
                                               description="Per topic: need, have, headroom.")
    lost: list[LostRangeStatus] = Field(default_factory=list, max_length=1000,
                                        description="Ranges deleted by Kafka before they were read (DataLoss=True).")
#: Why a spec was rolled back (status.upgrade.rolledBackReason): its driver crash-looped or never got ready, or the
#: running driver refused its query config (its SQL, a schema the table cannot take, or topics it cannot read). The
#: upgrade rule's too.
RolledBackReason = Literal["CrashLoop", "ReadinessTimeout", "TransformInvalid", "SchemaIncompatible", "SourceInvalid"]


class UpgradeStatus(StatusModel):
    """Automatic rollback of failed spec changes: which app config is known good, which one is being
    tried, and which one was rolled back (docs/operator.md, "Rollback of a failed upgrade")."""

    last_good_config_hash: str | None = Field(
        default=None, max_length=128,
        description="Config hash of the last spec whose driver committed a batch (its spec is kept in the "
                    "ConfigMap <name>-last-good).")
    trying_generation: int | None = Field(default=None, ge=0,
                                          description="Generation whose driver has not committed a batch yet.")
    trying_config_hash: str | None = Field(default=None, max_length=128,
                                           description="Config hash of the spec being tried.")
    trying_since: datetime | None = Field(
        default=None, description="Start of the readiness clock of the tried spec (it runs while records wait "
                                  "or the driver is not ready).")
    rolled_back_generation: int | None = Field(
        default=None, ge=0, description="Generation whose driver failed and was rolled back; the last good "
                                        "config runs until the spec changes again.")
    rolled_back_config_hash: str | None = Field(default=None, max_length=128,
                                                description="Config hash of the rolled back spec.")
    rolled_back_reason: RolledBackReason | None = \
        Field(default=None, description="Why it was rolled back (TransformInvalid: the running driver refused the "
                                        "changed transform and kept running the one before; SchemaIncompatible: it "
                                        "refused a changed schema the table cannot take, likewise; SourceInvalid: "
                                        "it refused topics Kafka lacks or that were recreated, or servers where no "
                                        "broker answers or of another cluster, likewise).")
    rolled_back_at: datetime | None = Field(default=None, description="When it was rolled back.")
    message: str | None = Field(default=None, max_length=1024, description="What happened, for people.")


class StreamTableHandoffStatus(StatusModel):
    """Observed state, written by the operator only."""

    observed_generation: int | None = Field(default=None, ge=0,
                                            description="metadata.generation the status reflects.")
    phase: HandoffPhase | None = Field(default=None, description="One-word summary; conditions hold the detail.")
    conditions: list[Condition] = Field(default_factory=list, max_length=32,
                                        json_schema_extra=CONDITIONS_FIELD_SCHEMA,
                                        description="Ready, Progressing, Degraded and domain conditions.")
    app: AppStatus | None = Field(default=None, description="Spark application.")
    committed: CommittedStatus | None = Field(default=None, description="Newest durable commit.")
    lag: int | None = Field(default=None, ge=0, description="Records in Kafka not yet committed to the table.")
    freshness: str | None = Field(default=None, max_length=32,
                                  description="Age of the newest committed record, e.g. 42s. While nothing else "
                                              "in the status changes it is rewritten only when it moved by more "
                                              "than 10% and at least a minute (the handoff_freshness_seconds "
                                              "metric is exact).")
    freshness_seconds: float | None = Field(default=None, ge=0, description="freshness in seconds.")
    executors: ExecutorsStatus | None = Field(default=None, description="Executor counts.")
    last_batch: LastBatchStatus | None = Field(default=None,
                                               description="The driver's report of its newest micro-batch.")
    retention: RetentionStatus | None = Field(default=None, description="Kafka retention against replay needs.")
    last_good_generation: int | None = Field(
        default=None, ge=0, description="Newest generation whose driver committed a batch (what a failed spec "
                                        "change is rolled back to).")
    upgrade: UpgradeStatus | None = Field(default=None, description="Automatic rollback of failed spec changes.")
    cost: CostStatus | None = Field(default=None, description="Bytes read and written, files and snapshots made.")


# ---------------------------------------------------------------------------------------------------
# The resource

# Children are named <name>-driver, <name>-checkpoint ...: with the longest suffix they must still fit the
# 63 characters of a DNS label (Service names, label values). render and validation import these.
MAX_NAME_LENGTH = 63 - len("-checkpoint")
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


class StreamTableHandoff(CustomResource):
    """StreamTableHandoff hands Kafka topics off to an Iceberg or BigQuery table, exactly once: every
    table commit records the Kafka offsets it contains."""

    plural: ClassVar[str] = "streamtablehandoffs"
    singular: ClassVar[str] = "streamtablehandoff"
    short_names: ClassVar[list[str]] = ["sth"]
    printer_columns: ClassVar[list[dict[str, Any]]] = [
        PHASE_COLUMN,
        {"name": "Lag", "type": "integer", "jsonPath": ".status.lag"},
        {"name": "Freshness", "type": "string", "jsonPath": ".status.freshness"},
        {"name": "Executors", "type": "integer", "jsonPath": ".status.executors.current"},
        {"name": "Snapshot", "type": "string", "priority": 1, "jsonPath": ".status.committed.snapshot"},
        {"name": "Cost", "type": "string", "priority": 1, "jsonPath": ".status.cost.summary"},
        AGE_COLUMN,
    ]

    root_validations: ClassVar[list[dict[str, str]]] = [
        {"rule": f"self.metadata.name.size() <= {MAX_NAME_LENGTH} && self.metadata.name.matches('{NAME_PATTERN}')",
         "message": f"metadata.name must be at most {MAX_NAME_LENGTH} lower-case letters, digits and '-', "
                    f"starting with a letter (it names the driver Service and the checkpoint volume)"},
    ]

    operator_checks: ClassVar[list[str]] = [
        "replay.maxOutage must not exceed replay.window",
        "freshness.target must be at least commitInterval",
    ]

    kind: Literal["StreamTableHandoff"] = "StreamTableHandoff"
    spec: StreamTableHandoffSpec
    status: StreamTableHandoffStatus | None = None

    @model_validator(mode="after")
    def _name(self) -> "StreamTableHandoff":
        name = self.metadata.get("name")
        if name is not None and (len(name) > MAX_NAME_LENGTH or not re.fullmatch(NAME_PATTERN, name)):
            raise ValueError(self.root_validations[0]["message"])
        return self
