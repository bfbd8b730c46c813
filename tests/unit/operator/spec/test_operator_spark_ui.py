"""The driver's Spark UI (spec.spark.ui): its own ClusterIP Service `<name>-ui`, owned by the handoff, selecting the
driver pod's `ui` port; turned off with ui.service: false, which also asks the operator to delete the one it made.
The opt-in Ingress (ui.ingress): `<name>-ui` to that Service's port, host/path/class/TLS/annotations as given, valid
for the Kubernetes API; a path other than `/` reaches the driver as spark.ui.proxyBase; without ui.ingress the
operator is asked to delete the one it made; with ui.service: false it is refused, naming the field."""
from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from handoff_operator.models.stream_table_handoff import SparkUiIngressSpec
from handoff_operator.spec.render import Rendered
from handoff_operator.spec.validation import parse_spec

from operator_spec_support import body, render_valid, spec

KUBE_VERSIONS = ("1.29", "1.35")
INGRESS_ABSENT = {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                  "metadata": {"name": "orders-ui", "namespace": "shop"}}


def _render(spec_dict: dict[str, Any]) -> Rendered:
    return render_valid(spec_dict)


def test_the_ui_gets_a_service_of_its_own_that_selects_the_drivers_ui_port():
    r = _render(spec())
    (ui,) = [c for c in r.children if c["kind"] == "Service" and c["metadata"]["name"] == "orders-ui"]
    deployment = r.child("Deployment")
    assert ui["metadata"]["ownerReferences"][0]["kind"] == "StreamTableHandoff"
    assert ui["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert ui["spec"]["ports"] == [{"name": "http", "port": 4040, "targetPort": "ui"}]
    assert "clusterIP" not in ui["spec"] and "type" not in ui["spec"]  # the API server's to fill in
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {"name": "ui", "containerPort": 4040} in container["ports"]
    assert r.absent == [INGRESS_ABSENT]  # no ui.ingress: an Ingress the operator made before goes
    assert "Ingress" not in [c["kind"] for c in r.children]


def test_ui_service_false_renders_none_and_asks_for_the_old_one_to_go():
    s = spec()
    s["spark"]["ui"] = {"service": False}
    r = _render(s)
    assert "orders-ui" not in [c["metadata"]["name"] for c in r.children]
    assert r.absent == [{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "orders-ui", "namespace": "shop"}},
                        INGRESS_ABSENT]
    # The UI Service is not part of what the driver runs with: turning it off restarts no driver.
    assert r.config_hash == _render(spec()).config_hash


def _with_ingress(**ingress: Any) -> dict[str, Any]:
    s = spec()
    s["spark"]["ui"] = {"ingress": ingress}
    return s


def _submit_args(r: Rendered) -> str:
    (container,) = r.child("Deployment")["spec"]["template"]["spec"]["containers"]
    return next(e["value"] for e in container["env"] if e["name"] == "PYSPARK_SUBMIT_ARGS")


def test_the_ingress_points_at_the_ui_service_with_what_the_spec_gives():
    r = _render(_with_ingress(host="orders-ui.spark.example.com", ingressClassName="nginx",
                              annotations={"nginx.ingress.kubernetes.io/auth-url": "https://auth.example.com/check"},
                              tls={"secretName": "orders-ui-tls"}))
    ingress = r.child("Ingress")
    assert ingress["apiVersion"] == "networking.k8s.io/v1"
    assert ingress["metadata"]["name"] == "orders-ui" and ingress["metadata"]["namespace"] == "shop"
    (ref,) = ingress["metadata"]["ownerReferences"]
    assert ref["kind"] == "StreamTableHandoff" and ref["name"] == "orders" and ref["controller"] is True
    assert ingress["metadata"]["annotations"] == {
        "nginx.ingress.kubernetes.io/auth-url": "https://auth.example.com/check"}
    assert ingress["spec"] == {
        "ingressClassName": "nginx",
        "rules": [{"host": "orders-ui.spark.example.com", "http": {"paths": [{
            "path": "/", "pathType": "Prefix",
            "backend": {"service": {"name": "orders-ui", "port": {"number": 4040}}}}]}}],
        "tls": [{"hosts": ["orders-ui.spark.example.com"], "secretName": "orders-ui-tls"}]}
    # The backend is the Service rendered beside it, on its port.
    (svc,) = [c for c in r.children if c["kind"] == "Service" and c["metadata"]["name"] == "orders-ui"]
    assert svc["spec"]["ports"][0]["port"] == 4040
    assert INGRESS_ABSENT not in r.absent
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(ingress, version, strict=True)
    # At `/` Spark's links work as they are: no proxyBase, and the Ingress restarts no driver.
    assert "proxyBase" not in _submit_args(r)
    assert r.config_hash == _render(spec()).config_hash


def test_the_minimal_ingress_has_no_class_tls_or_annotations():
    ingress = _render(_with_ingress(host="ui.example.com")).child("Ingress")
    assert "annotations" not in ingress["metadata"]
    assert set(ingress["spec"]) == {"rules"}
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(ingress, version, strict=True)


def test_a_path_prefix_reaches_the_driver_as_spark_ui_proxy_base():
    r = _render(_with_ingress(host="spark.example.com", path="/spark/orders/", pathType="ImplementationSpecific"))
    (path,) = r.child("Ingress")["spec"]["rules"][0]["http"]["paths"]
    assert path["path"] == "/spark/orders/" and path["pathType"] == "ImplementationSpecific"
    # Given at JVM launch (Spark reads it as a system property), without the trailing slash its links append to;
    # Spark's redirects go to the Ingress's URL (http: no tls).
    assert ("--conf spark.ui.proxyBase=/spark/orders --conf spark.ui.proxyRedirectUri=http://spark.example.com "
            "pyspark-shell") in _submit_args(r)
    # A wildcard host names no one URL to redirect to: the links' prefix alone.
    wild = _render(_with_ingress(host="*.example.com", path="/spark/orders", tls={"secretName": "wild"}))
    assert "--conf spark.ui.proxyBase=/spark/orders pyspark-shell" in _submit_args(wild)
    with_tls = _render(_with_ingress(host="spark.example.com", path="/spark/orders", tls={"secretName": "c"}))
    assert "spark.ui.proxyRedirectUri=https://spark.example.com " in _submit_args(with_tls)
    # The driver must restart to serve its links under another base.
    assert r.config_hash != _render(_with_ingress(host="spark.example.com")).config_hash


@pytest.mark.parametrize(("ui", "field", "words"), [
    ({"service": False, "ingress": {"host": "ui.example.com"}}, "spec.spark.ui",
     "spark.ui.ingress needs the UI Service it points to: remove spark.ui.service: false"),
    ({"ingress": {}}, "spec.spark.ui.ingress.host", "Field required"),
    ({"ingress": {"host": "Orders UI"}}, "spec.spark.ui.ingress.host", "is not a host name: use lower-case"),
    ({"ingress": {"host": "ui.example.com", "path": "spark"}}, "spec.spark.ui.ingress.path", "start it with '/'"),
    ({"ingress": {"host": "ui.example.com", "path": "/a;rm -rf"}}, "spec.spark.ui.ingress.path", "start it with '/'"),
    ({"ingress": {"host": "ui.example.com", "pathType": "Exact"}}, "spec.spark.ui.ingress.pathType", "Prefix"),
    ({"ingress": {"host": "ui.example.com", "path": "/spark/orders(/|$)(.*)"}}, "spec.spark.ui.ingress",
     "regular-expression characters needs pathType: ImplementationSpecific"),
    ({"ingress": {"host": "ui.example.com", "tls": {}}}, "spec.spark.ui.ingress.tls.secretName", "Field required"),
])
def test_bad_ingress_settings_are_one_line_naming_the_field(ui: dict[str, Any], field: str, words: str):
    s = spec()
    s["spark"]["ui"] = copy.deepcopy(ui)
    parsed, problems = parse_spec(body(s)["spec"])
    assert parsed is None
    (problem,) = problems
    assert problem.field == field and words in problem.message and "\n" not in problem.message, problem


def test_the_ingress_url_follows_tls_and_path():
    assert SparkUiIngressSpec(host="ui.example.com").url() == "http://ui.example.com/"
    assert SparkUiIngressSpec.model_validate(
        {"host": "ui.example.com", "path": "/spark/orders", "tls": {"secretName": "c"}}).url() == \
        "https://ui.example.com/spark/orders/"


def test_a_regex_path_for_a_controllers_rewrite_gives_spark_its_literal_part():
    """ingress-nginx strips a prefix with a regex path and rewrite-target: the Ingress gets the regex as written,
    Spark the literal prefix, status the URL a browser opens."""
    annotations = {"nginx.ingress.kubernetes.io/use-regex": "true",
                   "nginx.ingress.kubernetes.io/rewrite-target": "/$2"}
    r = _render(_with_ingress(host="spark.example.com", path="/spark/orders(/|$)(.*)",
                              pathType="ImplementationSpecific", annotations=annotations))
    ingress = r.child("Ingress")
    assert ingress["spec"]["rules"][0]["http"]["paths"][0]["path"] == "/spark/orders(/|$)(.*)"
    assert ingress["metadata"]["annotations"] == annotations
    assert "--conf spark.ui.proxyBase=/spark/orders --conf spark.ui.proxyRedirectUri=http://spark.example.com " \
        in _submit_args(r)
    parsed = SparkUiIngressSpec.model_validate({"host": "spark.example.com", "path": "/spark/orders(/|$)(.*)",
                                                "pathType": "ImplementationSpecific"})
    assert parsed.url() == "http://spark.example.com/spark/orders/"
