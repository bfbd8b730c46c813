"""Prometheus metrics of the operator itself (not of the Spark apps; those serve their own).

One registry object per process is what prometheus-client expects; the handlers update these and
`handoff operator` serves them with `start_http_server` on HANDOFF_METRICS_PORT.
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from handoff_operator.runtime.state import STORE

RECONCILES = Counter("handoff_reconciles_total", "Reconciles of StreamTableHandoffs by result",
                     ["result"])
RECONCILE_ERRORS = Counter("handoff_reconcile_errors_total", "Reconciles that raised an error",
                           ["kind"])
RECONCILE_DURATION = Histogram("handoff_reconcile_duration_seconds", "Wall time of one reconcile",
                               buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
HANDOFFS = Gauge("handoff_handoffs", "StreamTableHandoffs by phase", ["phase"])
LAG = Gauge("handoff_lag_records", "Kafka records not yet committed to the table",
            ["namespace", "name"])
FRESHNESS = Gauge("handoff_freshness_seconds", "Age of the newest committed event time",
                  ["namespace", "name"])
EXECUTORS_DESIRED = Gauge("handoff_executors_desired", "Executors the autoscaler wants (status.executors.desired)",
                          ["namespace", "name"])
EXECUTORS_CURRENT = Gauge("handoff_executors_current", "Executor pods running now", ["namespace", "name"])
RETENTION_HEADROOM = Gauge("handoff_retention_headroom_seconds",
                           "Topic retention minus what the handoff needs (replay window + max outage + lag age "
                           "+ margin); negative: too short, +Inf: unlimited", ["namespace", "name", "topic"])
RETENTION_NEED = Gauge("handoff_retention_need_seconds", "Retention the handoff needs of the topic",
                       ["namespace", "name", "topic"])
RETENTION_HAVE = Gauge("handoff_retention_have_seconds", "How long the topic keeps records (+Inf: unlimited)",
                       ["namespace", "name", "topic"])
LOST_RECORDS = Gauge("handoff_lost_records", "Records Kafka deleted before the handoff read them (ledger "
                     "position below the earliest offset)", ["namespace", "name", "topic"])
_retention_topics: dict[tuple[str, str], set[str]] = {}
FRESHNESS_TARGET = Gauge("handoff_freshness_target_seconds", "The handoff's freshness objective "
                         "(spec.freshness.target), to compare handoff_freshness_seconds with", ["namespace", "name"])
DRIVER_RESTARTS = Gauge("handoff_driver_restarts", "Restarts of the driver pod's container (a new pod starts at 0)",
                        ["namespace", "name"])
REPLAYS_ENDED = Counter("handoff_replays", "ReplayRequests that ended, by final phase (Succeeded, Failed; "
                        "Planned for a dryRun)", ["namespace", "phase"])
REREAD_RECORDS = Counter("handoff_cost_reread_records", "Records re-read from Kafka by finished replays "
                         "(RollbackAndReplay) and backfills, by the handoff they re-read for",
                         ["namespace", "name", "mode"])
REREAD_BYTES = Counter("handoff_cost_reread_bytes", "The plans' byte estimate of those re-reads (records × the "
                       "table's bytes per row of the range)", ["namespace", "name", "mode"])
UPGRADE_ROLLBACKS = Counter("handoff_upgrade_rollbacks_total",
                            "Spec changes rolled back to the last good spec, by reason (CrashLoop, "
                            "ReadinessTimeout)", ["reason"])
# What a status refresh costs, so bench/operator/handoff/operator_scale.py (and a dashboard) can divide by refreshes: a
# regression in per-handoff cost shows as a number, not only as a busier operator.
STATUS_REFRESHES = Counter("handoff_status_refreshes_total", "Status refreshes from the truth (daemon runs)")
KAFKA_REQUESTS = Counter("handoff_kafka_requests_total", "Kafka requests made for status refreshes and retention "
                         "checks (AdminClient calls; sample_records: a short-lived consumer reading a few records)",
                         ["api"])
CATALOG_READS = Counter("handoff_catalog_reads_total", "Table ledger reads for status refreshes (Iceberg "
                        "table loads, BigQuery ledger queries)", ["kind"])

# What each handoff read and wrote since counting began (status.cost, handoff.cost): gauges of running sums, so
# Grafana's per-day figures are `increase(...[1d])` and they survive an operator restart (read back from status).
COST_KAFKA_BYTES = Gauge("handoff_cost_kafka_read_bytes", "Bytes of Kafka records (keys and values) read into "
                         "committed batches, since counting began (status.cost.kafkaBytes)", ["namespace", "name"])
COST_TABLE_BYTES = Gauge("handoff_cost_table_written_bytes", "Bytes the commits added to the table (Iceberg data "
                         "files, BigQuery appends), since counting began", ["namespace", "name"])
COST_WRITE_API_BYTES = Gauge("handoff_cost_write_api_bytes", "Bytes appended through BigQuery's Storage Write API, "
                             "since counting began", ["namespace", "name"])
COST_WRITE_API_MONEY = Gauge("handoff_cost_write_api_estimate", "Storage Write API bytes in GiB × "
                             "HANDOFF_BIGQUERY_WRITE_PRICE_PER_GIB (status.cost.writeApiCost)", ["namespace", "name"])
COST_FILES = Gauge("handoff_cost_files", "Data files the commits added, since counting began", ["namespace", "name"])
COST_SNAPSHOTS = Gauge("handoff_cost_snapshots", "Table commits made, since counting began", ["namespace", "name"])
COST_REWRITTEN_BYTES = Gauge("handoff_cost_rewritten_bytes", "Bytes the driver's table upkeep (Iceberg compaction) "
                             "wrote, since counting began", ["namespace", "name"])
COST_GAUGES: dict[str, Gauge] = {"kafkaBytes": COST_KAFKA_BYTES, "tableBytes": COST_TABLE_BYTES,
                                 "writeApiBytes": COST_WRITE_API_BYTES, "writeApiCost": COST_WRITE_API_MONEY,
                                 "files": COST_FILES, "snapshots": COST_SNAPSHOTS,
                                 "rewrittenBytes": COST_REWRITTEN_BYTES}

# Last known phase per (namespace, name), so the phase gauge is a count, not an event tally.
_phases: dict[tuple[str, str], str] = {}
_seen_phases: set[str] = set()
#: The gauges with a series per handoff (labels namespace, name[, topic]).
PER_HANDOFF: tuple[Gauge, ...] = (LAG, FRESHNESS, FRESHNESS_TARGET, DRIVER_RESTARTS, EXECUTORS_DESIRED,
                                  EXECUTORS_CURRENT, RETENTION_HEADROOM, RETENTION_NEED, RETENTION_HAVE, LOST_RECORDS,
                                  *COST_GAUGES.values())


class _HandoffSeries:
    """A handoff's phase and its series in the gauges, as one part of the handoff store (runtime.state): forgotten
    with the handoff, so a deleted handoff's lag or retention is no longer exported."""

    name = "metrics"

    def held(self, namespace: str, name: str) -> object | None:
        series = sorted({metric.name for gauge in PER_HANDOFF for metric in gauge.collect()
                         for sample in metric.samples
                         if sample.labels.get("namespace") == namespace and sample.labels.get("name") == name})
        key = (namespace, name)
        held = {"phase": _phases.get(key), "series": series or None, "retentionTopics": _retention_topics.get(key)}
        held = {k: v for k, v in held.items() if v is not None}
        return held or None

    def forget_handoff(self, namespace: str, name: str) -> None:
        set_phase(namespace, name, None)


_series = _HandoffSeries()
STORE.join(_series)


@contextmanager
def observe_reconcile() -> Iterator[None]:
    """Times a reconcile and counts its result; `ok` unless it raised."""
    start = time.monotonic()
    try:
        yield
    except Exception as exc:  # re-raised: kopf decides retries
        RECONCILES.labels(result="error").inc()
        RECONCILE_ERRORS.labels(kind=type(exc).__name__).inc()
        raise
    else:
        RECONCILES.labels(result="ok").inc()
    finally:
        RECONCILE_DURATION.observe(time.monotonic() - start)


def set_phase(namespace: str, name: str, phase: str | None) -> None:
    """Records the phase of one handoff (None = deleted) and recomputes the per-phase counts."""
    key = (namespace, name)
    if phase is None:
        _phases.pop(key, None)
        for gauge in (LAG, FRESHNESS, FRESHNESS_TARGET, DRIVER_RESTARTS, EXECUTORS_DESIRED, EXECUTORS_CURRENT,
                      *COST_GAUGES.values()):
            try:
                gauge.remove(namespace, name)
            except KeyError:
                pass
        for topic in _retention_topics.pop(key, set()):
            for gauge in (RETENTION_HEADROOM, RETENTION_NEED, RETENTION_HAVE, LOST_RECORDS):
                try:
                    gauge.remove(namespace, name, topic)
                except KeyError:
                    pass
    else:
        _phases[key] = phase
        _seen_phases.add(phase)
    for known in _seen_phases:
        HANDOFFS.labels(phase=known).set(sum(1 for value in _phases.values() if value == known))


def set_progress(namespace: str, name: str, progress: Mapping[str, object]) -> None:
    lag = progress.get("lag")
    if isinstance(lag, int):
        LAG.labels(namespace, name).set(lag)
    freshness = progress.get("freshnessSeconds")
    if isinstance(freshness, (int, float)):
        FRESHNESS.labels(namespace, name).set(freshness)
    target = progress.get("freshnessTargetSeconds")
    if isinstance(target, (int, float)):
        FRESHNESS_TARGET.labels(namespace, name).set(target)


def _set_or_remove(gauge: Gauge, namespace: str, name: str, value: float | None) -> None:
    """None: the series goes (unknown is no sample, not a stale number)."""
    if value is None:
        try:
            gauge.remove(namespace, name)
        except KeyError:
            pass
    else:
        gauge.labels(namespace, name).set(value)


def set_cost(namespace: str, name: str, cost: Mapping[str, Any] | None) -> None:
    """The cost gauges from `status.cost` (None: none counted yet, nothing exported)."""
    if cost is None:
        return
    for key, gauge in COST_GAUGES.items():
        value = cost.get(key)
        if isinstance(value, (int, float)):
            gauge.labels(namespace, name).set(value)


def count_reread(namespace: str, name: str, mode: str, records: int, estimated_bytes: int | None) -> None:
    """A finished RollbackAndReplay's or Backfill's re-read (its bytes: the plan's estimate, when it had one)."""
    REREAD_RECORDS.labels(namespace, name, mode).inc(records)
    if isinstance(estimated_bytes, int) and estimated_bytes > 0:
        REREAD_BYTES.labels(namespace, name, mode).inc(estimated_bytes)


def set_driver_restarts(namespace: str, name: str, restarts: int | None) -> None:
    """The driver container's restart count (None: no driver pod now), for the crash-loop alert."""
    _set_or_remove(DRIVER_RESTARTS, namespace, name, restarts)


def set_executors(namespace: str, name: str, desired: int | None, current: int | None) -> None:
    _set_or_remove(EXECUTORS_DESIRED, namespace, name, desired)
    _set_or_remove(EXECUTORS_CURRENT, namespace, name, current)


def set_retention(namespace: str, name: str, check: Any, lost: Sequence[Any] | None) -> None:
    """Gauges from a retention check (`retention.report.RetentionCheck`, None: none this time) and the lost
    ranges (`retention.LostRange`, None: unknown this time)."""
    topics = _retention_topics.setdefault((namespace, name), set())
    inf = float("inf")
    for v in (check.verdicts if check is not None else ()):
        topics.add(v.topic)
        RETENTION_NEED.labels(namespace, name, v.topic).set(v.need_seconds)
        RETENTION_HAVE.labels(namespace, name, v.topic).set(inf if v.have_seconds is None else v.have_seconds)
        RETENTION_HEADROOM.labels(namespace, name, v.topic).set(
            inf if v.headroom_seconds is None else v.headroom_seconds)
    if lost is not None:
        per_topic: dict[str, int] = {t: 0 for t in topics}
        for r in lost:
            per_topic[r.topic] = per_topic.get(r.topic, 0) + (r.end - r.start)
        for topic, count in per_topic.items():
            topics.add(topic)
            LOST_RECORDS.labels(namespace, name, topic).set(count)


def serve(port: int) -> None:
    start_http_server(port)
