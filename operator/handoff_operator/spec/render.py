"""StreamTableHandoff spec → the app config and the child manifests (pure; no I/O).

What the operator creates for a handoff `<name>` in namespace `<ns>`:

- ConfigMap `<name>-app`: `app.json`, the rendered `handoff_spark.config.AppConfig` (values that came
  from Secrets are shown as `<from Secret …>` there), and `executor-pod-template.json` when the executors have pod
  options (spec.spark.pod / spec.spark.executor.pod): the pod template Spark creates each executor from;
- Secret `<name>-app` (only when propertiesFrom resolved something): the real `app.json`, mounted by
  the driver instead of the ConfigMap, so credentials never sit in a ConfigMap;
- ServiceAccount + Role + RoleBinding `<name>-driver`: exactly what a client-mode Spark driver needs to
  run its executors (pods, services, configmaps, persistentvolumeclaims in its own namespace);
- ConfigMap `<name>-progress`: created empty (no `data`); the driver publishes its latest progress record
  into `data["progress.json"]` (handoff_spark.driver.publisher), which the operator reads for the
  Degraded condition. The operator's server-side apply never sets `data`, so the two never fight;
- headless Service `<name>-driver`: a stable name for the driver's ports (UI, metrics). Executors connect
  back to the driver's pod IP (`spark.driver.host=$(POD_IP)`), which needs no cluster DNS;
- Service `<name>-ui` (unless spec.spark.ui.service is false): the driver's Spark UI, port 4040, ClusterIP;
- Ingress `<name>-ui` (networking.k8s.io/v1, only when spec.spark.ui.ingress is set): the host and path to that
  Service; removing ui.ingress deletes it;
- Deployment `<name>-driver` running `python -m handoff_spark run --config /etc/handoff/app.json` in
  Spark client mode, with the driver's pod options (spec.spark.pod / spec.spark.driver.pod) laid into its pod
  template; Spark then creates the executor pods itself (spark.kubernetes.*, and the executor pod template),
  owned by the driver pod, so they go when the driver goes;
- PersistentVolumeClaim `<name>-checkpoint` when spec.checkpoint.location is empty. It is deliberately
  NOT owned by the handoff: deleting a handoff keeps its table and its checkpoint.

Why a Deployment (replicas 1, or 0 when suspended; strategy Recreate) and not a bare Pod:
- a crashed driver comes back without the operator: the kubelet restarts the container, and the
  ReplicaSet controller replaces a deleted or evicted pod. The operator may be down meanwhile;
- Recreate stops the old driver (SIGTERM → the app finishes its batch, up to
  terminationGracePeriodSeconds) before the new one starts, so a spec change is one controlled restart
  and two drivers never run the same checkpoint side by side in normal operation. (In a node
  partition Kubernetes cannot promise that for any workload; the ledger's batch-id check in the table
  commit keeps the table exactly-once even then.);
- suspend/resume is `replicas: 0/1`, the checkpoint makes the restart safe;
- the config hash annotation on the pod template turns any change of the rendered config into exactly
  one rollout, and kubectl/Argo CD show the rollout like any other.

Children carry an ownerReference to the handoff (controller, blockOwnerDeletion), so the garbage
collector removes them after the handoff is gone. The owner's labels are NOT copied (kopf.adopt
would): Argo CD tracks its apps by a label, and children carrying the app's tracking label would be
shown as out-of-sync extras and pruned.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from handoff_spark import contract
from handoff_spark.config import AppConfig
from handoff_spark.contract import progress_configmap_name

from handoff_operator.models import (GROUP, MAX_NAME_LENGTH, VERSION, StreamTableHandoff, StreamTableHandoffSpec,
                     spark_memory)
from handoff_operator.models.stream_table_handoff import SparkUiIngressSpec
from handoff_operator.models.common import PropertyFrom, cpu_quantity, parse_duration
from handoff_operator.models.pod import PodOptions

KIND: str = StreamTableHandoff.model_fields["kind"].default
PLURAL = StreamTableHandoff.plural

CONFIG_HASH_ANNOTATION = f"{GROUP}/config-hash"
# Set on a StreamTableHandoff by a running ReplayRequest (replay_handlers): `replay` names the request (the
# handoff's phase is Replaying), `replay-hold` keeps the driver at 0 replicas while the table is rewound.
REPLAY_ANNOTATION = f"{GROUP}/replay"
REPLAY_HOLD_ANNOTATION = f"{GROUP}/replay-hold"
#: REPLAY_HOLD_ANNOTATION's value when the replay holds the query inside the running driver (the pod stays,
#: `handoff_spark.driver.hold`); any other value stops the driver pod (replicas 0).
QUERY_HOLD_VALUE = "query"
NAME_LABEL = f"{GROUP}/name"
COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_BY = {"app.kubernetes.io/managed-by": "handoff-operator", "app.kubernetes.io/part-of": "handoff"}

CONFIG_DIR = "/etc/handoff"
CONFIG_FILE = f"{CONFIG_DIR}/{contract.APP_CONFIG_FILE}"
CHECKPOINT_DIR = "/var/lib/handoff/checkpoint"
RUN_DIR = "/var/run/handoff"
PROGRESS_FILE = f"{RUN_DIR}/progress.json"
BIGQUERY_CREDENTIALS_DIR = "/var/run/secrets/handoff/bigquery"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
#: The executors' pod template (spec.spark.pod + spec.spark.executor.pod), a file beside app.json in the driver's
#: /etc/handoff (ConfigMap or Secret `<name>-app`): Spark reads it when it creates an executor pod.
EXECUTOR_TEMPLATE_FILE = "executor-pod-template.json"
EXECUTOR_TEMPLATE_PATH = f"{CONFIG_DIR}/{EXECUTOR_TEMPLATE_FILE}"
EXECUTOR_CONTAINER = "executor"
POD_TEMPLATE_CONF = ("spark.kubernetes.executor.podTemplateFile", "spark.kubernetes.executor.podTemplateContainerName")
#: What the operator and Spark mount, name and set themselves in the Spark pods: a user's pod options may not
#: take these (spec.validation says which field to change).
OPERATOR_VOLUMES = ("app-config", "run", "checkpoint", "bigquery-credentials", "checkpoint-gcs-key")
RESERVED_VOLUME_PREFIX = "spark-"
RESERVED_MOUNT_DIRS = (CONFIG_DIR, RUN_DIR, "/var/lib/handoff", "/opt/spark/conf", SA_DIR)
OPERATOR_DRIVER_ENV = ("POD_NAME", "POD_NAMESPACE", "POD_IP", "PYSPARK_SUBMIT_ARGS", contract.ENV_SPARK_MASTER,
                       contract.ENV_STOP_GRACE_SECONDS, contract.ENV_DRIVER_POD_NAME,
                       contract.ENV_PROGRESS_CONFIGMAP, contract.ENV_PROGRESS_NAMESPACE)
RESERVED_EXECUTOR_ENV_PREFIX = "SPARK_"

DRIVER_PORT = 7078
BLOCK_MANAGER_PORT = 7079
UI_PORT = 4040
METRICS_PORT = 9090
DEFAULT_GRACE_SECONDS = 120
# The API server as every pod sees it (the kubelet sets these for the `kubernetes` Service and expands
# $(VAR) in env values): an address, not `kubernetes.default.svc`, so clusters without DNS work too.
SPARK_MASTER = "k8s://https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)"

# MAX_NAME_LENGTH (from the model): the longest handoff name whose children still have valid names.
__all__ = ["GROUP", "VERSION", "KIND", "PLURAL", "MAX_NAME_LENGTH"]


@dataclass(frozen=True)
class Resolved:
    """Values the handlers read from Secrets for this spec (plain data, so rendering stays pure)."""

    source_properties: dict[str, str] = field(default_factory=dict)
    catalog_properties: dict[str, str] = field(default_factory=dict)
    schema_registry_user_info: str | None = None

    @property
    def secret_values(self) -> bool:
        return bool(self.source_properties or self.catalog_properties or self.schema_registry_user_info)


# ------------------------------------------------------------------------------------------- names

def driver_name(name: str) -> str:
    return f"{name}-driver"


def app_config_name(name: str) -> str:
    return f"{name}-app"


def ui_service_name(name: str) -> str:
    """The Service of the driver's Spark UI (spec.spark.ui)."""
    return f"{name}-ui"


def ui_ingress_name(name: str) -> str:
    """The Ingress to the UI Service (spec.spark.ui.ingress): the same name, one UI per handoff."""
    return f"{name}-ui"


def checkpoint_pvc_name(name: str) -> str:
    return f"{name}-checkpoint"


def executor_pod_prefix(name: str) -> str:
    """Spark names executor pods `<prefix>-exec-<n>` and wants the prefix to be a DNS label of at most
    47 characters; longer handoff names are cut and made unique with a hash."""
    if len(name) <= 47:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[:47 - 9].rstrip('-')}-{digest}"


def selector_labels(name: str) -> dict[str, str]:
    return {NAME_LABEL: name, COMPONENT_LABEL: "driver"}


def labels(name: str, component: str) -> dict[str, str]:
    return {**MANAGED_BY, NAME_LABEL: name, COMPONENT_LABEL: component}


def handoff_id(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


# --------------------------------------------------------------------------------- secret resolving

def referenced_secrets(spec: StreamTableHandoffSpec) -> set[str]:
    """Names of the Secrets the spec reads (the handlers fetch exactly these)."""
    refs: list[PropertyFrom] = list(spec.source.properties_from)
    if spec.sink.iceberg is not None:
        refs += spec.sink.iceberg.catalog.properties_from
    names = {(r.secret_ref or r.secret_key_ref).name for r in refs}  # type: ignore[union-attr]
    if spec.sink.bigquery is not None and spec.sink.bigquery.credentials_from is not None:
        names.add(spec.sink.bigquery.credentials_from.name)
    registry = spec.source.schema_registry
    if registry is not None and registry.credentials_from is not None:
        names.add(registry.credentials_from.name)
    return names


def resolve_properties_from(refs: Sequence[PropertyFrom], secrets: Mapping[str, Mapping[str, str] | None],
                            path: str) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """Properties from `refs`, given the decoded data of the Secrets (None = Secret missing).

    Returns (properties, problems); a problem is (field path, message) for validation to report.
    Later entries win over earlier ones, as in a Pod's envFrom.
    """
    props: dict[str, str] = {}
    problems: list[tuple[str, str]] = []
    for i, ref in enumerate(refs):
        where = f"{path}[{i}]"
        if ref.secret_ref is not None:
            data = secrets.get(ref.secret_ref.name)
            if data is None:
                problems.append((f"{where}.secretRef.name",
                                 f"Secret {ref.secret_ref.name!r} not found in this namespace; create it "
                                 f"or correct the name"))
                continue
            for key, value in data.items():
                props[f"{ref.prefix or ''}{key}"] = value
        elif ref.secret_key_ref is not None and ref.property is not None:
            data = secrets.get(ref.secret_key_ref.name)
            if data is None:
                problems.append((f"{where}.secretKeyRef.name",
                                 f"Secret {ref.secret_key_ref.name!r} not found in this namespace; create "
                                 f"it or correct the name"))
            elif ref.secret_key_ref.key not in data:
                problems.append((f"{where}.secretKeyRef.key",
                                 f"Secret {ref.secret_key_ref.name!r} has no key {ref.secret_key_ref.key!r} "
                                 f"(it has: {', '.join(sorted(data)) or 'none'}); add it or correct the key"))
            else:
                props[ref.property] = data[ref.secret_key_ref.key]
    return props, problems


def resolve(spec: StreamTableHandoffSpec, secrets: Mapping[str, Mapping[str, str] | None]
            ) -> tuple[Resolved, list[tuple[str, str]]]:
    source, problems = resolve_properties_from(spec.source.properties_from, secrets,
                                               "spec.source.propertiesFrom")
    catalog: dict[str, str] = {}
    if spec.sink.iceberg is not None:
        catalog, more = resolve_properties_from(spec.sink.iceberg.catalog.properties_from, secrets,
                                                "spec.sink.iceberg.catalog.propertiesFrom")
        problems += more
    bq = spec.sink.bigquery
    if bq is not None and bq.credentials_from is not None:
        data = secrets.get(bq.credentials_from.name)
        if data is None:
            problems.append(("spec.sink.bigquery.credentialsFrom.name",
                             f"Secret {bq.credentials_from.name!r} not found in this namespace; create it "
                             f"or correct the name"))
        elif bq.credentials_from.key not in data:
            problems.append(("spec.sink.bigquery.credentialsFrom.key",
                             f"Secret {bq.credentials_from.name!r} has no key {bq.credentials_from.key!r}; "
                             f"add the service-account JSON under that key or correct the key"))
    user_info = None
    registry = spec.source.schema_registry
    if registry is not None and registry.credentials_from is not None:
        ref = registry.credentials_from
        data = secrets.get(ref.name)
        if data is None:
            problems.append(("spec.source.schemaRegistry.credentialsFrom.name",
                             f"Secret {ref.name!r} not found in this namespace; create it or correct the name"))
        elif ref.key not in data:
            problems.append(("spec.source.schemaRegistry.credentialsFrom.key",
                             f"Secret {ref.name!r} has no key {ref.key!r}; add `user:password` under that key "
                             f"or correct the key"))
        else:
            user_info = data[ref.key]
    return Resolved(source, catalog, user_info), problems


# ------------------------------------------------------------------------------------- app config

#: Speculative copies of straggler tasks. A micro-batch waits for its slowest task, and the commonest
#: straggler here is a task Spark hands to an executor the moment it registers (a scale-up, a replaced
#: pod): its Python worker daemon, imports and JVM are cold, so its first task can take tens of seconds
#: while the warm executors idle (measured in bench/operator/scaling/scaling_live.py, docs/benchmarks.md). With these,
#: once 30 % of a batch's tasks are done, a task running over 5 s and 2 × the median gets a copy on
#: another executor; the first attempt to finish commits, the other is killed. Safe for the sinks: a
#: write task's data files (Iceberg) or PENDING stream (BigQuery) reach the table only through the
#: driver's commit of the winning attempts' messages, so a losing attempt leaves unreferenced files at
#: most; dead letters are at-least-once already (sink/dead_letters.py). No effect with one executor or in local mode
#: (a copy needs another executor). `spark.sparkConf` may override any of them.
STRAGGLER_CONF = {
    "spark.speculation": "true",
    "spark.speculation.quantile": "0.3",
    "spark.speculation.multiplier": "2",
    "spark.speculation.minTaskRuntime": "5s",
    # Judge by duration only: a cold task is late because of start-up time, not because it reads slowly.
    "spark.speculation.efficiency.enabled": "false",
    # A batch of one task per core has no finished tasks to compare with (the quantile rule never fires): while
    # a new executor warms up, batches are one task per warm core (handoff_spark.startup.executor_warmup). Spark then
    # copies a task that runs longer than this. Longer than an executor's warm-up job takes on a small CPU share
    # (17.5-18.5 s per task at 0.2 core, measured), so that the job's own tasks are not copied to another executor.
    # Executors of ~0.1 core need a higher value (docs/operator.md).
    "spark.speculation.task.duration.threshold": "30s",
}


def spark_conf(spec: StreamTableHandoffSpec, namespace: str, name: str, image: str) -> dict[str, str]:
    """Spark settings for a client-mode driver in a pod that starts its executors as pods.

    The master URL and the driver's host are not here: they depend on the pod (its IP, the cluster's
    `kubernetes` Service address), so the pod template passes them as environment the kubelet expands
    (driver_pod_template), which works with or without cluster DNS.

    User `spark.sparkConf` comes last but cannot override the reserved keys (the models reject them).
    """
    ex = spec.spark.executor
    exec_labels = {NAME_LABEL: name, COMPONENT_LABEL: "executor", **MANAGED_BY}
    conf = {
        "spark.submit.deployMode": "client",
        "spark.kubernetes.namespace": namespace,
        "spark.kubernetes.container.image": image,
        "spark.kubernetes.executor.podNamePrefix": executor_pod_prefix(name),
        "spark.kubernetes.authenticate.caCertFile": f"{SA_DIR}/ca.crt",
        "spark.kubernetes.authenticate.oauthTokenFile": f"{SA_DIR}/token",
        "spark.driver.port": str(DRIVER_PORT),
        "spark.driver.blockManager.port": str(BLOCK_MANAGER_PORT),
        "spark.executor.cores": str(ex.cores),
        "spark.executor.memory": spark_memory(ex.memory),
        "spark.kubernetes.executor.request.cores": cpu_quantity(ex.request_millis()),
        "spark.kubernetes.executor.limit.cores": cpu_quantity(ex.limit_millis()),
        # The operator scales on Kafka lag and the driver applies its count live (handoff.io/desired-executors
        # on the progress ConfigMap; handoff_spark.driver.executor_scaler): Spark's own allocation stays off.
        "spark.dynamicAllocation.enabled": "false",
        LIVE_EXECUTORS_KEY: str(spec.scaling.min_executors),
        # Spark stops the application after max(3, 2 × spark.executor.instances) executor failures, pod
        # creations that time out on a busy API server included, counted from the start: instances is only the
        # starting count here, so the budget follows maxExecutors, and failures older than an hour stop counting.
        MAX_FAILURES_KEY: str(max(3, 2 * spec.scaling.max_executors)),
        # A DataFrame-path query's shuffle (a dedupe's state) gets one partition per core the handoff may scale to.
        SHUFFLE_PARTITIONS_KEY: str(shuffle_partitions(spec)),
        "spark.executor.failuresValidityInterval": "1h",
        "spark.kubernetes.executor.deleteOnTermination": "true",
        **STRAGGLER_CONF,
    }
    conf.update(overhead_conf(spec))
    if spec.spark.image_pull_policy:
        conf["spark.kubernetes.container.image.pullPolicy"] = spec.spark.image_pull_policy
    for key, value in exec_labels.items():
        conf[f"spark.kubernetes.executor.label.{key}"] = value
    if not spec.spark.executor_pod().is_empty():
        conf[POD_TEMPLATE_CONF[0]] = EXECUTOR_TEMPLATE_PATH
        conf[POD_TEMPLATE_CONF[1]] = EXECUTOR_CONTAINER
    conf.update(spec.spark.spark_conf)
    return conf


#: Spark settings of a memory overhead. The driver's are the operator's alone (it sizes the driver's container, and
#: Spark must be told the same); the executors' may come from spec.spark.sparkConf when the typed fields are unset.
DRIVER_OVERHEAD_CONF = ("spark.driver.memory", "spark.driver.memoryOverhead", "spark.driver.memoryOverheadFactor",
                        "spark.driver.minMemoryOverhead")
EXECUTOR_OVERHEAD_CONF = ("spark.executor.memoryOverhead", "spark.executor.memoryOverheadFactor",
                          "spark.executor.minMemoryOverhead", "spark.kubernetes.memoryOverheadFactor")
EXECUTOR_CPU_CONF = ("spark.kubernetes.executor.request.cores", "spark.kubernetes.executor.limit.cores")


def overhead_conf(spec: StreamTableHandoffSpec) -> dict[str, str]:
    """What Spark is told of the memory overheads the spec sets (nothing when it sets none, so a spec from before
    these fields keeps its config hash). The driver's is the number its container was sized with; the executors'
    is what Spark sizes their pods with (memory + overhead, requested and limited)."""
    driver, ex = spec.spark.driver, spec.spark.executor
    conf: dict[str, str] = {}
    if driver.memory_overhead is not None or driver.memory_overhead_factor is not None:
        conf["spark.driver.memoryOverhead"] = f"{driver.overhead_mib('driver')}m"
    if ex.memory_overhead is not None:
        conf["spark.executor.memoryOverhead"] = f"{ex.overhead_mib('executor')}m"
    elif ex.memory_overhead_factor is not None:
        conf["spark.executor.memoryOverheadFactor"] = str(ex.memory_overhead_factor)
    return conf


def checkpoint_location(spec: StreamTableHandoffSpec) -> str:
    return spec.checkpoint.location or f"file://{CHECKPOINT_DIR}"


def app_config(spec: StreamTableHandoffSpec, namespace: str, name: str, image: str,
               resolved: Resolved = Resolved()) -> AppConfig:
    """The AppConfig the driver runs (secrets included: it goes into a Secret when it has any)."""
    src = spec.source
    source = {
        "bootstrapServers": src.bootstrap_servers, "topics": list(src.topics),
        "startingOffsets": src.starting_offsets, "format": src.format,
        "maxRecordsPerBatch": src.max_records_per_batch, "minPartitions": src.min_partitions,
        "properties": {**src.properties, **resolved.source_properties},
        "onOffsetOutOfRange": src.on_offset_out_of_range, "consumerGroup": src.consumer_group,
    }
    if src.schema_registry is not None:
        source["schemaRegistry"] = {"url": src.schema_registry.url,
                                    "basicAuthUserInfo": resolved.schema_registry_user_info}
    if spec.sink.iceberg is not None:
        ice = spec.sink.iceberg
        sink: dict[str, Any] = {
            "kind": "iceberg", "catalogName": ice.catalog.name,
            "catalogProperties": {**ice.catalog.properties, **resolved.catalog_properties},
            "table": ice.table, "partitionBy": list(ice.partition_by), "autoCreate": ice.auto_create,
        }
    else:
        bq = spec.sink.bigquery
        assert bq is not None
        sink = {
            "kind": "bigquery", "project": bq.project, "dataset": bq.dataset, "table": bq.table,
            "writeMode": bq.write_mode, "partitionBy": bq.partition_by, "clusterBy": list(bq.cluster_by),
            "autoCreate": bq.auto_create,
            "credentialsFile": (f"{BIGQUERY_CREDENTIALS_DIR}/credentials.json"
                                if bq.credentials_from is not None else None),
            "restEndpoint": bq.rest_endpoint, "grpcEndpoint": bq.grpc_endpoint,
        }
    schema = spec.schema_
    return AppConfig.model_validate({
        "handoffId": handoff_id(namespace, name),
        "source": source,
        "sink": sink,
        "schema": {"columns": [c.model_dump(by_alias=True, exclude_none=True) for c in schema.columns],
                   "evolution": schema.evolution, "onIncompatible": schema.on_incompatible,
                   "eventTimeColumn": (spec.event_time.column if spec.event_time is not None
                                       else schema.event_time_column),
                   "limits": schema.limits.model_dump(by_alias=True)},
        "deadLetterTopic": spec.dead_letter.topic if spec.dead_letter is not None else None,
        "triggerIntervalSeconds": spec.commit_interval_seconds,
        "checkpointLocation": checkpoint_location(spec),
        "metricsPort": METRICS_PORT,
        "progressFile": PROGRESS_FILE,
        "maintenance": {"expireOlderThanSeconds": int(spec.replay_window_seconds)},
        "sparkConf": spark_conf(spec, namespace, name, image),
        # Records as Spark rows, through the SQL, event time and dedupe (handoff_spark.driver.transform).
        "transform": spec.transform.model_dump(by_alias=True) if spec.transform is not None else None,
        "dedupe": ({"keys": list(spec.dedupe.keys), "withinSeconds": parse_duration(spec.dedupe.within)}
                   if spec.dedupe is not None else None),
        "eventTime": ({"column": spec.event_time.column,
                       "watermarkSeconds": parse_duration(spec.event_time.watermark),
                       "lateRecords": spec.event_time.late_records} if spec.event_time is not None else None),
    })


def redacted_json(config: AppConfig, resolved: Resolved, spec: StreamTableHandoffSpec) -> str:
    """app.json for the ConfigMap: values that came from Secrets replaced by where they came from."""
    data = json.loads(config.to_json())
    for key in resolved.source_properties:
        data["source"]["properties"][key] = "<from a Secret: spec.source.propertiesFrom>"
    if resolved.schema_registry_user_info:
        data["source"]["schemaRegistry"]["basicAuthUserInfo"] = \
            "<from a Secret: spec.source.schemaRegistry.credentialsFrom>"
    if data["sink"].get("kind") == "iceberg":
        for key in resolved.catalog_properties:
            data["sink"]["catalogProperties"][key] = "<from a Secret: spec.sink.iceberg.catalog.propertiesFrom>"
    return json.dumps(data, indent=2, sort_keys=True)


# -------------------------------------------------------------------------------------- manifests

#: The key of the timeline record's `data` (`<name>-timeline`, handoff.journal): a JSON list of entries.
TIMELINE_DATA_KEY = "timeline.json"


def timeline_configmap_name(handoff: str) -> str:
    """`<handoff>-timeline`: what the operator decided and saw, kept beyond the hour Kubernetes keeps Events.
    Written by the operator's reconcile (handoff.journal); read by `kubectl handoff timeline`."""
    return f"{handoff}-timeline"


def timeline_configmap(owner: Mapping[str, Any], text: str) -> dict[str, Any]:
    """The timeline record, owned by the handoff (garbage-collected with it)."""
    meta = owner["metadata"]
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _meta(timeline_configmap_name(meta["name"]), meta["namespace"], "timeline", owner),
            "data": {TIMELINE_DATA_KEY: text}}


def owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    meta = owner["metadata"]
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": meta["name"], "uid": meta["uid"],
            "controller": True, "blockOwnerDeletion": True}


def _meta(name: str, namespace: str, component: str, owner: Mapping[str, Any] | None,
          owned: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace,
                            "labels": labels(owner["metadata"]["name"] if owner else name, component)}
    if owner is not None and owned:
        meta["ownerReferences"] = [owner_reference(owner)]
    return meta


def driver_pod_resources(spec: StreamTableHandoffSpec) -> dict[str, Any]:
    """Container resources of the driver: JVM heap + the overhead (spec.spark.driver.memoryOverhead, else
    max(384Mi, memoryOverheadFactor × heap), the factor 0.4 for PySpark as Spark itself sizes a cluster-mode Python
    driver pod), requested and limited alike; CPU as coreRequest/coreLimit, else cores. Quantities are written as
    the API server writes them back (whole cores or millicores), so the Deployment reads back as applied."""
    driver = spec.spark.driver
    memory = f"{driver.heap_mib() + driver.overhead_mib('driver')}Mi"
    return {"requests": {"cpu": cpu_quantity(driver.request_millis()), "memory": memory},
            "limits": {"cpu": cpu_quantity(driver.limit_millis()), "memory": memory}}


def driver_heap(spec: StreamTableHandoffSpec) -> str:
    return spark_memory(spec.spark.driver.memory)


def service_account_name(spec: StreamTableHandoffSpec, name: str) -> str:
    return spec.spark.service_account_name or driver_name(name)


def stop_grace_seconds(grace_seconds: int) -> int:
    """The app's batch-boundary wait for a pod with `grace_seconds` of termination grace."""
    return max(1, grace_seconds - max(10, grace_seconds // 5))


def checkpoint_env(spec: StreamTableHandoffSpec) -> list[dict[str, Any]]:
    """The driver's environment for a checkpoint on S3 (s3a://): the store's settings, and the credentials from
    spec.checkpoint.credentialsSecret by secretKeyRef, so they never pass through the operator, the app config or
    Spark's conf. The driver hands the settings to Spark's S3A (handoff_spark.driver.app.s3_checkpoint_conf) and
    asks for the same Secret in its executor pods. Nothing for a volume."""
    checkpoint = spec.checkpoint
    if (checkpoint.location or "").startswith("gs://"):
        return gcs_checkpoint_env(spec)
    if not (checkpoint.location or "").startswith("s3a://"):
        return []
    env: list[dict[str, Any]] = []
    if checkpoint.endpoint:
        env.append({"name": contract.ENV_CHECKPOINT_S3_ENDPOINT, "value": checkpoint.endpoint.rstrip("/")})
    if checkpoint.path_style_access is not None:
        env.append({"name": contract.ENV_CHECKPOINT_S3_PATH_STYLE, "value": str(checkpoint.path_style_access).lower()})
    if checkpoint.region:
        env.append({"name": contract.ENV_CHECKPOINT_S3_REGION, "value": checkpoint.region})
    secret = checkpoint.credentials_secret
    if secret:
        env.append({"name": contract.ENV_CHECKPOINT_CREDENTIALS_SECRET, "value": secret})
        env += [{"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
                for key in contract.CHECKPOINT_CREDENTIAL_KEYS]
        env += [{"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": True}}}
                for key in contract.CHECKPOINT_OPTIONAL_CREDENTIAL_KEYS]
    return env


#: The volume holding a gs:// checkpoint's service account key (spec.checkpoint.credentialsSecret).
GCS_KEY_VOLUME = "checkpoint-gcs-key"


def gcs_checkpoint_env(spec: StreamTableHandoffSpec) -> list[dict[str, Any]]:
    """The driver's environment for a checkpoint on Google Cloud Storage (gs://): the storage endpoint, anonymous
    access, and the path of the service account key `checkpoint_key_volume` mounts (Google's own
    GOOGLE_APPLICATION_CREDENTIALS, which pyarrow and the GCS connector read; the key never passes through the
    operator, the app config or Spark's conf). The driver hands them to the connector
    (handoff_spark.driver.app.gcs_checkpoint_conf) and asks Spark to mount the same Secret in its executors."""
    checkpoint = spec.checkpoint
    env: list[dict[str, Any]] = []
    if checkpoint.endpoint:
        env.append({"name": contract.ENV_CHECKPOINT_GCS_ENDPOINT, "value": checkpoint.endpoint.rstrip("/")})
    if checkpoint.anonymous:
        env.append({"name": contract.ENV_CHECKPOINT_GCS_ANONYMOUS, "value": "true"})
    if checkpoint.credentials_secret:
        env.append({"name": contract.ENV_CHECKPOINT_CREDENTIALS_SECRET, "value": checkpoint.credentials_secret})
        env.append({"name": contract.ENV_GOOGLE_APPLICATION_CREDENTIALS,
                    "value": f"{contract.GCS_KEY_DIR}/{contract.GCS_KEY_FILE}"})
    return env


def checkpoint_key_volume(spec: StreamTableHandoffSpec) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(mount, volume) of a gs:// checkpoint's key Secret in the driver, or None. The same Secret reaches the
    executors through `spark.kubernetes.executor.secrets.<name>` at the same path."""
    checkpoint = spec.checkpoint
    if not (checkpoint.location or "").startswith("gs://") or not checkpoint.credentials_secret:
        return None
    return ({"name": GCS_KEY_VOLUME, "mountPath": contract.GCS_KEY_DIR, "readOnly": True},
            {"name": GCS_KEY_VOLUME, "secret": {"secretName": checkpoint.credentials_secret,
                                                 "items": [{"key": contract.GCS_KEY_FILE,
                                                            "path": contract.GCS_KEY_FILE}]}})


def ui_proxy_conf(spec: StreamTableHandoffSpec) -> dict[str, str]:
    """The Spark settings a UI served under an Ingress path other than `/` needs; none at `/` (or without ingress).

    - spark.ui.proxyBase: Spark prefixes every link of its pages with it (Spark still answers at `/`: the ingress
      controller strips the prefix);
    - spark.ui.proxyRedirectUri: Spark's own redirects (`/` → `/jobs/`, an unknown page → `/jobs/`) otherwise go to
      the bare `/jobs/` of the host, outside the prefix; with it they go to `<scheme>://<host><path>/jobs/`. Left
      out for a wildcard host, which names no one URL.
    Both checked against the driver's Spark (tests/integration/spark/test_spark_ui_proxy_base.py)."""
    ingress = spec.spark.ui_ingress()
    base = ingress.proxy_base() if ingress is not None else None
    if ingress is None or base is None:
        return {}
    conf = {"spark.ui.proxyBase": base}
    if not ingress.host.startswith("*."):
        conf["spark.ui.proxyRedirectUri"] = f"{'https' if ingress.tls is not None else 'http'}://{ingress.host}"
    return conf


def ui_proxy_base_args(spec: StreamTableHandoffSpec) -> str:
    """`ui_proxy_conf` as spark-submit arguments (each followed by a space), for PYSPARK_SUBMIT_ARGS.

    spark.ui.proxyBase is read as a JVM system property (UIUtils.uiRoot), not from the SparkConf a SparkSession is
    built with: so it must come at JVM launch, through spark-submit's --conf, and the app's sparkConf could not carry
    it. The host and path patterns of the model keep both values free of spaces and shell characters, since pyspark
    splits these arguments like a shell."""
    return "".join(f"--conf {key}={value} " for key, value in ui_proxy_conf(spec).items())


def driver_pod_template(spec: StreamTableHandoffSpec, namespace: str, name: str, image: str,
                        mount_secret: bool, grace_seconds: int) -> dict[str, Any]:
    """The pod template without the config-hash annotation (the hash is computed over it)."""
    # Client mode: the driver JVM is started by pyspark inside this container, so its heap and the
    # pod name (for executor ownerReferences) must be given at JVM launch: PYSPARK_SUBMIT_ARGS.
    # $(POD_NAME) is expanded by the kubelet from the env var above it. Executors reach the driver (its
    # scheduler and its block manager) at its pod IP: no DNS needed. The bind address is the pod IP too:
    # in client mode on Kubernetes Spark advertises the bind address as spark.driver.host (seen on a real
    # node: with bindAddress 0.0.0.0 executors were told to connect to 0.0.0.0).
    submit_args = (f"--driver-memory {driver_heap(spec)} "
                   f"--conf spark.kubernetes.driver.pod.name=$(POD_NAME) "
                   f"--conf spark.driver.host=$(POD_IP) --conf spark.driver.bindAddress=$(POD_IP) "
                   f"{ui_proxy_base_args(spec)}pyspark-shell")
    env = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "PYSPARK_SUBMIT_ARGS", "value": submit_args},
        {"name": contract.ENV_SPARK_MASTER, "value": SPARK_MASTER},
        # The app waits this long for a batch boundary on SIGTERM: inside the pod's grace period, with
        # time left for Spark to shut down, so the kubelet's SIGKILL never cuts the graceful stop short.
        {"name": contract.ENV_STOP_GRACE_SECONDS, "value": str(stop_grace_seconds(grace_seconds))},
        {"name": contract.ENV_DRIVER_POD_NAME, "value": "$(POD_NAME)"},
        # Where the driver publishes its progress record for the operator (handoff_spark.driver.publisher).
        {"name": contract.ENV_PROGRESS_CONFIGMAP, "value": progress_configmap_name(name)},
        {"name": contract.ENV_PROGRESS_NAMESPACE, "value": namespace},
    ]
    # The pod's own config hash: the driver applies the operator's changed query config in place only when it was
    # rendered for this pod template (handoff_spark.driver.query_config).
    env.append({"name": contract.ENV_POD_CONFIG_HASH,
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{CONFIG_HASH_ANNOTATION}']"}}})
    env += checkpoint_env(spec)
    mounts = [{"name": "app-config", "mountPath": CONFIG_DIR, "readOnly": True},
              {"name": "run", "mountPath": RUN_DIR}]
    config_source = ({"secret": {"secretName": app_config_name(name)}} if mount_secret
                     else {"configMap": {"name": app_config_name(name)}})
    volumes: list[dict[str, Any]] = [{"name": "app-config", **config_source},
                                     {"name": "run", "emptyDir": {}}]
    if spec.checkpoint.location is None:
        mounts.append({"name": "checkpoint", "mountPath": CHECKPOINT_DIR})
        volumes.append({"name": "checkpoint",
                        "persistentVolumeClaim": {"claimName": checkpoint_pvc_name(name)}})
    key_volume = checkpoint_key_volume(spec)
    if key_volume is not None:
        mounts.append(key_volume[0])
        volumes.append(key_volume[1])
    bq = spec.sink.bigquery
    if bq is not None and bq.credentials_from is not None:
        mounts.append({"name": "bigquery-credentials", "mountPath": BIGQUERY_CREDENTIALS_DIR, "readOnly": True})
        volumes.append({"name": "bigquery-credentials", "secret": {
            "secretName": bq.credentials_from.name,
            "items": [{"key": bq.credentials_from.key, "path": "credentials.json"}]}})
    container: dict[str, Any] = {
        "name": "driver",
        "image": image,
        "command": contract.run_command("python", CONFIG_FILE),
        "env": env,
        "ports": [{"name": "driver", "containerPort": DRIVER_PORT},
                  {"name": "blockmanager", "containerPort": BLOCK_MANAGER_PORT},
                  {"name": "ui", "containerPort": UI_PORT},
                  {"name": "metrics", "containerPort": METRICS_PORT}],
        "resources": driver_pod_resources(spec),
        "volumeMounts": mounts,
        # A driver that dies without writing /dev/termination-log leaves its log tail as the message,
        # which the operator reports as status.app.lastFailure.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # Ready once the SparkContext listens: executors can then register.
        "readinessProbe": {"tcpSocket": {"port": DRIVER_PORT}, "periodSeconds": 10},
    }
    if spec.spark.image_pull_policy:
        container["imagePullPolicy"] = spec.spark.image_pull_policy
    template: dict[str, Any] = {
        "metadata": {"labels": {**labels(name, "driver")}},
        "spec": {
            "serviceAccountName": service_account_name(spec, name),
            "terminationGracePeriodSeconds": grace_seconds,
            "containers": [container],
            "volumes": volumes,
        },
    }
    apply_pod_options(template, container, spec.spark.driver_pod())
    return template


def apply_pod_options(template: dict[str, Any], container: dict[str, Any], options: PodOptions) -> None:
    """Lay the user's pod options into a pod template and its Spark container: only what is set, after (never
    instead of) what the operator sets, so an unset option renders nothing the API server would default and a
    spec without options renders exactly what it did before they existed (the config hash stays)."""
    meta, pod = template["metadata"], template["spec"]
    if options.labels:
        meta["labels"] = {**options.labels, **meta.get("labels", {})}
    if options.annotations:
        meta["annotations"] = {**options.annotations, **meta.get("annotations", {})}
    for field, key in (("node_selector", "nodeSelector"), ("tolerations", "tolerations"),
                       ("affinity", "affinity"), ("topology_spread_constraints", "topologySpreadConstraints"),
                       ("priority_class_name", "priorityClassName"), ("image_pull_secrets", "imagePullSecrets"),
                       ("pod_security_context", "securityContext")):
        value = options.wire(field)
        if value is not None:
            pod[key] = value
    if options.volumes:
        pod["volumes"] = pod.get("volumes", []) + options.wire("volumes")
    for field, key in (("env", "env"), ("env_from", "envFrom"), ("volume_mounts", "volumeMounts")):
        value = options.wire(field)
        if value:
            container[key] = container.get(key, []) + value
    security = options.wire("container_security_context")
    if security is not None:
        container["securityContext"] = security


def executor_pod_template(spec: StreamTableHandoffSpec) -> dict[str, Any] | None:
    """The executors' pod template (a Pod manifest Spark starts each executor pod from), or None when the spec
    sets no executor pod options (Spark's own executor pods then, as before). Spark fills in the container's
    image, command, resources and its own env, labels and volumes; the template holds only the user's options,
    with the Spark container named by spark.kubernetes.executor.podTemplateContainerName."""
    options = spec.spark.executor_pod()
    if options.is_empty():
        return None
    container: dict[str, Any] = {"name": EXECUTOR_CONTAINER}
    template: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": {},
                                "spec": {"containers": [container]}}
    apply_pod_options(template, container, options)
    return template


#: Only the count a new driver starts with: the running driver follows the operator's desired count live, so a
#: scaling change (minExecutors) must not restart it and this key is left out of the config hash.
LIVE_EXECUTORS_KEY = "spark.executor.instances"
#: Follows maxExecutors (see spark_conf); a running driver keeps its budget, so it stays out of the hash too.
MAX_FAILURES_KEY = "spark.executor.maxNumFailures"


#: Follows maxExecutors too: a running driver's query keeps its checkpoint's number, so it stays out of the hash.
SHUFFLE_PARTITIONS_KEY = contract.SHUFFLE_PARTITIONS_CONF


def shuffle_partitions(spec: StreamTableHandoffSpec) -> int:
    """The shuffle partitions a DataFrame-path query starts with on this handoff's executors (pure): one per core it
    may scale to, so a dedupe's state, split by them for its checkpoint's life, can use every executor; at most
    Spark's own default of 200, each a task and a state store per batch however few executors run."""
    cores = spec.scaling.max_executors * spec.spark.executor.cores
    return max(1, min(contract.MAX_SHUFFLE_PARTITIONS, cores))


#: The app config's query-only part: what the running driver changes by restarting its query, not its pod
#: (handoff_spark.driver.query_config). Neither their content nor whether they are set is in the pod's hash: adding
#: or removing a transform, dedupe or event time switches the query between the fused path and the DataFrame path in
#: the running driver (which sets the session's state store for a dedupe then; the JVMs keep the JIT they were
#: launched with until the pod's next start). The declared schema too: the driver reconciles the table with it at the
#: batch boundary, as a start does, and refuses one the table cannot take (SchemaIncompatible). And the dead-letter
#: topic (the query's writers produce to it) and the table's upkeep (`maintenance`: the snapshots expired past
#: spec.replay.window, run by the query's commit).
QUERY_ONLY_KEYS = contract.QUERY_CONFIG_PARTS
#: The query's pace and event-time column: the trigger (spec.commitInterval), the source's batch size
#: (spec.source.maxRecordsPerBatch) and the column freshness is measured on (eventTime.column, else
#: schema.eventTimeColumn), as the query config's key → its path in the app config's JSON. Options of the query, so
#: the running driver applies them too, on either path.
QUERY_PACE_KEYS = contract.QUERY_CONFIG_PACE
#: The source's query settings (spec.source.bootstrapServers, topics, startingOffsets, minPartitions, consumerGroup):
#: the running driver checks Kafka answers there with the ledger's cluster and has the topics (SourceInvalid
#: otherwise) and starts its query again with them. The source's other
#: settings stay in the pod's hash (contract.QUERY_CONFIG_SOURCE says why).
QUERY_SOURCE_KEYS = contract.QUERY_CONFIG_SOURCE
#: Every query-config key that sits at a path in the app config's JSON.
QUERY_PATH_KEYS = {**QUERY_PACE_KEYS, **QUERY_SOURCE_KEYS}
#: What a query-only key's content is replaced by in the pod's hash.
QUERY_ONLY_MARK = "<applied in the running driver>"


def _pace(doc: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        doc = (doc or {}).get(key)  # type: ignore[assignment]
    return doc


def config_hash(app_json: str, template: Mapping[str, Any],
                executor_template: Mapping[str, Any] | None = None, *, pod: bool = False) -> str:
    """Hash of everything the driver runs with, but the live executor count: a change means one restart, no
    change none. The executors' pod template counts (the driver reads it at start); without one the hash is what
    it was before executor templates existed, so an operator upgrade restarts no driver.

    `pod`: the pod template's hash (its annotation, a rollout per change), which leaves the query-only keys out: a
    change of the transform, the dedupe, the event time (adding or removing one too), the commit interval or the
    batch size, the declared schema (its columns, evolution, policy and limits), the source's servers,
    topics, startingOffsets, minPartitions or consumerGroup alone restarts the query in the running driver, not the pod."""
    doc = json.loads(app_json)
    if pod:
        for path in QUERY_PATH_KEYS.values():
            parent = doc
            for key in path[:-1]:
                parent = parent.setdefault(key, {})
            parent[path[-1]] = QUERY_ONLY_MARK
        for key in QUERY_ONLY_KEYS:  # after the pace: the schema holds the event-time column
            doc[key] = QUERY_ONLY_MARK
    for key in (LIVE_EXECUTORS_KEY, MAX_FAILURES_KEY, SHUFFLE_PARTITIONS_KEY):
        (doc.get("sparkConf") or {}).pop(key, None)
    digest = hashlib.sha256()
    digest.update(json.dumps(doc, sort_keys=True).encode())
    digest.update(json.dumps(template, sort_keys=True).encode())
    if executor_template is not None:
        digest.update(json.dumps(executor_template, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def query_config_json(config: AppConfig, full_hash: str, pod_hash: str) -> str:
    """The progress ConfigMap's `handoff.io/query-config` (contract.QueryConfig): the query-only part the running
    driver of pod template `pod_hash` applies in place, and the whole config's hash it then reports. None of it holds
    a Secret's value (only source and sink properties do), so it may sit in a ConfigMap."""
    app = json.loads(config.to_json())
    doc = {"configHash": full_hash, "podConfigHash": pod_hash, **{key: app.get(key) for key in QUERY_ONLY_KEYS},
           **{key: _pace(app, path) for key, path in QUERY_PATH_KEYS.items()}}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Rendered:
    config: AppConfig
    config_hash: str                      # of the whole app config (status.app.configHash, the upgrade rule)
    children: list[dict[str, Any]]        # owned by the handoff, applied in this order
    unowned: list[dict[str, Any]]         # created if missing, never deleted by the operator
    #: Owned children the spec has turned off (apiVersion, kind, metadata name/namespace only): deleted when
    #: present and owned by this handoff.
    absent: list[dict[str, Any]] = field(default_factory=list)

    #: The pod template's hash (without the query-only part): the driver pod's annotation. None: as config_hash.
    pod_config_hash: str | None = None

    @property
    def pod_hash(self) -> str:
        return self.pod_config_hash or self.config_hash

    def child(self, kind: str) -> dict[str, Any]:
        return next(c for c in self.children if c["kind"] == kind)



def pod_held(annotations: Mapping[str, str] | None) -> bool:
    """Does a replay hold the driver pod stopped (replicas 0)? Not when it holds only the query in the running
    driver (`QUERY_HOLD_VALUE`)."""
    value = (annotations or {}).get(REPLAY_HOLD_ANNOTATION)
    return value is not None and value != QUERY_HOLD_VALUE

def render(owner: Mapping[str, Any], spec: StreamTableHandoffSpec, image: str,
           resolved: Resolved = Resolved(), grace_seconds: int = DEFAULT_GRACE_SECONDS) -> Rendered:
    """Every child of one handoff. `owner` is the CR body (metadata.name/namespace/uid are used)."""
    meta = owner["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    image = spec.spark.image or image
    config = app_config(spec, namespace, name, image, resolved)
    full_json = config.to_json()
    template = driver_pod_template(spec, namespace, name, image, resolved.secret_values, grace_seconds)
    executor_template = executor_pod_template(spec)
    full_digest = config_hash(full_json, template, executor_template)
    digest = config_hash(full_json, template, executor_template, pod=True)
    template["metadata"]["annotations"] = {**template["metadata"].get("annotations", {}),
                                           CONFIG_HASH_ANNOTATION: digest}
    # Beside app.json in whichever of the two the driver mounts at /etc/handoff.
    template_files = ({EXECUTOR_TEMPLATE_FILE: json.dumps(executor_template, indent=2, sort_keys=True)}
                      if executor_template is not None else {})
    held = pod_held(meta.get("annotations"))
    replicas = 0 if spec.suspend or held else 1

    children: list[dict[str, Any]] = [{
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": _meta(app_config_name(name), namespace, "config", owner),
        "data": {contract.APP_CONFIG_FILE: redacted_json(config, resolved, spec), **template_files},
    }]
    if resolved.secret_values:
        children.append({
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _meta(app_config_name(name), namespace, "config", owner),
            "stringData": {contract.APP_CONFIG_FILE: full_json, **template_files},
        })
    if spec.spark.service_account_name is None:
        children += rbac(owner, name, namespace)
    # Metadata only, never `data`: that field belongs to the driver (field manager handoff-driver).
    progress_meta = _meta(progress_configmap_name(name), namespace, "progress", owner)
    progress_meta["annotations"] = {contract.QUERY_CONFIG_ANNOTATION: query_config_json(config, full_digest, digest)}
    children.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": progress_meta})
    children.append({
        "apiVersion": "v1", "kind": "Service",
        "metadata": _meta(driver_name(name), namespace, "driver", owner),
        "spec": {
            "clusterIP": "None",
            # Executors resolve the driver before its readiness probe passes.
            "publishNotReadyAddresses": True,
            "selector": selector_labels(name),
            "ports": [{"name": "driver", "port": DRIVER_PORT, "targetPort": DRIVER_PORT},
                      {"name": "blockmanager", "port": BLOCK_MANAGER_PORT, "targetPort": BLOCK_MANAGER_PORT},
                      {"name": "ui", "port": UI_PORT, "targetPort": UI_PORT},
                      {"name": "metrics", "port": METRICS_PORT, "targetPort": METRICS_PORT}],
        },
    })
    if spec.spark.ui_service():
        # A ClusterIP Service for the UI alone: what `kubectl port-forward svc/<name>-ui 4040` and an Ingress's
        # backend need; only a ready driver is behind it (a stopped driver's UI is gone with it).
        children.append({
            "apiVersion": "v1", "kind": "Service",
            "metadata": _meta(ui_service_name(name), namespace, "ui", owner),
            "spec": {"selector": selector_labels(name),
                     "ports": [{"name": "http", "port": UI_PORT, "targetPort": "ui"}]},
        })
    ingress = spec.spark.ui_ingress()
    if ingress is not None:
        children.append(ui_ingress(owner, name, namespace, ingress))
    deployment_meta = _meta(driver_name(name), namespace, "driver", owner)
    deployment_meta["annotations"] = {CONFIG_HASH_ANNOTATION: digest}
    children.append({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": deployment_meta,
        "spec": {
            "replicas": replicas,
            "strategy": {"type": "Recreate"},
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": selector_labels(name)},
            "template": template,
        },
    })
    unowned = []
    if spec.checkpoint.location is None:
        pvc_spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"],
                                    "resources": {"requests": {"storage": spec.checkpoint.storage_size}}}
        if spec.checkpoint.storage_class_name:
            pvc_spec["storageClassName"] = spec.checkpoint.storage_class_name
        unowned.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                        "metadata": _meta(checkpoint_pvc_name(name), namespace, "checkpoint", owner,
                                          owned=False),
                        "spec": pvc_spec})
    absent = [] if spec.spark.ui_service() else [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": ui_service_name(name), "namespace": namespace}}]
    if ingress is None:
        absent.append({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                       "metadata": {"name": ui_ingress_name(name), "namespace": namespace}})
    return Rendered(config, full_digest, children, unowned, absent, pod_config_hash=digest)


def ui_ingress(owner: Mapping[str, Any], name: str, namespace: str, ingress: SparkUiIngressSpec) -> dict[str, Any]:
    """The Ingress of spec.spark.ui.ingress: one rule, host + path to the UI Service's port. Nothing
    controller-specific is added (no rewrite, no auth): those are the platform's, through ingress.annotations. Not
    part of the config hash: adding, changing or removing it restarts no driver (only a path other than `/` does,
    through spark.ui.proxyBase in the driver's pod template)."""
    meta = _meta(ui_ingress_name(name), namespace, "ui", owner)
    if ingress.annotations:
        meta["annotations"] = dict(ingress.annotations)
    ingress_spec: dict[str, Any] = {"rules": [{"host": ingress.host, "http": {"paths": [{
        "path": ingress.path, "pathType": ingress.path_type,
        "backend": {"service": {"name": ui_service_name(name), "port": {"number": UI_PORT}}}}]}}]}
    if ingress.ingress_class_name:
        ingress_spec["ingressClassName"] = ingress.ingress_class_name
    if ingress.tls is not None:
        ingress_spec["tls"] = [{"hosts": [ingress.host], "secretName": ingress.tls.secret_name}]
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": meta, "spec": ingress_spec}


def rbac(owner: Mapping[str, Any], name: str, namespace: str) -> list[dict[str, Any]]:
    """ServiceAccount + Role + RoleBinding: what a client-mode driver needs for its executors, and the
    right to publish its progress record into `<name>-progress` (its own rule, by name, so it stays
    when the executor rule is ever narrowed)."""
    verbs = ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]
    sa = driver_name(name)
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(sa, namespace, "driver", owner)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": _meta(sa, namespace, "driver", owner),
         "rules": [{"apiGroups": [""], "resources": ["pods", "services", "configmaps",
                                                     "persistentvolumeclaims"], "verbs": verbs},
                   {"apiGroups": [""], "resources": ["configmaps"],
                    "resourceNames": [progress_configmap_name(name)], "verbs": ["get", "patch", "update"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": _meta(sa, namespace, "driver", owner),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
         "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}]},
    ]


_PARTITION_ARG = re.compile(r"^\s*(?:[a-z]+\(\s*(?:[0-9]+\s*,\s*)?)?([A-Za-z_][A-Za-z0-9_]*)\s*\)?\s*$")


def partition_source_column(transform: str) -> str | None:
    """The column a partition transform reads: 'day(ts)' → ts, 'bucket(16, id)' → id, 'region' → region."""
    match = _PARTITION_ARG.match(transform)
    return match.group(1) if match else None
