"""`kubectl handoff status NAME` (pure): a StreamTableHandoff (+ its driver's published progress record) → one
summary dict (what `-o json|yaml` prints) and its plain-text form.

Lag per partition is not in the resource's status (which holds the total, from the table's ledger and Kafka):
it comes from the driver's own record in the ConfigMap `<name>-progress` (the lag it measured after its newest
batch), so the text says how old that measurement is.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from handoff_operator.truth import driver_report
from handoff_operator.models.common import format_duration
from handoff_operator.models.stream_table_handoff import SparkUiIngressSpec
from handoff_operator.spec.render import UI_PORT, driver_name, ui_ingress_name, ui_service_name
from handoff_operator.spec.validation import parse_spec


def lag_per_partition(report: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """[{topic, partition, lag}] sorted by topic and partition, from the record's nested `lag`."""
    out = []
    lag = (report or {}).get("lag")
    if isinstance(lag, Mapping):
        for topic, parts in lag.items():
            if not isinstance(parts, Mapping):
                continue
            for partition, value in parts.items():
                if isinstance(value, int) and str(partition).isdigit():
                    out.append({"topic": topic, "partition": int(partition), "lag": value})
    return sorted(out, key=lambda r: (r["topic"], r["partition"]))


def spark_ui(namespace: str | None, name: str | None, service: bool,
             ingress: SparkUiIngressSpec | None = None) -> dict[str, Any]:
    """How to reach the running driver's Spark UI: the Ingress's URL when spec.spark.ui.ingress is set (https when
    it has TLS), and always the port-forward to its Service (`<name>-ui`, or the driver's headless Service when
    spec.spark.ui.service is false), which works without an ingress controller. A stopped driver's UI is gone;
    nothing keeps it."""
    svc = ui_service_name(name or "") if service else driver_name(name or "")
    out: dict[str, Any] = {"service": svc, "port": UI_PORT,
                           "portForward": f"kubectl port-forward -n {namespace} svc/{svc} {UI_PORT}",
                           "url": f"http://localhost:{UI_PORT}"}
    if ingress is not None:
        out["ingress"] = {"name": ui_ingress_name(name or ""), "url": ingress.url()}
    return out


def summary(obj: Mapping[str, Any], report_text: str | None, now_ms: int) -> dict[str, Any]:
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    spec, _problems = parse_spec(obj.get("spec") or {})
    target = spec.freshness_target_seconds if spec is not None else None
    freshness = status.get("freshnessSeconds")
    report = driver_report.document(report_text)
    published = (report or {}).get("publishedAtMs")
    executors = status.get("executors") or {}
    retention = status.get("retention") or {}
    return {
        "namespace": meta.get("namespace"), "name": meta.get("name"),
        "phase": status.get("phase"),
        "observedGeneration": status.get("observedGeneration"), "generation": meta.get("generation"),
        "lag": status.get("lag"),
        "lagPerPartition": lag_per_partition(report),
        "lagMeasuredSecondsAgo": (round(max(0, now_ms - published) / 1000, 1)
                                  if isinstance(published, int) else None),
        "freshness": status.get("freshness"), "freshnessSeconds": freshness,
        "freshnessTargetSeconds": target,
        "freshnessTargetMet": (freshness <= target if isinstance(freshness, (int, float)) and target is not None
                               else None),
        "executors": {k: executors.get(k) for k in ("current", "desired", "reason", "message")},
        "committed": status.get("committed"),
        "lastBatch": status.get("lastBatch"),
        "lastFailure": (status.get("app") or {}).get("lastFailure"),
        "retentionHeadroomSeconds": retention.get("headroomSeconds"),
        "sparkUi": spark_ui(meta.get("namespace"), meta.get("name"), spec is None or spec.spark.ui_service(),
                            spec.spark.ui_ingress() if spec is not None else None),
        "conditions": [{k: c.get(k) for k in ("type", "status", "reason", "message", "lastTransitionTime")}
                       for c in status.get("conditions") or []],
    }


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def format_text(s: Mapping[str, Any]) -> str:
    lines = [f"StreamTableHandoff {s['namespace']}/{s['name']}: {s['phase'] or 'no status yet'}"]
    if s["generation"] is not None and s["observedGeneration"] != s["generation"]:
        lines.append(f"  (status is of generation {s['observedGeneration']}, the spec is at {s['generation']})")
    lines.append(f"  lag         {s['lag']} records" if s["lag"] is not None else "  lag         unknown")
    target = s["freshnessTargetSeconds"]
    target_text = ""
    if target is not None:
        met = s["freshnessTargetMet"]
        target_text = f" (target {format_duration(target)}" + ("" if met is None else
                                                               ": met" if met else ": MISSED") + ")"
    lines.append(f"  freshness   {s['freshness'] or 'unknown'}{target_text}")
    ex = s["executors"]
    if ex["current"] is not None or ex["desired"] is not None:
        why = f" ({ex['reason']}: {ex['message']})" if ex["reason"] and ex["message"] else (
            f" ({ex['reason']})" if ex["reason"] else "")
        lines.append(f"  executors   {ex['current']} current / {ex['desired']} desired{why}")
    committed = s["committed"] or {}
    if committed:
        lines.append(f"  committed   snapshot {committed.get('snapshot')} batch {committed.get('batch')}"
                     f" at {committed.get('at')}")
    last = s["lastBatch"] or {}
    if last.get("id") is not None:
        lines.append(f"  last batch  {last['id']}: {last.get('rows')} rows in {last.get('durationMs')} ms, "
                     f"{last.get('deadLetters') or 0} dead letters")
    if s["retentionHeadroomSeconds"] is not None:
        headroom = s["retentionHeadroomSeconds"]
        lines.append("  retention   " + (f"{format_duration(headroom)} headroom" if headroom >= 0
                                         else f"{format_duration(-headroom)} TOO SHORT"))
    if s["lastFailure"]:
        lines.append(f"  last failure  {s['lastFailure'].splitlines()[0][:200]}")
    ui = s["sparkUi"]
    if ui.get("ingress"):
        lines.append(f"  spark ui    {ui['ingress']['url']} (Ingress {ui['ingress']['name']}), or "
                     f"{ui['portForward']}, then {ui['url']} (only while the driver runs: a stopped driver's UI "
                     f"is not kept)")
    else:
        lines.append(f"  spark ui    {ui['portForward']}, then {ui['url']} (only while the driver runs: a stopped "
                     f"driver's UI is not kept)")
    if s["lagPerPartition"]:
        lines.append(f"Lag per partition (the driver's report, {s['lagMeasuredSecondsAgo']}s ago):")
        lines += _table([["TOPIC", "PARTITION", "LAG"]]
                        + [[r["topic"], str(r["partition"]), str(r["lag"])] for r in s["lagPerPartition"]])
    else:
        lines.append("Lag per partition: no report from a driver yet")
    if s["conditions"]:
        lines.append("Conditions:")
        lines += _table([["TYPE", "STATUS", "REASON", "MESSAGE"]]
                        + [[c["type"] or "", c["status"] or "", c["reason"] or "", (c["message"] or "")[:160]]
                           for c in s["conditions"]])
    return "\n".join(lines)
