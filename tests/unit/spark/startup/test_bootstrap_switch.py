"""When the driver runs its bootstrap batch (handoff_spark.startup.bootstrap.off_reason): pure, no Kafka needed."""
from __future__ import annotations

import pytest

from handoff_spark.startup import bootstrap
from handoff_spark.config import AppConfig


def _cfg(**overrides):
    doc = {"handoffId": "ns/h", "source": {"bootstrapServers": "localhost:9092", "topics": ["t"]},
           "sink": {"kind": "iceberg", "table": "ns.t"}, "checkpointLocation": "/tmp/x",
           "schema": {"onIncompatible": "halt"}, **overrides}
    return AppConfig.model_validate(doc)


def test_on_by_default_for_the_iceberg_sink(monkeypatch):
    monkeypatch.delenv(bootstrap.ENV, raising=False)
    assert bootstrap.off_reason(_cfg(), None) is None


@pytest.mark.parametrize("value", ["0", "off", "false", "NO"])
def test_the_environment_turns_it_off(monkeypatch, value):
    monkeypatch.setenv(bootstrap.ENV, value)
    assert bootstrap.off_reason(_cfg(), None) == f"{bootstrap.ENV}={value}"


def test_the_app_config_turns_it_off_and_other_paths_never_use_it(monkeypatch):
    monkeypatch.delenv(bootstrap.ENV, raising=False)
    assert bootstrap.off_reason(_cfg(bootstrapBatch=False), None) == "bootstrapBatch is false"
    assert bootstrap.off_reason(_cfg(), "noop") == "the sink is overridden (noop)"
    bq = _cfg(sink={"kind": "bigquery", "project": "p", "dataset": "d", "table": "t"})
    assert bootstrap.off_reason(bq, None) == "the bigquery sink commits through Spark only"


def test_the_bootstrap_batch_is_reported_like_any_batch():
    """progress.report_from_commit: the console line, lag and record come from the commit result alone."""
    from handoff_spark.driver.progress import report_from_commit

    commit = {"batch_id": 0, "snapshot_id": 42, "skipped": False, "rows": 9, "dlq_rows": 1, "records": 10,
              "commit_latency_ms": 12.0, "max_event_time_ms": 1_000}
    report = report_from_commit(commit, {("t", 0): (5, 10), ("t", 1): (7, 12)}, {("t", 0): 10, ("t", 1): 20},
                                duration_ms=500, prev_max_event_time_ms=None)
    assert report.rows == 10 and report.lag == {("t", 0): 0, ("t", 1): 8}
    assert report.line().startswith("batch 0: 10 rows in 500 ms, snapshot 42 (commit 12 ms), 1 dead letters, "
                                    "offsets t[0] 5→10 t[1] 7→12, lag 8")
    record = report.record("ns/h")
    assert record["committedSnapshot"] == 42 and record["offsets"] == {"t": {"0": 10, "1": 12}}
    assert record["maxEventTimeMs"] == 1_000 and record["inputRowsPerSecond"] == 20.0
