"""The operator's gauges the dashboard and alerts read next to each other: the freshness target beside the
freshness, the driver's restart count, ended replays; all of a handoff's series go when it is deleted."""
from __future__ import annotations

from prometheus_client import REGISTRY

from handoff_operator.runtime import metrics


def _value(metric: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(metric, labels)


def test_freshness_target_and_driver_restarts_follow_the_handoff_and_go_with_it() -> None:
    metrics.set_phase("m", "h", "Running")
    metrics.set_progress("m", "h", {"lag": 3, "freshnessSeconds": 40.0, "freshnessTargetSeconds": 300.0})
    metrics.set_driver_restarts("m", "h", 2)
    assert _value("handoff_freshness_target_seconds", namespace="m", name="h") == 300.0
    assert _value("handoff_freshness_seconds", namespace="m", name="h") == 40.0
    assert _value("handoff_driver_restarts", namespace="m", name="h") == 2
    metrics.set_driver_restarts("m", "h", None)  # no driver pod now
    assert _value("handoff_driver_restarts", namespace="m", name="h") is None
    metrics.set_driver_restarts("m", "h", 0)
    metrics.set_phase("m", "h", None)
    for metric in ("handoff_freshness_target_seconds", "handoff_freshness_seconds", "handoff_driver_restarts",
                   "handoff_lag_records"):
        assert _value(metric, namespace="m", name="h") is None, metric


def test_ended_replays_count_by_phase() -> None:
    before = _value("handoff_replays_total", namespace="m2", phase="Failed") or 0
    metrics.REPLAYS_ENDED.labels("m2", "Failed").inc()
    assert _value("handoff_replays_total", namespace="m2", phase="Failed") == before + 1
