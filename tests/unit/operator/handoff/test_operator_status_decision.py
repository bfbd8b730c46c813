"""The decide step of the reconcile (handoff.status.decide): facts in, the status patch and Events out."""
from __future__ import annotations

import datetime as dt

import pytest
from pydantic import ValidationError

from handoff_operator.conditions import DriverFacts, Facts, ProgressFacts
from handoff_operator.handoff.status import Observed, decide, differs

NOW = dt.datetime(2026, 11, 23, 12, 0, 0, tzinfo=dt.timezone.utc)
RUNNING = DriverFacts(desired_replicas=1, replicas=1, ready_replicas=1, updated_replicas=1, pod_name="h-driver-0",
                      pod_phase="Running", pod_ready=True, pod_config_hash="abc")


def observed(progress: ProgressFacts, status: dict | None = None, refresh: bool = True) -> Observed:
    facts = Facts(generation=3, suspended=False, desired_hash="abc", driver=RUNNING, progress=progress,
                  previous_hash="abc", now_ms=int(NOW.timestamp() * 1000))
    return Observed(generation=3, status=status or {}, app={"configHash": "abc", "restarts": 0}, facts=facts,
                    refresh_truth=refresh, now=NOW)


def test_a_running_handoff_gets_typed_wire_status_with_committed_progress() -> None:
    progress = ProgressFacts(committed_snapshot=42, committed_batch=7, committed_at_ms=int(NOW.timestamp() * 1000),
                             committed_offsets={"orders": {"0": 10}}, lag=5, freshness_seconds=1.23456)
    decision = decide(observed(progress))
    status = decision.status
    assert decision.phase == "Running" and status["phase"] == "Running"
    assert status["observedGeneration"] == 3
    assert status["committed"] == {"snapshot": "42", "batch": 7, "offsets": {"orders": {"0": 10}},
                                   "at": "2026-11-23T12:00:00Z"}
    assert status["lag"] == 5 and status["freshnessSeconds"] == 1.235 and status["freshness"]
    assert status["app"] == {"configHash": "abc", "restarts": 0, "driver": "h-driver-0"}
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and ready["lastTransitionTime"] == "2026-11-23T12:00:00Z"
    assert decision.events == [], "a first status that is healthy is no news"
    starting = [{"type": "Ready", "status": "False", "reason": "DriverStarting", "message": "waiting"},
                {"type": "Progressing", "status": "True", "reason": "Starting", "message": "waiting"},
                {"type": "Degraded", "status": "False", "reason": "AsExpected", "message": "starting"}]
    later = decide(observed(progress, status={"conditions": starting}))
    assert ("Normal", "Running") in [(kind, reason) for kind, reason, _ in later.events]


def test_a_refresh_that_cannot_read_the_truth_clears_lag_and_says_why() -> None:
    decision = decide(observed(ProgressFacts(errors=("cannot read Kafka offsets: boom",)),
                               status={"lag": 9, "freshness": "1s", "freshnessSeconds": 1.0}))
    assert decision.status["lag"] is None and decision.status["freshnessSeconds"] is None
    degraded = next(c for c in decision.status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "StatusUnavailable" and "boom" in degraded["message"]
    # A change-triggered reconcile (no truth read) keeps what the last refresh found.
    kept = decide(observed(ProgressFacts(lag=9), status={"lag": 9}, refresh=False))
    assert "freshnessSeconds" not in kept.status and kept.status["lag"] == 9


def test_the_same_facts_twice_need_no_second_write() -> None:
    progress = ProgressFacts(committed_snapshot=1, committed_batch=0, committed_offsets={"orders": {"0": 1}}, lag=0)
    first = decide(observed(progress)).status
    again = decide(observed(progress, status=first))
    assert not differs(first, again.status)
    assert [reason for _, reason, _ in again.events] == []  # no transition, no Event


def test_a_status_the_crd_would_refuse_fails_in_the_decision() -> None:
    with pytest.raises(ValidationError):
        decide(observed(ProgressFacts(lag=-1)))


def test_a_freshness_that_only_grew_a_little_is_not_written_anything_else_is() -> None:
    from handoff_operator.handoff.status import worth_writing

    stored = {"lag": 0, "freshness": "16m40s", "freshnessSeconds": 1000.0}
    assert not worth_writing(stored, {"lag": 0, "freshness": "18m", "freshnessSeconds": 1080.0})
    assert worth_writing(stored, {"lag": 0, "freshness": "18m30s", "freshnessSeconds": 1110.0})
    young = {"lag": 0, "freshness": "30s", "freshnessSeconds": 30.0}  # a young one: not at every refresh either
    assert not worth_writing(young, {"lag": 0, "freshness": "1m15s", "freshnessSeconds": 75.0})
    assert worth_writing(young, {"lag": 0, "freshness": "1m35s", "freshnessSeconds": 95.0})
    assert worth_writing(stored, {"lag": 1, "freshness": "1m45s", "freshnessSeconds": 105.0})
    assert worth_writing(stored, {"lag": 0, "freshness": None, "freshnessSeconds": None})
    assert worth_writing({"lag": 0}, {"lag": 0, "freshnessSeconds": 1.0})


def test_a_change_handler_after_a_refresh_writes_nothing_when_nothing_changed() -> None:
    """A driver pod's event reconciles without reading the truth: it must keep what the refresh wrote (the commit
    time included), or every child event costs two status writes, its own and the next refresh's (issue 16)."""
    from handoff_operator.handoff.status import status_progress, worth_writing

    progress = ProgressFacts(committed_snapshot=42, committed_batch=7, committed_at_ms=int(NOW.timestamp() * 1000),
                             committed_offsets={"orders": {"0": 10}}, end_offsets={"orders": {"0": 15}}, lag=5,
                             freshness_seconds=30.0)
    refreshed = decide(observed(progress)).status
    assert refreshed["committed"]["at"] == "2026-11-23T12:00:00Z"
    child = decide(observed(status_progress(refreshed), status=refreshed, refresh=False))
    assert not worth_writing(refreshed, child.status), child.status


def test_the_status_counts_the_cost_the_drivers_totals_show():
    """decide() puts handoff.cost's figures in status.cost (typed through the CRD's model) from the report."""
    import dataclasses

    from handoff_operator.conditions import DriverReport, Facts
    from handoff_operator.handoff.status import Observed, decide

    report = DriverReport(published_at_ms=1, driver_pod="p1",
                          totals={"records": 4, "kafkaBytes": 100, "tableBytes": 2048, "writeApiBytes": 0,
                                  "files": 1, "snapshots": 1})
    observed = Observed(generation=1, status={"cost": {"kafkaBytes": 50, "since": "2026-11-27T00:00:00Z"}},
                        app={}, facts=Facts(generation=1, suspended=False, desired_hash="h", driver_report=report), write_api_price_per_gib=0.025)
    got = decide(observed).status["cost"]
    assert (got["kafkaBytes"], got["tableBytes"], got["files"], got["summary"]) == (150, 2048, 1, "150B→2.0KiB")
    assert got["since"] == "2026-11-27T00:00:00Z" and got["driver"]["pod"] == "p1"
    assert "cost" not in decide(dataclasses.replace(observed, facts=Facts(generation=1, suspended=False, desired_hash="h"))).status
