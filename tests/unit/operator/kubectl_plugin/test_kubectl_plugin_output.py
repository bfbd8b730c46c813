"""`kubectl handoff`'s pure parts: the status summary and its text, the ReplayRequest it writes, what a newer
status of the request prints, and flag mistakes said in one line before any connection."""
from __future__ import annotations

import json

import pytest

from handoff_operator.kubectl_plugin import replay, status
from handoff_operator.kubectl_plugin.cli import main
from operator_spec_support import spec

NOW_MS = 1_800_000_000_000


def _handoff(**status_fields):
    return {"metadata": {"namespace": "shop", "name": "orders", "generation": 3},
            "spec": spec(freshness={"target": "2m"}),
            "status": {"observedGeneration": 3, "phase": "Running", "lag": 12, "freshness": "3m0s",
                       "freshnessSeconds": 180.0, "executors": {"current": 2, "desired": 3, "reason": "ScaleUp"},
                       "conditions": [{"type": "Ready", "status": "True", "reason": "Committing", "message": "ok"}],
                       **status_fields}}


def test_summary_compares_freshness_with_the_target_and_takes_lag_per_partition_from_the_driver() -> None:
    report = json.dumps({"publishedAtMs": NOW_MS - 4_000, "lag": {"b": {"1": 2, "0": 3}, "a": {"0": 7}}})
    s = status.summary(_handoff(), report, NOW_MS)
    assert s["freshnessTargetSeconds"] == 120 and s["freshnessTargetMet"] is False
    assert s["lagPerPartition"] == [{"topic": "a", "partition": 0, "lag": 7}, {"topic": "b", "partition": 0, "lag": 3},
                                    {"topic": "b", "partition": 1, "lag": 2}]
    assert s["lagMeasuredSecondsAgo"] == 4.0
    text = status.format_text(s)
    assert "freshness   3m0s (target 2m: MISSED)" in text and "executors   2 current / 3 desired (ScaleUp)" in text
    assert "Lag per partition (the driver's report, 4.0s ago):" in text and "  b      1          2" in text
    assert "  Ready  True    Committing  ok" in text


def test_summary_without_a_report_or_status_says_so() -> None:
    for report in (None, "not json", json.dumps(["a list"])):
        s = status.summary({"metadata": {"namespace": "shop", "name": "orders"}, "spec": spec()}, report, NOW_MS)
        assert s["lagPerPartition"] == [] and s["freshnessTargetMet"] is None
        text = status.format_text(s)
        assert "orders: no status yet" in text and "lag         unknown" in text
        assert "Lag per partition: no report from a driver yet" in text


def test_replay_target_and_manifest() -> None:
    assert replay.target("42", None) == {"snapshotId": 42}
    assert replay.target(None, "2026-11-21T10:00:00+01:00") == {"timestamp": "2026-11-21T09:00:00Z"}
    for snap, when, says in ((None, None, "exactly one"), ("1", "2026-11-21T09:00:00Z", "exactly one"),
                             ("abc", None, "--to-snapshot 'abc'"), (None, "yesterday", "RFC 3339"),
                             (None, "2026-11-21T09:00:00", "time zone")):
        with pytest.raises(replay.BadArgument, match=says):
            replay.target(snap, when)
    m = replay.manifest("shop", "orders", "Rollback", {"snapshotId": 42}, True)
    assert m["metadata"] == {"namespace": "shop", "generateName": "orders-replay-"}
    assert m["spec"] == {"handoffRef": {"name": "orders"}, "mode": "Rollback", "target": {"snapshotId": 42},
                         "dryRun": True}
    assert replay.manifest("shop", "orders", "Rollback", {}, False, "r1")["metadata"]["name"] == "r1"


def test_replay_changes_print_plan_steps_progress_and_the_end_once() -> None:
    planned = {"phase": "Running", "plan": {"summary": "roll back 2 snapshots"}}
    assert replay.changes({}, planned) == ["plan: roll back 2 snapshots", "phase Running"]
    stepped = {**planned, "steps": [{"name": "DriverStopped", "message": "driver gone"}, {"name": "Tagged"}],
               "progress": {"records": 5, "total": 10}}
    assert replay.changes(planned, stepped) == ["step DriverStopped: driver gone", "step Tagged",
                                                "replayed 5/10 records"]
    done = {**stepped, "phase": "Succeeded", "conditions": [{"type": "Ready", "reason": "Replayed", "message": "m"}]}
    assert replay.changes(stepped, done) == ["phase Succeeded (Replayed: m)"]
    assert replay.changes(done, done) == []
    assert replay.is_final(done, False) and not replay.is_final(planned, False)
    assert replay.is_final({"phase": "Planned"}, True) and not replay.is_final({"phase": "Planned"}, False)


def test_flag_mistakes_are_one_line_before_any_connection(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "orders", "--to-time", "noon", "--kubeconfig", "/nonexistent"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --to-time 'noon'") and len(err.strip().splitlines()) == 1
    assert main(["status", "orders", "--kubeconfig", "/nonexistent"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot use kubeconfig /nonexistent") and len(err.strip().splitlines()) == 1


def test_status_says_how_to_reach_the_spark_ui_and_that_a_stopped_driver_has_none() -> None:
    text = status.format_text(status.summary(_handoff(), None, NOW_MS))
    assert "spark ui    kubectl port-forward -n shop svc/orders-ui 4040, then http://localhost:4040" in text
    assert "a stopped driver's UI is not kept" in text
    # Without the UI Service, the driver's headless Service names the same port.
    handoff = _handoff()
    handoff["spec"]["spark"]["ui"] = {"service": False}
    s = status.summary(handoff, None, NOW_MS)
    assert s["sparkUi"]["portForward"] == "kubectl port-forward -n shop svc/orders-driver 4040"


def test_status_prints_the_ingress_url_by_tls_and_still_the_port_forward() -> None:
    handoff = _handoff()
    handoff["spec"]["spark"]["ui"] = {"ingress": {"host": "orders-ui.example.com", "path": "/spark/orders"}}
    text = status.format_text(status.summary(handoff, None, NOW_MS))
    assert ("spark ui    http://orders-ui.example.com/spark/orders/ (Ingress orders-ui), or kubectl port-forward -n "
            "shop svc/orders-ui 4040, then http://localhost:4040 (only while the driver runs: a stopped driver's UI "
            "is not kept)") in text
    handoff["spec"]["spark"]["ui"]["ingress"]["tls"] = {"secretName": "orders-ui-tls"}
    s = status.summary(handoff, None, NOW_MS)
    assert s["sparkUi"]["ingress"] == {"name": "orders-ui", "url": "https://orders-ui.example.com/spark/orders/"}
    assert "https://orders-ui.example.com/spark/orders/ (Ingress orders-ui)" in status.format_text(s)
    # Without an ingress the summary has none (what -o json prints).
    assert "ingress" not in status.summary(_handoff(), None, NOW_MS)["sparkUi"]
