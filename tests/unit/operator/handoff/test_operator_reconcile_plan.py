"""The decide step of a reconcile, before anything is done (handoff.status.plan and the decisions it composes:
upgrade.step.decide_step, status.restart, scaling.step.decide_step, retention.step.decide/checked): pure functions
over gathered facts."""
from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

from kubernetes import client

from handoff_operator.conditions import DriverFacts, DriverReport, ProgressFacts
from handoff_operator.handoff import journal
from handoff_operator.handoff.status import Gathered, Truth, decide, observe, plan, restart
from handoff_operator.retention import step as retention_step
from handoff_operator.retention.report import EnforceOutcome
from handoff_operator.retention.rule import PartitionFacts, TopicFacts
from handoff_operator.runtime import state
from handoff_operator.runtime.kube import Kube
from handoff_operator.runtime.settings import OperatorSettings
from handoff_operator.scaling import step as scaling_step
from handoff_operator.spec import rendered as rendering
from handoff_operator.spec.rendered import Prepared
from handoff_operator.upgrade.rule import UpgradeState
from handoff_operator.upgrade.step import status_from_state

from operator_support import base_spec  # in tests/integration, which pyproject.toml puts on the path

NOW = 1_800_000_000_000
MIN = 60_000
SETTINGS = OperatorSettings(metrics_port=None, default_image="img:1")


def _handoff(spec: dict[str, Any], generation: int = 1, status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"apiVersion": "handoff.io/v1alpha1", "kind": "StreamTableHandoff",
            "metadata": {"name": "orders", "namespace": "ns-plan", "uid": "u1", "generation": generation},
            "spec": spec, "status": status or {}}


def _prepared(spec: dict[str, Any]) -> Prepared:
    state.forget("ns-plan", "orders")
    prepared = rendering.prepare(Kube(client.ApiClient()), _handoff(spec), "img:1")  # no Secret: no request
    assert prepared.rendered is not None
    return prepared


def _gathered(obj: dict[str, Any], prepared: Prepared, **kw: Any) -> Gathered:
    return Gathered(obj, prepared.spec, list(prepared.problems), prepared.rendered, prepared.digests,
                    settings=SETTINGS, now_ms=NOW, **kw)


def _driver(config_hash: str, **kw: Any) -> DriverFacts:
    base = dict(desired_replicas=1, replicas=1, ready_replicas=1, updated_replicas=1, pod_name=f"d-{config_hash}",
                pod_phase="Running", pod_ready=True, pod_config_hash=config_hash, pod_started_at_ms=NOW - 10 * MIN)
    return DriverFacts(**{**base, **kw})


def test_a_changed_config_is_one_restart_with_an_event_unless_a_rollback_says_it():
    app, event = restart({"configHash": "a", "restarts": 1, "driver": "d"}, "b", False, 3, False)
    assert app == {"configHash": "b", "restarts": 2, "driver": "d"}
    assert event is not None and event[1] == "Restarting" and "generation 3" in event[2] and "a → b" in event[2]
    assert restart({"configHash": "a"}, "b", False, 3, True) == ({"configHash": "b", "restarts": 1}, None)
    assert restart({"configHash": "a"}, "a", False, 3, False) == ({"configHash": "a"}, None)
    assert restart({}, "a", False, 1, False) == ({"configHash": "a"}, None)           # the first config
    assert restart({"configHash": "a"}, "b", True, 2, False) == ({"configHash": "b"}, None)  # suspended


def test_a_changed_transform_is_planned_as_a_restart_of_the_query_in_the_running_pod():
    """Only the transform changed: the pod's template is the same, so the Event names the running pod whose query
    restarts (driver.query_config); a change of the pod's template is the driver's restart, as before."""
    frames = dict(deadLetter={"topic": "orders-dlq"}, transform={"sql": "SELECT * FROM source"})
    old = _prepared(base_spec(**frames))
    new = _prepared(base_spec(**{**frames, "transform": {"sql": "SELECT * FROM source WHERE id > 0"}}))
    assert new.rendered.pod_hash == old.rendered.pod_hash != new.rendered.config_hash != old.rendered.config_hash
    obj = _handoff(base_spec(**{**frames, "transform": {"sql": "SELECT * FROM source WHERE id > 0"}}), 2,
                   {"app": {"configHash": old.rendered.config_hash}})
    running = _driver(old.rendered.pod_hash, running_config_hash=old.rendered.config_hash)
    planned = plan(_gathered(obj, new, driver=running))
    assert planned.restart is not None and planned.app["configHash"] == new.rendered.config_hash
    assert f"driver pod {running.pod_name} checks it and restarts its query" in planned.restart[2], planned.restart
    # A transform added to a handoff on the fused path, and removed again: the same pod template, the query
    # restarts in the running driver, which switches path.
    fused = _prepared(base_spec(deadLetter={"topic": "orders-dlq"}))
    assert fused.rendered.pod_hash == old.rendered.pod_hash != fused.rendered.config_hash
    for before, after, spec in ((fused, old, base_spec(**frames)),
                                (old, fused, base_spec(deadLetter={"topic": "orders-dlq"}))):
        driver = _driver(before.rendered.pod_hash, running_config_hash=before.rendered.config_hash)
        planned = plan(_gathered(_handoff(spec, 2, {"app": {"configHash": before.rendered.config_hash}}), after,
                                 driver=driver))
        assert planned.restart is not None and planned.app["configHash"] == after.rendered.config_hash
        assert f"driver pod {driver.pod_name} checks it and restarts its query" in planned.restart[2], planned.restart
    other = _prepared(base_spec(**{**frames, "spark": BIGGER}))
    assert other.rendered.pod_hash != old.rendered.pod_hash
    planned = plan(_gathered(_handoff(base_spec(**{**frames, "spark": BIGGER}), 2,
                                      {"app": {"configHash": old.rendered.config_hash}}), other, driver=running))
    assert planned.restart is not None and "stopping the driver at a batch boundary" in planned.restart[2]


#: A change of the driver pod itself (its resources): a new pod template, where a new commit interval changes only
#: the running driver's query (driver.query_config).
BIGGER = {"driver": {"cores": 1, "memory": "2Gi"}, "executor": {"cores": 2, "memory": "2Gi"}}


def test_a_driver_waiting_out_a_crash_back_off_is_replaced_when_its_query_config_changes():
    """A change the running driver would apply in place (here the SQL) leaves the pod template as it was; a driver
    pod that crashed waits out the kubelet's back-off before it starts again with it. The plan deletes that pod as
    the config changes, so its Deployment starts one now, and says so; only then (a pod that crashes after it started
    with the new config), only a pod of that template, only in a back-off, and not when it ran that very config."""
    frames = dict(deadLetter={"topic": "orders-dlq"}, transform={"sql": "SELECT * FROM source"})
    old = _prepared(base_spec(**frames))
    new_spec = base_spec(**{**frames, "transform": {"sql": "SELECT * FROM source WHERE id > 0"}})
    new = _prepared(new_spec)
    assert new.rendered.pod_hash == old.rendered.pod_hash
    crashed = _driver(old.rendered.pod_hash, ready_replicas=0, pod_ready=False, restart_count=2,
                      waiting_reason="CrashLoopBackOff")

    def planned_for(driver: DriverFacts, before: str | None = old.rendered.config_hash, prepared: Prepared = new,
                    spec: dict[str, Any] = new_spec) -> Any:
        return plan(_gathered(_handoff(spec, 2, {"app": {"configHash": before}}), prepared, driver=driver))

    planned = planned_for(crashed)
    assert planned.replace_pod == crashed.pod_name and planned.app["configHash"] == new.rendered.config_hash
    assert planned.restart is not None and planned.restart[1] == "CrashedDriverReplaced", planned.restart
    assert (f"driver pod {crashed.pod_name} waits out a crash back-off (2 restarts) with config "
            f"{old.rendered.config_hash}; {new.rendered.config_hash} (generation 2)") in planned.restart[2]
    # Only as the config changes: a pod in a back-off later crashed with it (and a first config replaces nothing).
    assert planned_for(crashed, before=new.rendered.config_hash).replace_pod is None
    assert planned_for(crashed, before=None).replace_pod is None
    # The pod says it ran this very config: nothing to gain.
    assert planned_for(replace(crashed, running_config_hash=new.rendered.config_hash)).replace_pod is None
    # A pod that runs applies the change itself; a pod of another template is rolled by its Deployment; a handoff
    # held at 0 replicas runs no pod; an image that cannot be pulled is not the config's doing.
    assert planned_for(_driver(old.rendered.pod_hash, running_config_hash=old.rendered.config_hash)).replace_pod is None
    bigger = {**new_spec, "spark": BIGGER}
    assert planned_for(crashed, prepared=_prepared(bigger), spec=bigger).replace_pod is None
    assert planned_for(replace(crashed, desired_replicas=0)).replace_pod is None
    assert planned_for(replace(crashed, waiting_reason="ImagePullBackOff")).replace_pod is None


def test_a_crash_looping_change_plans_the_last_good_children_and_says_why():
    good, new = _prepared(base_spec()), _prepared(base_spec(spark=BIGGER))
    good_hash, new_hash = good.rendered.config_hash, new.rendered.config_hash
    tried = UpgradeState(last_good_generation=1, last_good_hash=good_hash, trying_generation=2, trying_hash=new_hash,
                         trying_since_ms=NOW - MIN)
    obj = _handoff(base_spec(spark=BIGGER), 2, {**status_from_state(tried), "app": {"configHash": good_hash}})
    crashing = _driver(new.rendered.pod_hash, ready_replicas=0, pod_ready=False, restart_count=3,
                       waiting_reason="CrashLoopBackOff")
    planned = plan(_gathered(obj, new, driver=crashing, last_good=good.rendered))
    assert planned.upgrade is not None and planned.upgrade.rolling_back and planned.rolls_out
    assert planned.rendered is good.rendered and planned.upgrade.good_hash is None
    assert [e[1] for e in planned.upgrade.events] == ["UpgradeRolledBack"]
    assert planned.restart is None and planned.app["configHash"] == good_hash  # the last good config keeps running
    # Without a last good spec to go back to, the change stays (and so do its children).
    kept = plan(_gathered(obj, new, driver=crashing, last_good=None))
    assert kept.rendered is new.rendered and not kept.upgrade.rolling_back


def test_a_rollback_that_deleted_the_crashing_pod_names_it_as_the_driver_it_replaced():
    """Acting on a rollback deletes the crash-looping pod before its replacement exists: status.app.driver names
    that pod (not the one before it), so the timeline says which pod the rollback's pod replaced (the timeline
    drill of issue 35 read "<the rollback's pod> replaced <the pod before the bad upgrade>")."""
    good, new = _prepared(base_spec()), _prepared(base_spec(spark=BIGGER))
    good_hash, new_hash = good.rendered.config_hash, new.rendered.config_hash
    tried = UpgradeState(last_good_generation=1, last_good_hash=good_hash, trying_generation=2, trying_hash=new_hash,
                         trying_since_ms=NOW - MIN)
    obj = _handoff(base_spec(spark=BIGGER), 2, {**status_from_state(tried), "observedGeneration": 2,
                                                "app": {"configHash": good_hash, "driver": "d-before"}})
    crashing = _driver(new.rendered.pod_hash, pod_name=f"d-{new_hash}", ready_replicas=0, pod_ready=False, restart_count=3, waiting_reason="CrashLoopBackOff",
                       last_termination_reason="Error (exit code 1)", last_termination_message="ImportError: x")
    seen = _gathered(obj, new, driver=crashing, last_good=good.rendered)
    planned = plan(seen)
    assert planned.upgrade is not None and planned.upgrade.rolling_back
    gone = DriverFacts(desired_replicas=1, replicas=1)  # the crashing pod is being deleted, no new one yet
    decided = decide(observe(seen, planned, gone, None, [], dt.datetime.now(dt.timezone.utc), NOW))
    app = decided.status["app"]
    assert app["driver"] == f"d-{new_hash}" and app["lastFailure"] == "Error (exit code 1): ImportError: x"
    owed = journal.owed(now_ms=NOW, generation=2, old_status=obj["status"], new_status=decided.status, events=[])
    assert [(e["reason"], e["message"]) for e in owed] == [(
        "DriverReplaced", f"driver pod d-{new_hash} replaced d-before (a restart, a kill or an eviction)")]
    # The next reconcile finds the rollback's pod: it replaced the crashing one.
    back = _driver(good.rendered.pod_hash, pod_name="d-after")
    again = journal.owed(now_ms=NOW, generation=2, old_status=decided.status,
                         new_status={"app": {**app, "driver": back.pod_name}}, events=[])
    assert [e["message"] for e in again] == [
        f"driver pod d-after replaced d-{new_hash} (a restart, a kill or an eviction)"]


def test_a_committing_first_spec_is_marked_good_and_stored():
    first = _prepared(base_spec())
    config_hash = first.rendered.config_hash
    obj = _handoff(base_spec(), 1, status_from_state(UpgradeState(trying_generation=1, trying_hash=config_hash,
                                                                  trying_since_ms=NOW - MIN)))
    report = DriverReport(published_at_ms=NOW, driver_pod=f"d-{config_hash}", batch_id=4, committed_snapshot=7)
    planned = plan(_gathered(obj, first, driver=_driver(first.rendered.pod_hash, pod_name=f"d-{config_hash}"),
                             report=report))
    assert planned.upgrade is not None and planned.upgrade.decision.action == "markGood" and planned.rolls_out
    assert planned.upgrade.good_hash == config_hash and planned.rendered is first.rendered
    assert planned.upgrade.events == []  # the first good spec is no upgrade


def test_a_deleting_handoff_or_an_invalid_spec_plans_nothing_for_the_children_but_the_retention_check():
    prepared = _prepared(base_spec())
    read = retention_step.TopicsRead(NOW, error="KafkaException: unreachable")
    truth = Truth(ProgressFacts(), prepared.spec, prepared.rendered.config, read)
    for gathered in (_gathered(_handoff(base_spec()), prepared, deleting=True, truth=truth),
                     replace(_gathered(_handoff(base_spec()), prepared, truth=truth), rendered=None)):
        planned = plan(gathered)
        assert (planned.rendered, planned.upgrade, planned.scaling, planned.restart) == (None, None, None, None)
        assert planned.retention is not None and planned.retention.read is read and not planned.retention.raises


def test_the_executor_count_is_planned_from_the_measurements():
    spec = _prepared(base_spec()).spec  # 1 to 3 executors
    # A change handler (no truth read): the last decision stands, nothing to tell the driver.
    last = {"desired": 2, "reason": "ScaleUp", "message": "m", "lastScaleTime": "2027-01-15T08:00:00Z"}
    held = scaling_step.decide_step(spec, last, None, None, 2, NOW, scaling_step.Measured(annotated=2))
    assert (held.desired, held.event, held.annotate, held.history) == (2, None, False, None)
    assert held.status == {**last, "current": 2}
    # No decision yet: the bounds; the driver is told the count once.
    first = scaling_step.decide_step(spec, {}, None, None, 0, NOW, scaling_step.Measured())
    assert (first.desired, first.event, first.annotate) == (1, None, True)
    told = scaling_step.decide_step(spec, {}, None, None, 1, NOW, scaling_step.Measured(annotated=1))
    assert not told.annotate
    # A refresh with lag the measured rate cannot catch up on: scale up, say so, tell the driver.
    progress = ProgressFacts(committed_offsets={"orders": {"0": 0}}, end_offsets={"orders": {"0": 10_000_000}})
    measured = scaling_step.Measured(input_rate=1000.0, rate_per_executor=500.0, annotated=1)
    up = scaling_step.decide_step(spec, {"desired": 1, "reason": "Bounds", "message": ""}, progress, None, 1,
                                  NOW, measured)
    assert up.desired > 1 and up.event is not None and up.event[1] == "ScaledUp" and up.annotate
    assert up.history is not None and up.status["lastScaleTime"] is not None


def _read(retention_ms: int) -> retention_step.TopicsRead:
    parts = {0: PartitionFacts(0, 100, next_offset=100)}
    return retention_step.TopicsRead(NOW, {"orders": TopicFacts("orders", retention_ms, -1, ("delete",), parts)})


def test_retention_is_raised_only_in_enforce_mode_and_the_check_takes_the_raise_into_account():
    hour = 3_600_000
    audit = _prepared(base_spec(replay={"window": "1d", "maxOutage": "6h"})).spec
    enforce = _prepared(base_spec(replay={"window": "1d", "maxOutage": "6h"}, retention={"mode": "enforce"})).spec
    assert not retention_step.decide(audit, _read(hour)).raises
    planned = retention_step.decide(enforce, _read(hour))
    (wanted,) = planned.raises
    assert wanted.facts.topic == "orders" and wanted.target_ms >= 30 * hour
    assert not planned.verdicts[0].sufficient
    raised = retention_step.checked(enforce, planned, [EnforceOutcome("orders", "raised", hour, wanted.target_ms,
                                                                      "Kafka")])
    assert raised.verdicts[0].sufficient and raised.enforced[0].action == "raised"
    refused = retention_step.checked(enforce, planned, [EnforceOutcome("orders", "refused", hour, None, "Kafka",
                                                                       "denied")])
    assert not refused.verdicts[0].sufficient and refused.enforced[0].error == "denied"
    assert not retention_step.decide(enforce, _read(40 * hour)).raises  # already long enough
    failed = retention_step.TopicsRead(NOW, error="KafkaException: unreachable")
    assert retention_step.checked(enforce, retention_step.decide(enforce, failed)).errors == (failed.error,)
