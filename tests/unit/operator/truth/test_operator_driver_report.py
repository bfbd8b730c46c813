"""The driver's published progress record → Degraded (SinkDegraded) and status.lastBatch (pure logic)."""
from __future__ import annotations

import json

from handoff_operator.conditions import DriverFacts, DriverReport, Facts, ProgressFacts, evaluate, live_report
from handoff_operator.truth.driver_report import last_batch_status, parse

NOW = 1_700_000_000_000
RUNNING = DriverFacts(desired_replicas=1, replicas=1, ready_replicas=1, updated_replicas=1, pod_name="d-1",
                      pod_phase="Running", pod_ready=True, pod_config_hash="h1")


def _report(reason: str | None = "BigQueryResourceExhausted", *, age_s: float = 5, pod: str | None = "d-1",
            batch: int = 7) -> DriverReport:
    return DriverReport(published_at_ms=NOW - int(age_s * 1000), driver_pod=pod, batch_id=batch,
                        degraded_reason=reason, timestamp_ms=NOW - 6000, rows=500, duration_ms=1234,
                        input_rows_per_second=405.2, dlq_rows=0)


def _facts(report: DriverReport | None, driver: DriverFacts | None = RUNNING, **kw) -> Facts:
    return Facts(generation=1, suspended=False, desired_hash="h1", driver=driver,
                 progress=ProgressFacts(committed_snapshot=1, lag=10), driver_report=report, now_ms=NOW,
                 driver_report_max_age_seconds=60, **kw)


def _degraded(facts: Facts):
    ev = evaluate(facts)
    return ev, next(c for c in ev.conditions if c.type == "Degraded")


def test_fresh_degraded_reason_makes_degraded_true_with_the_drivers_reason() -> None:
    ev, cond = _degraded(_facts(_report()))
    assert (cond.status, cond.reason) == ("True", "SinkDegraded")
    assert "BigQueryResourceExhausted" in cond.message and "batch 7" in cond.message
    assert "quota" in cond.message
    assert ev.phase == "Degraded"
    # Still Ready: the driver runs and commits, only slower.
    assert next(c for c in ev.conditions if c.type == "Ready").status == "True"


def test_a_catalog_the_starting_driver_waits_for_is_degraded_with_what_it_means() -> None:
    """The driver publishes CatalogUnavailable while it waits for the catalog at its start (driver.table_wait),
    before any batch: Degraded says so."""
    waiting = DriverReport(published_at_ms=NOW - 2000, driver_pod="d-1", degraded_reason="CatalogUnavailable")
    ev, cond = _degraded(_facts(waiting))
    assert (cond.status, cond.reason) == ("True", "SinkDegraded") and ev.phase == "Degraded"
    assert "degradedReason=CatalogUnavailable: the Iceberg table's catalog did not answer" in cond.message


def test_the_error_the_starting_driver_waits_on_is_in_the_condition_message() -> None:
    """A catalog whose host does not resolve (a wrong host in the spec, or a Service not made yet): the driver's one
    line, with the field to check, is what Degraded says, so a dashboard tells it from a catalog that is down."""
    detail = ('OperationalError: (psycopg2.OperationalError) could not translate host name "pg-typo" to address: '
              'Name or service not known; its host name does not resolve: check the host in '
              'spec.sink.iceberg.catalog.properties (uri), or that its Service exists')
    doc = {"publishedAtMs": NOW - 2000, "driverPod": "d-1", "degradedReason": "CatalogUnavailable",
           "degradedDetail": detail}
    report = parse(json.dumps(doc))
    assert report is not None and report.degraded_detail == detail
    _ev, cond = _degraded(_facts(report))
    assert f"the Iceberg table's catalog did not answer ({detail}); the sink retries" in cond.message
    # once it answered, the driver clears both; a detail without a reason is no trouble
    assert parse(json.dumps({**doc, "degradedReason": None})).degraded_detail is None
    assert parse(json.dumps({**doc, "degradedDetail": "x" * 2000})).degraded_detail == "x" * 500


def test_cleared_reason_is_back_to_running() -> None:
    ev, cond = _degraded(_facts(_report(reason=None)))
    assert (cond.status, cond.reason) == ("False", "AsExpected")
    assert ev.phase == "Running"


def test_stale_report_does_not_keep_degraded() -> None:
    # Not republished for longer than the max age: the driver stopped publishing.
    ev, cond = _degraded(_facts(_report(age_s=61)))
    assert (cond.status, ev.phase) == ("False", "Running")
    assert live_report(_facts(_report(age_s=59))) is not None


def test_report_of_an_earlier_driver_pod_is_ignored() -> None:
    ev, cond = _degraded(_facts(_report(pod="d-0")))
    assert (cond.status, ev.phase) == ("False", "Running")


def test_degraded_report_while_the_driver_is_not_running_is_not_used() -> None:
    pending = DriverFacts(desired_replicas=1, replicas=1, updated_replicas=1, pod_name="d-1", pod_phase="Pending",
                          pod_config_hash="h1")
    ev, cond = _degraded(_facts(_report(), driver=pending))
    assert ev.phase == "Starting" and cond.status == "False"
    assert live_report(_facts(_report(), driver=None)) is None


def test_sink_trouble_wins_over_the_freshness_symptom() -> None:
    facts = Facts(generation=1, suspended=False, desired_hash="h1", driver=RUNNING,
                  progress=ProgressFacts(committed_snapshot=1, lag=10, freshness_seconds=900),
                  freshness_target_seconds=60, driver_report=_report("BigQueryUnavailable"), now_ms=NOW)
    _, cond = _degraded(facts)
    assert cond.reason == "SinkDegraded" and "transient" in cond.message


def test_parse_the_published_document() -> None:
    text = json.dumps({"handoffId": "ns/x", "batchId": 3, "rows": 10, "durationMs": 50, "dlqRows": 1,
                       "inputRowsPerSecond": 200.04, "timestampMs": 1_700_000_000_000,
                       "degradedReason": "BigQueryUnavailable", "driverPod": "d-9", "publishedAtMs": NOW})
    report = parse(text)
    assert report == DriverReport(published_at_ms=NOW, driver_pod="d-9", batch_id=3,
                                  degraded_reason="BigQueryUnavailable", timestamp_ms=1_700_000_000_000,
                                  rows=10, duration_ms=50, input_rows_per_second=200.04, dlq_rows=1)
    assert last_batch_status(report) == {"id": 3, "rows": 10, "durationMs": 50, "inputRowsPerSecond": 200.0,
                                         "deadLetters": 1, "at": "2023-11-14T22:13:20Z",
                                         "degradedReason": "BigQueryUnavailable"}
    assert last_batch_status(None) is None
    config = parse(json.dumps({"publishedAtMs": NOW, "configHash": "h2", "configSinceMs": 5,
                               "configCommittedSnapshot": 77, "committedSnapshot": None}))
    assert (config.config_hash, config.config_since_ms, config.config_committed_snapshot,
            config.committed_snapshot) == ("h2", 5, 77, None)


def test_unreadable_documents_are_no_report() -> None:
    assert parse(None) is None and parse("") is None and parse("{not json") is None and parse("[1]") is None
    assert parse(json.dumps({"batchId": 1})) is None  # no publishedAtMs: cannot tell its age
    assert parse(json.dumps({"publishedAtMs": NOW, "degradedReason": ""})).degraded_reason is None


def test_the_published_totals_and_a_checkpoint_discard_are_read():
    import json

    from handoff_operator.truth import driver_report

    doc = {"publishedAtMs": 1, "driverPod": "p1", "checkpointDiscarded": "the table was rolled back",
           "totals": {"records": 3, "kafkaBytes": 30, "tableBytes": 2000, "writeApiBytes": 0, "files": 1,
                      "snapshots": 1, "rewrittenFiles": 9, "rewrittenBytes": 1500}}
    report = driver_report.parse(json.dumps(doc))
    assert report.totals == doc["totals"] and report.checkpoint_discarded == "the table was rolled back"
    # An unreadable figure loses the totals rather than count a wrong one; absent keys are zero.
    assert driver_report.parse(json.dumps({**doc, "totals": {"kafkaBytes": "many"}})).totals is None
    assert driver_report.parse(json.dumps({**doc, "totals": {"kafkaBytes": -1}})).totals is None
    assert driver_report.parse(json.dumps({**doc, "totals": {"kafkaBytes": 5}})).totals["tableBytes"] == 0
    assert driver_report.parse(json.dumps({"publishedAtMs": 1})).totals is None


def test_a_held_query_is_read_and_anything_else_is_none():
    import json

    from handoff_operator.truth import driver_report

    assert driver_report.parse(json.dumps({"publishedAtMs": 1, "queryHeld": "rewind"})).query_held == "rewind"
    assert driver_report.parse(json.dumps({"publishedAtMs": 1})).query_held is None
    assert driver_report.parse(json.dumps({"publishedAtMs": 1, "queryHeld": 3})).query_held is None
    assert driver_report.parse(json.dumps({"publishedAtMs": 1, "queryHolding": "rewind"})).query_holding == "rewind"
