"""render: CR spec → AppConfig and child manifests."""
from __future__ import annotations

import copy
import json

import pytest

from handoff_operator.spec.render import (CONFIG_HASH_ANNOTATION, executor_pod_prefix, partition_source_column,
                                     render)
from handoff_operator.spec.validation import check, parse_spec
from handoff_spark.config import AppConfig

from operator_spec_support import SECRETS, body, spec


def _render(spec_dict=None, secrets=SECRETS, name="orders"):
    b = body(spec_dict, name=name)
    parsed, problems = parse_spec(b["spec"])
    assert not problems
    resolved, problems = check(name, parsed, secrets)
    assert not problems, problems
    return render(b, parsed, "default/image:1", resolved)


def test_children_are_owned_and_named():
    r = _render()
    kinds = [c["kind"] for c in r.children]
    assert kinds == ["ConfigMap", "Secret", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Service", "Service",
                     "Deployment"]
    for child in r.children:
        assert child["metadata"]["namespace"] == "shop"
        assert child["metadata"]["ownerReferences"] == [{
            "apiVersion": "handoff.io/v1alpha1", "kind": "StreamTableHandoff", "name": "orders", "uid": "uid-1",
            "controller": True, "blockOwnerDeletion": True}]
    # The checkpoint volume outlives the handoff: no owner.
    (pvc,) = r.unowned
    assert pvc["kind"] == "PersistentVolumeClaim" and "ownerReferences" not in pvc["metadata"]
    assert pvc["metadata"]["name"] == "orders-checkpoint"


def test_app_config_resolves_secrets_into_secret_not_configmap():
    r = _render()
    cm, secret = r.child("ConfigMap"), r.child("Secret")
    real = AppConfig.model_validate_json(secret["stringData"]["app.json"])
    assert real.source.properties == {"security.protocol": "SASL_SSL", "sasl.password": "s3cret"}
    assert real.sink.catalog_properties["s3.secret-access-key"] == "SK"
    shown = json.loads(cm["data"]["app.json"])
    assert "s3cret" not in cm["data"]["app.json"] and "SK" not in json.dumps(shown["sink"])
    assert shown["source"]["properties"]["security.protocol"] == "SASL_SSL"
    pod = r.child("Deployment")["spec"]["template"]["spec"]
    assert {"name": "app-config", "secret": {"secretName": "orders-app"}} in pod["volumes"]
    assert real.handoff_id == "shop/orders" and real.trigger_interval_seconds == 10
    assert real.checkpoint_location == "file:///var/lib/handoff/checkpoint"


def test_without_secrets_driver_mounts_the_configmap():
    s = spec()
    s["source"].pop("propertiesFrom")
    s["sink"]["iceberg"]["catalog"].pop("propertiesFrom")
    r = _render(s, secrets={})
    assert "Secret" not in [c["kind"] for c in r.children]
    pod = r.child("Deployment")["spec"]["template"]["spec"]
    assert {"name": "app-config", "configMap": {"name": "orders-app"}} in pod["volumes"]


def test_driver_deployment_runs_client_mode_spark_on_kubernetes():
    r = _render()
    dep = r.child("Deployment")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    tpl = dep["spec"]["template"]
    assert tpl["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] == r.pod_hash != r.config_hash
    assert dep["spec"]["selector"]["matchLabels"].items() <= tpl["metadata"]["labels"].items()
    (c,) = tpl["spec"]["containers"]
    assert c["image"] == "registry.example/handoff:1.2"
    assert c["command"] == ["python", "-m", "handoff_spark", "run", "--config", "/etc/handoff/app.json"]
    assert c["resources"]["requests"] == {"cpu": "1", "memory": "1433Mi"}  # 1024 heap + 40% overhead
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert "spark.kubernetes.driver.pod.name=$(POD_NAME)" in env["PYSPARK_SUBMIT_ARGS"]["value"]
    assert "--driver-memory 1024m" in env["PYSPARK_SUBMIT_ARGS"]["value"]
    # No cluster DNS needed: executors dial the driver's pod IP, the driver the API server's Service address.
    assert "--conf spark.driver.host=$(POD_IP)" in env["PYSPARK_SUBMIT_ARGS"]["value"]
    assert "--conf spark.driver.bindAddress=$(POD_IP)" in env["PYSPARK_SUBMIT_ARGS"]["value"]
    assert [e["name"] for e in c["env"]].index("POD_IP") < [e["name"] for e in c["env"]].index("PYSPARK_SUBMIT_ARGS")
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"  # the log tail becomes lastFailure
    # The batch-boundary wait ends before the kubelet's SIGKILL, with time left for Spark to stop.
    grace = tpl["spec"]["terminationGracePeriodSeconds"]
    assert 0 < int(env["HANDOFF_STOP_GRACE_SECONDS"]["value"]) <= grace - 10
    assert env["HANDOFF_SPARK_MASTER"]["value"] == "k8s://https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)"
    assert tpl["spec"]["serviceAccountName"] == "orders-driver"
    conf = r.config.spark_conf
    assert "spark.master" not in conf and "spark.driver.host" not in conf  # from the pod's env (above)
    assert conf["spark.submit.deployMode"] == "client"
    assert conf["spark.kubernetes.namespace"] == "shop"
    assert conf["spark.kubernetes.container.image"] == "registry.example/handoff:1.2"
    assert conf["spark.kubernetes.executor.podNamePrefix"] == "orders"  # pods: orders-exec-<n>
    assert conf["spark.driver.port"] == "7078" and conf["spark.driver.blockManager.port"] == "7079"
    # The operator scales on lag and the driver applies it live: Spark's own allocation is off, a new driver
    # starts with minExecutors.
    assert conf["spark.dynamicAllocation.enabled"] == "false"
    assert conf["spark.executor.instances"] == "1"
    assert conf["spark.executor.cores"] == "2" and conf["spark.executor.memory"] == "3072m"
    assert conf["spark.sql.shuffle.partitions"] == "4"
    assert conf["spark.kubernetes.executor.label.handoff.io/name"] == "orders"


def test_service_is_headless_and_selects_only_the_driver():
    svc = _render().child("Service")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {"handoff.io/name": "orders", "app.kubernetes.io/component": "driver"}
    assert {p["port"] for p in svc["spec"]["ports"]} >= {7078, 7079}


def test_role_lets_the_driver_manage_executors():
    role = _render().child("Role")
    rule, progress = role["rules"]
    assert set(rule["resources"]) == {"pods", "services", "configmaps", "persistentvolumeclaims"}
    assert {"create", "delete", "watch", "list"} <= set(rule["verbs"])
    # Its own rule for the progress ConfigMap, by name, without create (the operator creates it).
    assert progress == {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["orders-progress"],
                        "verbs": ["get", "patch", "update"]}
    binding = _render().child("RoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "orders-driver", "namespace": "shop"}]


def test_suspend_scales_to_zero_without_changing_the_hash():
    running, suspended = _render(), _render(spec(suspend=True))
    assert suspended.child("Deployment")["spec"]["replicas"] == 0
    assert running.config_hash == suspended.config_hash


def test_hash_changes_with_config_and_only_then():
    a, b = _render(), _render()
    assert a.config_hash == b.config_hash
    assert _render(spec(commitInterval="20s")).config_hash != a.config_hash
    changed_secret = {**SECRETS, "kafka-creds": {"password": "rotated"}}
    assert _render(secrets=changed_secret).config_hash != a.config_hash


def test_straggler_tasks_get_speculative_copies_unless_the_user_says_otherwise():
    """A batch waits for its slowest task, typically one handed to a just-registered, cold executor: the
    driver runs with Spark's speculation on, tuned for that case, and a user's sparkConf still wins."""
    conf = _render().config.spark_conf
    assert conf["spark.speculation"] == "true"
    assert float(conf["spark.speculation.quantile"]) < 0.5  # one cold task of three must be enough
    assert conf["spark.speculation.minTaskRuntime"] == "5s"  # ordinary short tasks are never copied
    assert conf["spark.speculation.efficiency.enabled"] == "false"
    # A one-task batch (one wave on one warm core) is copied too, after longer than an executor's warm-up.
    assert conf["spark.speculation.task.duration.threshold"] == "30s"
    quiet = spec()
    quiet["spark"]["sparkConf"] = {"spark.speculation": "false"}
    off = _render(quiet).config.spark_conf
    assert off["spark.speculation"] == "false"


def test_scaling_changes_apply_live_without_a_restart():
    a = _render()
    scaled = _render(spec(scaling={"minExecutors": 3, "maxExecutors": 8, "targetCatchUp": "1m",
                                   "cooldown": "30s"}))
    assert scaled.config.spark_conf["spark.executor.instances"] == "3"  # what a new driver starts with
    # Spark's executor-failure budget follows maxExecutors, not the starting count (pod creations that time
    # out count as failures: with 2 × instances a scaled-up driver stopped itself), and forgets after an hour.
    assert scaled.config.spark_conf["spark.executor.maxNumFailures"] == "16"
    assert scaled.config.spark_conf["spark.executor.failuresValidityInterval"] == "1h"
    # A DataFrame-path query's shuffle: one partition per core the handoff may scale to (8 executors × 2 cores).
    assert scaled.config.spark_conf["spark.handoff.shufflePartitions"] == "16"
    assert a.config.spark_conf["spark.handoff.shufflePartitions"] == "10"  # 5 executors × 2 cores
    assert scaled.config_hash == a.config_hash
    assert scaled.pod_hash == a.pod_hash


def test_the_shuffle_has_a_partition_per_core_the_handoff_may_scale_to_at_most_200():
    """A dedupe's state is split by the shuffle's partitions for its checkpoint's life: as many as the executor cores
    maxExecutors allows, so a scale-up has dedupe work for every executor; never more than Spark's default 200."""
    def partitions(scaling: dict, cores: int) -> str:
        s = spec(scaling=scaling)
        s["spark"]["executor"]["cores"] = cores
        return _render(s).config.spark_conf["spark.handoff.shufflePartitions"]

    assert partitions({"minExecutors": 1, "maxExecutors": 3}, 2) == "6"
    assert partitions({"minExecutors": 0, "maxExecutors": 1}, 1) == "1"
    assert partitions({"minExecutors": 1, "maxExecutors": 100}, 4) == "200"


def test_own_service_account_skips_rbac():
    s = spec()
    s["spark"]["serviceAccountName"] = "spark"
    r = _render(s)
    assert not {"ServiceAccount", "Role", "RoleBinding"} & {c["kind"] for c in r.children}
    assert r.child("Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "spark"


def test_checkpoint_location_given_means_no_volume():
    r = _render(spec(checkpoint={"location": "file:///mnt/ckpt/orders"}))
    assert r.unowned == [] and r.config.checkpoint_location == "file:///mnt/ckpt/orders"
    pod = r.child("Deployment")["spec"]["template"]["spec"]
    assert "checkpoint" not in [v["name"] for v in pod["volumes"]]


S3_CHECKPOINT = {"location": "s3a://lake/checkpoints/orders", "credentialsSecret": "ckpt-s3",
                 "endpoint": "http://minio.storage:9000/", "pathStyleAccess": True, "region": "eu-west-1"}


def test_checkpoint_on_s3_means_no_volume_and_credentials_from_the_secret():
    r = _render(spec(checkpoint=S3_CHECKPOINT))
    assert r.unowned == [] and r.config.checkpoint_location == "s3a://lake/checkpoints/orders"
    assert not any(c["kind"] == "PersistentVolumeClaim" for c in r.children)
    pod = r.child("Deployment")["spec"]["template"]["spec"]
    assert "checkpoint" not in [v["name"] for v in pod["volumes"]]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["HANDOFF_CHECKPOINT_S3_ENDPOINT"]["value"] == "http://minio.storage:9000"
    assert env["HANDOFF_CHECKPOINT_S3_PATH_STYLE"]["value"] == "true"
    assert env["HANDOFF_CHECKPOINT_S3_REGION"]["value"] == "eu-west-1"
    assert env["HANDOFF_CHECKPOINT_CREDENTIALS_SECRET"]["value"] == "ckpt-s3"
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert env[key] == {"name": key, "valueFrom": {"secretKeyRef": {"name": "ckpt-s3", "key": key}}}
    assert env["AWS_SESSION_TOKEN"]["valueFrom"]["secretKeyRef"]["optional"] is True
    # the credentials never pass through the operator: not in the app config, nor in Spark's conf
    assert "AWS_" not in r.config.to_json() and "ckpt-s3" not in json.dumps(r.config.spark_conf)


def test_checkpoint_settings_change_the_hash():
    base = _render(spec(checkpoint=S3_CHECKPOINT)).child("Deployment")
    moved = _render(spec(checkpoint={**S3_CHECKPOINT, "endpoint": "http://other:9000"})).child("Deployment")
    key = CONFIG_HASH_ANNOTATION
    assert (base["spec"]["template"]["metadata"]["annotations"][key]
            != moved["spec"]["template"]["metadata"]["annotations"][key])


def test_checkpoint_on_s3_without_a_secret_uses_the_pods_identity():
    env = _render(spec(checkpoint={"location": "s3a://lake/ckpt"})).child("Deployment")["spec"]["template"]["spec"][
        "containers"][0]["env"]
    names = {e["name"] for e in env}
    assert not names & {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "HANDOFF_CHECKPOINT_CREDENTIALS_SECRET",
                        "HANDOFF_CHECKPOINT_S3_ENDPOINT"}


GCS_CHECKPOINT = {"location": "gs://lake/checkpoints/orders", "credentialsSecret": "ckpt-gcs",
                  "endpoint": "https://storage.private.example/"}


def test_checkpoint_on_gcs_means_no_volume_and_the_key_mounted_from_the_secret():
    r = _render(spec(checkpoint=GCS_CHECKPOINT))
    assert r.unowned == [] and r.config.checkpoint_location == "gs://lake/checkpoints/orders"
    assert not any(c["kind"] == "PersistentVolumeClaim" for c in r.children)
    pod = r.child("Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "checkpoint" not in volumes
    assert volumes["checkpoint-gcs-key"]["secret"] == {"secretName": "ckpt-gcs",
                                                        "items": [{"key": "key.json", "path": "key.json"}]}
    container = pod["containers"][0]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "checkpoint-gcs-key"]
    assert mount["readOnly"] is True
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GOOGLE_APPLICATION_CREDENTIALS"] == mount["mountPath"] + "/key.json"
    assert env["HANDOFF_CHECKPOINT_GCS_ENDPOINT"] == "https://storage.private.example"
    assert env["HANDOFF_CHECKPOINT_CREDENTIALS_SECRET"] == "ckpt-gcs"
    assert not [n for n in env if n.startswith(("AWS_", "HANDOFF_CHECKPOINT_S3"))]
    assert "ckpt-gcs" not in r.config.to_json()


def test_checkpoint_on_gcs_anonymous_or_with_the_pods_identity_mounts_no_key():
    for checkpoint, anonymous in (({"location": "gs://lake/ckpt", "endpoint": "http://fake-gcs:4443",
                                    "anonymous": True}, "true"), ({"location": "gs://lake/ckpt"}, None)):
        pod = _render(spec(checkpoint=checkpoint)).child("Deployment")["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env.get("HANDOFF_CHECKPOINT_GCS_ANONYMOUS") == anonymous
        assert "GOOGLE_APPLICATION_CREDENTIALS" not in env
        assert "checkpoint-gcs-key" not in [v["name"] for v in pod["volumes"]]


def test_a_volume_checkpoint_renders_no_s3_environment():
    for checkpoint in ({}, {"location": "file:///mnt/ckpt/orders"}):
        env = _render(spec(checkpoint=checkpoint)).child("Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
        assert not [e["name"] for e in env if "CHECKPOINT" in e["name"] or e["name"].startswith("AWS_")]


def test_executor_prefix_is_a_short_dns_label():
    long = "a" * 52
    prefix = executor_pod_prefix(long)
    assert len(prefix) <= 47 and prefix != executor_pod_prefix("a" * 51 + "b")


@pytest.mark.parametrize("text,column", [("day(ts)", "ts"), ("bucket(16, id)", "id"), ("region", "region"),
                                         ("truncate(4,name)", "name")])
def test_partition_source_column(text, column):
    assert partition_source_column(text) == column


def test_progress_configmap_is_created_empty_and_the_driver_is_told_where_it_is():
    r = _render()
    progress = [c for c in r.children if c["kind"] == "ConfigMap" and c["metadata"]["name"] == "orders-progress"]
    assert len(progress) == 1
    # No `data` at all: the operator's server-side apply must never own the field the driver writes.
    assert set(progress[0]) == {"apiVersion", "kind", "metadata"}
    assert progress[0]["metadata"]["labels"]["handoff.io/name"] == "orders"
    assert r.child("ConfigMap")["metadata"]["name"] == "orders-app"  # the app config stays the first one
    (c,) = r.child("Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["HANDOFF_PROGRESS_CONFIGMAP"] == "orders-progress"
    assert env["HANDOFF_PROGRESS_NAMESPACE"] == "shop"
    assert env["HANDOFF_DRIVER_POD_NAME"] == "$(POD_NAME)"  # the report names its pod


def test_progress_configmap_also_with_an_own_service_account():
    s = spec()
    s["spark"]["serviceAccountName"] = "spark"
    r = _render(s)
    assert "orders-progress" in [c["metadata"]["name"] for c in r.children if c["kind"] == "ConfigMap"]


def test_schema_registry_credentials_come_from_a_secret_and_stay_out_of_the_configmap():
    s = spec()
    s["source"].pop("propertiesFrom")
    s["sink"]["iceberg"]["catalog"].pop("propertiesFrom")
    s["source"].update(format="avro", schemaRegistry={"url": "http://registry:8081",
                                                      "credentialsFrom": {"name": "sr", "key": "userInfo"}})
    s["schema"]["columns"] = []
    s["sink"]["iceberg"].pop("partitionBy", None)
    s["schema"].pop("eventTimeColumn", None)
    r = _render(s, secrets={"sr": {"userInfo": "reader:pw"}})
    real = AppConfig.model_validate_json(r.child("Secret")["stringData"]["app.json"])
    assert real.source.format == "avro" and real.source.schema_registry is not None
    assert real.source.schema_registry.url == "http://registry:8081"
    assert real.source.schema_registry.basic_auth_user_info == "reader:pw"
    shown = r.child("ConfigMap")["data"]["app.json"]
    assert "reader:pw" not in shown and "schemaRegistry.credentialsFrom" in shown
    parsed, _ = parse_spec(body(s, name="orders")["spec"])
    _, problems = check("orders", parsed, {})
    assert [p.field for p in problems] == ["spec.source.schemaRegistry.credentialsFrom.name"]


def test_registry_formats_need_a_registry():
    s = spec(source={**spec()["source"], "format": "protobuf"})
    _, problems = parse_spec(body(s, name="orders")["spec"])
    assert problems and "schemaRegistry" in str(problems[0])


def test_record_limits_reach_the_drivers_app_config():
    """spec.schema.limits is what the decoder enforces (handoff_spark.decode.records); unset, the documented defaults."""
    limits = _render().config.schema_.limits
    assert (limits.max_depth, limits.max_value_bytes) == (64, 8 * 1024 * 1024)
    tight = spec()
    tight.setdefault("schema", {})["limits"] = {"maxDepth": 5, "maxValueBytes": 4096}
    limits = _render(tight).config.schema_.limits
    assert (limits.max_depth, limits.max_value_bytes) == (5, 4096)
    bad = spec()
    bad.setdefault("schema", {})["limits"] = {"maxDepth": 10_000}
    _parsed, problems = parse_spec(body(bad)["spec"])
    assert problems and any("limits.maxDepth" in str(p) for p in problems), problems


def test_the_removed_bootstrap_batch_field_is_refused_by_name():
    """spec.spark.driver.bootstrapBatch is gone (every batch is committed by Spark's query): a manifest that still
    sets it is told which field to delete, rather than having it silently ignored."""
    old = spec()
    old["spark"].setdefault("driver", {})["bootstrapBatch"] = False
    _parsed, problems = parse_spec(body(old)["spec"])
    assert problems and any("spark.driver.bootstrapBatch" in str(p) for p in problems), problems
    assert not hasattr(_render().config, "bootstrap_batch")


TRANSFORM = {"transform": {"sql": "SELECT * FROM source WHERE amount > 0"},
             "dedupe": {"keys": ["id"], "within": "1h"},
             "eventTime": {"column": "created_at", "watermark": "30s"}, "deadLetter": {"topic": "orders-dlq"}}
DLQ = {"deadLetter": {"topic": "orders-dlq"}}


def test_transform_dedupe_and_event_time_reach_the_app_config_and_change_the_hash():
    plain = _render()
    r = _render(spec(**TRANSFORM))
    cfg = AppConfig.model_validate_json(r.child("Secret")["stringData"]["app.json"]) if r.child("Secret") \
        else AppConfig.model_validate_json(r.child("ConfigMap")["data"]["app.json"])
    assert cfg.transform is not None and cfg.transform.sql == "SELECT * FROM source WHERE amount > 0"
    assert cfg.dedupe is not None and cfg.dedupe.keys == ["id"] and cfg.dedupe.within_seconds == 3600
    assert cfg.event_time is not None and cfg.event_time.watermark_seconds == 30
    assert cfg.event_time.late_records == "deadLetter" and cfg.schema_.event_time_column == "created_at"
    assert cfg.frame_path and r.config_hash != plain.config_hash
    changed = _render(spec(**{**TRANSFORM, "transform": {"sql": "SELECT * FROM source"}}))
    assert changed.config_hash != r.config_hash


@pytest.mark.parametrize("fields, message", [
    ({**DLQ, "dedupe": {"keys": ["id"], "within": "1m"}, "eventTime": {"column": "ts", "watermark": "2m"}},
     "eventTime.watermark must be at most dedupe.within"),
    ({**DLQ, "dedupe": {"keys": ["id"], "within": "1h"}, "eventTime": {"column": "ts", "lateRecords": "keep"}},
     "eventTime.lateRecords=keep cannot be checked with a dedupe"),
    ({**DLQ, "dedupe": {"keys": ["id"], "within": "soon"}}, "within"),
    ({"dedupe": {"keys": ["id"], "within": "1h"}}, "dedupe needs deadLetter.topic"),
    ({**DLQ, "eventTime": {"column": "ts"}, "schema": {"columns": [{"name": "ts", "type": "timestamp"},
                                                                   {"name": "other", "type": "timestamp"}],
                                                       "eventTimeColumn": "other"}},
     "schema.eventTimeColumn differs from eventTime.column"),
])
def test_combinations_that_cannot_work_are_invalid_specs_naming_the_field(fields, message):
    _parsed, problems = parse_spec(spec(**fields))
    assert problems and any(message in str(p) for p in problems), problems


def test_lookups_and_the_late_record_policy_reach_the_configmap_the_user_reads():
    """The ConfigMap's app.json (what `kubectl get cm <name>-app` shows) carries the three fields as the driver
    reads them: durations in seconds, lookups by name and table."""
    fields = {**TRANSFORM, "transform": {"sql": "SELECT s.*, c.tier FROM source s JOIN customers c USING (id)",
                                         "lookups": [{"name": "customers", "table": "crm.customers"}]},
              "eventTime": {"column": "created_at", "watermark": "1m30s", "lateRecords": "deadLetter"}}
    app = json.loads(_render(spec(**fields)).child("ConfigMap")["data"]["app.json"])
    assert app["transform"] == {"sql": "SELECT s.*, c.tier FROM source s JOIN customers c USING (id)",
                                "lookups": [{"name": "customers", "table": "crm.customers"}]}
    assert app["dedupe"] == {"keys": ["id"], "withinSeconds": 3600.0}
    assert app["eventTime"] == {"column": "created_at", "watermarkSeconds": 90.0, "lateRecords": "deadLetter"}
    plain = json.loads(_render().child("ConfigMap")["data"]["app.json"])
    assert plain["transform"] is None and plain["dedupe"] is None and plain["eventTime"] is None


def test_event_time_sets_the_freshness_column_when_schema_names_none():
    s = spec(**{**DLQ, "eventTime": {"column": "created_at"}})
    s["schema"].pop("eventTimeColumn")
    cfg = _render(s).config
    assert cfg.schema_.event_time_column == "created_at" and cfg.event_time is not None
    assert cfg.event_time.watermark_seconds == 0 and cfg.event_time.late_records == "deadLetter"


@pytest.mark.parametrize("change", [
    {"transform": {"sql": "SELECT * FROM source WHERE amount > 1"}},
    {"transform": {"sql": "SELECT * FROM source WHERE amount > 0",
                   "lookups": [{"name": "customers", "table": "crm.customers"}]}},
    {"dedupe": {"keys": ["id", "created_at"], "within": "1h"}},
    {"dedupe": {"keys": ["id"], "within": "2h"}},
    {"eventTime": {"column": "created_at", "watermark": "31s"}},
    {"dedupe": None},
    {"eventTime": None},
    {"transform": None, "dedupe": None, "eventTime": None},
])
def test_each_change_of_transform_dedupe_or_event_time_changes_the_hash(change):
    """The config hash (status.app.configHash, the upgrade rule's) changes with each of them. The pod's own hash
    (the driver pod template's annotation: a rollout per change) leaves them out, which the running driver applies
    by restarting its query (driver.query_config): removing one (or adding it) too, and all of them (the query goes
    back to the fused path in the same driver)."""
    fields = {**TRANSFORM, **change}
    for key in [k for k, v in fields.items() if v is None]:
        del fields[key]
    changed, before = _render(spec(**fields)), _render(spec(**TRANSFORM))
    assert changed.config_hash != before.config_hash
    assert before.config_hash == _render(spec(**TRANSFORM)).config_hash
    assert changed.pod_hash == before.pod_hash
    pod = lambda r: r.child("Deployment")["spec"]["template"]  # noqa: E731
    assert pod(changed) == pod(before)


def _with_batch_size(n):
    out = spec(**TRANSFORM)
    out["source"] = {**out["source"], "maxRecordsPerBatch": n}
    return out


@pytest.mark.parametrize("changed", [
    lambda: spec(**{**TRANSFORM, "commitInterval": "30s"}),
    lambda: _with_batch_size(5000),
])
def test_on_the_dataframe_path_the_commit_interval_and_batch_size_change_in_the_running_driver(changed):
    """The query's pace is an option of the query: on the DataFrame path the pod keeps its template (hash and all)
    and the query config carries the new value; the whole config's hash changes (the rollout rule judges it)."""
    before, after = _render(spec(**TRANSFORM)), _render(changed())
    assert after.config_hash != before.config_hash and after.pod_hash == before.pod_hash
    pod = lambda r: r.child("Deployment")["spec"]["template"]  # noqa: E731
    assert pod(after) == pod(before)
    progress = next(c for c in after.children if c["metadata"]["name"] == "orders-progress")
    doc = json.loads(progress["metadata"]["annotations"]["handoff.io/query-config"])
    assert (doc["triggerIntervalSeconds"], doc["maxRecordsPerBatch"]) == (
        after.config.trigger_interval_seconds, after.config.source.max_records_per_batch)
    assert doc["triggerIntervalSeconds"] == 30.0 or doc["maxRecordsPerBatch"] == 5000


def test_on_the_fused_path_the_commit_interval_changes_in_the_running_driver_too():
    """The fused path's query takes its pace from the query config as well: a new interval is no new pod template.
    A change of what the pod runs (its resources) still is."""
    before, after = _render(), _render(spec(commitInterval="30s"))
    assert after.config_hash != before.config_hash and after.pod_hash == before.pod_hash
    progress = next(c for c in after.children if c["metadata"]["name"] == "orders-progress")
    assert json.loads(progress["metadata"]["annotations"]["handoff.io/query-config"])["triggerIntervalSeconds"] == 30.0
    bigger = _render(spec(spark={"driver": {"cores": 1, "memory": "2Gi"}, "executor": {"cores": 1, "memory": "1Gi"}}))
    assert bigger.pod_hash != before.pod_hash


def test_a_changed_schema_changes_in_the_running_driver_on_either_path():
    """The declared schema (a column added, its policy, its limits) is the query's: the pod keeps its template and the
    query config carries the new one, on the fused path and on the DataFrame path alike."""
    for extra in ({}, TRANSFORM):
        base = spec(**extra)
        wider = copy.deepcopy(base)
        wider["schema"]["columns"].append({"name": "note", "type": "string"})
        stricter = copy.deepcopy(base)
        stricter["schema"]["evolution"] = "none"
        before = _render(base)
        for changed in (wider, stricter):
            after = _render(changed)
            assert after.config_hash != before.config_hash and after.pod_hash == before.pod_hash, extra
            assert after.child("Deployment")["spec"]["template"] == before.child("Deployment")["spec"]["template"]
            progress = next(c for c in after.children if c["metadata"]["name"] == "orders-progress")
            doc = json.loads(progress["metadata"]["annotations"]["handoff.io/query-config"])
            assert doc["schema"] == json.loads(after.config.to_json())["schema"] != \
                json.loads(before.config.to_json())["schema"]


def test_a_changed_dead_letter_topic_or_replay_window_changes_in_the_running_driver_on_either_path():
    """The dead-letter topic (the query's writers produce to it) and the replay window (the snapshot expiry the
    query's commits run) are the query's too: the pod keeps its template, the query config carries the new value."""
    for extra in ({}, TRANSFORM):
        base = {**DLQ, **extra}
        before = _render(spec(**base))
        for changed, key, value in (({**base, "deadLetter": {"topic": "orders-dlq-2"}}, "deadLetterTopic",
                                     "orders-dlq-2"),
                                    ({**base, "replay": {"window": "14d"}}, "maintenance", 14 * 86400)):
            after = _render(spec(**changed))
            assert after.config_hash != before.config_hash and after.pod_hash == before.pod_hash, (extra, key)
            assert after.child("Deployment")["spec"]["template"] == before.child("Deployment")["spec"]["template"]
            progress = next(c for c in after.children if c["metadata"]["name"] == "orders-progress")
            doc = json.loads(progress["metadata"]["annotations"]["handoff.io/query-config"])
            got = doc[key]["expireOlderThanSeconds"] if key == "maintenance" else doc[key]
            assert got == value, (extra, key, doc[key])


def test_the_sources_query_settings_change_in_the_running_driver_on_either_path():
    """The source's servers and topics, where a new topic starts, its least task count and the consumer group are
    the query's: the
    pod keeps its template, the query config carries them. The source's other settings (its properties may hold a
    Secret's values; onOffsetOutOfRange fixes a driver that has exited) still roll the pod."""
    for extra in ({}, TRANSFORM):
        base = {**DLQ, **extra}
        before = _render(spec(**base))
        source = before.config.source
        for changed, key, value in (({"topics": [*source.topics, "refunds"]}, "topics", [*source.topics, "refunds"]),
                                    ({"startingOffsets": "latest"}, "startingOffsets", "latest"),
                                    ({"minPartitions": 12}, "minPartitions", 12),
                                    ({"consumerGroup": "lag-tools"}, "consumerGroup", "lag-tools"),
                                    ({"bootstrapServers": "other:9092"}, "bootstrapServers", "other:9092")):
            after = _render(spec(**base, source={**spec()["source"], **changed}))
            assert after.config_hash != before.config_hash and after.pod_hash == before.pod_hash, (extra, key)
            assert after.child("Deployment")["spec"]["template"] == before.child("Deployment")["spec"]["template"]
            progress = next(c for c in after.children if c["metadata"]["name"] == "orders-progress")
            doc = json.loads(progress["metadata"]["annotations"]["handoff.io/query-config"])
            assert doc[key] == value, (extra, key, doc[key])
        for rolls in ({"format": "raw"}, {"onOffsetOutOfRange": "earliest"},
                      {"properties": {"client.rack": "rack-a"}}):
            moved = _render(spec(**base, source={**spec()["source"], **rolls}))
            assert moved.pod_hash != before.pod_hash, (extra, rolls)


def test_a_transform_goes_to_the_running_driver_through_the_progress_configmap():
    """The progress ConfigMap's query-config annotation holds the transform, dedupe and event time and the pace with
    both hashes, and the driver pod gets its own hash through the downward API. Without a transform, dedupe or event
    time too (the fused path's driver takes its pace from it, and a transform added later)."""
    r = _render(spec(**TRANSFORM))
    progress = next(c for c in r.children if c["metadata"]["name"] == "orders-progress")
    doc = json.loads(progress["metadata"]["annotations"]["handoff.io/query-config"])
    assert doc == {"configHash": r.config_hash, "podConfigHash": r.pod_hash,
                   "transform": {"sql": "SELECT * FROM source WHERE amount > 0", "lookups": []},
                   "dedupe": {"keys": ["id"], "withinSeconds": 3600.0},
                   "eventTime": {"column": "created_at", "watermarkSeconds": 30.0, "lateRecords": "deadLetter"},
                   "schema": json.loads(r.config.to_json())["schema"],
                   "deadLetterTopic": r.config.dead_letter_topic, "maintenance": {
                       "expireOlderThanSeconds": 7 * 86400, "everyBatches": 50, "compact": True,
                       "orphanMinAgeSeconds": 600},
                   "triggerIntervalSeconds": 10.0, "maxRecordsPerBatch": None, "eventTimeColumn": "created_at",
                   "bootstrapServers": r.config.source.bootstrap_servers, "topics": ["orders"],
                   "startingOffsets": "earliest", "minPartitions": None, "consumerGroup": None}
    assert doc["deadLetterTopic"]
    assert doc["schema"]["columns"] and doc["schema"]["eventTimeColumn"] == "created_at"
    assert r.pod_hash != r.config_hash
    template = r.child("Deployment")["spec"]["template"]
    assert template["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] == r.pod_hash
    env = {e["name"]: e for e in template["spec"]["containers"][0]["env"]}
    assert env["HANDOFF_POD_CONFIG_HASH"]["valueFrom"] == {
        "fieldRef": {"fieldPath": f"metadata.annotations['{CONFIG_HASH_ANNOTATION}']"}}
    dedupe_only = _render(spec(**DLQ, dedupe={"keys": ["id"], "within": "1h"}))
    progress = next(c for c in dedupe_only.children if c["metadata"]["name"] == "orders-progress")
    doc = json.loads(progress["metadata"]["annotations"]["handoff.io/query-config"])
    assert doc["transform"] is None and doc["eventTime"] is None and doc["dedupe"]["keys"] == ["id"]
    plain = _render()
    progress = next(c for c in plain.children if c["metadata"]["name"] == "orders-progress")
    doc = json.loads(progress["metadata"]["annotations"]["handoff.io/query-config"])
    assert (doc["transform"], doc["dedupe"], doc["eventTime"]) == (None, None, None)
    assert (doc["configHash"], doc["podConfigHash"]) == (plain.config_hash, plain.pod_hash)
    template = plain.child("Deployment")["spec"]["template"]
    assert "HANDOFF_POD_CONFIG_HASH" in {e["name"] for e in template["spec"]["containers"][0]["env"]}
    assert template["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] == plain.pod_hash != plain.config_hash


BIGQUERY = {"sink": {"bigquery": {"project": "p1", "dataset": "d", "table": "t"}}}


def test_transform_dedupe_and_event_time_are_accepted_on_bigquery_but_lookups_are_not():
    _parsed, problems = parse_spec(spec(**BIGQUERY, **TRANSFORM))
    assert not [p for p in problems if "transform" in str(p) or "dedupe" in str(p) or "eventTime" in str(p)], problems
    lookups = {**TRANSFORM, "transform": {"sql": "SELECT * FROM source",
                                          "lookups": [{"name": "customers", "table": "crm.customers"}]}}
    _parsed, problems = parse_spec(spec(**BIGQUERY, **lookups))
    assert problems and any("transform.lookups need sink.iceberg" in str(p) for p in problems), problems
    _parsed, problems = parse_spec(spec(**lookups))  # Iceberg: lookups are its catalog's tables
    assert not problems, problems
