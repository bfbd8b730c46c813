"""The Helm chart, offline: it lints clean (strict), its values schema rejects bad values, and every
rendered manifest validates against the Kubernetes API schemas (kubernetes-validate, strict: unknown
fields are errors) for the oldest supported and the test bed's Kubernetes versions. RBAC gets its own
checks: the operator holds what it needs, and at least what it grants the Spark driver (a Role can only
grant what its creator holds)."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from handoff_operator.models import StreamTableHandoffSpec
from handoff_operator.spec.render import rbac

CHART = Path(__file__).resolve().parents[3] / "charts" / "handoff-operator"
KUBE_VERSIONS = ("1.29", "1.35")
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "namespaced": {"watchNamespaces": ["shop", "analytics"]},
    "everything-on": {"watchNamespaces": ["shop"], "argocd": {"healthChecks": True},
                      "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
                      "imagePullSecrets": [{"name": "regcred"}], "sparkImage": "registry.local/spark:1",
                      "extraEnv": [{"name": "HANDOFF_X", "value": "1"}], "nodeSelector": {"pool": "ops"}},
    "metrics-off": {"metrics": {"enabled": False}, "serviceAccount": {"create": False, "name": "existing"}},
    "retention-enforce": {"retention": {"enforce": True}},
    "placement": {"nodeSelector": {"pool": "ops"}, "priorityClassName": "system-cluster-critical",
                  "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"},
                                  {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                                   "effect": "NoExecute", "tolerationSeconds": 30}],
                  "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                      "nodeSelectorTerms": [{"matchExpressions": [
                          {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}},
                  "podSecurityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                                         "fsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
                  "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                                      "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}},
    "retention-enforce-namespaced": {"watchNamespaces": ["shop"],
                                     "retention": {"enforce": True, "kafkaTopicNamespaces": ["kafka"]}},
}


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    chart = helm.Chart.load(CHART)
    out = chart.render(values, name="handoff", namespace="handoff-system", is_install=True)
    docs = []
    for path, text in out.items():
        if path.endswith(".yaml"):
            docs += [d for d in yaml.load_all(text, Loader=yaml.CSafeLoader) if d]
    return docs


@functools.cache
def chart_crds() -> tuple[dict[str, Any], ...]:
    """The chart's CRDs, parsed once for all the parameters (libyaml's parser: they are large)."""
    return tuple(yaml.load(path.read_text(), Loader=yaml.CSafeLoader)
                 for path in sorted((CHART / "crds").glob("*.yaml")))


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_lint_is_clean() -> None:
    for values in VALUE_SETS.values():
        report = helm.lint(CHART, values, strict=True, namespace="handoff-system", kube_version="v1.35.0")
        assert report["errors"] == []
        assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("name", VALUE_SETS)
@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_rendered_manifests_are_valid(name: str, kube_version: str) -> None:
    docs = render(VALUE_SETS[name])
    assert docs
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":  # a Prometheus Operator CRD: not in the built-in schemas
            assert doc["spec"]["endpoints"][0]["port"] == "metrics"
            continue
        kubernetes_validate.validate(doc, kube_version, strict=True)
    # The chart's CRDs are valid CustomResourceDefinitions as well.
    crds = chart_crds()
    assert crds
    for crd in crds:
        kubernetes_validate.validate(crd, kube_version, strict=True)


def test_values_schema_rejects_bad_values() -> None:
    chart = helm.Chart.load(CHART)
    chart.validate_schema({})
    chart.validate_schema(VALUE_SETS["placement"])
    for bad in ({"watchNamespaces": ["Not_A_Namespace"]}, {"metrics": {"port": 0}},
                {"image": {"pullPolicy": "Sometimes"}}, {"replicaCount": 3}, {"logLevel": "LOUD"},
                {"tolerations": [{"key": "x", "effect": "Sometimes"}]}, {"tolerations": [{"efect": "NoSchedule"}]},
                {"tolerations": {"key": "x"}}, {"affinity": {"nodeAfinity": {}}}, {"priorityClassName": "Not Valid"},
                {"podSecurityContext": {"runAsNonRoot": "yes"}}, {"securityContext": {"runAsUser": -1}},
                {"nodeSelector": {"pool": 1}}):
        with pytest.raises(helm.HelmValuesError):
            chart.validate_schema(bad)


def test_deployment_wiring() -> None:
    docs = render(VALUE_SETS["everything-on"])
    (deploy,) = by_kind(docs, "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert container["args"][0] == "operator"
    assert env["HANDOFF_NAMESPACES"] == "shop"
    assert env["HANDOFF_DEFAULT_IMAGE"] == "registry.local/spark:1"
    assert env["HANDOFF_METRICS_PORT"] == "8080" and env["HANDOFF_X"] == "1"
    assert env["HANDOFF_UPGRADE_READINESS_TIMEOUT"] == "300" and env["HANDOFF_UPGRADE_CRASH_RESTARTS"] == "3"
    # the one price a ReplayRequest's plan prices BigQuery writes with, read back by the operator's settings
    assert env["HANDOFF_BIGQUERY_WRITE_PRICE_PER_GIB"] == "0.025"
    assert deploy["spec"]["replicas"] == 1 and deploy["spec"]["strategy"]["type"] == "Recreate"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["serviceAccountName"] == by_kind(docs, "ServiceAccount")[0]["metadata"]["name"]
    (service,) = by_kind(docs, "Service")
    assert service["spec"]["selector"] == deploy["spec"]["selector"]["matchLabels"]
    (cm,) = by_kind(docs, "ConfigMap")
    lua = cm["data"]["resource.customizations.health.handoff.io_StreamTableHandoff"]
    assert "hs.status" in lua and "Suspended" in lua
    off = render(VALUE_SETS["metrics-off"])
    assert not by_kind(off, "Service") and not by_kind(off, "ServiceAccount")
    env_off = {e["name"]: e.get("value") for e in by_kind(off, "Deployment")[0]["spec"]["template"]["spec"]
               ["containers"][0]["env"]}
    assert env_off["HANDOFF_METRICS_PORT"] == "0"
    assert by_kind(off, "Deployment")[0]["spec"]["template"]["spec"]["serviceAccountName"] == "existing"


def test_operator_pod_placement_and_security_values_reach_its_deployment() -> None:
    """nodeSelector, tolerations, affinity, priorityClassName and both security contexts: where a platform team
    must put the operator's pod, as it set them, and the chart's defaults (non-root, read-only root) otherwise."""
    values = VALUE_SETS["placement"]
    (deploy,) = by_kind(render(values), "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName"):
        assert pod[key] == values[key], key
    assert pod["securityContext"] == values["podSecurityContext"]
    assert pod["containers"][0]["securityContext"] == values["securityContext"]
    (default,) = by_kind(render({}), "Deployment")
    pod = default["spec"]["template"]["spec"]
    assert not {"nodeSelector", "tolerations", "affinity", "priorityClassName"} & set(pod)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True


def _allows(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules)


NEEDED = [  # (group, resource, verbs) the operator uses in a managed namespace
    ("handoff.io", "streamtablehandoffs", ["get", "list", "watch", "patch"]),
    ("handoff.io", "streamtablehandoffs/status", ["patch"]),
    ("handoff.io", "streamtablehandoffs/finalizers", ["update"]),
    ("handoff.io", "replayrequests", ["get", "list", "watch", "patch"]),
    ("handoff.io", "replayrequests/status", ["patch"]),
    ("", "configmaps", ["get", "create", "patch", "delete"]),
    ("", "secrets", ["get", "create", "patch"]),
    ("", "services", ["get", "create", "patch", "delete"]),  # delete: the UI Service of spark.ui.service: false
    ("", "serviceaccounts", ["get", "create", "patch"]),
    ("", "persistentvolumeclaims", ["get", "create"]),
    ("", "pods", ["get", "list", "watch"]),
    ("apps", "deployments", ["get", "create", "patch", "delete"]),
    ("apps", "deployments/scale", ["patch"]),
    ("networking.k8s.io", "ingresses", ["get", "create", "patch", "delete"]),  # spec.spark.ui.ingress
    ("batch", "jobs", ["get", "list", "watch", "create", "delete"]),
    ("rbac.authorization.k8s.io", "roles", ["get", "create", "patch"]),
    ("rbac.authorization.k8s.io", "rolebindings", ["get", "create", "patch"]),
    ("", "events", ["create"]),
]


def test_needed_covers_every_kind_the_operator_renders() -> None:
    """NEEDED is what the RBAC test checks: every child the operator applies or deletes (here with every optional
    child on: the app Secret, the driver's RBAC, the UI Service and Ingress, the checkpoint PVC) must be in it."""
    from handoff_operator.spec.render import render as render_children
    from handoff_operator.spec.validation import check, parse_spec
    raw = {"source": {"bootstrapServers": "k:9092", "topics": ["t"],
                      "propertiesFrom": [{"secretKeyRef": {"name": "kafka", "key": "password"},
                                          "property": "sasl.password"}]},
           "sink": {"iceberg": {"table": "db.t"}},
           "spark": {"ui": {"ingress": {"host": "ui.example.com"}}}}
    spec, problems = parse_spec(raw)
    assert spec is not None, problems
    resolved, problems = check("x", spec, {"kafka": {"password": "p"}})
    assert not problems, problems
    owner = {"metadata": {"name": "x", "namespace": "shop", "uid": "u"}}
    rendered = render_children(owner, spec, "img:1", resolved)
    plural = {"Ingress": "ingresses", "PersistentVolumeClaim": "persistentvolumeclaims"}
    needed = {(g, res) for g, res, _ in NEEDED}
    for obj in rendered.children + rendered.unowned + rendered.absent:
        group = obj["apiVersion"].rpartition("/")[0]
        resource = plural.get(obj["kind"], obj["kind"].lower() + "s")
        assert (group, resource) in needed, (group, resource)
    assert {o["kind"] for o in rendered.children} >= {"Secret", "Role", "Service", "Ingress", "Deployment"}


@pytest.mark.parametrize("name", ["defaults", "namespaced"])
def test_rbac_covers_what_the_operator_does(name: str) -> None:
    docs = render(VALUE_SETS[name])
    (cluster_role,) = by_kind(docs, "ClusterRole")
    assert _allows(cluster_role["rules"], "apiextensions.k8s.io", "customresourcedefinitions", "list")
    roles = by_kind(docs, "Role")
    if name == "defaults":
        assert roles == [] and len(by_kind(docs, "ClusterRoleBinding")) == 1
        scopes = [cluster_role["rules"]]
    else:
        assert sorted(r["metadata"]["namespace"] for r in roles) == ["analytics", "shop"]
        assert sorted(b["metadata"]["namespace"] for b in by_kind(docs, "RoleBinding")) == ["analytics", "shop"]
        # Namespaced mode: nothing namespaced is granted cluster-wide.
        assert not _allows(cluster_role["rules"], "", "secrets", "get")
        scopes = [r["rules"] for r in roles]
    for rules in scopes:
        missing = [(g, res, v) for g, res, verbs in NEEDED for v in verbs if not _allows(rules, g, res, v)]
        assert missing == []
        # What render.rbac() grants the driver must be held by the operator (RBAC escalation check).
        spec = StreamTableHandoffSpec.model_validate({"source": {"bootstrapServers": "k:9092", "topics": ["t"]},
                                                      "sink": {"iceberg": {"table": "db.t"}}})
        assert spec.spark.service_account_name is None
        owner = {"metadata": {"name": "x", "namespace": "shop", "uid": "u"}}
        driver_role = next(o for o in rbac(owner, "x", "shop") if o["kind"] == "Role")
        for rule in driver_role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        assert _allows(rules, group, resource, verb), (group, resource, verb)
    # Never cluster-wide write access to RBAC objects that could grant more than the operator holds.
    assert not _allows(cluster_role["rules"], "rbac.authorization.k8s.io", "clusterroles", "create")
    assert not any("escalate" in r["verbs"] or "bind" in r["verbs"] or "*" in r["verbs"]
                   for r in cluster_role["rules"])


def _kafka_topic_verbs(rules: list[dict[str, Any]]) -> set[str]:
    return {v for r in rules if "kafka.strimzi.io" in r["apiGroups"] for v in r["verbs"]
            if "kafkatopics" in r["resources"] or "*" in r["resources"]}


def test_retention_rbac_audit_needs_nothing_enforce_gets_exactly_kafkatopic_get_list_patch() -> None:
    audit = render({})
    assert all(not _kafka_topic_verbs(r["rules"]) for r in by_kind(audit, "ClusterRole") + by_kind(audit, "Role"))
    (cluster_role,) = by_kind(render(VALUE_SETS["retention-enforce"]), "ClusterRole")
    assert _kafka_topic_verbs(cluster_role["rules"]) == {"get", "list", "patch"}
    docs = render(VALUE_SETS["retention-enforce-namespaced"])
    (cluster_role,) = by_kind(docs, "ClusterRole")
    assert not _kafka_topic_verbs(cluster_role["rules"])  # only in the namespaces that hold KafkaTopics
    (role,) = [r for r in by_kind(docs, "Role") if _kafka_topic_verbs(r["rules"])]
    assert role["metadata"]["namespace"] == "kafka" and _kafka_topic_verbs(role["rules"]) == {"get", "list", "patch"}
    (binding,) = [b for b in by_kind(docs, "RoleBinding") if b["roleRef"]["name"] == role["metadata"]["name"]]
    assert binding["metadata"]["namespace"] == "kafka"
    env = {e["name"]: e.get("value") for e in by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]
           ["containers"][0]["env"]}
    assert env["HANDOFF_KAFKA_TOPIC_NAMESPACES"] == "kafka" and env["HANDOFF_RETENTION_CHECK_INTERVAL"] == "300"
