"""The chart's monitoring objects, offline: off by default; when on, the dashboard ConfigMap carries Grafana's
sidecar label and valid JSON whose every query is valid PromQL covering the issue's panels, every alert rule is
valid PromQL with a runbook line that docs/runbooks.md answers, and the driver PodMonitor selects the pods and
port the operator renders. (That each metric named here is one the code exports: the integration test
test_monitoring_scrape.py, which scrapes a running driver and operator.)"""
from __future__ import annotations

import copy
import re
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import promql_parser
import pytest

from handoff_operator.spec.render import METRICS_PORT, NAME_LABEL, labels
from monitoring_support import (CHART, MONITORING_ON, chart_metrics, dashboard, dashboard_queries, grafana_to_promql,
                                render, rules, selected_metrics)

RUNBOOKS = Path(__file__).resolve().parents[3] / "docs" / "runbooks.md"
MONITORING_KINDS = {"PrometheusRule", "PodMonitor", "ServiceMonitor"}


def test_off_by_default() -> None:
    docs = render({})
    assert not [d for d in docs if d["kind"] in MONITORING_KINDS]
    assert not [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]


def test_lint_is_clean_with_monitoring_on() -> None:
    for values in (MONITORING_ON, {**MONITORING_ON, "watchNamespaces": ["shop"]}):
        report = helm.lint(CHART, values, strict=True, namespace="handoff-system", kube_version="v1.35.0")
        assert report["errors"] == []
        assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_values_schema_rejects_bad_monitoring_values() -> None:
    chart = helm.Chart.load(CHART)
    chart.validate_schema(MONITORING_ON)
    for bad in ({"monitoring": {"rules": {"lagGrowingFor": "soon"}}}, {"monitoring": {"dashboards": {"on": True}}},
                {"monitoring": {"rules": {"crashRestarts": 0}}}):
        with pytest.raises(helm.HelmValuesError):
            chart.validate_schema(bad)


def test_dashboard_configmap_has_the_sidecar_label_and_is_valid() -> None:
    docs = render(MONITORING_ON)
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    kubernetes_validate.validate(cm, "1.35", strict=True)
    values = copy.deepcopy(MONITORING_ON)
    # Helm merges the map with the default: a sidecar configured with another label value gets it.
    values["monitoring"]["dashboards"].update(labels={"grafana_dashboard": "handoff", "team": "data"},
                                              namespace="monitoring")
    (other,) = [d for d in render(values) if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    assert {"grafana_dashboard": "handoff", "team": "data"}.items() <= other["metadata"]["labels"].items()
    assert other["metadata"]["namespace"] == "monitoring"


def test_every_dashboard_query_is_promql_and_the_issue_panels_are_there() -> None:
    dash = dashboard(render(MONITORING_ON))
    assert dash["uid"] and dash["title"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
    queries = dashboard_queries(dash)
    names = {name for q in queries for name, _ in selected_metrics(grafana_to_promql(q))}
    # lag, freshness vs target, rows/s, batch duration, commit latency, DLQ rate, executors, retention headroom
    assert {"handoff_lag_records", "handoff_freshness_seconds", "handoff_freshness_target_seconds",
            "handoff_rows_total", "handoff_batch_duration_seconds_bucket", "handoff_commit_latency_seconds_bucket",
            "handoff_dead_letters_total", "handoff_executors_desired", "handoff_executors_current",
            "handoff_retention_headroom_seconds"} <= names
    # the cost row (issue 35): bytes read and written, files and snapshots, the Storage Write API estimate
    assert {"handoff_cost_kafka_read_bytes", "handoff_cost_table_written_bytes", "handoff_cost_files",
            "handoff_cost_snapshots", "handoff_cost_write_api_estimate", "handoff_cost_rewritten_bytes",
            "handoff_cost_reread_bytes_total"} <= names
    assert "Cost" in [p["title"] for p in dash["panels"] if p["type"] == "row"]
    # The per-partition lag panel reads the driver's series, the totals the operator's.
    assert ("handoff_lag_records", "driver") in chart_metrics(render(MONITORING_ON))


def test_a_broken_query_is_caught() -> None:
    with pytest.raises(ValueError):
        selected_metrics("sum by (name) (rate(handoff_rows_total[5m])")


def test_every_alert_is_promql_with_a_runbook_docs_answer() -> None:
    alerts = rules(render(MONITORING_ON))
    assert {a["alert"] for a in alerts} == {
        "HandoffFreshnessTargetMissed", "HandoffLagGrowing", "HandoffDataLoss", "HandoffRetentionInsufficient",
        "HandoffDriverCrashLooping", "HandoffReplayFailed", "HandoffQueryHeldTooLong"}
    headings = {re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
                for line in RUNBOOKS.read_text().splitlines() if line.startswith("#")}
    for alert in alerts:
        assert selected_metrics(alert["expr"]), alert["alert"]
        if "for" in alert:
            assert promql_parser.parse_duration(alert["for"]).total_seconds() > 0
        runbook = alert["annotations"]["runbook"]
        anchor = alert["alert"].lower()
        assert f"docs/runbooks.md#{anchor}" in runbook and anchor in headings, alert["alert"]
        assert alert["labels"]["severity"] in ("warning", "critical")
        assert "runbook_url" not in alert["annotations"]
    values = copy.deepcopy(MONITORING_ON)
    values["monitoring"]["rules"].update(runbookBaseUrl="https://docs.example/runbooks", lagGrowingFor="30m",
                                         queryHeldFor="2h")
    alerts = {a["alert"]: a for a in rules(render(values))}
    assert alerts["HandoffDataLoss"]["annotations"]["runbook_url"] == "https://docs.example/runbooks#handoffdataloss"
    assert alerts["HandoffLagGrowing"]["for"] == "30m"
    assert alerts["HandoffQueryHeldTooLong"]["for"] == "2h" and "over 2h" in \
        alerts["HandoffQueryHeldTooLong"]["annotations"]["summary"]


def test_pod_monitor_selects_the_driver_pods_and_port_the_operator_renders() -> None:
    (pm,) = [d for d in render(MONITORING_ON) if d["kind"] == "PodMonitor"]
    driver = labels("orders", "driver")
    assert pm["spec"]["selector"]["matchLabels"].items() <= driver.items()
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and METRICS_PORT == 9090
    source = "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", NAME_LABEL)
    assert endpoint["relabelings"] == [{"sourceLabels": [source], "targetLabel": "name"}]
    (pm,) = [d for d in render({**MONITORING_ON, "watchNamespaces": ["shop", "lake"]}) if d["kind"] == "PodMonitor"]
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["shop", "lake"]}


def test_operator_service_monitor_keeps_the_handoffs_namespace_label() -> None:
    (sm,) = [d for d in render(MONITORING_ON) if d["kind"] == "ServiceMonitor"]
    assert sm["spec"]["endpoints"][0]["honorLabels"] is True
