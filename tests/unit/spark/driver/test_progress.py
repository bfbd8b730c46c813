"""Progress record, console line and metrics from Spark progress + the sink's last-commit record."""
from __future__ import annotations

import json
import time

from prometheus_client import generate_latest

from handoff_spark.driver.progress import Metrics, lag_per_partition, report_from_progress


def progress(batch_id: int, start: dict | None, end: dict, latest: dict, rows: int = 10) -> dict:
    return {"batchId": batch_id, "numInputRows": rows, "durationMs": {"triggerExecution": 1234},
            "sources": [{"startOffset": json.dumps(start) if start else None, "endOffset": json.dumps(end),
                         "latestOffset": json.dumps(latest)}]}


def test_lag_is_latest_minus_end_and_counts_partitions_not_yet_read() -> None:
    assert lag_per_partition({("t", 0): 5, ("t", 1): 9}, {("t", 0): 8, ("t", 1): 9, ("t", 2): 4}) == {
        ("t", 0): 3, ("t", 1): 0, ("t", 2): 4}


def test_report_combines_spark_progress_with_the_matching_sink_commit() -> None:
    now_ms = int(time.time() * 1000)
    commit = {"batch_id": 3, "snapshot_id": 42, "commit_latency_ms": 12.5, "dlq_rows": 2,
              "max_event_time_ms": now_ms - 5000, "skipped": False}
    r = report_from_progress(progress(3, {"t": {"0": 0}}, {"t": {"0": 10}}, {"t": {"0": 15}}), commit, None)
    assert r.lag == {("t", 0): 5}
    rec = r.record("ns/h")
    assert rec["committedSnapshot"] == 42 and rec["dlqRows"] == 2 and rec["lagTotal"] == 5
    assert rec["offsets"] == {"t": {"0": 10}} and rec["durationMs"] == 1234
    assert 4.0 <= rec["freshnessSeconds"] < 60
    line = r.line()
    assert line.startswith("batch 3: 10 rows in 1234 ms") and "snapshot 42" in line and "t[0] 0→10" in line
    # a stale commit record (other batch) is not attributed to this batch; freshness carries over
    r2 = report_from_progress(progress(4, {"t": {"0": 10}}, {"t": {"0": 15}}, {"t": {"0": 15}}), commit,
                              r.max_event_time_ms)
    assert r2.commit is None and r2.max_event_time_ms == now_ms - 5000


def test_fused_sink_reports_records_read_not_the_sources_range_rows() -> None:
    # Fused path: Spark's numInputRows counts offset ranges (here 3); the sink's `records` is the truth.
    commit = {"batch_id": 5, "snapshot_id": 7, "records": 2468, "rows": 2460, "dlq_rows": 8}
    r = report_from_progress(progress(5, {"t": {"0": 0}}, {"t": {"0": 2468}}, {"t": {"0": 2468}}, rows=3), commit,
                             None)
    assert r.rows == 2468 and r.record("ns/h")["rows"] == 2468
    assert r.input_rows_per_second == 2468 * 1000 / 1234
    # without `records` (older sink, other batch) Spark's count stays
    assert report_from_progress(progress(6, {"t": {"0": 0}}, {"t": {"0": 3}}, {"t": {"0": 3}}, rows=3), commit,
                                None).rows == 3


def test_batch_zero_start_comes_from_the_initial_offsets() -> None:
    r = report_from_progress(progress(0, None, {"t": {"0": 7}}, {"t": {"0": 7}}), None, None,
                             initial_offsets={("t", 0): 2})
    assert "t[0] 2→7" in r.line()


def test_metrics_expose_rows_lag_dead_letters_and_freshness() -> None:
    m = Metrics("ns/h")
    commit = {"batch_id": 1, "snapshot_id": 1, "commit_latency_ms": 20, "dlq_rows": 3,
              "max_event_time_ms": int(time.time() * 1000) - 2000}
    m.observe(report_from_progress(progress(1, {"t": {"0": 0}}, {"t": {"0": 10}}, {"t": {"0": 12}}), commit, None))
    text = generate_latest(m.registry).decode()
    assert 'handoff_rows_total{handoff="ns/h"} 10.0' in text
    assert 'handoff_dead_letters_total{handoff="ns/h"} 3.0' in text
    assert 'handoff_lag_records{handoff="ns/h",partition="0",topic="t"} 2.0' in text
    fresh = [line for line in text.splitlines() if line.startswith('handoff_freshness_seconds{')]
    assert fresh and 1.5 < float(fresh[0].split()[-1]) < 60


def test_work_is_add_batch_minus_the_table_commit() -> None:
    # What executors share (the operator's capacity estimate): Spark's addBatch without the sink's commit.
    doc = progress(5, {"t": {"0": 0}}, {"t": {"0": 2468}}, {"t": {"0": 2468}})
    doc["durationMs"] = {"triggerExecution": 1234, "addBatch": 900}
    commit = {"batch_id": 5, "snapshot_id": 7, "records": 2468, "commit_latency_ms": 150}
    r = report_from_progress(doc, commit, None)
    assert r.work_ms == 750 and r.record("ns/h")["workMs"] == 750
    # no addBatch in the progress: unknown, and the operator falls back to the whole batch's rate
    assert report_from_progress(progress(6, None, {"t": {"0": 1}}, {"t": {"0": 1}}), None, None).work_ms is None


def test_an_idle_progress_is_not_reported_and_does_not_hide_the_batch_that_runs_next(tmp_path) -> None:
    """Spark adds a progress every 10 s while a query waits for data, carrying the id of the batch that runs
    next. The reporter skips it: the real batch with that id (rows, its range) is the one reported."""
    from handoff_spark.driver.app import ProgressReporter, idle_progress
    from handoff_spark.config import AppConfig

    cfg = AppConfig.model_validate({"handoffId": "ns/x", "source": {"bootstrapServers": "b:9092", "topics": ["t"]},
                                    "sink": {"kind": "iceberg", "table": "db.t"}, "schema": {"onIncompatible": "halt"},
                                    "checkpointLocation": f"file://{tmp_path}/ck"})
    lines: list[str] = []
    reporter = ProgressReporter(cfg, None, lines.append)

    class Query:
        recentProgress: list[dict] = []
        lastProgress = property(lambda self: self.recentProgress[-1] if self.recentProgress else None)

    Query = Query()  # type: ignore[misc]
    ran = progress(1, {"t": {"0": 0}}, {"t": {"0": 3000}}, {"t": {"0": 3000}}, rows=3)
    ran["durationMs"] = {"triggerExecution": 825, "addBatch": 700}
    ran["timestamp"] = "2026-11-28T10:00:00.000Z"
    idle = progress(2, {"t": {"0": 3000}}, {"t": {"0": 3000}}, {"t": {"0": 3000}}, rows=0)
    idle["durationMs"] = {"triggerExecution": 4, "latestOffset": 4}
    idle["timestamp"] = "2026-11-28T10:00:10.000Z"
    assert idle_progress(idle) and not idle_progress(ran)
    Query.recentProgress = [ran, idle]
    reporter.poll(Query)
    assert [line.split(":")[0] for line in lines] == ["batch 1"]
    after = progress(2, {"t": {"0": 3000}}, {"t": {"0": 6000}}, {"t": {"0": 6000}}, rows=3)
    after["durationMs"] = {"triggerExecution": 900, "addBatch": 800}
    after["timestamp"] = "2026-11-28T10:00:12.000Z"
    Query.recentProgress = [ran, idle, after]  # type: ignore[attr-defined]
    reporter.poll(Query)
    assert [line.split(":")[0] for line in lines] == ["batch 1", "batch 2"]
    assert "t[0] 3000→6000" in lines[-1] and reporter.reports[-1].batch_id == 2


def test_totals_sum_what_the_commits_read_and_wrote():
    """The running totals every progress record carries (the operator's cost figures): a batch already in the
    table (skipped) read its records but made no commit; BigQuery's appended bytes are table and Write API bytes."""
    from handoff_spark.driver.progress import BatchReport, Totals

    def batch(i, commit):
        return BatchReport(batch_id=i, rows=10, duration_ms=1, start={}, end={}, lag={}, commit=commit,
                           max_event_time_ms=None)

    totals = Totals()
    totals.add(batch(0, {"snapshot_id": 7, "kafka_bytes": 1000, "files_added": 2, "file_bytes": 4096,
                         "rewritten_files": 9, "rewritten_bytes": 3000}))  # a compaction ran after it
    totals.add(batch(1, {"snapshot_id": 7, "skipped": True, "kafka_bytes": 500}))
    totals.add(batch(2, {"snapshot_id": 1700000000000000, "kafka_bytes": 300, "bytes": 250}))
    totals.add(batch(3, None))  # nothing committed (an empty batch)
    assert totals.record() == {"records": 40, "kafkaBytes": 1800, "tableBytes": 4346, "writeApiBytes": 250,
                               "files": 2, "snapshots": 2, "rewrittenFiles": 9, "rewrittenBytes": 3000}


def test_record_bytes_counts_keys_and_values_nulls_as_nothing():
    import pyarrow as pa

    from handoff_spark.sink.common import record_bytes

    raw = pa.table({"key": pa.array([b"k1", None, b""], pa.binary()),
                    "value": pa.array([b"hello", b"{}", None], pa.binary()), "offset": [1, 2, 3]})
    assert record_bytes(raw) == 2 + 5 + 2
    assert record_bytes(raw.to_batches()[0]) == 9
    assert record_bytes(pa.table({"value": pa.array([], pa.binary())})) == 0


def test_poll_reads_the_last_progress_and_the_whole_list_only_when_a_batch_went_by_unseen(tmp_path) -> None:
    """`recentProgress` serialises up to 100 progresses in the JVM on every call: a poll reads `lastProgress`,
    and the list only for the first batch of a driver or when more than one batch finished since the last poll.
    Every batch is still reported once, in order."""
    from handoff_spark.driver.app import ProgressReporter
    from handoff_spark.config import AppConfig

    cfg = AppConfig.model_validate({"handoffId": "ns/x", "source": {"bootstrapServers": "b:9092", "topics": ["t"]},
                                    "sink": {"kind": "iceberg", "table": "db.t"}, "schema": {"onIncompatible": "halt"},
                                    "checkpointLocation": f"file://{tmp_path}/ck"})
    lines: list[str] = []
    reporter = ProgressReporter(cfg, None, lines.append)

    def ran(i: int, at: str) -> dict:
        data = progress(i, {"t": {"0": i * 10}}, {"t": {"0": i * 10 + 10}}, {"t": {"0": i * 10 + 10}}, rows=10)
        data["durationMs"] = {"triggerExecution": 50, "addBatch": 40}
        data["timestamp"] = at
        return data

    class Query:
        def __init__(self) -> None:
            self.progresses: list[dict] = []
            self.list_reads = 0

        @property
        def lastProgress(self) -> dict | None:
            return self.progresses[-1] if self.progresses else None

        @property
        def recentProgress(self) -> list[dict]:
            self.list_reads += 1
            return list(self.progresses)

    query = Query()
    reporter.poll(query)  # nothing yet
    query.progresses += [ran(5, "a"), ran(6, "b")]  # a resumed driver's first two batches
    reporter.poll(query)
    assert query.list_reads == 1
    for i, at in ((7, "c"), (8, "d")):
        query.progresses.append(ran(i, at))
        reporter.poll(query)
        reporter.poll(query)  # unchanged: nothing read, nothing reported twice
    assert query.list_reads == 1
    query.progresses += [ran(9, "e"), ran(10, "f"), ran(11, "g")]  # three between two polls
    reporter.poll(query)
    assert query.list_reads == 2
    assert [r.batch_id for r in reporter.reports] == [5, 6, 7, 8, 9, 10, 11]
    assert [line.split(":")[0] for line in lines] == [f"batch {i}" for i in range(5, 12)]


def test_a_topic_no_longer_read_has_no_lag_and_its_series_goes() -> None:
    """A topic removed from spec.source.topics in the running driver keeps its offsets in the source's (Spark's
    progress still shows them), but it is not read: no lag in the record, and its metric series is removed rather
    than left at its last value or shown as 0."""
    m = Metrics("ns/h")
    both = progress(1, {"t": {"0": 0}, "u": {"0": 0}}, {"t": {"0": 10}, "u": {"0": 4}}, {"t": {"0": 12}, "u": {"0": 9}})
    m.observe(report_from_progress(both, None, None, topics=["t", "u"]))
    assert m.registry.get_sample_value("handoff_lag_records", {"handoff": "ns/h", "topic": "u", "partition": "0"}) == 5
    removed = progress(2, {"t": {"0": 10}, "u": {"0": 4}}, {"t": {"0": 12}, "u": {"0": 4}}, {"t": {"0": 12}})
    r = report_from_progress(removed, None, None, topics=["t"])
    assert r.lag == {("t", 0): 0} and r.record("ns/h")["offsets"] == {"t": {"0": 12}, "u": {"0": 4}}
    m.observe(r)
    assert m.registry.get_sample_value("handoff_lag_records", {"handoff": "ns/h", "topic": "u", "partition": "0"}) \
        is None
    assert m.registry.get_sample_value("handoff_lag_records", {"handoff": "ns/h", "topic": "t", "partition": "0"}) == 0
    # Spark's progress without the source's latest offsets (lag then measured against the batch's end): the same.
    unreported = {**removed, "sources": [{**removed["sources"][0], "latestOffset": None}]}
    assert report_from_progress(unreported, None, None, topics=["t"]).lag == {("t", 0): 0}
