"""The chart's monitoring objects (Grafana dashboard, PrometheusRule) rendered offline, the metric names their
PromQL reads (parsed by a real PromQL parser, not by regular expressions), and the names a Prometheus scrape of
a metrics endpoint exposes. Shared by the unit test of the chart and the integration test that scrapes a running
driver and operator."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import helm_python as helm
import promql_parser
import yaml
from prometheus_client.parser import text_string_to_metric_families

CHART = Path(__file__).resolve().parents[1] / "charts" / "handoff-operator"
MONITORING_ON: dict[str, Any] = {
    "monitoring": {"dashboards": {"enabled": True}, "rules": {"enabled": True}, "podMonitor": {"enabled": True}},
    "metrics": {"serviceMonitor": {"enabled": True}},
}
# Grafana's own variables, replaced before parsing as Grafana does before sending the query.
_GRAFANA_VARS = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}
_LABEL_VALUES = re.compile(r"^label_values\((?P<expr>.*),\s*(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\)$", re.S)


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    out = helm.Chart.load(CHART).render(values, name="handoff", namespace="handoff-system", is_install=True)
    return [d for path, text in out.items() if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]


def dashboard(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    return json.loads(cm["data"]["handoff.json"])


def rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def grafana_to_promql(query: str) -> str:
    """A dashboard query as Grafana sends it: its variables substituted (`$name`, `${name}`); a template
    variable's `label_values(expr, label)` becomes its expr."""
    def sub(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return _GRAFANA_VARS.get(name, "x")
    text = re.sub(r"\$\{(\w+)\}|\$(\w+)", sub, query.strip())
    m = _LABEL_VALUES.match(text)
    return m.group("expr") if m else text


def dashboard_queries(dash: dict[str, Any]) -> list[str]:
    queries = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            q = var["query"]
            queries.append(q["query"] if isinstance(q, dict) else q)
    return queries


def selected_metrics(promql: str) -> set[tuple[str, str]]:
    """Every metric a PromQL expression selects, as (name, whose): `driver` for a selector with handoff!=""
    (the driver labels its series handoff="<namespace>/<name>"), `operator` for handoff="" (the operator's
    series have no such label), `any` otherwise. Raises ValueError if the text is not valid PromQL."""
    found: set[tuple[str, str]] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            matchers = node.matchers.matchers
            name = node.name or next((m.value for m in matchers if m.name == "__name__"), None)
            assert name, f"a selector without a metric name in {promql!r}"
            whose = "any"
            for m in matchers:
                if m.name == "handoff" and m.value == "":
                    whose = "driver" if m.op == promql_parser.MatchOp.NotEqual else "operator"
            found.add((name, whose))

    promql_parser.walk(promql_parser.parse(promql), visit)
    return found


def chart_metrics(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """(name, whose) of every metric the rendered dashboard and alert rules read."""
    found: set[tuple[str, str]] = set()
    for query in dashboard_queries(dashboard(docs)):
        found |= selected_metrics(grafana_to_promql(query))
    for rule in rules(docs):
        found |= selected_metrics(rule["expr"])
    return found


def exposed_names(exposition: str) -> set[str]:
    """The series names a scrape of this text can give Prometheus: each family's samples, and for families with
    no sample yet (labelled metrics before their first use) the names their type implies."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count"),
                "gauge": ("",), "info": ("_info",), "stateset": ("",), "unknown": ("",)}
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names.update(s.name for s in family.samples)
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
    return names
