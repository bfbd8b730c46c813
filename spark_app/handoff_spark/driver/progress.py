"""Per-micro-batch progress: the console line, the JSON progress record the operator reads, and the
Prometheus metrics — all from one place so the three never disagree.

Inputs per batch: Spark's own `StreamingQueryProgress` (batch id, input rows, durations, start/end/latest
source offsets) and the sink's last-commit record (`<checkpoint>/handoff/last-commit.json`, written by
the sink's driver-side commit in a Spark Python worker: snapshot id, commit latency, dead letters,
newest committed event time). Pure functions over dicts; the Spark listener in `app.py` only feeds them.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection, Mapping

from handoff_spark import checkpoint as ckpt
from handoff_spark.ledger.lag import lag_per_partition as _lag_per_partition


def _parse_offsets(text: Any) -> dict[tuple[str, int], int]:
    if not text:
        return {}
    try:
        doc = json.loads(text) if isinstance(text, str) else text
    except json.JSONDecodeError:
        return {}
    if not isinstance(doc, dict):
        return {}
    return {(t, int(p)): int(o) for t, parts in doc.items() if isinstance(parts, dict) for p, o in parts.items()}


def lag_per_partition(end: Mapping[tuple[str, int], int], latest: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """Records (offsets) available in Kafka but not yet in the table, per partition (`end`: the table's
    position; a partition Kafka's answer lacks shows 0)."""
    return {tp: 0 for tp in end} | _lag_per_partition(end, latest)


def read_commit(checkpoint: str, batch_id: int) -> dict[str, Any] | None:
    return ckpt.read_commit(checkpoint, batch_id)


def read_initial_offsets(checkpoint: str) -> dict[tuple[str, int], int]:
    """The source's initial offsets (the start of batch 0, which Spark's progress leaves empty)."""
    return _parse_offsets(ckpt.read_json(checkpoint, ckpt.INITIAL_OFFSETS_FILE))


@dataclass
class BatchReport:
    batch_id: int
    rows: int
    duration_ms: int
    start: dict[tuple[str, int], int]
    end: dict[tuple[str, int], int]
    lag: dict[tuple[str, int], int]
    commit: dict[str, Any] | None  # the sink's record for this batch, if it wrote one
    max_event_time_ms: int | None  # newest event time committed so far (any batch)
    input_rows_per_second: float | None = None
    #: The batch's parallel part: Spark's addBatch minus the sink's table commit (planning, offset reads and
    #: the commit do not shrink when executors are added; the operator's capacity estimate uses this).
    work_ms: int | None = None
    #: Records Spark's dedupe dropped in this batch (its state operator's `numDroppedDuplicateRows`; the DataFrame
    #: path with `dedupe`), None without one.
    duplicates_dropped: int | None = None
    timestamp_ms: int = field(default_factory=lambda: int(time.time() * 1000))

    @property
    def freshness_seconds(self) -> float | None:
        if self.max_event_time_ms is None:
            return None
        return max(0.0, (time.time() * 1000 - self.max_event_time_ms) / 1000)

    def line(self) -> str:
        """One console line per micro-batch."""
        parts = [f"batch {self.batch_id}: {self.rows} rows in {self.duration_ms} ms"]
        if self.commit is not None:
            if self.commit.get("skipped"):
                parts.append("already committed (replay skipped)")
            else:
                parts.append(f"snapshot {self.commit.get('snapshot_id')} "
                             f"(commit {float(self.commit.get('commit_latency_ms') or 0):.0f} ms)")
            records, written = self.commit.get("records"), int(self.commit.get("rows") or 0)
            if records is not None and written + int(self.commit.get("dlq_rows") or 0) != int(records):
                parts.append(f"{written} written")  # the transform filtered, or the dedupe dropped, the rest
            if self.commit.get("dlq_rows"):
                parts.append(f"{self.commit['dlq_rows']} dead letters")
        if self.duplicates_dropped:
            parts.append(f"{self.duplicates_dropped} duplicates dropped")
        parts.append("offsets " + _fmt_ranges(self.start, self.end))
        parts.append(f"lag {sum(self.lag.values())}")
        fresh = self.freshness_seconds
        if fresh is not None:
            parts.append(f"freshness {fresh:.1f} s")
        return ", ".join(parts)

    def record(self, handoff_id: str) -> dict[str, Any]:
        """The progress record (docs/design/data-plane-contract.md, "Progress record")."""
        commit = self.commit or {}
        return {
            "handoffId": handoff_id,
            "batchId": self.batch_id,
            "rows": self.rows,
            "dlqRows": int(commit.get("dlq_rows") or 0),
            "committedSnapshot": commit.get("snapshot_id"),
            "offsets": _nest(self.end),
            "durationMs": self.duration_ms,
            "workMs": self.work_ms,
            "commitLatencyMs": commit.get("commit_latency_ms"),
            "freshnessSeconds": self.freshness_seconds,
            "maxEventTimeMs": self.max_event_time_ms,
            "lag": _nest(self.lag),
            "lagTotal": sum(self.lag.values()),
            "inputRowsPerSecond": self.input_rows_per_second,
            "timestampMs": self.timestamp_ms,
            # Set by a sink that met quota/size limits or transient server errors in this batch (BigQuery:
            # BigQueryResourceExhausted | BigQueryUnavailable); the operator's Degraded condition reason.
            "degradedReason": commit.get("degraded_reason"),
        }


@dataclass
class Totals:
    """What this driver committed since it started (issue 35's cost surface), published with every progress
    record as `totals`: running sums, so a record the operator missed (it reads the newest one per status
    refresh) loses nothing; the operator adds their rise to the handoff's own totals (handoff.cost).

    `kafkaBytes`: the Kafka records' keys and values read into committed batches; `tableBytes`: the bytes the
    commits added to the table (Iceberg: the data files; BigQuery: the Storage Write API's appended bytes, also
    `writeApiBytes`); `files` and `snapshots` the commits made (a batch already in the table made none);
    `rewrittenFiles` and `rewrittenBytes` what the upkeep after a commit rewrote (Iceberg compaction: the small
    files replaced, the bytes written in their place)."""

    records: int = 0
    kafka_bytes: int = 0
    table_bytes: int = 0
    write_api_bytes: int = 0
    files: int = 0
    snapshots: int = 0
    rewritten_files: int = 0
    rewritten_bytes: int = 0

    def add(self, report: BatchReport) -> None:
        commit = report.commit or {}
        self.records += report.rows
        self.kafka_bytes += int(commit.get("kafka_bytes") or 0)
        self.rewritten_files += int(commit.get("rewritten_files") or 0)
        self.rewritten_bytes += int(commit.get("rewritten_bytes") or 0)
        if commit.get("skipped") or commit.get("snapshot_id") is None:
            return
        self.snapshots += 1
        self.files += int(commit.get("files_added") or 0)
        written = int(commit.get("file_bytes") or 0)
        appended = int(commit.get("bytes") or 0)  # BigQuery's Storage Write API bytes
        self.table_bytes += written + appended
        self.write_api_bytes += appended

    def record(self) -> dict[str, int]:
        return {"records": self.records, "kafkaBytes": self.kafka_bytes, "tableBytes": self.table_bytes,
                "writeApiBytes": self.write_api_bytes, "files": self.files, "snapshots": self.snapshots,
                "rewrittenFiles": self.rewritten_files, "rewrittenBytes": self.rewritten_bytes}


def _nest(flat: Mapping[tuple[str, int], int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (t, p), v in sorted(flat.items()):
        out.setdefault(t, {})[str(p)] = v
    return out


def _fmt_ranges(start: Mapping[tuple[str, int], int], end: Mapping[tuple[str, int], int]) -> str:
    items = [f"{t}[{p}] {start.get((t, p), e)}→{e}" for (t, p), e in sorted(end.items())
             if start.get((t, p), e) != e]
    return " ".join(items) if items else "(none new)"


def report_from_progress(progress: Mapping[str, Any], last_commit: Mapping[str, Any] | None,
                         prev_max_event_time_ms: int | None,
                         initial_offsets: Mapping[tuple[str, int], int] | None = None,
                         topics: Collection[str] | None = None) -> BatchReport:
    """Combine Spark's progress JSON (as a dict) with the sink's last-commit record. `topics`: the ones the query
    reads now; a topic removed from the spec keeps its offsets in the source's (so it resumes there if added back),
    but it has no lag to report: it is not read."""
    batch_id = int(progress["batchId"])
    src = (progress.get("sources") or [{}])[0]
    start, end = _parse_offsets(src.get("startOffset")), _parse_offsets(src.get("endOffset"))
    if not start and initial_offsets:
        start = dict(initial_offsets)
    latest = _parse_offsets(src.get("latestOffset")) or end
    commit = dict(last_commit) if last_commit and int(last_commit.get("batch_id", -1)) == batch_id else None
    max_event = prev_max_event_time_ms
    if commit and commit.get("max_event_time_ms") not in (None, ""):
        candidate = int(commit["max_event_time_ms"])
        max_event = candidate if max_event is None else max(max_event, candidate)
    durations = progress.get("durationMs") or {}
    # A fused sink's source rows are offset ranges, so the sink's own count of records read wins.
    duration_ms = int(durations.get("triggerExecution") or 0)
    rows, rate = int(progress.get("numInputRows") or 0), progress.get("processedRowsPerSecond")
    if commit and commit.get("records") is not None:
        rows = int(commit["records"])
        rate = rows * 1000.0 / duration_ms if duration_ms else None
    add_batch = durations.get("addBatch")
    work_ms = None
    if add_batch:
        work_ms = max(1, int(add_batch) - int((commit or {}).get("commit_latency_ms") or 0))
    dedupes = [op for op in progress.get("stateOperators") or []
                if "numDroppedDuplicateRows" in (op.get("customMetrics") or {})]
    dropped = sum(int(op["customMetrics"]["numDroppedDuplicateRows"]) for op in dedupes) if dedupes else None
    return BatchReport(batch_id=batch_id, rows=rows, duration_ms=duration_ms, start=start, end=end,
                       lag={tp: n for tp, n in lag_per_partition(end, latest).items()
                            if topics is None or tp[0] in topics},
                       commit=commit, max_event_time_ms=max_event,
                       input_rows_per_second=rate, work_ms=work_ms, duplicates_dropped=dropped)


def write_progress_file(path: str, record: Mapping[str, Any]) -> None:
    """Atomic rewrite (readers never see a half-written record)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=target.parent, delete=False, suffix=".tmp") as tmp:
        json.dump(record, tmp)
    os.replace(tmp.name, target)


class Metrics:
    """Prometheus metrics of one Handoff app (own registry, so tests can run several)."""

    def __init__(self, handoff_id: str) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.handoff_id = handoff_id
        lbl = ["handoff"]
        self.rows = Counter("handoff_rows", "Kafka records read into committed micro-batches", lbl,
                            registry=self.registry)
        self.bytes = Counter("handoff_bytes", "Bytes of record values committed (reported by the sink)", lbl,
                             registry=self.registry)
        self.dead_letters = Counter("handoff_dead_letters", "Records sent to the dead-letter topic", lbl,
                                    registry=self.registry)
        self.batches = Counter("handoff_batches", "Micro-batches completed", lbl, registry=self.registry)
        self.duplicates = Counter("handoff_duplicates_dropped", "Records the dedupe dropped (a business key seen "
                                  "within its window)", lbl, registry=self.registry)
        self.batch_duration = Histogram("handoff_batch_duration_seconds", "Micro-batch wall time", lbl,
                                        buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
                                        registry=self.registry)
        self.commit_latency = Histogram("handoff_commit_latency_seconds", "Table commit latency", lbl,
                                        buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
                                        registry=self.registry)
        self.lag = Gauge("handoff_lag_records", "Records in Kafka not yet in the table", lbl + ["topic", "partition"],
                         registry=self.registry)
        self._lag_series: set[tuple[str, str]] = set()  # the (topic, partition) series the last batch reported
        self.last_batch = Gauge("handoff_last_batch_id", "Id of the last completed micro-batch", lbl,
                                registry=self.registry)
        self.max_event_time = Gauge("handoff_max_event_time_seconds",
                                    "Newest event time committed to the table (unix seconds)", lbl,
                                    registry=self.registry)
        # Sink-side request trouble (the BigQuery sink reports it; the Iceberg sink reports none): refused
        # requests and backoff retries by gRPC code, and the append latency of the last batch.
        self.sink_errors = Counter("handoff_sink_request_errors", "Sink requests refused, by gRPC code",
                                   lbl + ["code"], registry=self.registry)
        self.sink_retries = Counter("handoff_sink_retries", "Sink requests retried after backoff, by gRPC code",
                                    lbl + ["code"], registry=self.registry)
        self.append_latency = Gauge("handoff_sink_append_latency_seconds",
                                    "Append request latency in the last batch", lbl + ["quantile"],
                                    registry=self.registry)
        # The progress record published to the operator (progress_publisher): failed API requests.
        self.publish_errors = Counter("handoff_progress_publish_errors",
                                      "Failed attempts to publish the progress record to the operator's "
                                      "ConfigMap", lbl, registry=self.registry)
        # A replay's hold (driver.hold) and the query's starts in this driver: a held stream is quiet on purpose.
        self.query_held = Gauge("handoff_query_held", "1 while a replay holds this driver's query (stopped at a batch "
                                "boundary until the operator lifts the hold), else 0", lbl, registry=self.registry)
        self.query_held.labels(handoff_id).set(0)
        self.query_starts = Counter("handoff_query_starts", "Starts of the stream's query in this driver, by reason: "
                                    "start, hold (again after a replay's hold), lookup (a lookup table changed), "
                                    "quarantine (after dead-lettering records the transform failed on), config (the "
                                    "operator changed the transform, dedupe or event time)",
                                    lbl + ["reason"], registry=self.registry)
        self._max_event_ms: int | None = None
        freshness = Gauge("handoff_freshness_seconds", "now - newest event time committed to the table", lbl,
                          registry=self.registry)
        freshness.labels(handoff_id).set_function(self._freshness)

    def _freshness(self) -> float:
        if self._max_event_ms is None:
            return float("nan")
        return max(0.0, time.time() - self._max_event_ms / 1000)

    def observe(self, report: BatchReport) -> None:
        h = self.handoff_id
        self.rows.labels(h).inc(report.rows)
        self.batches.labels(h).inc()
        self.batch_duration.labels(h).observe(report.duration_ms / 1000)
        self.last_batch.labels(h).set(report.batch_id)
        for (topic, partition), lag in report.lag.items():
            self.lag.labels(h, topic, str(partition)).set(lag)
        for topic, partition in self._lag_series - {(t, str(p)) for t, p in report.lag}:
            self.lag.remove(h, topic, partition)  # no longer read (a topic removed in place): no series, not a 0
        self._lag_series = {(t, str(p)) for t, p in report.lag}
        commit = report.commit or {}
        if commit.get("dlq_rows"):
            self.dead_letters.labels(h).inc(int(commit["dlq_rows"]))
        if report.duplicates_dropped:
            self.duplicates.labels(h).inc(report.duplicates_dropped)
        if commit.get("bytes"):
            self.bytes.labels(h).inc(int(commit["bytes"]))
        for code, n in (commit.get("append_errors") or {}).items():
            self.sink_errors.labels(h, code).inc(int(n))
        for code, n in (commit.get("append_retries") or {}).items():
            self.sink_retries.labels(h, code).inc(int(n))
        for q, key in (("0.5", "append_latency_p50_ms"), ("0.99", "append_latency_p99_ms")):
            if commit.get(key) is not None:
                self.append_latency.labels(h, q).set(float(commit[key]) / 1000)
        if commit.get("commit_latency_ms") is not None and not commit.get("skipped"):
            self.commit_latency.labels(h).observe(float(commit["commit_latency_ms"]) / 1000)
        if report.max_event_time_ms is not None:
            self._max_event_ms = report.max_event_time_ms
            self.max_event_time.labels(h).set(report.max_event_time_ms / 1000)

    def serve(self, port: int, *, any_if_taken: bool = False) -> int:
        """Start the HTTP endpoint; returns the bound port (0 → an ephemeral one).

        `any_if_taken`: a port another process holds gives an ephemeral one instead of the error. A local `handoff
        run` without `--metrics-port` asks for that, so a second run beside a first one starts; a port the user
        or the operator chose (the pod's fixed, scraped port) is that port or a clear failure."""
        from prometheus_client import start_http_server

        try:
            server, _thread = start_http_server(port, registry=self.registry)
        except OSError as exc:
            from handoff_spark.errors import HandoffConfigError

            if any_if_taken and port != 0:
                return self.serve(0)

            raise HandoffConfigError(
                f"metrics port {port} cannot be used ({exc.strerror}): another process (an earlier driver?) holds "
                f"it. Fix: stop that process, or pick another port (`handoff run --metrics-port 0` takes any free "
                f"one; in the app config: metricsPort)") from None
        return int(server.server_address[1])
