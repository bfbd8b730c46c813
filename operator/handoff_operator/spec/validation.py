"""Specs the CRD schema allows but that cannot work → `Ready=False, reason=InvalidSpec` (pure).

The API server already refuses what the schema and its CEL rules can express. What remains needs either
the rest of the cluster (does the Secret exist, does it have the key?) or rules the schema cannot say
well (durations in days, partition transforms naming undeclared columns). Each problem names the field
path and the fix, so the condition message is actionable. The operator keeps running; a previously
running driver keeps its last good config until the spec is fixed.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from handoff_spark.config import REGISTRY_FORMATS
from handoff_spark.contract import KAFKA_METADATA_COLUMNS

from handoff_operator.models import StreamTableHandoffSpec
from handoff_operator.models.common import parse_duration
from handoff_operator.models.pod import KEYED_LISTS, PodOptions
from handoff_operator.spec.render import (DRIVER_OVERHEAD_CONF, EXECUTOR_CPU_CONF, EXECUTOR_OVERHEAD_CONF,
                                          MAX_NAME_LENGTH, OPERATOR_DRIVER_ENV, OPERATOR_VOLUMES, POD_TEMPLATE_CONF,
                                          RESERVED_EXECUTOR_ENV_PREFIX, RESERVED_MOUNT_DIRS, RESERVED_VOLUME_PREFIX,
                                          Resolved, app_config, partition_source_column, resolve)

MIN_COMMIT_INTERVAL_SECONDS = 1.0
#: Spark's checkpoint and Handoff's side files (initial offsets, retention gaps) live on a mounted volume (file://),
#: on S3 through S3A (s3a://: the image ships hadoop-aws) or on Google Cloud Storage (gs://: the image ships Google's
#: GCS connector); the driver reads the side files of both with pyarrow.
CHECKPOINT_SCHEMES = ("file", "s3a", "gs")
OBJECT_STORE_SCHEMES = ("s3a", "gs")
#: Object stores whose Hadoop connectors the image lacks: refused, naming the ones that work.
UNSUPPORTED_STORE_SCHEMES = ("s3", "s3n", "hdfs", "abfs", "abfss", "wasb", "wasbs", "oss", "cos")
#: spec.checkpoint's fields and the object-store schemes each means something for.
CHECKPOINT_STORE_FIELDS = (("credentials_secret", "credentialsSecret", ("s3a", "gs")),
                           ("endpoint", "endpoint", ("s3a", "gs")),
                           ("path_style_access", "pathStyleAccess", ("s3a",)), ("region", "region", ("s3a",)),
                           ("anonymous", "anonymous", ("gs",)))
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
#: The view `transform.sql` reads (handoff_spark.driver.transform.SOURCE_VIEW; the operator does not import the
#: driver's Spark module): a lookup of that name would hide the records.
TRANSFORM_SOURCE_VIEW = "source"


@dataclass(frozen=True)
class Problem:
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def _loc(loc: tuple[Any, ...]) -> str:
    path = "spec"
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def parse_spec(raw: Mapping[str, Any]) -> tuple[StreamTableHandoffSpec | None, list[Problem]]:
    """The typed spec, or the problems pydantic found (rules that are stricter than the CRD's)."""
    try:
        return StreamTableHandoffSpec.model_validate(dict(raw)), []
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
            problems.append(Problem(_loc(tuple(err.get("loc", ()))), msg))
        return None, problems


def check(name: str, spec: StreamTableHandoffSpec,
          secrets: Mapping[str, Mapping[str, str] | None]) -> tuple[Resolved, list[Problem]]:
    """Problems of a schema-valid spec, and the Secret values it resolves to (when there are none)."""
    problems: list[Problem] = []
    if len(name) > MAX_NAME_LENGTH or not _DNS_1035.match(name):
        problems.append(Problem("metadata.name", (
            f"{name!r} cannot name the driver Service and checkpoint volume: use at most {MAX_NAME_LENGTH} "
            f"lower-case letters, digits and '-', starting with a letter")))

    resolved, secret_problems = resolve(spec, secrets)
    problems += [Problem(path, msg) for path, msg in secret_problems]

    if spec.commit_interval_seconds < MIN_COMMIT_INTERVAL_SECONDS:
        problems.append(Problem("spec.commitInterval", (
            f"{spec.commit_interval} is shorter than 1s: every commit is a table snapshot, so this would "
            f"flood the table's metadata; use 1s or more (10s is a good start)")))

    schema = spec.schema_
    if schema.on_incompatible == "deadLetter" and spec.dead_letter is None:
        problems.append(Problem("spec.deadLetter.topic", (
            "schema.onIncompatible=deadLetter needs a dead-letter topic; set deadLetter.topic or use "
            "onIncompatible: halt")))

    declared = {c.name: c for c in schema.columns}
    if schema.event_time_column is not None:
        column = declared.get(schema.event_time_column)
        if column is None or column.type not in ("timestamp", "timestamptz"):
            problems.append(Problem("spec.schema.eventTimeColumn", (
                f"{schema.event_time_column!r} is not a declared column of type timestamp; declare it "
                f"in schema.columns or remove eventTimeColumn (freshness then uses the Kafka timestamp)")))

    known = set(declared) | set(KAFKA_METADATA_COLUMNS)
    # Columns that come from the Schema Registry at run time cannot be checked here.
    from_registry = spec.source.format in REGISTRY_FORMATS and not schema.columns
    if spec.sink.iceberg is not None and not from_registry:
        for i, transform in enumerate(spec.sink.iceberg.partition_by):
            column = partition_source_column(transform)
            if column is not None and column not in known:
                problems.append(Problem(f"spec.sink.iceberg.partitionBy[{i}]", (
                    f"{transform!r} reads column {column!r}, which schema.columns does not declare; "
                    f"declare it or partition by one of: {', '.join(sorted(known))}")))
    if spec.sink.bigquery is not None and not from_registry:
        bq = spec.sink.bigquery
        if bq.partition_by is not None and bq.partition_by not in known:
            problems.append(Problem("spec.sink.bigquery.partitionBy", (
                f"{bq.partition_by!r} is not a declared column; declare it (timestamp or date) in "
                f"schema.columns or remove partitionBy")))
        elif bq.partition_by is not None and bq.partition_by in declared and \
                declared[bq.partition_by].type not in ("timestamp", "timestamptz", "date"):
            problems.append(Problem("spec.sink.bigquery.partitionBy", (
                f"{bq.partition_by!r} is {declared[bq.partition_by].type}; BigQuery time partitioning "
                f"needs a timestamp or date column")))
        for i, column in enumerate(bq.cluster_by):
            if column not in known:
                problems.append(Problem(f"spec.sink.bigquery.clusterBy[{i}]", (
                    f"{column!r} is not a declared column; declare it in schema.columns or remove it")))

    problems += _frame_path_problems(spec)
    problems += _pod_option_problems(spec)
    problems += _resource_conf_problems(spec)

    problems += _checkpoint_problems(spec)
    if not problems:
        problems += _data_plane_refusals(name, spec, resolved)
    return resolved, problems


def _checkpoint_problems(spec: StreamTableHandoffSpec) -> list[Problem]:
    """spec.checkpoint: a scheme the driver can reach, and each store setting only with a location it applies to."""
    checkpoint = spec.checkpoint
    location = checkpoint.location
    scheme = (location.split("://", 1)[0] if "://" in location else "") if location is not None else ""
    if location is not None and scheme in UNSUPPORTED_STORE_SCHEMES:
        return [Problem("spec.checkpoint.location", (
            f"{location!r}: {scheme}:// is not supported for checkpoints (the image has no connector for it); "
            f"use s3a://<bucket>/<prefix> for S3 or an S3-compatible store, gs://<bucket>/<prefix> for Google "
            f"Cloud Storage, file:///<path> on a volume you mount, or leave it empty for a PersistentVolumeClaim"))]
    if location is not None and scheme not in CHECKPOINT_SCHEMES:
        return [Problem("spec.checkpoint.location", (
            f"{location!r} has no supported scheme; use s3a://<bucket>/<prefix>, gs://<bucket>/<prefix> or "
            f"file:///<path>, or leave it empty for a volume"))]
    if scheme in OBJECT_STORE_SCHEMES:
        bucket = location.split("://", 1)[1].split("/", 1)  # type: ignore[union-attr]
        if not bucket[0] or len(bucket) < 2 or not bucket[1].strip("/"):
            return [Problem("spec.checkpoint.location", (
                f"{location!r}: name a bucket and a prefix, {scheme}://<bucket>/<prefix> (the prefix is the "
                f"checkpoint's alone: discarding it removes what is under it)"))]
    problems = []
    for field, wire, schemes in CHECKPOINT_STORE_FIELDS:
        if getattr(checkpoint, field) is not None and scheme not in schemes:
            forms = " or ".join(f"{s}://<bucket>/<prefix>" for s in schemes)
            problems.append(Problem(f"spec.checkpoint.{wire}", (
                f"only applies to a {' or '.join(s + '://' for s in schemes)} checkpoint location; remove it or "
                f"set location to {forms}")))
    if scheme == "gs" and checkpoint.anonymous and checkpoint.credentials_secret is not None:
        problems.append(Problem("spec.checkpoint.anonymous", (
            "anonymous requests carry no credentials, so credentialsSecret would be ignored; remove one of the "
            "two")))
    return problems


def _frame_path_problems(spec: StreamTableHandoffSpec) -> list[Problem]:
    """transform, dedupe and eventTime: what the driver would refuse at start (handoff_spark.driver.transform.check,
    exit 3, TransformInvalid) when the operator can already tell, so the user learns it from `kubectl apply`'s
    status instead of a crash-looping driver. The rules between the three fields themselves (dead-letter topic,
    keep with a dedupe, watermark over the window, Iceberg only, eventTimeColumn disagreeing) are the model's
    (StreamTableHandoffSpec._cross_field), which mirrors the app config's validators."""
    if not spec.frame_path:
        return []
    problems: list[Problem] = []
    schema = spec.schema_
    declared = {c.name: c for c in schema.columns}
    from_registry = spec.source.format in REGISTRY_FORMATS and not schema.columns
    if not schema.columns and not from_registry:
        problems.append(Problem("spec.schema.columns", (
            "transform, dedupe and eventTime work on the records' columns, and none are declared; declare them "
            "in schema.columns (or use a Schema Registry format, whose columns come from the registry)")))
    if spec.dedupe is not None and parse_duration(spec.dedupe.within) <= 0:
        problems.append(Problem("spec.dedupe.within", (
            f"{spec.dedupe.within} is no window: a dedupe drops a key seen within it; give a positive duration, "
            f"e.g. 1h")))
    # Without a transform the columns Spark sees are the declared ones plus the Kafka metadata; with one, only
    # Spark knows the SQL's output (the driver checks it before it writes anything).
    if schema.columns and spec.transform is None:
        known = set(declared) | set(KAFKA_METADATA_COLUMNS)
        choices = ", ".join(sorted(known))
        for i, key in enumerate(spec.dedupe.keys if spec.dedupe is not None else ()):
            if key not in known:
                problems.append(Problem(f"spec.dedupe.keys[{i}]", (
                    f"{key!r} is not a declared column; declare it in schema.columns or use one of: {choices}")))
        if spec.event_time is not None and spec.event_time.column not in known:
            problems.append(Problem("spec.eventTime.column", (
                f"{spec.event_time.column!r} is not a declared column; declare it (type timestamp) in "
                f"schema.columns or use one of: {choices}")))
    if spec.event_time is not None and spec.event_time.column in declared \
            and declared[spec.event_time.column].type not in ("timestamp", "timestamptz"):
        column = declared[spec.event_time.column]
        problems.append(Problem("spec.eventTime.column", (
            f"{column.name!r} is declared {column.type}; the driver measures event time on a column of type "
            f"timestamp (or timestamptz) only: declare it as timestamp or name another column")))
    if spec.transform is not None:
        seen: set[str] = set()
        for i, lookup in enumerate(spec.transform.lookups):
            # Spark's view names are case-insensitive: `Source` would replace the records' view too.
            folded = lookup.name.lower()
            if folded == TRANSFORM_SOURCE_VIEW:
                problems.append(Problem(f"spec.transform.lookups[{i}].name", (
                    f"{lookup.name!r} is the records' view in the SQL; give the lookup another name, e.g. the "
                    f"table's own ({lookup.table.rsplit('.', 1)[-1]})")))
            elif folded in seen:
                problems.append(Problem(f"spec.transform.lookups[{i}].name", (
                    f"{lookup.name!r} names two lookups (names are case-insensitive in Spark SQL); give each its "
                    f"own name")))
            seen.add(folded)
    return problems


def _pod_blocks(spec: StreamTableHandoffSpec) -> list[tuple[str, tuple[str, ...], PodOptions]]:
    """The pod option blocks the spec sets: (field path, the roles whose pods they reach, the block)."""
    spark = spec.spark
    blocks = (("spec.spark.pod", ("driver", "executor"), spark.pod),
              ("spec.spark.driver.pod", ("driver",), spark.driver.pod),
              ("spec.spark.executor.pod", ("executor",), spark.executor.pod))
    return [(path, roles, block) for path, roles, block in blocks if block is not None]


def _pod_option_problems(spec: StreamTableHandoffSpec) -> list[Problem]:
    """Pod options the schema takes but the pods cannot: what would collide with what the operator and Spark put
    into the same pods (their volumes, mounts, environment, the executors' template setting), a name given twice in
    one list, a mount of a volume the role does not have. Each is named where it was written."""
    problems: list[Problem] = []
    for path, roles, block in _pod_blocks(spec):
        for field, key in KEYED_LISTS.items():
            seen: set[str] = set()
            for i, item in enumerate(getattr(block, field) or ()):
                value = getattr(item, key)
                if value in seen:
                    problems.append(Problem(f"{path}.{_camel(field)}[{i}].{_camel(key)}", (
                        f"{value!r} is given twice in this list; give each entry once")))
                seen.add(value)
        for i, volume in enumerate(block.volumes or ()):
            if volume.name in OPERATOR_VOLUMES or volume.name.startswith(RESERVED_VOLUME_PREFIX):
                problems.append(Problem(f"{path}.volumes[{i}].name", (
                    f"{volume.name!r} is a volume the operator or Spark adds to the pod "
                    f"({', '.join(OPERATOR_VOLUMES)}, {RESERVED_VOLUME_PREFIX}*); give yours another name")))
        for i, mount in enumerate(block.volume_mounts or ()):
            taken = next((d for d in RESERVED_MOUNT_DIRS if _within(mount.mount_path, d) or _within(d, mount.mount_path)),
                         None)
            if taken is not None:
                problems.append(Problem(f"{path}.volumeMounts[{i}].mountPath", (
                    f"{mount.mount_path!r} overlaps {taken}, where the operator or Spark mounts its own files; "
                    f"mount elsewhere")))
        for i, env in enumerate(block.env or ()):
            if "driver" in roles and env.name in OPERATOR_DRIVER_ENV:
                problems.append(Problem(f"{path}.env[{i}].name", (
                    f"{env.name} is set by the operator on the driver (it runs the driver with it); remove it"
                    + (" or set it in spec.spark.executor.pod" if len(roles) > 1 else ""))))
            if "executor" in roles and env.name.startswith(RESERVED_EXECUTOR_ENV_PREFIX):
                problems.append(Problem(f"{path}.env[{i}].name", (
                    f"{env.name}: Spark sets SPARK_* on its executors itself; use spark.sparkConf "
                    f"(spark.executorEnv.* or the setting) instead"
                    + (" or set it in spec.spark.driver.pod" if len(roles) > 1 else ""))))
    missing: dict[tuple[str, str], list[str]] = {}  # (field, volume) → the roles whose pod lacks it
    for role, options, own in (("driver", spec.spark.driver_pod(), spec.spark.driver.pod),
                               ("executor", spec.spark.executor_pod(), spec.spark.executor.pod)):
        names = {v.name for v in options.volumes or ()}
        for mount in options.volume_mounts or ():
            if mount.name in names:
                continue
            mine = [m.mount_path for m in (own.volume_mounts if own is not None else None) or ()]
            where, mounts = ((f"spec.spark.{role}.pod", mine) if mount.mount_path in mine
                             else ("spec.spark.pod", [m.mount_path for m in spec.spark.pod.volume_mounts or ()]
                                   if spec.spark.pod is not None else []))
            missing.setdefault((f"{where}.volumeMounts[{mounts.index(mount.mount_path)}].name", mount.name),
                               []).append(role)
    for (where, volume), roles_ in missing.items():
        problems.append(Problem(where, (
            f"the {' and the '.join(roles_)}'s pod has no volume {volume!r}; add it to volumes (here or in "
            f"spec.spark.pod) or correct the name")))
    if not spec.spark.executor_pod().is_empty():
        for key in POD_TEMPLATE_CONF:
            if key in spec.spark.spark_conf:
                problems.append(Problem(f"spec.spark.sparkConf[{key}]", (
                    "the operator renders the executors' pod template from spec.spark.pod and "
                    "spec.spark.executor.pod; remove this key and put the options there")))
    return problems


def _resource_conf_problems(spec: StreamTableHandoffSpec) -> list[Problem]:
    """Spark settings in spec.spark.sparkConf that would make Spark's idea of a pod's size differ from the pod's:
    the driver's memory settings always (the operator sizes the driver's container from spec.spark.driver), the
    executors' when the typed fields say otherwise (Spark sizes the executor pods from whichever it is told last)."""
    problems: list[Problem] = []
    ex = spec.spark.executor
    typed = {key: "spec.spark.driver.memory, memoryOverhead or memoryOverheadFactor" for key in DRIVER_OVERHEAD_CONF}
    if ex.memory_overhead is not None or ex.memory_overhead_factor is not None:
        typed.update({key: "spec.spark.executor.memoryOverhead or memoryOverheadFactor"
                      for key in EXECUTOR_OVERHEAD_CONF})
    if ex.core_request is not None or ex.core_limit is not None:
        typed.update({key: "spec.spark.executor.coreRequest and coreLimit" for key in EXECUTOR_CPU_CONF})
    for key in sorted(spec.spark.spark_conf):
        if key in typed:
            problems.append(Problem(f"spec.spark.sparkConf[{key}]", (
                f"the pod's size comes from {typed[key]}, and Spark must be told the same; remove this key and "
                f"set the size there")))
    return problems


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(p.title() for p in rest)


def _within(path: str, directory: str) -> bool:
    return path.rstrip("/") == directory or path.startswith(directory.rstrip("/") + "/")


def _data_plane_refusals(name: str, spec: StreamTableHandoffSpec, resolved: Resolved) -> list[Problem]:
    """The app config's own validators, run last on a spec that passed every rule above: whatever the data plane
    would refuse is a problem here (InvalidSpec), never an exception while rendering. The rules above mirror them
    one by one with the field to fix; this only catches a rule that was added to the data plane and not here."""
    try:
        app_config(spec, "validation", name, "", resolved)
    except ValidationError as exc:
        return [Problem("spec", "the Spark app would refuse its config: " + str(err.get("msg", "invalid"))
                        .removeprefix("Value error, ")) for err in exc.errors(include_url=False)]
    return []
