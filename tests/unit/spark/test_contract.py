"""The operator ↔ driver contract (`handoff_spark.contract`) holds from both ends: what the driver publishes
parses on the operator's side into the same facts, what the operator renders (command line, environment,
annotation) is what the driver reads, and neither package spells the contract's names anywhere but there."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, get_type_hints

from handoff_spark import contract
from handoff_spark.__main__ import parser as driver_parser
from handoff_spark.driver.executor_scaler import ExecutorScaler, parse_desired
from handoff_spark.driver.progress import report_from_progress
from handoff_spark.driver.publisher import ProgressPublisher, document

from handoff_operator.conditions import SINK_TROUBLE
from handoff_operator.replay.backfill import CHECKPOINT_MOUNT, backfill_job
from handoff_operator.scaling.rule import feedable_executors
from handoff_operator.spec.render import CONFIG_DIR, CONFIG_FILE, render
from handoff_operator.spec.validation import check, parse_spec
from handoff_operator.truth import driver_report

from operator_spec_support import SECRETS, body, spec
from package_source_support import modules

CONTRACT_FILE = Path(contract.__file__)


def _rendered(name: str = "orders") -> Any:
    b = body(name=name)
    parsed, problems = parse_spec(b["spec"])
    assert not problems
    resolved, problems = check(name, parsed, SECRETS)
    assert not problems
    return render(b, parsed, "default/image:1", resolved)


def _driver_container(deployment: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "driver")


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


# ------------------------------------------------------------------------ driver → operator: the record

def _published(degraded: str | None) -> str:
    """What the driver publishes after a batch: its progress record (as the app emits it), then the publisher's
    document around it."""
    commit = {"batch_id": 7, "snapshot_id": 42, "skipped": False, "rows": 9, "dlq_rows": 1, "records": 10,
              "commit_latency_ms": 12.0, "max_event_time_ms": 1_000, "degraded_reason": degraded}
    progress = {"batchId": 7, "numInputRows": 10, "durationMs": {"triggerExecution": 500},
                "sources": [{"startOffset": {"t": {"0": 5}}, "endOffset": {"t": {"0": 15}},
                             "latestOffset": {"t": {"0": 20}}}]}
    report = report_from_progress(progress, commit, prev_max_event_time_ms=None)
    report.work_ms, report.timestamp_ms = 300, 1_700_000_000_000
    from handoff_spark.driver.progress import Totals

    totals = Totals()
    totals.add(report)
    # what `driver.app` adds to each record, and to the last one when its query is held (`ProgressReporter.held`)
    record = {**report.record("shop/orders"), "firstOfDriver": True, "totals": totals.record(),
              "checkpointDiscarded": "the checkpoint is ahead of the table's ledger", contract.QUERY_HELD_KEY: "rewind",
              contract.QUERY_HOLDING_KEY: "rewind", contract.CONFIG_HASH_KEY: "c2", contract.CONFIG_SINCE_KEY: 1_699_999_999_000,
              contract.CONFIG_REFUSED_HASH_KEY: "c3", contract.CONFIG_REFUSED_KEY: "TransformInvalid: spec.transform.sql: x",
              # and before any batch, while the table's service does not answer (`ProgressReporter.degraded`)
              "degradedDetail": "OperationalError: could not connect to server"}
    return document(record, "orders-driver-abc", 1_700_000_000_500)


def test_what_the_driver_publishes_is_what_the_operator_reads():
    report = driver_report.parse(_published(contract.DEGRADED_BIGQUERY_UNAVAILABLE))
    assert report is not None
    assert (report.published_at_ms, report.driver_pod, report.batch_id) == (1_700_000_000_500, "orders-driver-abc", 7)
    assert (report.rows, report.dlq_rows, report.committed_snapshot) == (10, 1, 42)
    assert (report.duration_ms, report.work_ms, report.timestamp_ms) == (500, 300, 1_700_000_000_000)
    assert report.input_rows_per_second == 20.0 and report.first_of_driver is True
    assert report.degraded_reason == contract.DEGRADED_BIGQUERY_UNAVAILABLE
    assert driver_report.parse(_published(None)).degraded_reason is None
    assert report.degraded_detail == "OperationalError: could not connect to server"
    assert driver_report.parse(_published(None)).degraded_detail is None  # no reason, no trouble to detail
    assert report.totals is not None and report.totals["records"] == 10 and report.totals["snapshots"] == 1
    assert report.checkpoint_discarded == "the checkpoint is ahead of the table's ledger"
    assert report.query_held == report.query_holding == "rewind"
    assert (report.config_hash, report.config_since_ms) == ("c2", 1_699_999_999_000)
    assert (report.config_refused_hash, report.config_refused) == ("c3", "TransformInvalid: spec.transform.sql: x")


def test_the_documented_shape_is_the_published_one_and_covers_what_the_operator_reads():
    published = set(json.loads(_published(None)))
    declared = set(get_type_hints(contract.ProgressDocument))
    assert declared <= published
    tree = ast.parse(Path(driver_report.__file__).read_text())
    read = {node.args[0].value for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "doc"
            and node.args and isinstance(node.args[0], ast.Constant)}
    assert read and read <= declared, read - declared


def test_every_degraded_reason_a_sink_publishes_has_a_meaning_on_the_operators_side():
    from handoff_spark.bigquery.append import AppendStats
    from handoff_spark.bigquery.sink import degraded_reason
    from handoff_spark.sink import registry

    published = {degraded_reason(AppendStats(errors={"RESOURCE_EXHAUSTED": 1})),
                 degraded_reason(AppendStats(retries={"UNAVAILABLE": 1}))}
    # and what each sink's driver publishes while the table's service does not answer at its start (table_wait)
    published |= {registry.get(kind).outage_reason for kind in registry.kinds()}
    assert published == set(contract.DEGRADED_REASONS) and set(SINK_TROUBLE) == published


# ------------------------------------------------------------------- operator → driver: pod and command

def test_the_rendered_driver_pod_is_what_the_driver_reads():
    rendered = _rendered()
    container = _driver_container(rendered.child("Deployment"))
    args = driver_parser().parse_args(container["command"][3:])  # after `python -m handoff_spark`
    assert container["command"][:3] == ["python", "-m", contract.DRIVER_MODULE]
    assert (args.command, args.config, args.available_now) == (contract.RUN, CONFIG_FILE, False)
    # The config file is the key of the mounted ConfigMap.
    config_map = next(c for c in rendered.children if c["kind"] == "ConfigMap" and contract.APP_CONFIG_FILE in
                      c.get("data", {}))
    assert CONFIG_FILE == f"{CONFIG_DIR}/{contract.APP_CONFIG_FILE}"
    assert {"name": "app-config", "mountPath": CONFIG_DIR, "readOnly": True} in container["volumeMounts"]
    assert config_map["metadata"]["name"] == "orders-app"
    # Where the driver publishes and what it polls: the ConfigMap the operator creates.
    env = _env(container)
    publisher = ProgressPublisher.from_env(env, api=object())
    assert publisher is not None
    try:
        assert (publisher.namespace, publisher.configmap) == ("shop", contract.progress_configmap_name("orders"))
        assert publisher.pod == "$(POD_NAME)"  # the kubelet expands it: the downward API's pod name
    finally:
        publisher.close(timeout=1)
    scaler = ExecutorScaler.from_env(None, env, min_partitions_file="", partitions_per_core=3)  # type: ignore[arg-type]
    assert scaler is not None and (scaler.namespace, scaler.configmap) == ("shop", "orders-progress")
    assert any(c["kind"] == "ConfigMap" and c["metadata"]["name"] == "orders-progress" for c in rendered.children)
    assert env[contract.ENV_SPARK_MASTER].startswith("k8s://")
    assert 0 < float(env[contract.ENV_STOP_GRACE_SECONDS])


def test_the_rendered_s3_checkpoint_environment_is_what_the_driver_hands_to_spark():
    """spec.checkpoint on S3 → the driver pod's env (operator) → `spark.hadoop.fs.s3a.*` and the executors' Secret
    (driver): the names the operator writes are the ones the driver reads."""
    from handoff_spark.driver.app import s3_checkpoint_conf

    b = body(spec(checkpoint={"location": "s3a://lake/ckpt/orders", "credentialsSecret": "ckpt-s3",
                              "endpoint": "http://minio:9000", "pathStyleAccess": True, "region": "eu-west-1"}))
    parsed, problems = parse_spec(b["spec"])
    assert not problems
    resolved, problems = check("orders", parsed, SECRETS)
    assert not problems
    rendered = render(b, parsed, "default/image:1", resolved)
    container = _driver_container(rendered.child("Deployment"))
    conf = s3_checkpoint_conf({}, rendered.config.checkpoint_location, _env(container))
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://minio:9000"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-1"
    secret_refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e
                   and "secretKeyRef" in e["valueFrom"]}
    for key in contract.CHECKPOINT_CREDENTIAL_KEYS:
        assert conf[f"spark.kubernetes.executor.secretKeyRef.{key}"] == f"{secret_refs[key]['name']}:{key}"


def test_the_rendered_gcs_checkpoint_environment_is_what_the_driver_hands_to_spark():
    """spec.checkpoint on GCS → the driver pod's env and key volume (operator) → `spark.hadoop.fs.gs.*` and the
    executors' Secret mount (driver): the key file the driver names is where the operator mounts it."""
    from handoff_spark.driver.app import gcs_checkpoint_conf

    b = body(spec(checkpoint={"location": "gs://lake/ckpt/orders", "credentialsSecret": "ckpt-gcs",
                              "endpoint": "https://storage.private.example"}))
    parsed, problems = parse_spec(b["spec"])
    assert not problems
    resolved, problems = check("orders", parsed, SECRETS)
    assert not problems
    rendered = render(b, parsed, "default/image:1", resolved)
    pod = rendered.child("Deployment")["spec"]["template"]["spec"]
    container = _driver_container(rendered.child("Deployment"))
    conf = gcs_checkpoint_conf({}, rendered.config.checkpoint_location, _env(container))
    assert conf["spark.hadoop.fs.gs.storage.root.url"] == "https://storage.private.example"
    key_file = conf["spark.hadoop.fs.gs.auth.service.account.json.keyfile"]
    (mount,) = [m for m in container["volumeMounts"] if key_file.startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == "ckpt-gcs"
    assert [i["path"] for i in volume["secret"]["items"]] == [key_file.rsplit("/", 1)[1]]
    assert conf["spark.kubernetes.executor.secrets.ckpt-gcs"] == mount["mountPath"]
    assert not any(e["name"].startswith("HANDOFF_CHECKPOINT_S3") for e in container["env"])


def test_handoff_runs_command_line_parses_on_the_driver():
    args = driver_parser().parse_args(contract.run_command("python", "/tmp/x/app.json", available_now=True,
                                                           metrics_port_fallback=True)[3:])
    assert (args.command, args.config, args.available_now, args.metrics_port_fallback) == (
        contract.RUN, "/tmp/x/app.json", True, True)


def test_the_backfill_job_is_what_the_driver_reads():
    start, end = {"orders": {"1": 25, "0": 50}}, {"orders": {"0": 60, "1": 60}}
    request = {"metadata": {"name": "fill-june", "namespace": "shop", "uid": "req-uid"}}
    job = backfill_job(_rendered().child("Deployment"), request, "orders", start, end)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    args = driver_parser().parse_args(container["command"][3:])
    assert (args.command, args.config, args.query, args.checkpoint) == (
        contract.BACKFILL, CONFIG_FILE, "backfill-fill-june", CHECKPOINT_MOUNT)
    assert (json.loads(args.from_), json.loads(args.to)) == (start, end)
    env = _env(container)
    assert env[contract.ENV_SPARK_MASTER] == "local[*]"
    assert not contract.STREAM_DRIVER_ONLY_ENV & set(env)
    assert ProgressPublisher.from_env(env) is None
    assert ExecutorScaler.from_env(None, env) is None  # type: ignore[arg-type]


def test_the_desired_count_the_operator_writes_is_the_one_the_driver_applies():
    from handoff_operator.scaling import step

    class Core:
        def patch_namespaced_config_map(self, name: str, namespace: str, body: dict[str, Any], **_: Any) -> None:
            self.patched = (name, namespace, body)

    class Kube:
        core = Core()

    assert step._annotate(Kube(), "shop", "orders", 3)  # type: ignore[arg-type]
    name, namespace, patch = Kube.core.patched
    assert (name, namespace) == (contract.progress_configmap_name("orders"), "shop")
    assert parse_desired(patch["metadata"]["annotations"]) == 3


def test_the_scaling_rule_caps_executors_at_the_pieces_the_source_cuts():
    from handoff_spark.kafka.source import OffsetRange, split_ranges

    size = 3 * contract.MIN_SPLIT_OFFSETS + contract.MIN_SPLIT_OFFSETS // 2
    pieces = split_ranges([OffsetRange("t", 0, 0, size)], min_partitions=100)
    assert len(pieces) == 3 == feedable_executors({"t/0": size}, 0.0, 10, None, 1)


# ------------------------------------------------------------------------------------ defined only once

#: Names only `contract.py` may spell (the generic ones, "run" or "--config", are pinned by the tests above).
DISTINCTIVE = {contract.ENV_SPARK_MASTER, contract.ENV_STOP_GRACE_SECONDS, contract.ENV_DRIVER_POD_NAME,
               contract.ENV_PROGRESS_CONFIGMAP, contract.ENV_PROGRESS_NAMESPACE, contract.PROGRESS_DATA_KEY,
               contract.DESIRED_EXECUTORS_ANNOTATION, contract.APP_CONFIG_FILE, *contract.DEGRADED_REASONS,
               *contract.KAFKA_METADATA_COLUMNS, *contract.CHECKPOINT_S3_ENV}
#: Constants only `contract.py` may assign.
ASSIGNED = {"MIN_SPLIT_OFFSETS"}


def test_neither_package_spells_the_contracts_names_outside_it():
    found = []
    for module in modules(CONTRACT_FILE):
        found += [f"{module.path}:{n.lineno}: {n.value!r}" for n in module.code_strings() if n.value in DISTINCTIVE]
        for node in ast.walk(module.tree):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            found += [f"{module.path}:{node.lineno}: {t.id} =" for t in targets
                      if isinstance(t, ast.Name) and t.id in ASSIGNED]
    assert found == []


def test_the_contract_imports_nothing_heavy():
    """The operator imports it without pyspark, and before pydantic models or Kubernetes clients are needed."""
    code = ("import sys, handoff_spark.contract; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('pyspark', 'pyarrow', 'pydantic', 'kubernetes', 'pyiceberg', 'handoff_operator') "
            "or (m.startswith('handoff_spark.') and m != 'handoff_spark.contract')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"
