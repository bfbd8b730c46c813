"""The driver's published progress record (ConfigMap `<name>-progress`, key `progress.json`) → facts and
the `status.lastBatch` block (pure; no I/O).

The driver writes it (handoff_spark.driver.publisher); the document is the progress record of
docs/design/data-plane-contract.md plus `driverPod` and `publishedAtMs` (its shape:
`handoff_spark.contract.ProgressDocument`). Anything unreadable counts as no
report: a malformed record must not break the status of the handoff, it only loses the driver's view.
"""
from __future__ import annotations

import datetime as dt
import json
from typing import Any

#: The progress ConfigMap's key (also read by `runtime.kube` and `truth.watched`).
from handoff_spark.contract import PROGRESS_DATA_KEY as DATA_KEY  # noqa: F401
from handoff_spark.contract import (CONFIG_COMMITTED_KEY, CONFIG_HASH_KEY, CONFIG_REFUSED_HASH_KEY, CONFIG_REFUSED_KEY,
                                    CONFIG_SINCE_KEY, QUERY_HELD_KEY, QUERY_HOLDING_KEY)

from handoff_operator.conditions import DriverReport


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _float(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def document(text: str | None) -> dict[str, Any] | None:
    """The published JSON object, or None when there is none or it is unreadable."""
    if not text:
        return None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def parse(text: str | None) -> DriverReport | None:
    doc = document(text)
    if doc is None:
        return None
    published = _int(doc.get("publishedAtMs"))
    if published is None:
        return None
    reason = doc.get("degradedReason")
    pod = doc.get("driverPod")
    return DriverReport(
        published_at_ms=published, driver_pod=pod if isinstance(pod, str) and pod else None,
        batch_id=_int(doc.get("batchId")),
        degraded_reason=reason if isinstance(reason, str) and reason else None,
        degraded_detail=(doc["degradedDetail"][:500] if reason and _text(doc.get("degradedDetail")) else None),
        timestamp_ms=_int(doc.get("timestampMs")), rows=_int(doc.get("rows")),
        duration_ms=_int(doc.get("durationMs")), input_rows_per_second=_float(doc.get("inputRowsPerSecond")),
        work_ms=_int(doc.get("workMs")), first_of_driver=doc.get("firstOfDriver") is True,
        dlq_rows=_int(doc.get("dlqRows")), committed_snapshot=_int(doc.get("committedSnapshot")),
        totals=totals(doc.get("totals")),
        checkpoint_discarded=(doc["checkpointDiscarded"][:500] if isinstance(doc.get("checkpointDiscarded"), str)
                              and doc["checkpointDiscarded"] else None),
        query_held=_text(doc.get(QUERY_HELD_KEY)), query_holding=_text(doc.get(QUERY_HOLDING_KEY)),
        config_hash=_text(doc.get(CONFIG_HASH_KEY)), config_since_ms=_int(doc.get(CONFIG_SINCE_KEY)),
        config_committed_snapshot=_int(doc.get(CONFIG_COMMITTED_KEY)),
        config_refused=(doc[CONFIG_REFUSED_KEY][:1000] if _text(doc.get(CONFIG_REFUSED_KEY)) else None),
        config_refused_hash=_text(doc.get(CONFIG_REFUSED_HASH_KEY)))


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


#: The driver's running totals the operator reads (`handoff_spark.driver.progress.Totals.record`).
#: One list for the reading and the summing (handoff.cost.FIGURES is this).
TOTAL_KEYS = ("records", "kafkaBytes", "tableBytes", "writeApiBytes", "files", "snapshots", "rewrittenFiles",
              "rewrittenBytes")


def totals(value: Any) -> dict[str, int] | None:
    """The published totals; None unless every one is a whole number ≥ 0 (an unreadable part loses the lot,
    never counts a wrong figure)."""
    if not isinstance(value, dict):
        return None
    out = {k: _int(value.get(k, 0)) for k in TOTAL_KEYS}
    if any(v is None or v < 0 for v in out.values()):
        return None
    return {k: int(v) for k, v in out.items() if v is not None}


def last_batch_status(report: DriverReport | None) -> dict[str, Any] | None:
    """`status.lastBatch` (None: no live report). Every key is present, null when unknown, so a merge
    patch clears what an earlier report had set."""
    if report is None:
        return None
    at = (dt.datetime.fromtimestamp(report.timestamp_ms / 1000, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
          if report.timestamp_ms is not None else None)
    rate = report.input_rows_per_second
    return {"id": report.batch_id, "rows": report.rows, "durationMs": report.duration_ms,
            "inputRowsPerSecond": round(rate, 1) if rate is not None else None,
            "deadLetters": report.dlq_rows, "at": at, "degradedReason": report.degraded_reason}
