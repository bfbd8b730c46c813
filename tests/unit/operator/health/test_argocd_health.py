"""The Argo CD health checks, run by a real Lua interpreter (lupa) the way Argo CD runs them: the object
as a global `obj` (JSON arrays as 1-based tables), the script's return value as the health. Lua 5.1,
because Argo CD's interpreter (gopher-lua) implements 5.1: a 5.4-only construct would pass here and
fail there otherwise."""
from __future__ import annotations

from typing import Any

from lupa import lua51
import pytest

from handoff_operator.health import argocd_cm_data, health_lua


def health(kind: str, obj: dict[str, Any]) -> tuple[str, str]:
    lua = lua51.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    hs = lua.execute(health_lua(kind))
    return hs["status"], hs["message"]


def cond(type_: str, status: str, reason: str = "", message: str = "", gen: int | None = None) -> dict:
    c = {"type": type_, "status": status, "reason": reason, "message": message,
         "lastTransitionTime": "2026-11-22T03:00:00Z"}
    if gen is not None:
        c["observedGeneration"] = gen
    return c


def sth(generation: int = 2, suspend: bool = False, status: dict | None = None) -> dict:
    obj: dict[str, Any] = {"apiVersion": "handoff.io/v1alpha1", "kind": "StreamTableHandoff",
                           "metadata": {"name": "orders", "generation": generation},
                           "spec": {"suspend": suspend}}
    if status is not None:
        obj["status"] = status
    return obj


READY = [cond("Ready", "True", "Committing", "last commit 3s ago", 2), cond("Progressing", "False", "Idle"),
         cond("Degraded", "False", "AsExpected")]


@pytest.mark.parametrize("obj,expected,in_message", [
    (sth(status={"observedGeneration": 2, "phase": "Running", "lag": 12, "freshness": "8s", "conditions": READY}),
     "Healthy", "Committing: last commit 3s ago (lag 12, freshness 8s)"),
    (sth(), "Progressing", "Waiting for the operator"),
    # Status for an older spec: not Healthy, even though it says Ready.
    (sth(generation=3, status={"observedGeneration": 2, "phase": "Running", "conditions": READY}),
     "Progressing", "generation 3"),
    # Condition stamped with an older generation is stale as well.
    (sth(generation=3, status={"observedGeneration": 3, "phase": "Running", "conditions": READY}),
     "Progressing", "Waiting for Ready"),
    (sth(status={"observedGeneration": 2, "phase": "Degraded", "conditions": [
        cond("Ready", "True", "Committing", gen=2),
        cond("Degraded", "True", "FreshnessTargetMissed", "freshness 9m > target 2m", 2)]}),
     "Degraded", "FreshnessTargetMissed: freshness 9m > target 2m"),
    # A failed spec change rolled back: the last good config runs (Ready), but not the spec Argo CD applied.
    (sth(status={"observedGeneration": 2, "phase": "Degraded", "conditions": [
        cond("Ready", "True", "Running", gen=2), cond("Progressing", "False", "UpgradeRolledBack", gen=2),
        cond("Degraded", "True", "UpgradeRolledBack", "generation 2 (config ab) crash-looped", 2)]}),
     "Degraded", "UpgradeRolledBack: generation 2 (config ab) crash-looped"),
    (sth(status={"observedGeneration": 2, "phase": "Starting", "conditions": [
        cond("Ready", "False", "DriverStarting", gen=2), cond("Progressing", "True", "DriverStarting", "pod pending", 2)]}),
     "Progressing", "DriverStarting: pod pending"),
    (sth(status={"observedGeneration": 2, "phase": "Failed", "conditions": [
        cond("Ready", "False", "SchemaIncompatible", "column total: got string", 2)]}),
     "Degraded", "SchemaIncompatible: column total: got string"),
    (sth(status={"observedGeneration": 2, "phase": "Running", "conditions": [
        cond("Ready", "False", "SinkUnavailable", "catalog unreachable", 2), cond("Progressing", "False", "", "", 2)]}),
     "Degraded", "SinkUnavailable: catalog unreachable"),
    (sth(suspend=True, status={"observedGeneration": 2, "phase": "Running", "conditions": READY}),
     "Suspended", "spec.suspend"),
    (sth(status={"observedGeneration": 2, "phase": "Suspended", "conditions": READY}), "Suspended", ""),
    (sth(status={"observedGeneration": 2, "phase": "Pending"}), "Progressing", "Waiting for Ready"),
])
def test_stream_table_handoff_health(obj: dict, expected: str, in_message: str) -> None:
    status, message = health("StreamTableHandoff", obj)
    assert status == expected, message
    assert in_message in message


def replay(status: dict | None = None, dry_run: bool = False, generation: int = 1) -> dict:
    obj: dict[str, Any] = {"kind": "ReplayRequest", "metadata": {"name": "r", "generation": generation},
                           "spec": {"handoffRef": {"name": "orders"}, "mode": "Rollback", "dryRun": dry_run}}
    if status is not None:
        obj["status"] = status
    return obj


@pytest.mark.parametrize("obj,expected,in_message", [
    (replay(), "Progressing", "Waiting for the operator"),
    (replay({"observedGeneration": 1, "phase": "Running", "progress": {"records": 10},
             "conditions": [cond("Progressing", "True", "Replaying", "10 of 100 records")]}),
     "Progressing", "Replaying: 10 of 100 records"),
    (replay({"observedGeneration": 1, "phase": "Succeeded", "plan": {"summary": "rolled back 3 snapshots"}}),
     "Healthy", "rolled back 3 snapshots"),
    (replay({"observedGeneration": 1, "phase": "Planned", "plan": {"summary": "would roll back 3 snapshots"}},
            dry_run=True), "Healthy", "Dry run: would roll back 3 snapshots"),
    (replay({"observedGeneration": 1, "phase": "Planned"}), "Progressing", "Planned"),
    (replay({"observedGeneration": 1, "phase": "Failed",
             "conditions": [cond("Degraded", "True", "SnapshotExpired", "snapshot 42 was expired")]}),
     "Degraded", "SnapshotExpired: snapshot 42 was expired"),
    (replay({"observedGeneration": 1, "phase": "Succeeded"}, generation=2), "Progressing", "generation 2"),
])
def test_replay_request_health(obj: dict, expected: str, in_message: str) -> None:
    status, message = health("ReplayRequest", obj)
    assert status == expected, message
    assert in_message in message


def test_argocd_cm_keys() -> None:
    data = argocd_cm_data()
    assert set(data) == {"resource.customizations.health.handoff.io_StreamTableHandoff",
                         "resource.customizations.health.handoff.io_ReplayRequest"}
    assert all(text.lstrip().startswith("--") for text in data.values())


def test_a_refused_transform_is_degraded_in_argo_cd_with_the_drivers_line() -> None:
    """From the operator's own evaluation (conditions.evaluate) to what Argo CD shows: a driver that exited 3 with
    `TransformInvalid: …` is Degraded with that line, so the application page says what to fix."""
    from handoff_operator.conditions import DriverFacts, Facts, evaluate, merge_conditions

    line = "TransformInvalid: spec.transform.sql: [UNRESOLVED_COLUMN.WITH_SUGGESTION] `amout` cannot be resolved"
    driver = DriverFacts(desired_replicas=1, replicas=1, updated_replicas=1, pod_name="orders-driver-0",
                         pod_phase="Running", pod_config_hash="h2", restart_count=3,
                         waiting_reason="CrashLoopBackOff", last_termination_reason="Error (exit code 3)",
                         last_termination_message=line + "\n")
    ev = evaluate(Facts(generation=2, suspended=False, desired_hash="h2", driver=driver))
    conditions = merge_conditions(None, ev.conditions, 2, "2026-11-22T03:00:00Z")
    status, message = health("StreamTableHandoff", sth(status={"observedGeneration": 2, "phase": ev.phase,
                                                               "conditions": conditions}))
    assert status == "Degraded" and "TransformInvalid: " + line in message, message
