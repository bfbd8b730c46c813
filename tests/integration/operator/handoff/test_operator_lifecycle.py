"""The operator (kopf, in-process) against the real test-bed kube-apiserver + kube-controller-manager:
create → children, driver ready → Ready, spec change → one controlled restart, suspend/resume, delete →
finalizer + garbage collection, InvalidSpec, operator restart without duplicates, kubectl views."""
from __future__ import annotations

import json
import time
from typing import Any, Iterator

import pytest

from handoff_operator.runtime import state
from handoff_spark.config import AppConfig
from operator_support import IMAGE, Cluster, Operator, base_spec, eventually, kubectl

pytestmark = pytest.mark.apiserver

OWNED = ("ConfigMap", "ServiceAccount", "Role", "RoleBinding", "Service", "Deployment")
# ConfigMaps: <name>-app, <name>-progress (the driver's published progress record) and, from the first entry the
# operator owes it (the driver pod starting, a spec change, an Event), <name>-timeline. Services: the driver's, the UI's.
COUNT = {"ConfigMap": 2, "Service": 2}
OPTIONAL = {"ConfigMap": "-timeline"}


def _owned_count(children: dict[str, list[Any]], kind: str) -> int:
    """How many owned children of `kind`, not counting the one made only once there is something to record."""
    return len([c for c in children[kind] if not (kind in OPTIONAL and c.metadata.name.endswith(OPTIONAL[kind]))])
#: Longer than a child-triggered reconcile takes to come (handlers.CHILD_EVENTS_WINDOW) and run.
CHILD_EVENTS_SETTLE = 3.0


@pytest.fixture(scope="module")
def operator(cluster: Cluster) -> Iterator[Operator]:
    op = Operator(cluster.kubeconfig, status_interval=2.0, delete_grace_seconds=30.0)
    op.start()
    try:
        yield op
        cluster.delete_all_handoffs()
    finally:
        op.stop()


def _deployment(cluster: Cluster, ns: str, name: str):
    return cluster.apps.read_namespaced_deployment(f"{name}-driver", ns)


def _hash(dep) -> str:
    return dep.spec.template.metadata.annotations["handoff.io/config-hash"]


def _nothing_kept(ns: str, name: str) -> None:
    """The operator (in this process) keeps nothing of a deleted handoff once its children are gone, and what the
    events that follow its deletion bring (a child-triggered reconcile due, which finds the handoff gone and
    forgets it) goes again (runtime.state)."""
    for wait in (0.0, CHILD_EVENTS_SETTLE):
        time.sleep(wait)
        try:
            eventually(lambda: state.holding(ns, name) == {}, f"nothing kept of {ns}/{name}", timeout=30)
        except AssertionError:
            raise AssertionError(f"the operator still keeps of {ns}/{name}: {state.holding(ns, name)}") from None


def test_create_makes_owned_children_with_spark_settings(cluster: Cluster, operator: Operator) -> None:
    ns = cluster.new_namespace()
    cr = cluster.create(ns, "orders", base_spec())
    uid = cr["metadata"]["uid"]
    eventually(lambda: _deployment(cluster, ns, "orders"), "driver Deployment")
    children = cluster.children(ns, "orders")
    for kind in OWNED:
        assert _owned_count(children, kind) == COUNT.get(kind, 1), (kind, children[kind])
        for obj in children[kind]:
            refs = obj.metadata.owner_references
            assert [(r.kind, r.name, r.uid, r.controller, r.block_owner_deletion) for r in refs] == [
                ("StreamTableHandoff", "orders", uid, True, True)], kind
    # The checkpoint volume is created but not owned: deleting the handoff keeps it.
    (pvc,) = children["PersistentVolumeClaim"]
    assert not pvc.metadata.owner_references

    dep = children["Deployment"][0]
    assert dep.spec.replicas == 1 and dep.spec.strategy.type == "Recreate"
    pod = dep.spec.template.spec
    (container,) = pod.containers
    assert container.image == IMAGE
    assert container.command == ["python", "-m", "handoff_spark", "run", "--config", "/etc/handoff/app.json"]
    assert container.resources.requests == {"cpu": "1", "memory": "1433Mi"}
    assert pod.service_account_name == "orders-driver"
    assert pod.termination_grace_period_seconds == 120

    (svc,) = [s for s in children["Service"] if s.metadata.name == "orders-driver"]
    assert svc.spec.cluster_ip == "None"
    assert svc.spec.selector == {"handoff.io/name": "orders", "app.kubernetes.io/component": "driver"}

    (app_cm,) = [c for c in children["ConfigMap"] if c.metadata.name == "orders-app"]
    config = AppConfig.model_validate(json.loads(app_cm.data["app.json"]))
    conf = config.spark_conf
    assert config.handoff_id == f"{ns}/orders"
    assert "spark.master" not in conf  # HANDOFF_SPARK_MASTER in the driver's env, expanded by the kubelet
    assert conf["spark.kubernetes.namespace"] == ns
    assert conf["spark.kubernetes.container.image"] == IMAGE
    assert conf["spark.dynamicAllocation.enabled"] == "false"  # the operator scales executors live
    assert conf["spark.executor.instances"] == "1"  # a new driver starts with minExecutors
    assert conf["spark.executor.memory"] == "2048m"

    role = children["Role"][0]
    assert set(role.rules[0].resources) == {"pods", "services", "configmaps", "persistentvolumeclaims"}

    # The driver pod exists (kube-controller-manager ran the Deployment) but is Pending: Progressing.
    eventually(lambda: cluster.driver_pods(ns, "orders"), "driver pod")
    cond = cluster.wait_condition(ns, "orders", "Progressing", "True")
    assert cond["observedGeneration"] == 1 and cond["lastTransitionTime"]
    status = cluster.get(ns, "orders")["status"]
    assert status["phase"] in ("Pending", "Starting") and status["observedGeneration"] == 1
    out = kubectl(cluster.kubeconfig, "wait", "-n", ns, "--for=condition=Progressing", "--timeout=60s",
                  "sth/orders")
    assert "condition met" in out.stdout


def test_ready_running_driver_then_one_controlled_restart(cluster: Cluster, operator: Operator) -> None:
    ns = cluster.new_namespace()
    cluster.create(ns, "clicks", base_spec())
    first = cluster.make_driver_ready(ns, "clicks")
    cluster.wait_condition(ns, "clicks", "Ready", "True", "Running")
    out = kubectl(cluster.kubeconfig, "wait", "-n", ns, "--for=condition=Ready", "--timeout=60s", "sth/clicks")
    assert "condition met" in out.stdout
    status = cluster.get(ns, "clicks")["status"]
    # Kafka (127.0.0.1:9) is unreachable: once a status refresh has tried it (at once when another handoff of
    # the same cluster just did), the running handoff is Degraded=StatusUnavailable; Ready stays True.
    assert status["phase"] in ("Running", "Degraded") and status["app"]["driver"] == first.metadata.name
    old_hash = _hash(_deployment(cluster, ns, "clicks"))
    # The whole app config's hash; the pod template's leaves the query's own settings out (driver.query_config).
    old_config = status["app"]["configHash"]
    assert old_config != old_hash

    # kubectl shows the printer columns.
    table = kubectl(cluster.kubeconfig, "get", "sth", "-n", ns).stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "LAG", "FRESHNESS", "EXECUTORS", "AGE"]
    assert table[1].split()[:2] in (["clicks", "Running"], ["clicks", "Degraded"])

    # A change of what the pod runs (what its source does with offsets retention deleted; a new commit interval or
    # startingOffsets would change only the running driver's query: driver.query_config).
    cluster.patch_spec(ns, "clicks", {"source": {"onOffsetOutOfRange": "earliest"}})
    new_hash = eventually(lambda: _hash(_deployment(cluster, ns, "clicks")) != old_hash
                          and _hash(_deployment(cluster, ns, "clicks")), "new config hash on the pod template")
    cluster.wait_condition(ns, "clicks", "Progressing", "True", "Restarting")
    # Recreate: the old driver pod goes, one new pod comes with the new config.
    pods = eventually(lambda: [p for p in cluster.driver_pods(ns, "clicks")
                               if p.metadata.name != first.metadata.name], "a new driver pod")
    assert [p.metadata.annotations["handoff.io/config-hash"] for p in pods] == [new_hash]
    config = AppConfig.model_validate(json.loads(
        cluster.core.read_namespaced_config_map("clicks-app", ns).data["app.json"]))
    assert config.source.on_offset_out_of_range == "earliest"
    cluster.make_driver_ready(ns, "clicks")
    cluster.wait_condition(ns, "clicks", "Ready", "True", "Running")
    cond = cluster.wait_condition(ns, "clicks", "Progressing", "False", "RolloutComplete")
    assert cond["observedGeneration"] == 2
    status = cluster.get(ns, "clicks")["status"]
    new_config = status["app"]["configHash"]
    assert status["app"]["restarts"] == 1 and new_config not in (old_config, new_hash)
    restarts = [e for e in cluster.events(ns, "clicks") if e.reason == "Restarting"]
    assert len(restarts) == 1 and (restarts[0].count or 1) == 1, [(e.reason, e.message) for e in restarts]
    assert old_config in restarts[0].message and new_config in restarts[0].message


def test_suspend_stops_the_driver_and_resume_continues(cluster: Cluster, operator: Operator) -> None:
    ns = cluster.new_namespace()
    cluster.create(ns, "views", base_spec())
    cluster.make_driver_ready(ns, "views")
    cluster.wait_condition(ns, "views", "Ready", "True")
    config_hash = _hash(_deployment(cluster, ns, "views"))
    app_config_hash = cluster.get(ns, "views")["status"]["app"]["configHash"]

    cluster.patch_spec(ns, "views", {"suspend": True})
    eventually(lambda: _deployment(cluster, ns, "views").spec.replicas == 0, "replicas 0")
    eventually(lambda: not cluster.driver_pods(ns, "views"), "driver pod gone")
    cluster.wait_condition(ns, "views", "Ready", "False", "Suspended")
    cluster.wait_condition(ns, "views", "Progressing", "False", "Suspended")
    assert cluster.get(ns, "views")["status"]["phase"] == "Suspended"
    # The config (and so the checkpoint it points at) is unchanged: resuming continues from it.
    assert _hash(_deployment(cluster, ns, "views")) == config_hash

    cluster.patch_spec(ns, "views", {"suspend": False})
    eventually(lambda: _deployment(cluster, ns, "views").spec.replicas == 1, "replicas 1")
    cluster.make_driver_ready(ns, "views")
    cluster.wait_condition(ns, "views", "Ready", "True", "Running")
    status = cluster.get(ns, "views")["status"]
    # Running, or Degraded only because base_spec's Kafka and table are unreachable once a refresh has tried them.
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert status["phase"] == ("Degraded" if degraded["status"] == "True" else "Running")
    assert degraded["reason"] in {"AsExpected", "StatusUnavailable"}, degraded
    assert status["app"]["configHash"] == app_config_hash
    assert not status["app"].get("restarts"), "suspend/resume is not a config restart"
    reasons = [e.reason for e in cluster.events(ns, "views")]
    assert "Suspended" in reasons


def test_delete_stops_driver_releases_finalizer_and_keeps_checkpoint(cluster: Cluster,
                                                                     operator: Operator) -> None:
    ns = cluster.new_namespace()
    cluster.create(ns, "gone", base_spec())
    eventually(lambda: cluster.driver_pods(ns, "gone"), "driver pod")
    assert "handoff.io/finalizer" in cluster.get(ns, "gone")["metadata"]["finalizers"]
    cluster.custom.delete_namespaced_custom_object("handoff.io", "v1alpha1", ns, "streamtablehandoffs", "gone")

    def gone() -> bool:
        try:
            cluster.get(ns, "gone")
            return False
        except Exception as exc:  # noqa: BLE001
            return getattr(exc, "status", None) == 404
    eventually(gone, "the handoff released by its finalizer")
    # kube-controller-manager's garbage collector removes every owned child.
    eventually(lambda: all(not cluster.children(ns, "gone")[k] for k in OWNED + ("ReplicaSet",)),
               "children garbage-collected", timeout=90)
    eventually(lambda: not cluster.driver_pods(ns, "gone"), "driver pod gone")
    # The checkpoint volume stays (and the table is never touched).
    assert [p.metadata.name for p in cluster.children(ns, "gone")["PersistentVolumeClaim"]] == ["gone-checkpoint"]
    _nothing_kept(ns, "gone")


def test_unworkable_spec_gets_invalid_spec_and_recovers(cluster: Cluster, operator: Operator) -> None:
    ns = cluster.new_namespace()
    spec = base_spec()
    spec["source"]["propertiesFrom"] = [{"property": "sasl.password",
                                         "secretKeyRef": {"name": "kafka-creds", "key": "password"}}]
    spec["sink"]["iceberg"]["partitionBy"] = ["day(created_at)", "region"]
    cluster.create(ns, "bad", spec)
    cond = cluster.wait_condition(ns, "bad", "Ready", "False", "InvalidSpec")
    assert "spec.source.propertiesFrom[0].secretKeyRef.name" in cond["message"]
    assert "kafka-creds" in cond["message"] and "create it" in cond["message"]
    assert "spec.sink.iceberg.partitionBy[1]" in cond["message"]
    assert cluster.get(ns, "bad")["status"]["phase"] == "Failed"
    assert not cluster.children(ns, "bad")["Deployment"], "no app for a spec that cannot work"
    eventually(lambda: any(e.reason == "InvalidSpec" and e.type == "Warning" for e in cluster.events(ns, "bad")),
               "a Warning Event InvalidSpec")  # kopf posts Events asynchronously

    # The operator is still serving other resources.
    cluster.create(ns, "good", base_spec())
    eventually(lambda: cluster.children(ns, "good")["Deployment"], "the good handoff's Deployment")

    # Fix it: the Secret appears and the partition column is declared → the app is created.
    cluster.core.create_namespaced_secret(ns, {"metadata": {"name": "kafka-creds"},
                                               "stringData": {"password": "pw"}})
    cluster.patch_spec(ns, "bad", {"sink": {"iceberg": {"partitionBy": ["day(created_at)"]}}})
    eventually(lambda: cluster.children(ns, "bad")["Deployment"], "Deployment after the fix")
    cluster.wait_condition(ns, "bad", "Progressing", "True")
    # The credential went into a Secret the driver mounts, not into the ConfigMap.
    config_map = cluster.core.read_namespaced_config_map("bad-app", ns).data["app.json"]
    assert "pw" not in json.loads(config_map)["source"]["properties"].values()
    secret_names = [s.metadata.name for s in cluster.children(ns, "bad")["Secret"]]
    assert secret_names == ["bad-app"]


def test_operator_restart_mid_reconcile_converges_without_duplicates(cluster: Cluster,
                                                                     operator: Operator) -> None:
    ns = cluster.new_namespace()
    cluster.create(ns, "steady", base_spec())
    eventually(lambda: cluster.children(ns, "steady")["Deployment"], "Deployment")
    old_hash = _hash(_deployment(cluster, ns, "steady"))
    # Stop the operator, change the spec meanwhile, then stop it again right after it starts
    # (mid-reconcile), and start it once more.
    operator.stop()
    try:
        cluster.patch_spec(ns, "steady", {"source": {"onOffsetOutOfRange": "earliest"}})
        operator.start()
        operator.stop()
    finally:
        operator.start()
    eventually(lambda: AppConfig.model_validate(json.loads(cluster.core.read_namespaced_config_map(
        "steady-app", ns).data["app.json"])).source.on_offset_out_of_range == "earliest", "new config applied")
    new_hash = eventually(lambda: _hash(_deployment(cluster, ns, "steady")) != old_hash
                          and _hash(_deployment(cluster, ns, "steady")), "new config hash")
    eventually(lambda: [p.metadata.annotations["handoff.io/config-hash"]
                        for p in cluster.driver_pods(ns, "steady")] == [new_hash], "one driver of the new config")
    cluster.make_driver_ready(ns, "steady")
    cluster.wait_condition(ns, "steady", "Ready", "True")
    children = cluster.children(ns, "steady")
    for kind in OWNED:
        assert _owned_count(children, kind) == COUNT.get(kind, 1), (kind, [c.metadata.name for c in children[kind]])
    # The spec changed (generation 2), so the timeline record exists, once, whatever the restarts did.
    assert [c.metadata.name for c in children["ConfigMap"] if c.metadata.name.endswith("-timeline")] == [
        "steady-timeline"]
    assert len(children["PersistentVolumeClaim"]) == 1
    assert cluster.get(ns, "steady")["status"]["observedGeneration"] == 2


def test_crashed_driver_is_degraded_then_recovers(cluster: Cluster, operator: Operator) -> None:
    ns = cluster.new_namespace()
    cluster.create(ns, "flaky", base_spec())
    cluster.make_driver_crash(ns, "flaky", restarts=3, message="Py4JError: catalog unreachable")
    cond = cluster.wait_condition(ns, "flaky", "Degraded", "True", "DriverFailing")
    assert "CrashLoopBackOff" in cond["message"] and "catalog unreachable" in cond["message"]
    status = cluster.get(ns, "flaky")["status"]
    assert status["phase"] == "Degraded" and status["app"]["lastFailure"].startswith("Error (exit code 1)")
    assert cluster.condition(ns, "flaky", "Ready")["status"] == "False"
    # The Event is posted after the status patch (kopf's event queue): wait for it.
    eventually(lambda: any(e.reason == "DriverFailing" and e.type == "Warning" for e in cluster.events(ns, "flaky")),
               "a DriverFailing Warning Event", timeout=30)
    # The kubelet restarts the container (Deployment, restartPolicy Always): no operator action needed,
    # and the status follows when it runs again.
    cluster.make_driver_ready(ns, "flaky")
    cluster.wait_condition(ns, "flaky", "Ready", "True", "Running")
    # The driver's failure is gone from Degraded. base_spec's Kafka and table are unreachable on purpose, so once
    # the handoff's first status refresh has run (at once after its creation) Degraded says that instead.
    degraded = eventually(lambda: (c := cluster.condition(ns, "flaky", "Degraded")) and c["reason"] != "DriverFailing"
                          and c, "Degraded no longer DriverFailing")
    assert (degraded["status"], degraded["reason"]) in {("False", "AsExpected"), ("True", "StatusUnavailable")}, \
        degraded


def test_a_driver_in_a_crash_back_off_is_replaced_at_once_for_a_change_its_query_takes(cluster: Cluster,
                                                                                         operator: Operator) -> None:
    """A change the running driver applies in place (the commit interval: its query's pace) keeps the pod template;
    a driver that crashed (the test plays its kubelet) would meet it only after its back-off. The operator deletes
    that pod, its Deployment starts a new one of the same template at once, and says so; the new pod crashing too,
    with that config, is left to its back-off, as a first driver crashing is (no change to bring it)."""
    ns = cluster.new_namespace()
    cluster.create(ns, "fixme", base_spec())
    crashed = cluster.make_driver_crash(ns, "fixme", restarts=1, message="SourceInvalid: spec.source.topics: …")
    template = _hash(_deployment(cluster, ns, "fixme"))
    before = eventually(lambda: cluster.get(ns, "fixme").get("status", {}).get("app", {}).get("configHash"),
                        "the first config in the status")
    cluster.patch_spec(ns, "fixme", {"commitInterval": "20s"})
    (new,) = eventually(lambda: [p for p in cluster.driver_pods(ns, "fixme")
                                 if p.metadata.name != crashed.metadata.name], "a new driver pod")
    assert new.metadata.annotations["handoff.io/config-hash"] == template == _hash(_deployment(cluster, ns, "fixme"))
    after = eventually(lambda: (h := cluster.get(ns, "fixme")["status"]["app"]["configHash"]) != before and h,
                       "the new config in the status")
    replaced = eventually(lambda: [e.message for e in cluster.events(ns, "fixme") if e.reason == "CrashedDriverReplaced"],
                          "a CrashedDriverReplaced Event", timeout=30)
    assert (f"driver pod {crashed.metadata.name} waits out a crash back-off (1 restarts) with config {before}; "
            f"{after} (generation 2)") in replaced[0], replaced
    # The new pod crashes with the config it was started for: no second replacement.
    again = cluster.make_driver_crash(ns, "fixme", restarts=1, message="SourceInvalid: spec.source.topics: …")
    assert again.metadata.name == new.metadata.name
    time.sleep(CHILD_EVENTS_SETTLE + 2 * 2.0)  # a child-triggered reconcile and two status refreshes
    assert [p.metadata.name for p in cluster.driver_pods(ns, "fixme")] == [new.metadata.name]
    assert [e.count or 1 for e in cluster.events(ns, "fixme") if e.reason == "CrashedDriverReplaced"] == [1]


def test_kwok_node_runs_the_driver_to_ready_and_delete_waits_for_it(cluster: Cluster, operator: Operator) -> None:
    """With the test bed's scheduler + kwok node, a schedulable driver (checkpoint on a mounted path, no
    volume) is bound and reported Running/Ready by kwok: no test-written pod status at all."""
    ns = cluster.new_namespace()
    cluster.create(ns, "lake", base_spec(checkpoint={"location": "file:///mnt/checkpoints/lake"}))
    out = kubectl(cluster.kubeconfig, "wait", "-n", ns, "--for=condition=Ready", "--timeout=90s", "sth/lake",
                  check=False)
    assert out.returncode == 0 and "condition met" in out.stdout, (out.stderr, cluster.get(ns, "lake").get("status"))
    (pod,) = cluster.driver_pods(ns, "lake")
    assert pod.spec.node_name, "bound to the kwok node"
    assert "checkpoint" not in [v.name for v in pod.spec.volumes]
    status = cluster.get(ns, "lake")["status"]
    assert status["app"]["driver"] == pod.metadata.name
    # Running, or Degraded only because base_spec's Kafka and table are unreachable once a refresh has tried them.
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert status["phase"] == ("Degraded" if degraded["status"] == "True" else "Running")
    assert degraded["reason"] in {"AsExpected", "StatusUnavailable"}, degraded
    assert not cluster.children(ns, "lake")["PersistentVolumeClaim"]

    cluster.custom.delete_namespaced_custom_object("handoff.io", "v1alpha1", ns, "streamtablehandoffs", "lake")
    eventually(lambda: not cluster.custom.list_namespaced_custom_object(
        "handoff.io", "v1alpha1", ns, "streamtablehandoffs")["items"], "handoff released", timeout=90)
    # The finalizer waited until the driver pod was gone (not merely terminating).
    assert not cluster.core.list_namespaced_pod(ns, label_selector="handoff.io/name=lake").items
    eventually(lambda: not cluster.children(ns, "lake")["Deployment"], "Deployment garbage-collected")
    _nothing_kept(ns, "lake")


def _frames_spec() -> dict:
    """base_spec plus transform, dedupe and eventTime (issue 31), as a user writes them."""
    spec = base_spec(deadLetter={"topic": "orders-dlq"},
                     transform={"sql": "SELECT *, CAST(id AS STRING) AS id_text FROM source WHERE id > 0",
                                "lookups": [{"name": "customers", "table": "crm.customers"}]},
                     dedupe={"keys": ["id"], "within": "1h"},
                     eventTime={"column": "created_at", "watermark": "30s"})
    del spec["schema"]["eventTimeColumn"]  # eventTime supersedes it
    return spec


def test_transform_dedupe_and_event_time_applied_with_kubectl_reach_the_drivers_app_config(
        cluster: Cluster, operator: Operator, tmp_path) -> None:
    ns = cluster.new_namespace()
    manifest = tmp_path / "frames.yaml"
    manifest.write_text(json.dumps({"apiVersion": "handoff.io/v1alpha1", "kind": "StreamTableHandoff",
                                    "metadata": {"name": "frames", "namespace": ns}, "spec": _frames_spec()}))
    kubectl(cluster.kubeconfig, "apply", "-f", str(manifest))
    # The API server applied the defaults the CRD declares (eventTime.lateRecords).
    assert cluster.get(ns, "frames")["spec"]["eventTime"] == {"column": "created_at", "watermark": "30s",
                                                              "lateRecords": "deadLetter"}
    raw = eventually(lambda: (cm := next((c for c in cluster.children(ns, "frames")["ConfigMap"]
                                          if c.metadata.name == "frames-app"), None)) and cm.data["app.json"],
                     "the app config")
    cfg = AppConfig.model_validate_json(raw)
    assert cfg.transform is not None and cfg.transform.sql.startswith("SELECT *, CAST(id AS STRING)")
    assert [(lk.name, lk.table) for lk in cfg.transform.lookups] == [("customers", "crm.customers")]
    assert cfg.dedupe is not None and (cfg.dedupe.keys, cfg.dedupe.within_seconds) == (["id"], 3600)
    assert cfg.event_time is not None
    assert (cfg.event_time.column, cfg.event_time.watermark_seconds, cfg.event_time.late_records) == \
        ("created_at", 30, "deadLetter")
    assert cfg.schema_.event_time_column == "created_at" and cfg.dead_letter_topic == "orders-dlq"
    cluster.wait_condition(ns, "frames", "Progressing", "True")

    # A changed SQL goes to the running driver (driver.query_config), which restarts only its query: the
    # Deployment's pod template keeps its hash, the progress ConfigMap's query-config annotation and the handoff's
    # config hash change. (The driver's side: tests/e2e/test_operator_transform_change.py.)
    def query_config() -> dict:
        cm = cluster.core.read_namespaced_config_map("frames-progress", ns)
        return json.loads((cm.metadata.annotations or {})["handoff.io/query-config"])

    old_hash, old_config = _hash(_deployment(cluster, ns, "frames")), query_config()
    assert old_config["podConfigHash"] == old_hash and old_config["transform"]["sql"] == cfg.transform.sql
    assert old_config["configHash"] == cluster.get(ns, "frames")["status"]["app"]["configHash"] != old_hash
    cluster.patch_spec(ns, "frames", {"transform": {"sql": "SELECT * FROM source WHERE id > 1"}})
    new_config = eventually(lambda: (c := query_config())["transform"]["sql"] == "SELECT * FROM source WHERE id > 1"
                            and c, "the new SQL in the query config")
    assert new_config["configHash"] != old_config["configHash"] and new_config["podConfigHash"] == old_hash
    eventually(lambda: cluster.get(ns, "frames")["status"]["app"]["configHash"] == new_config["configHash"],
               "the handoff's new config hash")
    assert _hash(_deployment(cluster, ns, "frames")) == old_hash, "the driver pod's template is the same"
    eventually(lambda: AppConfig.model_validate_json(cluster.core.read_namespaced_config_map(
        "frames-app", ns).data["app.json"]).transform.sql == "SELECT * FROM source WHERE id > 1", "the new SQL")
    # So does a changed dedupe window, and a new pace (commit interval, batch size), and removing the transform, the
    # dedupe and the event time: the running driver's query goes back to the fused path.
    cluster.patch_spec(ns, "frames", {"dedupe": {"within": "2h"}})
    eventually(lambda: query_config()["dedupe"] == {"keys": ["id"], "withinSeconds": 7200.0}, "the new window")
    assert _hash(_deployment(cluster, ns, "frames")) == old_hash, "the driver pod's template is still the same"
    cluster.patch_spec(ns, "frames", {"commitInterval": "30s", "source": {"maxRecordsPerBatch": 5000}})
    eventually(lambda: (query_config()["triggerIntervalSeconds"], query_config()["maxRecordsPerBatch"]) == (30.0, 5000),
               "the new pace")
    assert _hash(_deployment(cluster, ns, "frames")) == old_hash, "the driver pod's template is still the same"
    cluster.patch_spec(ns, "frames", {"transform": None, "dedupe": None, "eventTime": None})
    eventually(lambda: (query_config()["transform"], query_config()["dedupe"], query_config()["eventTime"])
               == (None, None, None), "the query config without the transform, the dedupe and the event time")
    assert _hash(_deployment(cluster, ns, "frames")) == old_hash, "the driver pod's template is still the same"


def test_a_transform_combination_that_cannot_work_is_invalid_spec_naming_the_field(
        cluster: Cluster, operator: Operator) -> None:
    ns = cluster.new_namespace()
    spec = _frames_spec()
    spec["eventTime"]["lateRecords"] = "keep"   # a late record's key may have left the dedupe's window
    cluster.create(ns, "keep", spec)
    cond = cluster.wait_condition(ns, "keep", "Ready", "False", "InvalidSpec")
    assert "eventTime.lateRecords=keep cannot be checked with a dedupe" in cond["message"], cond
    assert "use deadLetter" in cond["message"]
    assert cluster.get(ns, "keep")["status"]["phase"] == "Failed"
    assert not cluster.children(ns, "keep")["Deployment"], "no driver for a spec that cannot work"

    # Fixed, but keyed on a column the records do not have (no transform to derive it): named too.
    cluster.patch_spec(ns, "keep", {"transform": None, "eventTime": {"lateRecords": "deadLetter"},
                                    "dedupe": {"keys": ["order_id"]}})
    cond = eventually(lambda: (c := cluster.condition(ns, "keep", "Ready")) and "spec.dedupe.keys[0]" in c["message"]
                      and c, "InvalidSpec naming spec.dedupe.keys[0]")
    assert cond["reason"] == "InvalidSpec" and "'order_id' is not a declared column" in cond["message"], cond
    out = kubectl(cluster.kubeconfig, "get", "sth", "keep", "-n", ns)
    assert "Failed" in out.stdout, out.stdout

    cluster.patch_spec(ns, "keep", {"dedupe": {"keys": ["id"]}})
    eventually(lambda: cluster.children(ns, "keep")["Deployment"], "the driver after the fix")


def test_a_driver_that_refuses_its_transform_is_degraded_transform_invalid(cluster: Cluster,
                                                                           operator: Operator) -> None:
    ns = cluster.new_namespace()
    cluster.create(ns, "badsql", _frames_spec())
    line = "TransformInvalid: spec.transform.sql: [UNRESOLVED_COLUMN.WITH_SUGGESTION] `nope` cannot be resolved"
    cluster.make_driver_crash(ns, "badsql", restarts=2, message=line + "\n")
    cond = cluster.wait_condition(ns, "badsql", "Degraded", "True", "TransformInvalid")
    assert cond["message"].startswith(line), cond
    ready = cluster.condition(ns, "badsql", "Ready")
    assert ready is not None and (ready["status"], ready["reason"]) == ("False", "TransformInvalid")
    out = kubectl(cluster.kubeconfig, "get", "sth", "badsql", "-n", ns)
    assert "Degraded" in out.stdout.splitlines()[1], out.stdout
