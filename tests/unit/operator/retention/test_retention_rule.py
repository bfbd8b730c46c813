"""retention: need = replay.window + maxOutage + lag age + margin against retention.ms / retention.bytes;
compacted topics; lost ranges; and the conditions, Events and status they become (pure)."""
from __future__ import annotations

import pytest

from handoff_operator.retention.rule import (MARGIN_FRACTION, PartitionFacts, Requirement, TopicFacts, lag_age_seconds,
                                        lost_from_offsets, lost_ranges, may_raise, verdict)
from handoff_operator.retention.report import (EnforceOutcome, RetentionCheck, conditions, events,
                                               retention_condition, status)

H = 3600.0
NOW = 10_000_000_000
NEED = Requirement(window_seconds=24 * H, max_outage_seconds=6 * H)


def topic(retention_ms: int | None = 7 * 24 * 3_600_000, retention_bytes: int | None = -1,
          policy: tuple[str, ...] = ("delete",), **partitions: PartitionFacts) -> TopicFacts:
    parts = {int(k[1:]): v for k, v in partitions.items()} or {0: PartitionFacts(0, 100, next_offset=100)}
    return TopicFacts("orders", retention_ms, retention_bytes, policy, parts)


def test_need_is_window_plus_outage_plus_margin_when_nothing_waits():
    v = verdict(topic(), NEED, NOW)
    assert v.need_seconds == pytest.approx(30 * H * (1 + MARGIN_FRACTION))
    assert v.sufficient and v.have_seconds == 7 * 24 * H and v.limited_by == "retention.ms"
    assert v.headroom_seconds == pytest.approx(7 * 24 * H - 33 * H)
    assert v.fix == "" and v.target_retention_ms is None


def test_lag_age_of_the_oldest_waiting_record_adds_to_the_need():
    waiting = PartitionFacts(0, 100, next_offset=40, oldest_unconsumed_ms=NOW - int(10 * H * 1000))
    caught_up = PartitionFacts(0, 50, next_offset=50, oldest_unconsumed_ms=NOW - int(99 * H * 1000))
    facts = topic(p0=waiting, p1=caught_up)
    assert lag_age_seconds(facts, NOW) == pytest.approx(10 * H)
    v = verdict(facts, NEED, NOW)
    assert v.need_seconds == pytest.approx(40 * H * 1.1)
    assert v.lag_age_seconds == pytest.approx(10 * H)


def test_short_retention_ms_says_need_have_and_the_fix():
    v = verdict(topic(retention_ms=12 * 3_600_000), NEED, NOW)
    assert not v.sufficient
    assert v.have_seconds == 12 * H and v.headroom_seconds == pytest.approx(12 * H - 33 * H)
    assert v.target_retention_ms == 33 * 3_600_000  # need 33h, whole hours
    assert "keeps records only 12h" in v.message and "need 1d9h" in v.message
    assert "raise retention.ms of topic orders to at least 118800000" in v.fix
    # 3h18m is rounded up to 4h; a need that is exactly what the topic has is sufficient (no float slack).
    small = Requirement(2 * H, 1 * H)
    assert verdict(topic(retention_ms=3_600_000), small, NOW).target_retention_ms == 4 * 3_600_000
    assert verdict(topic(retention_ms=11_880_000), small, NOW).sufficient
    assert "spec.retention.mode=enforce" in v.fix
    enforced = verdict(topic(retention_ms=12 * 3_600_000), Requirement(24 * H, 6 * H, enforce=True), NOW)
    assert "spec.retention.mode=enforce" not in enforced.fix


def test_retention_bytes_limits_by_how_long_the_busiest_partition_lasts():
    # 100 records/s × 1000 B = 100 kB/s on the busiest partition: 1 GB lasts 10^4 s (2h46m).
    busy = PartitionFacts(0, 10, records_per_second=100.0, average_record_bytes=1000.0)
    quiet = PartitionFacts(0, 10, records_per_second=1.0, average_record_bytes=1000.0)
    v = verdict(topic(retention_bytes=10**9, p0=busy, p1=quiet), NEED, NOW)
    assert not v.sufficient and v.limited_by == "retention.bytes"
    assert v.have_seconds == pytest.approx(10_000)
    assert v.need_bytes == pytest.approx(33 * H * 100_000, rel=1e-6)
    assert "raise retention.bytes of topic orders to at least" in v.fix
    assert v.target_retention_ms is None  # retention.ms is long enough: nothing for enforce to raise


def test_idle_partitions_never_exhaust_a_byte_budget_and_unlimited_is_forever():
    idle = PartitionFacts(0, 10, records_per_second=0.0, average_record_bytes=100.0)
    assert verdict(topic(retention_bytes=1000, p0=idle), NEED, NOW).limited_by == "retention.ms"
    v = verdict(topic(retention_ms=-1, retention_bytes=-1), NEED, NOW)
    assert v.sufficient and v.have_seconds is None and v.headroom_seconds is None and v.limited_by is None


def test_compacted_topic_is_sufficient_and_says_what_holds():
    v = verdict(topic(retention_ms=1000, policy=("compact",)), NEED, NOW)
    assert v.sufficient and v.compacted and not v.deletes and v.target_retention_ms is None
    assert "newest value of each key" in v.message
    both = verdict(topic(retention_ms=1000, policy=("compact", "delete")), NEED, NOW)
    assert not both.sufficient and both.compacted and "only the newest record per key" in both.message


def test_lost_ranges_where_the_ledger_is_below_kafkas_earliest():
    facts = topic(p0=PartitionFacts(15, 20, next_offset=10), p1=PartitionFacts(0, 5, next_offset=5),
                  p2=PartitionFacts(7, 9, next_offset=None))
    (lost,) = lost_ranges([facts])
    assert (lost.topic, lost.partition, lost.start, lost.end) == ("orders", 0, 10, 15)
    assert str(lost) == "orders[0] offsets 10..14 (5 records)"
    assert lost_from_offsets({"orders": {"0": 10, "1": 5}}, {"orders": {"0": 15, "1": 0}}) == [lost]
    assert lost_from_offsets(None, {"orders": {"0": 15}}) == []


def test_enforce_only_ever_raises():
    assert may_raise(1000, 2000)
    assert not may_raise(3000, 2000) and not may_raise(-1, 2000) and not may_raise(None, 2000)
    assert not may_raise(1000, None)


def _check(*verdicts, enforced=(), errors=()):
    return RetentionCheck(NOW, tuple(verdicts), tuple(enforced), tuple(errors))


def test_conditions_from_a_check():
    short = verdict(topic(retention_ms=3_600_000), NEED, NOW)
    cond = retention_condition(_check(short))
    assert (cond.status, cond.reason) == ("False", "RetentionTooShort")
    assert "topic orders" in cond.message and "fix: raise retention.ms" in cond.message
    ok = verdict(topic(), NEED, NOW)
    assert (retention_condition(_check(ok)).status, retention_condition(_check(ok)).reason) == ("True", "Sufficient")
    unknown = retention_condition(_check(errors=("KafkaException: timed out",)))
    assert (unknown.status, unknown.reason) == ("Unknown", "RetentionUnknown")
    refused = retention_condition(_check(short, enforced=[EnforceOutcome(
        "orders", "refused", 3_600_000, None, "Kafka", "Kafka refused AlterConfigs (TOPIC_AUTHORIZATION_FAILED)")]))
    assert (refused.status, refused.reason) == ("False", "EnforceRefused")
    assert "TOPIC_AUTHORIZATION_FAILED" in refused.message and "fix:" in refused.message
    raised = retention_condition(_check(ok, enforced=[EnforceOutcome("orders", "raised", 1, 2, "Kafka")]))
    assert (raised.status, raised.reason) == ("True", "RetentionRaised")
    pending = retention_condition(_check(short, enforced=[EnforceOutcome("orders", "patched", 1, 2,
                                                                         "KafkaTopic kafka/orders")]))
    assert (pending.status, pending.reason) == ("False", "WaitingForStrimzi")


def test_data_loss_condition_names_the_range_and_the_drivers_policy():
    lost = lost_from_offsets({"orders": {"0": 10}}, {"orders": {"0": 15}})
    (cond,) = conditions(None, lost, "fail")
    assert (cond.type, cond.status, cond.reason) == ("DataLoss", "True", "RecordsDeleted")
    assert "orders[0] offsets 10..14" in cond.message and "onOffsetOutOfRange=fail" in cond.message
    (cond,) = conditions(None, lost, "earliest")
    assert "records the gap" in cond.message
    (cond,) = conditions(None, [], "fail")
    assert (cond.status, cond.reason) == ("False", "NoDataLoss")
    assert conditions(None, None, "fail") == ()


def test_events_on_bad_news_and_changes_only():
    short = conditions(_check(verdict(topic(retention_ms=3_600_000), NEED, NOW)), [], "fail")
    first = events([], short, None)
    assert [(e.type, e.reason) for e in first] == [("Warning", "RetentionTooShort")]  # NoDataLoss: no event
    old = [{"type": c.type, "status": c.status, "reason": c.reason} for c in short]
    assert events(old, short, None) == []
    fixed = conditions(_check(verdict(topic(), NEED, NOW)), [], "fail")
    raised = _check(verdict(topic(), NEED, NOW), enforced=[EnforceOutcome("orders", "raised", 1, 2, "Kafka")])
    assert [(e.type, e.reason) for e in events(old, fixed, raised)] == [("Normal", "Sufficient"),
                                                                      ("Normal", "RetentionEnforced")]


def test_status_headroom_is_the_smallest_over_topics():
    a = verdict(topic(retention_ms=12 * 3_600_000), NEED, NOW)
    b = verdict(TopicFacts("clicks", -1, -1, ("delete",), {}), NEED, NOW)
    lost = lost_from_offsets({"orders": {"0": 10}}, {"orders": {"0": 15}})
    out = status(RetentionCheck(NOW, (a, b), cleanup_policies={"orders": "delete", "clicks": "delete"}), lost)
    assert out["headroomSeconds"] == pytest.approx(-21 * H)
    assert out["topics"][0]["topic"] == "orders" and out["topics"][0]["limitedBy"] == "retention.ms"
    assert "haveSeconds" not in out["topics"][1]  # unlimited
    assert out["lost"] == [{"topic": "orders", "partition": 0, "fromOffset": 10, "toOffset": 15}]
    assert status(None, None) == {}


def test_gauges_per_topic_and_removed_with_the_handoff():
    from prometheus_client import REGISTRY

    from handoff_operator.runtime import metrics

    short = verdict(topic(retention_ms=12 * 3_600_000), NEED, NOW)
    lost = lost_from_offsets({"orders": {"0": 10}}, {"orders": {"0": 15}})
    metrics.set_phase("ns", "g", "Running")
    metrics.set_retention("ns", "g", RetentionCheck(NOW, (short,)), lost)
    labels = {"namespace": "ns", "name": "g", "topic": "orders"}
    assert REGISTRY.get_sample_value("handoff_retention_headroom_seconds", labels) == pytest.approx(-21 * H)
    assert REGISTRY.get_sample_value("handoff_retention_need_seconds", labels) == pytest.approx(33 * H)
    assert REGISTRY.get_sample_value("handoff_retention_have_seconds", labels) == 12 * H
    assert REGISTRY.get_sample_value("handoff_lost_records", labels) == 5
    metrics.set_retention("ns", "g", None, [])  # the loss is over; the last check's numbers stay
    assert REGISTRY.get_sample_value("handoff_lost_records", labels) == 0
    assert REGISTRY.get_sample_value("handoff_retention_have_seconds", labels) == 12 * H
    metrics.set_phase("ns", "g", None)
    assert REGISTRY.get_sample_value("handoff_retention_headroom_seconds", labels) is None


def test_data_loss_makes_the_handoff_degraded_unless_already_degraded():
    from handoff_operator.conditions import Condition, Evaluation
    from handoff_operator.retention.report import degrade_on_data_loss

    running = Evaluation("Running", (Condition("Ready", "True", "Running", "ok"),
                                     Condition("Degraded", "False", "AsExpected", "ok")))
    loss = Condition("DataLoss", "True", "RecordsDeleted", "Kafka deleted records before the handoff read them")
    ev = degrade_on_data_loss(running, [loss], [])
    assert ev.phase == "Degraded"
    assert [(c.type, c.status, c.reason) for c in ev.conditions][1] == ("Degraded", "True", "DataLoss")
    # a reconcile without a refresh keeps the last known DataLoss
    old = [{"type": "DataLoss", "status": "True", "reason": "RecordsDeleted", "message": "lost 5..9"}]
    assert degrade_on_data_loss(running, [], old).phase == "Degraded"
    assert degrade_on_data_loss(running, [Condition("DataLoss", "False", "NoDataLoss", "")], old) is running
    failing = Evaluation("Degraded", (Condition("Degraded", "True", "DriverFailing", "crash"),))
    assert degrade_on_data_loss(failing, [loss], []) is failing
