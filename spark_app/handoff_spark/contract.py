"""The operator ↔ driver contract: every name and shape one side writes and the other reads, defined once.

The operator (`handoff_operator`) renders the driver's pod (command line, environment), writes the desired
executor count and reads what the driver publishes; the driver (`handoff_spark`) parses that command line, reads
that environment and annotation, and publishes its progress. Each name below says which side writes it and
which reads it. Both sides import it from here; `tests/unit/spark/test_contract.py` pins the two sides together (what
the driver publishes parses on the operator's side, what the operator renders is what the driver reads) and
checks that neither package spells these names anywhere else.

Standard library only and no other `handoff_spark` import: the operator imports it without pyspark.
The switches the environment carries are read through `handoff_spark.switches`, which takes the names of the
rendered ones from here.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict

# ---------------------------------------------------------------------------- the driver's command line

#: The module the driver pod runs (`python -m handoff_spark …`). Written by the operator (the Deployment's and
#: the Backfill Job's command, `handoff run`'s exec); read by Python.
DRIVER_MODULE = "handoff_spark"
#: The stream's entry point. Written by the operator; parsed by `handoff_spark.__main__`.
RUN = "run"
#: A Backfill's entry point (`ReplayRequest` with a backfill). Written by the operator's Backfill Job; parsed by
#: `handoff_spark.__main__`.
BACKFILL = "backfill"
#: The app config's path. Written by the operator; parsed by `handoff_spark.__main__` (`AppConfig.load`).
CONFIG_FLAG = "--config"
#: Drain what is in the topics now, then exit 0. Written by `handoff run --available-now`; parsed by `__main__`.
AVAILABLE_NOW_FLAG = "--available-now"
#: Serve metrics on a free port when the config's is taken. Written by `handoff run` without `--metrics-port`;
#: parsed by `__main__`.
METRICS_PORT_FALLBACK_FLAG = "--metrics-port-fallback"
#: A Backfill's ledger query name. Written by the operator's Backfill Job; parsed by `__main__`.
QUERY_FLAG = "--query"
#: A Backfill's start offsets (inclusive), JSON `{"topic": {"partition": offset}}`. Written by the Backfill Job;
#: parsed by `__main__`.
FROM_FLAG = "--from"
#: A Backfill's end offsets (exclusive), same shape. Written by the Backfill Job; parsed by `__main__`.
TO_FLAG = "--to"
#: A Backfill's own checkpoint directory. Written by the Backfill Job; parsed by `__main__`.
CHECKPOINT_FLAG = "--checkpoint"

#: The app config's file name: the key of the ConfigMap/Secret `<handoff>-app` the operator renders and mounts
#: (and the file `handoff run` writes). Written by the operator; the driver reads whatever path `--config`
#: names.
APP_CONFIG_FILE = "app.json"


def run_command(python: str, config_file: str, *, available_now: bool = False,
                metrics_port_fallback: bool = False) -> list[str]:
    """The stream driver's command line (the operator's Deployment, `handoff run`)."""
    return [python, "-m", DRIVER_MODULE, RUN, CONFIG_FLAG, config_file,
            *([AVAILABLE_NOW_FLAG] if available_now else []),
            *([METRICS_PORT_FALLBACK_FLAG] if metrics_port_fallback else [])]


def backfill_command(python: str, config_file: str, query: str, start: Mapping[str, Mapping[str, int]],
                     end: Mapping[str, Mapping[str, int]], checkpoint: str) -> list[str]:
    """A Backfill's command line (the operator's Backfill Job): offsets as JSON, keys sorted."""
    return [python, "-m", DRIVER_MODULE, BACKFILL, CONFIG_FLAG, config_file, QUERY_FLAG, query,
            FROM_FLAG, json.dumps(start, sort_keys=True), TO_FLAG, json.dumps(end, sort_keys=True),
            CHECKPOINT_FLAG, checkpoint]


# ------------------------------------------------------------------------- the driver pod's environment

#: The Spark master URL (`k8s://…` in the driver pod, `local[*]` in a Backfill Job). Written by the operator;
#: read by the driver (`switches.spark_master`) when the app config's sparkConf names none.
ENV_SPARK_MASTER = "HANDOFF_SPARK_MASTER"
#: How long a stopping driver waits for a batch boundary, in seconds (derived from the pod's termination grace).
#: Written by the operator; read by the driver (`switches.stop_grace_seconds`).
ENV_STOP_GRACE_SECONDS = "HANDOFF_STOP_GRACE_SECONDS"
#: The driver pod's own name (the downward API). Written by the operator; read by the driver, which puts it in
#: its published record (`driverPod`) so the operator can tell the running driver's report from an old one.
ENV_DRIVER_POD_NAME = "HANDOFF_DRIVER_POD_NAME"
#: The ConfigMap the driver publishes its progress into and polls for the desired executor count
#: (`progress_configmap_name`). Written by the operator; read by the driver (publisher, executor scaler). Without
#: it (and `ENV_PROGRESS_NAMESPACE`), a local run, nothing is published or polled.
ENV_PROGRESS_CONFIGMAP = "HANDOFF_PROGRESS_CONFIGMAP"
#: That ConfigMap's namespace. Written by the operator; read by the driver.
ENV_PROGRESS_NAMESPACE = "HANDOFF_PROGRESS_NAMESPACE"
#: The driver pod's variable with its pod's `handoff.io/config-hash` (the downward API): the driver applies a query
#: config only when the operator made it for this very pod template (a rollout to another pod runs the rest).
ENV_POD_CONFIG_HASH = "HANDOFF_POD_CONFIG_HASH"
#: A checkpoint on S3 (spec.checkpoint.location s3a://…): the store's endpoint (spec.checkpoint.endpoint, for an
#: S3-compatible store that is not AWS), whether it takes path-style requests (spec.checkpoint.pathStyleAccess,
#: "true"/"false") and its region (spec.checkpoint.region). Written by the operator, only for such a checkpoint;
#: read by the driver, which hands them to Spark as `spark.hadoop.fs.s3a.*` and reads Handoff's own checkpoint files
#: with them (`handoff_spark.checkpoint`).
ENV_CHECKPOINT_S3_ENDPOINT = "HANDOFF_CHECKPOINT_S3_ENDPOINT"
ENV_CHECKPOINT_S3_PATH_STYLE = "HANDOFF_CHECKPOINT_S3_PATH_STYLE"
ENV_CHECKPOINT_S3_REGION = "HANDOFF_CHECKPOINT_S3_REGION"
#: The Secret holding the checkpoint store's credentials (spec.checkpoint.credentialsSecret). Written by the operator,
#: which also sets `CHECKPOINT_CREDENTIAL_KEYS` from it in the driver's env (secretKeyRef); read by the driver, which
#: asks Spark to give its executor pods the same variables from the same Secret (a stateful query's executors write
#: its state store into the checkpoint).
ENV_CHECKPOINT_CREDENTIALS_SECRET = "HANDOFF_CHECKPOINT_CREDENTIALS_SECRET"
#: The keys of that Secret, each set as the environment variable of its name: the AWS SDKs' own (S3A's and pyarrow's
#: default credential chains read them). The session token is optional in the Secret.
CHECKPOINT_CREDENTIAL_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
CHECKPOINT_OPTIONAL_CREDENTIAL_KEYS = ("AWS_SESSION_TOKEN",)
#: What the operator sets for a checkpoint on S3 (besides the credentials themselves).
CHECKPOINT_S3_ENV = frozenset({ENV_CHECKPOINT_S3_ENDPOINT, ENV_CHECKPOINT_S3_PATH_STYLE, ENV_CHECKPOINT_S3_REGION,
                               ENV_CHECKPOINT_CREDENTIALS_SECRET})
#: A checkpoint on Google Cloud Storage (spec.checkpoint.location gs://…): the JSON API's root URL of a store that is
#: not Google's (spec.checkpoint.endpoint: an emulator, a private endpoint) and whether requests go without
#: credentials (spec.checkpoint.anonymous, "true"). Written by the operator, only for such a checkpoint; read by the
#: driver, which hands them to Spark's GCS connector as `spark.hadoop.fs.gs.*`, and by `handoff_spark.checkpoint`.
ENV_CHECKPOINT_GCS_ENDPOINT = "HANDOFF_CHECKPOINT_GCS_ENDPOINT"
ENV_CHECKPOINT_GCS_ANONYMOUS = "HANDOFF_CHECKPOINT_GCS_ANONYMOUS"
#: Google's own variable for a service account key file: the operator mounts spec.checkpoint.credentialsSecret's
#: `GCS_KEY_FILE` at `GCS_KEY_DIR` and points this at it (pyarrow's and the connector's default credentials read it).
ENV_GOOGLE_APPLICATION_CREDENTIALS = "GOOGLE_APPLICATION_CREDENTIALS"
GCS_KEY_FILE = "key.json"
GCS_KEY_DIR = "/var/run/secrets/handoff/checkpoint-gcs"
#: What the operator sets for a checkpoint on GCS.
CHECKPOINT_GCS_ENV = frozenset({ENV_CHECKPOINT_GCS_ENDPOINT, ENV_CHECKPOINT_GCS_ANONYMOUS,
                                ENV_CHECKPOINT_CREDENTIALS_SECRET, ENV_GOOGLE_APPLICATION_CREDENTIALS})
#: What only the stream's driver gets: a Backfill Job copies the driver's pod without them (it neither
#: publishes nor is scaled).
STREAM_DRIVER_ONLY_ENV = frozenset({ENV_PROGRESS_CONFIGMAP, ENV_PROGRESS_NAMESPACE, ENV_DRIVER_POD_NAME,
                                    ENV_POD_CONFIG_HASH})
#: Every variable the operator sets in the driver pod (the checkpoint's only for a checkpoint on S3 or GCS).
RENDERED_ENV = frozenset({ENV_SPARK_MASTER, ENV_STOP_GRACE_SECONDS, *STREAM_DRIVER_ONLY_ENV, *CHECKPOINT_S3_ENV,
                          *CHECKPOINT_GCS_ENV})


# ------------------------------------------------------------------------------ the progress ConfigMap

def progress_configmap_name(handoff: str) -> str:
    """`<handoff>-progress`: created (without `data`) and owned by the operator, named to the driver in
    `ENV_PROGRESS_CONFIGMAP`; the driver patches `PROGRESS_DATA_KEY` into it, the operator its annotation."""
    return f"{handoff}-progress"


#: The key of the progress ConfigMap's `data` holding the driver's published record (`ProgressDocument`, JSON).
#: Written by the driver (`driver.publisher`, merge patch); read by the operator (`truth.driver_report`).
PROGRESS_DATA_KEY = "progress.json"
#: Spark conf the operator sets in a driver pod's config: the shuffle partitions a DataFrame-path query starts with
#: (a dedupe's state is split by them for the checkpoint's life), the most executor cores the handoff may scale to,
#: scaling.maxExecutors × spark.executor.cores, at most MAX_SHUFFLE_PARTITIONS. Written by the operator
#: (`spec.render.spark_conf`, outside the pod's config hash: the bounds apply live, and a checkpoint keeps the
#: number it started with anyway); read by the driver (`driver.app.cluster_partitions`). A user's own
#: spark.sql.shuffle.partitions wins.
SHUFFLE_PARTITIONS_CONF = "spark.handoff.shufflePartitions"
#: Spark's own default shuffle partitions: each is a task and a state store per batch, on however few executors run.
MAX_SHUFFLE_PARTITIONS = 200
#: The annotation of the progress ConfigMap holding the executor count the operator wants (a decimal integer).
#: Written by the operator (`scaling.step`); polled and applied live by the driver (`driver.executor_scaler`).
DESIRED_EXECUTORS_ANNOTATION = "handoff.io/desired-executors"
#: The annotation of the progress ConfigMap that holds the stream's query (its value: the ReplayRequest's name).
#: Written by the operator (`replay.handlers`) for a Rollback or RollbackAndReplay; polled by the driver
#: (`driver.hold`), which runs no query while it is there: it stops its query at a batch boundary, says so in its
#: record (`QUERY_HELD_KEY`) and starts the query again from the table's ledger once the annotation is gone,
#: in the same JVM and Spark session (no pod restart).
QUERY_HOLD_ANNOTATION = "handoff.io/query-hold"
#: The progress record's key with the hold the driver obeys now (the request's name): its query is stopped.
QUERY_HELD_KEY = "queryHeld"
#: The progress record's key with the hold the driver has seen and is stopping its query for, at a batch boundary
#: (at most `HANDOFF_STOP_GRACE_SECONDS`): the operator then waits for `QUERY_HELD_KEY` instead of stopping the pod.
QUERY_HOLDING_KEY = "queryHolding"
#: The annotation of the progress ConfigMap holding the query-only part of the app config the operator wants run
#: now (`QueryConfig`, JSON): the transform, the dedupe, the event time, the declared schema, the dead-letter topic, the
#: table's upkeep, the query's pace (trigger interval, batch size, event-time column) and the source's query settings
#: (`QUERY_CONFIG_SOURCE`); when a part is absent, the driver keeps its own. The pod's config hash leaves them out. Written by
#: the operator (`spec.render`) for every handoff; polled by the driver (`driver.hold`, one read with the hold) and
#: applied by `driver.query_config`: a change (adding or removing a transform, dedupe or event time too: the query
#: then switches between the fused and the DataFrame path) restarts the query at a batch boundary in the running
#: driver (no pod restart), after it passed the same check a start runs.
QUERY_CONFIG_ANNOTATION = "handoff.io/query-config"
#: The progress record's key with the config hash (the operator's, of the whole app config) this driver runs now.
CONFIG_HASH_KEY = "configHash"
#: The progress record's key with when (ms since the epoch) this driver started running that config: a ledger
#: commit after it is that config's (`upgrade.rule.committed_by`).
CONFIG_SINCE_KEY = "configSinceMs"
#: The progress record's key with the newest table commit (snapshot id) a batch of that config made in this driver:
#: kept through the batches that commit nothing (an idle stream), dropped when the query restarts with another
#: config. The operator's evidence that the config committed (`upgrade.rule.committed_by`), also when the spec
#: changes again before it read the ledger.
CONFIG_COMMITTED_KEY = "configCommittedSnapshot"
#: The progress record's keys of a query config this driver refused (its check failed): the config hash and the
#: one line (`TransformInvalid: …`). The driver keeps running the config it ran; the operator shows Degraded
#: TransformInvalid and rolls back to the last good spec when it can.
CONFIG_REFUSED_KEY = "configRefused"
CONFIG_REFUSED_HASH_KEY = "configRefusedHash"


class QueryConfig(TypedDict):
    """The value of `QUERY_CONFIG_ANNOTATION`."""

    configHash: str               # the operator's hash of the whole app config this query config belongs to
    podConfigHash: str            # the pod template's hash (without the query-only part) it goes with
    transform: dict[str, Any] | None  # `AppConfig.transform` as JSON (`handoff_spark.config.Transform`) or null
    dedupe: dict[str, Any] | None     # `AppConfig.dedupe` (`config.Dedupe`) or null
    eventTime: dict[str, Any] | None  # `AppConfig.event_time` (`config.EventTime`) or null
    schema: NotRequired[dict[str, Any]]  # `AppConfig.schema_` (`config.SchemaPolicy`: columns, policy, limits)
    deadLetterTopic: NotRequired[str | None]      # `AppConfig.dead_letter_topic` (spec.deadLetter.topic); null: none
    maintenance: NotRequired[dict[str, Any]]      # `AppConfig.maintenance` (`config.Maintenance`: spec.replay.window)
    triggerIntervalSeconds: NotRequired[float]    # `AppConfig.trigger_interval_seconds` (spec.commitInterval)
    maxRecordsPerBatch: NotRequired[int | None]   # `AppConfig.source.max_records_per_batch`; null: no limit
    eventTimeColumn: NotRequired[str | None]      # `AppConfig.schema_.event_time_column`; null: none
    bootstrapServers: NotRequired[str]            # `AppConfig.source.bootstrap_servers`
    topics: NotRequired[list[str]]                # `AppConfig.source.topics`
    startingOffsets: NotRequired[str]             # `AppConfig.source.starting_offsets`: earliest or latest
    minPartitions: NotRequired[int | None]        # `AppConfig.source.min_partitions`; null: follow the executors' cores
    consumerGroup: NotRequired[str | None]        # `AppConfig.source.consumer_group`; null: handoff-<handoffId>


#: The query config's parts that are the app config's own top-level keys (JSON names), each as the app config has it.
QUERY_CONFIG_PARTS = ("transform", "dedupe", "eventTime", "schema", "deadLetterTopic", "maintenance")
#: The query config's pace: its key → where the value sits in the app config's JSON.
QUERY_CONFIG_PACE = {"triggerIntervalSeconds": ("triggerIntervalSeconds",),
                     "maxRecordsPerBatch": ("source", "maxRecordsPerBatch"),
                     "eventTimeColumn": ("schema", "eventTimeColumn")}

#: The source's settings that are the query's: its bootstrap servers, its topics, where a topic new to the handoff
#: starts (`kafka.source.entry_points`), the tasks a batch is split into at least, and the consumer group the sink
#: mirrors committed offsets to: its key → where the value sits in the app config's JSON. A change of any restarts the
#: query in the running driver (other servers or topics once Kafka answers there with the cluster and topic ids the
#: table's ledger records: `driver.resume.source_problem`). The source's other settings roll the pod: its properties
#: (the app config merges a Secret's values into them, which the annotation must not hold), its format and registry
#: (the registry's credentials too), and
#: onOffsetOutOfRange, whose change is the fix for a driver stopped on offsets retention deleted: that driver exits,
#: so a new pod brings it at once whatever the crashing pod is doing (for an in-place change the operator replaces a
#: crashed pod only while it waits in its back-off: `handoff_operator.handoff.crash_backoff`).
QUERY_CONFIG_SOURCE = {"bootstrapServers": ("source", "bootstrapServers"), "topics": ("source", "topics"),
                       "startingOffsets": ("source", "startingOffsets"),
                       "minPartitions": ("source", "minPartitions"), "consumerGroup": ("source", "consumerGroup")}


class ProgressDocument(TypedDict, total=False):
    """The shape of `data[PROGRESS_DATA_KEY]`: the driver's progress record (docs/design/data-plane-contract.md)
    plus `driverPod` and `publishedAtMs`. Written by the driver; these are the keys the operator reads
    (`truth.driver_report.parse`); the record carries more (offsets, lag, …) for people and other readers.
    A key may be missing or null; the operator treats an unreadable value as unknown."""

    publishedAtMs: int            # when the driver published it (it republishes every ~15 s: a heartbeat)
    driverPod: str | None         # ENV_DRIVER_POD_NAME of the publishing driver
    batchId: int                  # the newest batch's id
    degradedReason: str | None    # trouble the sink met (`DEGRADED_REASONS`); null when none
    degradedDetail: str | None    # the error behind it at a driver's start, one line (`driver.table_wait`)
    timestampMs: int              # when that batch finished
    rows: int                     # its input rows (the Kafka records it read)
    durationMs: int               # its wall time
    inputRowsPerSecond: float     # Spark's input rate of the batch
    workMs: int                   # its parallel part (Spark's addBatch minus the table commit)
    firstOfDriver: bool           # the driver's first batch (it paid the start-up costs)
    dlqRows: int                  # dead letters of the batch
    committedSnapshot: int | None  # the batch's table commit (Iceberg snapshot id)
    totals: dict[str, int]        # what this driver committed since it started, running sums (the cost surface)
    checkpointDiscarded: str      # why this driver discarded its checkpoint at start (resumed from the ledger)
    queryHeld: str                # the hold (QUERY_HOLD_ANNOTATION's request) this driver's stopped query obeys
    queryHolding: str             # the hold this driver is stopping its query for (a batch still running)
    configHash: str               # the app config (the operator's hash) this driver runs now (CONFIG_HASH_KEY)
    configSinceMs: int            # since when it runs it (CONFIG_SINCE_KEY)
    configRefused: str            # a query config this driver refused: its one line (CONFIG_REFUSED_KEY)
    configRefusedHash: str        # that config's hash (CONFIG_REFUSED_HASH_KEY)


#: Published by the driver as `degradedReason` when BigQuery refused requests for quota or size limits.
#: Written by the BigQuery sink (`bigquery.sink.degraded_reason`); read by the operator (Degraded condition).
DEGRADED_BIGQUERY_RESOURCE_EXHAUSTED = "BigQueryResourceExhausted"
#: Published by the driver as `degradedReason` when BigQuery answered with transient server errors. Written by
#: the BigQuery sink; read by the operator.
DEGRADED_BIGQUERY_UNAVAILABLE = "BigQueryUnavailable"
#: Published by the driver as `degradedReason` while an Iceberg table's catalog does not answer at the driver's start
#: (it waits for it: `driver.table_wait`). Written by the Iceberg sink's driver; read by the operator.
DEGRADED_CATALOG_UNAVAILABLE = "CatalogUnavailable"
#: Every `degradedReason` a sink publishes, with what it means (the operator's condition message).
DEGRADED_REASONS: Mapping[str, str] = {
    DEGRADED_BIGQUERY_RESOURCE_EXHAUSTED: "BigQuery refused requests for quota or size limits",
    DEGRADED_BIGQUERY_UNAVAILABLE: "BigQuery answered with transient server errors",
    DEGRADED_CATALOG_UNAVAILABLE: "the Iceberg table's catalog did not answer",
}


#: A driver that refuses to start because `spec.transform` cannot run (the SQL does not parse or analyse, or its
#: output does not fit the declared schema) prints one line `TransformInvalid: <what and the fix>` as its last
#: and exits with `TRANSFORM_INVALID_EXIT`. Written by the driver (`driver.transform`); read by the operator, which
#: shows `Degraded` with reason `TransformInvalid` and that line (from the pod's termination message).
TRANSFORM_INVALID = "TransformInvalid"
TRANSFORM_INVALID_EXIT = 3
#: A declared schema the running driver was handed in place (`driver.query_config`) and the table cannot take (what
#: the sink's `prepare` refuses at a driver's start: a type its column cannot become, a column it lacks under
#: evolution=none): the driver refuses it in one line `SchemaIncompatible: spec.schema: <what and the fix>`, runs on
#: with the schema before, and the operator shows `Degraded` with this reason.
SCHEMA_INCOMPATIBLE = "SchemaIncompatible"
#: Topics or servers the running driver was handed in place (`driver.query_config`) that it cannot read: a topic
#: Kafka lacks, one recreated under its name (another topic id than the table's ledger records), servers where no
#: broker answers or of another cluster than the ledger's. The driver refuses them in one line `SourceInvalid:
#: spec.source.topics: <what and the fix>` (or `spec.source.bootstrapServers: …`), runs on with the source before,
#: and the operator shows `Degraded` with this reason.
SOURCE_INVALID = "SourceInvalid"
#: The reasons a refused query config's line may start with (`<reason>: …`); the operator shows that reason.
REFUSAL_REASONS = (TRANSFORM_INVALID, SCHEMA_INCOMPATIBLE, SOURCE_INVALID)


# -------------------------------------------------------------------------------- rules both sides apply

#: The Kafka source never cuts a partition's range into pieces smaller than this many offsets. Used by the
#: driver (`kafka.source.split_ranges`); the operator's scaling rule caps executors at what a topic can feed
#: in pieces of this size (`scaling.rule`).
MIN_SPLIT_OFFSETS = 10_000

#: The Kafka columns every table row carries (topic, partition, offset, record timestamp). Added by the data
#: plane (decoders, both sinks' table schemas); the operator refuses a declared column of the same name
#: (`spec.validation`).
KAFKA_TOPIC = "_kafka_topic"
KAFKA_PARTITION = "_kafka_partition"
KAFKA_OFFSET = "_kafka_offset"
KAFKA_TIMESTAMP = "_kafka_timestamp"
KAFKA_METADATA_COLUMNS = (KAFKA_TOPIC, KAFKA_PARTITION, KAFKA_OFFSET, KAFKA_TIMESTAMP)
