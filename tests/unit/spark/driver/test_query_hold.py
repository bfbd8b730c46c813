"""driver.hold: reading the operator's hold (pure), and what the driver publishes while its query is held.
The hold end to end (a real driver, the operator, a real API server): tests/e2e/test_operator_replay_drill.py."""
from __future__ import annotations

from handoff_spark.config import AppConfig
from handoff_spark.contract import QUERY_HELD_KEY, QUERY_HOLD_ANNOTATION, QUERY_HOLDING_KEY
from handoff_spark.driver.hold import QueryHold, parse_hold


def test_the_hold_is_the_annotations_request_name() -> None:
    assert parse_hold({QUERY_HOLD_ANNOTATION: "rewind"}) == "rewind"
    assert parse_hold({QUERY_HOLD_ANNOTATION: " rewind "}) == "rewind"
    assert parse_hold({QUERY_HOLD_ANNOTATION: ""}) is None
    assert parse_hold({"handoff.io/desired-executors": "3"}) is None
    assert parse_hold(None) is None


def test_no_hold_without_the_operator_env() -> None:
    assert QueryHold.from_env({}) is None
    hold = QueryHold.from_env({"HANDOFF_PROGRESS_CONFIGMAP": "orders-progress", "HANDOFF_PROGRESS_NAMESPACE": "ns",
                               "HANDOFF_HOLD_POLL_SECONDS": "0.5"})
    assert hold is not None and (hold.namespace, hold.configmap, hold.poll) == ("ns", "orders-progress", 0.5)


class _Publisher:
    def __init__(self) -> None:
        self.offered: list[dict] = []

    def offer(self, record: dict) -> None:
        self.offered.append(dict(record))


def _reporter(tmp_path, publisher):
    from handoff_spark.driver.app import ProgressReporter

    cfg = AppConfig.model_validate({"handoffId": "ns/x", "source": {"bootstrapServers": "b:9092", "topics": ["t"]},
                                    "sink": {"kind": "iceberg", "table": "db.t"}, "schema": {"onIncompatible": "halt"},
                                    "checkpointLocation": f"file://{tmp_path}/ck"})
    return ProgressReporter(cfg, None, lambda _line: None, publisher)


def test_a_held_query_is_published_with_the_last_batch_and_cleared_when_the_query_starts_again(tmp_path) -> None:
    from handoff_spark.driver.progress import BatchReport  # noqa: F401 - the record's producer

    publisher = _Publisher()
    reporter = _reporter(tmp_path, publisher)
    reporter.held("rewind")  # a driver that has not run a batch yet (restarted mid-replay)
    assert publisher.offered[-1][QUERY_HELD_KEY] == "rewind"
    assert publisher.offered[-1]["handoffId"] == "ns/x" and "totals" in publisher.offered[-1]
    reporter._offer({"handoffId": "ns/x", "batchId": 7, "totals": {}})
    reporter.holding("rewind")  # seen, a batch still running
    assert publisher.offered[-1] == {"handoffId": "ns/x", "batchId": 7, "totals": {}, QUERY_HOLDING_KEY: "rewind"}
    reporter.held("rewind")
    assert publisher.offered[-1] == {"handoffId": "ns/x", "batchId": 7, "totals": {}, QUERY_HELD_KEY: "rewind"}
    reporter.last_batch_id = 7
    reporter.new_query("the checkpoint resumes at 900, the table's ledger ends at 600", {})
    assert QUERY_HELD_KEY not in publisher.offered[-1] and publisher.offered[-1]["batchId"] == 7
    # The new query's checkpoint may be fresh: its batch 0 must be reported, not taken for an old one.
    assert reporter.last_batch_id == -1
    assert reporter.checkpoint_discarded.startswith("the checkpoint resumes at 900")


def test_the_held_gauge_says_when_the_stream_is_quiet_on_purpose(tmp_path) -> None:
    from handoff_spark.driver.progress import Metrics

    reporter = _reporter(tmp_path, _Publisher())
    reporter.metrics = Metrics("ns/x")
    held = lambda: reporter.metrics.registry.get_sample_value("handoff_query_held", {"handoff": "ns/x"})  # noqa: E731
    assert held() == 0
    reporter.held("rewind")
    assert held() == 1
    reporter.new_query(None, {})
    assert held() == 0
