"""Pod options (spec.spark.pod, spec.spark.driver.pod, spec.spark.executor.pod): what reaches the driver Deployment
and the executors' pod template, how a role's block overrides the shared one, that nothing is rendered when they
are unset, and the refusals. The rendered objects are checked against the Kubernetes API schemas (strict: an
unknown or misspelled field fails), so the models' shapes are Kubernetes' own."""
from __future__ import annotations

import copy
import json
from typing import Any

import kubernetes_validate
import pytest

from handoff_operator.spec.render import (EXECUTOR_TEMPLATE_FILE, EXECUTOR_TEMPLATE_PATH, Rendered)
from handoff_operator.spec.validation import check, parse_spec

from operator_spec_support import SECRETS, body, render_valid, spec

KUBE_VERSIONS = ("1.29", "1.35")

SHARED: dict[str, Any] = {
    "nodeSelector": {"pool": "spark"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "spark", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a", "b"]}]}]}},
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 50, "podAffinityTerm": {
            "labelSelector": {"matchLabels": {"team": "payments"}}, "topologyKey": "kubernetes.io/hostname"}}]}},
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                   "whenUnsatisfiable": "ScheduleAnyway",
                                   "labelSelector": {"matchLabels": {"team": "payments"}}}],
    "priorityClassName": "streaming",
    "imagePullSecrets": [{"name": "regcred"}],
    "labels": {"team": "payments"},
    "annotations": {"example.com/owner": "payments"},
    "env": [{"name": "TZ", "value": "UTC"},
            {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {"name": "api", "key": "token"}}}],
    "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "APP_"}],
    "volumes": [{"name": "certs", "secret": {"secretName": "kafka-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}],
    "volumeMounts": [{"name": "certs", "mountPath": "/etc/kafka-ca", "readOnly": True},
                     {"name": "tmp", "mountPath": "/tmp"}],
    "podSecurityContext": {"runAsNonRoot": True, "runAsUser": 185, "fsGroup": 185,
                           "seccompProfile": {"type": "RuntimeDefault"}},
    "containerSecurityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                                 "capabilities": {"drop": ["ALL"]}},
}


def _spec(shared: dict[str, Any] | None = None, driver: dict[str, Any] | None = None,
          executor: dict[str, Any] | None = None, **spark: Any) -> dict[str, Any]:
    s = spec()
    if shared is not None:
        s["spark"]["pod"] = copy.deepcopy(shared)
    if driver is not None:
        s["spark"]["driver"]["pod"] = copy.deepcopy(driver)
    if executor is not None:
        s["spark"]["executor"]["pod"] = copy.deepcopy(executor)
    s["spark"].update(spark)
    return s


def _render(spec_dict: dict[str, Any]) -> Rendered:
    return render_valid(spec_dict)


def _problems(spec_dict: dict[str, Any]) -> list[str]:
    parsed, problems = parse_spec(spec_dict)
    if parsed is not None:
        problems = check("orders", parsed, SECRETS)[1]
    return [str(p) for p in problems]


def _driver(r: Rendered) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    template = r.child("Deployment")["spec"]["template"]
    return template["metadata"], template["spec"], template["spec"]["containers"][0]


def _executor(r: Rendered) -> dict[str, Any]:
    return json.loads(r.child("ConfigMap")["data"][EXECUTOR_TEMPLATE_FILE])


def test_the_driver_deployment_carries_every_option_as_kubernetes_spells_it():
    r = _render(_spec(SHARED))
    meta, pod, container = _driver(r)
    assert meta["labels"]["team"] == "payments" and meta["labels"]["handoff.io/name"] == "orders"
    assert meta["annotations"]["example.com/owner"] == "payments" and "handoff.io/config-hash" in meta["annotations"]
    for key, field in (("nodeSelector", "nodeSelector"), ("tolerations", "tolerations"), ("affinity", "affinity"),
                       ("topologySpreadConstraints", "topologySpreadConstraints"),
                       ("priorityClassName", "priorityClassName"), ("imagePullSecrets", "imagePullSecrets"),
                       ("securityContext", "podSecurityContext")):
        assert pod[key] == SHARED[field], key
    assert container["securityContext"] == SHARED["containerSecurityContext"]
    assert container["envFrom"] == SHARED["envFrom"]
    # The operator's own entries stay, first; the user's follow.
    assert [e["name"] for e in container["env"]][-2:] == ["TZ", "API_TOKEN"]
    assert container["env"][0]["name"] == "POD_NAME"
    assert [m["name"] for m in container["volumeMounts"]] == ["app-config", "run", "checkpoint", "certs", "tmp"]
    assert [v["name"] for v in pod["volumes"]] == ["app-config", "run", "checkpoint", "certs", "tmp"]
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(r.child("Deployment"), version, strict=True)


def test_the_executors_get_a_pod_template_beside_app_json():
    r = _render(_spec(SHARED))
    conf = r.config.spark_conf
    assert conf["spark.kubernetes.executor.podTemplateFile"] == EXECUTOR_TEMPLATE_PATH
    assert conf["spark.kubernetes.executor.podTemplateContainerName"] == "executor"
    # In whichever of the two the driver mounts at /etc/handoff (here the Secret: propertiesFrom resolved).
    assert r.child("Secret")["stringData"][EXECUTOR_TEMPLATE_FILE] == r.child("ConfigMap")["data"][EXECUTOR_TEMPLATE_FILE]
    pod = _executor(r)
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(pod, version, strict=True)
    spec_ = pod["spec"]
    assert spec_["nodeSelector"] == SHARED["nodeSelector"] and spec_["tolerations"] == SHARED["tolerations"]
    assert spec_["affinity"] == SHARED["affinity"] and spec_["priorityClassName"] == "streaming"
    assert spec_["imagePullSecrets"] == [{"name": "regcred"}] and spec_["securityContext"] == SHARED["podSecurityContext"]
    assert spec_["topologySpreadConstraints"] == SHARED["topologySpreadConstraints"]
    assert pod["metadata"] == {"labels": {"team": "payments"}, "annotations": {"example.com/owner": "payments"}}
    (container,) = spec_["containers"]
    assert container == {"name": "executor", "env": SHARED["env"], "envFrom": SHARED["envFrom"],
                         "volumeMounts": SHARED["volumeMounts"],
                         "securityContext": SHARED["containerSecurityContext"]}
    assert spec_["volumes"] == SHARED["volumes"]


def test_a_roles_block_wins_field_by_field_as_a_strategic_merge_patch_would():
    driver = {"nodeSelector": {"pool": "drivers", "disk": "ssd"},
              "tolerations": [],
              "env": [{"name": "TZ", "value": "Europe/Berlin"}, {"name": "EXTRA", "value": "1"}],
              "podSecurityContext": {"runAsUser": 1000},
              "labels": {"tier": "driver"}}
    executor = {"priorityClassName": "batch", "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "kafka"}}, "topologyKey": "kubernetes.io/hostname"}]}},
        "volumes": [{"name": "certs", "configMap": {"name": "other-ca"}}]}
    r = _render(_spec(SHARED, driver=driver, executor=executor))
    meta, pod, container = _driver(r)
    assert pod["nodeSelector"] == {"pool": "drivers", "disk": "ssd"}          # maps: key by key
    assert pod["tolerations"] == []                                          # lists without a key: replaced
    env = {e["name"]: e for e in container["env"]}
    assert env["TZ"]["value"] == "Europe/Berlin" and env["EXTRA"]["value"] == "1" and "API_TOKEN" in env
    assert [e["name"] for e in container["env"]].count("TZ") == 1             # env: by name
    assert pod["securityContext"] == {**SHARED["podSecurityContext"], "runAsUser": 1000}  # field by field
    assert meta["labels"]["tier"] == "driver" and meta["labels"]["team"] == "payments"
    assert pod["affinity"] == SHARED["affinity"] and pod["priorityClassName"] == "streaming"
    ex = _executor(r)["spec"]
    assert ex["priorityClassName"] == "batch" and ex["affinity"] == executor["affinity"]  # replaced whole
    assert ex["nodeSelector"] == {"pool": "spark"} and ex["tolerations"] == SHARED["tolerations"]
    assert ex["volumes"] == [{"name": "certs", "configMap": {"name": "other-ca"}}, SHARED["volumes"][1]]
    assert "tier" not in _executor(r)["metadata"]["labels"]


def test_only_one_role_gets_options_when_only_its_block_is_set():
    r = _render(_spec(driver={"nodeSelector": {"pool": "drivers"}}))
    assert _driver(r)[1]["nodeSelector"] == {"pool": "drivers"}
    assert EXECUTOR_TEMPLATE_FILE not in r.child("ConfigMap")["data"]
    assert "spark.kubernetes.executor.podTemplateFile" not in r.config.spark_conf
    r = _render(_spec(executor={"nodeSelector": {"pool": "executors"}}))
    assert "nodeSelector" not in _driver(r)[1]
    assert _executor(r)["spec"]["nodeSelector"] == {"pool": "executors"}


@pytest.mark.parametrize("options", [None, {}])
def test_nothing_is_rendered_when_unset_and_the_hash_stays(options):
    plain = _render(spec())
    r = _render(_spec(options, driver=options, executor=options))
    assert r.config_hash == plain.config_hash
    assert r.child("Deployment") == plain.child("Deployment")
    assert r.child("ConfigMap")["data"] == plain.child("ConfigMap")["data"]
    _, pod, container = _driver(r)
    for key in ("nodeSelector", "tolerations", "affinity", "topologySpreadConstraints", "priorityClassName",
                "imagePullSecrets", "securityContext"):
        assert key not in pod
    assert "envFrom" not in container and "securityContext" not in container


def test_only_what_is_set_is_rendered_nothing_the_api_server_defaults():
    r = _render(_spec({"tolerations": [{"key": "dedicated", "operator": "Exists"}],
                       "volumes": [{"name": "s", "secret": {"secretName": "x"}}],
                       "volumeMounts": [{"name": "s", "mountPath": "/etc/s"}]}))
    _, pod, container = _driver(r)
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert pod["volumes"][-1] == {"name": "s", "secret": {"secretName": "x"}}  # no defaultMode
    assert container["volumeMounts"][-1] == {"name": "s", "mountPath": "/etc/s"}


def test_executor_options_change_the_hash_so_the_driver_restarts_with_them():
    a = _render(_spec(executor={"nodeSelector": {"pool": "a"}}))
    b = _render(_spec(executor={"nodeSelector": {"pool": "b"}}))
    assert a.config_hash != b.config_hash
    assert _driver(a)[1] == _driver(b)[1]          # the driver's own pod is untouched: only the hash rolls it


@pytest.mark.parametrize("block,field,value,where", [
    ("pod", "labels", {"handoff.io/name": "other"}, "spec.spark.pod.labels"),
    ("driver", "labels", {"app.kubernetes.io/component": "x"}, "spec.spark.driver.pod.labels"),
    ("executor", "labels", {"spark-role": "driver"}, "spec.spark.executor.pod.labels"),
    ("pod", "annotations", {"handoff.io/config-hash": "0"}, "spec.spark.pod.annotations"),
    ("pod", "labels", {"Bad Key": "x"}, "spec.spark.pod.labels"),
])
def test_the_operators_own_labels_and_annotations_are_refused_naming_the_field(block, field, value, where):
    s = spec()
    target = s["spark"] if block == "pod" else s["spark"][block]
    target["pod"] = {field: value}
    (problem,) = _problems(s)
    assert problem.startswith(where + ": ") and "\n" not in problem


@pytest.mark.parametrize("options,where,words", [
    ({"volumeMounts": [{"name": "nope", "mountPath": "/x"}]}, "spec.spark.pod.volumeMounts[0].name", "no volume"),
    ({"volumes": [{"name": "run", "emptyDir": {}}]}, "spec.spark.pod.volumes[0].name", "operator or Spark"),
    ({"volumes": [{"name": "spark-local-dir-1", "emptyDir": {}}]}, "spec.spark.pod.volumes[0].name", "another name"),
    ({"volumes": [{"name": "a", "emptyDir": {}}], "volumeMounts": [{"name": "a", "mountPath": "/etc/handoff/x"}]},
     "spec.spark.pod.volumeMounts[0].mountPath", "overlaps /etc/handoff"),
    ({"env": [{"name": "PYSPARK_SUBMIT_ARGS", "value": "x"}]}, "spec.spark.pod.env[0].name", "operator"),
    ({"env": [{"name": "SPARK_LOCAL_DIRS", "value": "x"}]}, "spec.spark.pod.env[0].name", "Spark sets"),
    ({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}, "spec.spark.pod.env[1].name", "twice"),
    ({"volumes": [{"name": "a", "emptyDir": {}, "secret": {"secretName": "s"}}]}, "spec.spark.pod.volumes[0]",
     "exactly one"),
    ({"env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
     "spec.spark.pod.env[0]", "not both"),
    ({"tolerations": [{"key": "k", "effect": "Sometimes"}]}, "spec.spark.pod.tolerations[0].effect", "NoSchedule"),
])
def test_options_that_cannot_work_are_one_line_field_named_problems(options, where, words):
    problems = _problems(_spec(options))
    assert len(problems) == 1, problems
    assert problems[0].startswith(where) and words in problems[0] and "\n" not in problems[0]


def test_problems_name_the_block_they_were_written_in():
    (problem,) = _problems(_spec(executor={"volumeMounts": [{"name": "nope", "mountPath": "/x"}]}))
    assert problem.startswith("spec.spark.executor.pod.volumeMounts[0].name: the executor's pod has no volume")
    # The driver may take SPARK_* (only executors get Spark's), executors the driver's names.
    assert _problems(_spec(driver={"env": [{"name": "SPARK_X", "value": "1"}]})) == []
    assert _problems(_spec(executor={"env": [{"name": "POD_NAME", "value": "1"}]})) == []
    # A mount in the shared block of a volume only one role has fails for the other one.
    (problem,) = _problems(_spec({"volumeMounts": [{"name": "v", "mountPath": "/v"}]},
                                driver={"volumes": [{"name": "v", "emptyDir": {}}]}))
    assert problem.startswith("spec.spark.pod.volumeMounts[0].name: the executor's pod has no volume 'v'")


def test_an_own_executor_pod_template_setting_conflicts_with_executor_options():
    s = _spec(executor={"nodeSelector": {"a": "b"}},
              sparkConf={"spark.kubernetes.executor.podTemplateFile": "/x.yaml"})
    (problem,) = _problems(s)
    assert problem.startswith("spec.spark.sparkConf[spark.kubernetes.executor.podTemplateFile]: ")
    # Without executor options it is the user's setting, as before.
    assert _problems(_spec(sparkConf={"spark.kubernetes.executor.podTemplateFile": "/x.yaml"})) == []


def test_a_backfill_job_runs_with_the_drivers_pod_options():
    """Backfill Jobs (ReplayRequest) are built from the driver Deployment's pod template: a pod that must tolerate
    a taint, pull with a secret or mount a CA as the stream's driver must do so as a backfill too."""
    from handoff_operator.replay.backfill import backfill_job

    r = _render(_spec(SHARED))
    request = {"metadata": {"name": "fill", "namespace": "shop", "uid": "uid-r"}}
    job = backfill_job(r.child("Deployment"), request, "orders", {"orders": {"0": 0}}, {"orders": {"0": 10}})
    pod = job["spec"]["template"]["spec"]
    for key, field in (("nodeSelector", "nodeSelector"), ("tolerations", "tolerations"),
                       ("imagePullSecrets", "imagePullSecrets"), ("securityContext", "podSecurityContext")):
        assert pod[key] == SHARED[field], key
    (container,) = pod["containers"]
    assert {"TZ", "API_TOKEN"} <= {e["name"] for e in container["env"]}
    assert {"certs", "tmp"} <= {v["name"] for v in pod["volumes"]}
    assert container["securityContext"] == SHARED["containerSecurityContext"]
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(job, version, strict=True)
