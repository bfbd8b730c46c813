"""progress_publisher: when to publish (pure), and that a local run (no operator env) publishes nothing.
Publishing against a real API server: tests/integration/operator/truth/test_operator_driver_report_apiserver.py."""
from __future__ import annotations

import json

from handoff_spark.driver.publisher import ProgressPublisher, document, publish_due, state_key


def test_first_record_and_state_changes_go_out_at_once() -> None:
    assert publish_due(None, None, None, now=100.0, interval=15)
    assert publish_due("BigQueryResourceExhausted", None, published_at=99.0, now=100.0, interval=15)
    assert publish_due(None, "BigQueryResourceExhausted", published_at=99.0, now=100.0, interval=15)


def test_same_state_at_most_once_per_interval_then_as_heartbeat() -> None:
    assert not publish_due(None, None, published_at=90.0, now=100.0, interval=15)
    assert publish_due(None, None, published_at=85.0, now=100.0, interval=15)


def test_state_is_the_degraded_reason_and_the_document_names_pod_and_time() -> None:
    record = {"batchId": 4, "degradedReason": "BigQueryUnavailable"}
    assert state_key(record) != state_key({"batchId": 5}) == state_key({"batchId": 6})
    doc = json.loads(document(record, "driver-abc", 1234))
    assert doc == {"batchId": 4, "degradedReason": "BigQueryUnavailable", "driverPod": "driver-abc",
                   "publishedAtMs": 1234}


def test_disabled_without_the_operator_env() -> None:
    assert ProgressPublisher.from_env({}) is None
    assert ProgressPublisher.from_env({"HANDOFF_PROGRESS_CONFIGMAP": "x-progress"}) is None


def test_the_query_held_and_released_go_out_at_once() -> None:
    """The operator waits for a held query's acknowledgement (driver.hold): it must not wait for a heartbeat."""
    running, held = {"batchId": 5}, {"batchId": 5, "queryHeld": "rewind"}
    assert publish_due(state_key(held), state_key(running), published_at=99.0, now=100.0, interval=15)
    assert publish_due(state_key(running), state_key(held), published_at=99.0, now=100.0, interval=15)
    assert not publish_due(state_key(held), state_key(held), published_at=99.0, now=100.0, interval=15)
    holding = {"batchId": 5, "queryHolding": "rewind"}
    assert publish_due(state_key(holding), state_key(running), published_at=99.0, now=100.0, interval=15)
    assert publish_due(state_key(held), state_key(holding), published_at=99.0, now=100.0, interval=15)
