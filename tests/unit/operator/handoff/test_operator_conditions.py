"""conditions: Ready/Progressing/Degraded from observed facts; transitions → Events."""
from __future__ import annotations

from handoff_operator.conditions import (DriverFacts, Facts, ProgressFacts, evaluate, merge_conditions,
                                         transitions)


def _by_type(ev):
    return {c.type: c for c in ev.conditions}


RUNNING = DriverFacts(desired_replicas=1, replicas=1, ready_replicas=1, updated_replicas=1, pod_name="d-1",
                      pod_phase="Running", pod_ready=True, pod_config_hash="h1")


def test_invalid_spec_is_failed_with_reason():
    ev = evaluate(Facts(generation=3, suspended=False, desired_hash=None,
                        invalid=["spec.commitInterval: too short"]))
    c = _by_type(ev)
    assert ev.phase == "Failed"
    assert (c["Ready"].status, c["Ready"].reason) == ("False", "InvalidSpec")
    assert "spec.commitInterval" in c["Ready"].message


def test_no_driver_yet_is_pending_and_progressing():
    ev = evaluate(Facts(generation=1, suspended=False, desired_hash="h1"))
    c = _by_type(ev)
    assert ev.phase == "Pending" and c["Progressing"].status == "True" and c["Ready"].status == "False"


def test_running_is_ready_and_not_progressing():
    ev = evaluate(Facts(generation=1, suspended=False, desired_hash="h1", driver=RUNNING,
                        progress=ProgressFacts(committed_snapshot=42, lag=0)))
    c = _by_type(ev)
    assert ev.phase == "Running"
    assert c["Ready"].status == "True" and "snapshot 42" in c["Ready"].message
    assert c["Progressing"].status == "False" and c["Degraded"].status == "False"


def test_new_hash_means_restarting():
    driver = DriverFacts(desired_replicas=1, replicas=1, ready_replicas=1, updated_replicas=0, pod_name="d-1",
                         pod_phase="Running", pod_ready=True, pod_config_hash="h1", rollout_observed=False)
    ev = evaluate(Facts(generation=2, suspended=False, desired_hash="h2", driver=driver))
    c = _by_type(ev)
    assert ev.phase == "Starting" and c["Progressing"].reason == "Restarting"
    assert c["Ready"].status == "False"


def test_pending_pod_is_starting():
    driver = DriverFacts(desired_replicas=1, replicas=1, updated_replicas=1, pod_name="d-1", pod_phase="Pending",
                         pod_config_hash="h1")
    ev = evaluate(Facts(generation=1, suspended=False, desired_hash="h1", driver=driver))
    assert ev.phase == "Starting" and _by_type(ev)["Progressing"].reason == "Starting"


def test_crash_loop_is_degraded():
    driver = DriverFacts(desired_replicas=1, replicas=1, updated_replicas=1, pod_name="d-1", pod_phase="Running",
                         pod_config_hash="h1", restart_count=4, waiting_reason="CrashLoopBackOff",
                         last_termination_reason="Error (exit code 1)", last_termination_message="boom")
    ev = evaluate(Facts(generation=1, suspended=False, desired_hash="h1", driver=driver))
    c = _by_type(ev)
    assert ev.phase == "Degraded" and c["Degraded"].status == "True" and "boom" in c["Degraded"].message


def test_a_refused_transform_is_degraded_with_reason_transform_invalid():
    line = "TransformInvalid: spec.transform.sql: [UNRESOLVED_COLUMN] nope cannot be resolved"
    driver = DriverFacts(desired_replicas=1, replicas=1, updated_replicas=1, pod_name="d-1", pod_phase="Running",
                         pod_config_hash="h1", restart_count=2, waiting_reason="CrashLoopBackOff",
                         last_termination_reason="Error (exit code 3)",
                         last_termination_message="some log line\n" + line + "\nINFO closing down\n")
    ev = evaluate(Facts(generation=1, suspended=False, desired_hash="h1", driver=driver))
    c = _by_type(ev)
    assert ev.phase == "Degraded"
    assert (c["Degraded"].status, c["Degraded"].reason) == ("True", "TransformInvalid")
    assert c["Ready"].reason == "TransformInvalid" and c["Degraded"].message.startswith(line)
    # Every condition it changes is told as a Warning Event (kubectl describe / events), Ready's included.
    events = transitions(None, ev.conditions)
    assert events and {e.type for e in events} == {"Warning"}, events
    assert {e.reason for e in events if e.message.startswith("Ready=")} == {"TransformInvalid"}


def test_suspended_progressing_until_stopped():
    stopping = DriverFacts(desired_replicas=0, replicas=1, pod_name="d-1", pod_phase="Running")
    ev = evaluate(Facts(generation=2, suspended=True, desired_hash="h1", driver=stopping))
    assert ev.phase == "Suspended" and _by_type(ev)["Progressing"].status == "True"
    ev = evaluate(Facts(generation=2, suspended=True, desired_hash="h1", driver=DriverFacts()))
    c = _by_type(ev)
    assert c["Progressing"].status == "False" and c["Ready"].reason == "Suspended"


def test_freshness_target_missed_only_with_waiting_records():
    stale = ProgressFacts(freshness_seconds=600, lag=10)
    ev = evaluate(Facts(generation=1, suspended=False, desired_hash="h1", driver=RUNNING, progress=stale,
                        freshness_target_seconds=60))
    assert ev.phase == "Degraded" and _by_type(ev)["Degraded"].reason == "FreshnessTargetMissed"
    caught_up = ProgressFacts(freshness_seconds=600, lag=0)
    ev = evaluate(Facts(generation=1, suspended=False, desired_hash="h1", driver=RUNNING, progress=caught_up,
                        freshness_target_seconds=60))
    assert ev.phase == "Running"


def test_a_missed_freshness_target_does_not_change_its_condition_as_the_age_grows():
    """The age is status.freshness's job (written in steps): a message carrying it changed the status, so an API
    write and a watch event, at every refresh of every stalled handoff."""
    def degraded(age: float):
        return _by_type(evaluate(Facts(generation=1, suspended=False, desired_hash="h1", driver=RUNNING,
                                       progress=ProgressFacts(freshness_seconds=age, lag=10),
                                       freshness_target_seconds=60)))["Degraded"]

    assert degraded(600) == degraded(615)
    assert "60s" in degraded(600).message and "10 records waiting" in degraded(600).message


def test_last_transition_time_changes_only_with_status():
    first = evaluate(Facts(generation=1, suspended=False, desired_hash="h1"))
    merged = merge_conditions(None, first.conditions, 1, "2026-01-01T00:00:00Z")
    assert all(c["lastTransitionTime"] == "2026-01-01T00:00:00Z" and c["observedGeneration"] == 1 for c in merged)
    pod = DriverFacts(desired_replicas=1, replicas=1, updated_replicas=1, pod_name="d", pod_phase="Pending",
                      pod_config_hash="h1")
    second = evaluate(Facts(generation=2, suspended=False, desired_hash="h1", driver=pod))
    again = {c["type"]: c for c in merge_conditions(merged, second.conditions, 2, "2026-01-01T00:01:00Z")}
    # Ready stays False, Progressing stays True: times kept even though reasons changed.
    assert again["Ready"]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert again["Ready"]["observedGeneration"] == 2
    third = evaluate(Facts(generation=2, suspended=False, desired_hash="h1", driver=RUNNING))
    final = {c["type"]: c for c in merge_conditions(list(again.values()), third.conditions, 2, "2026-01-01T00:02:00Z")}
    assert final["Ready"]["lastTransitionTime"] == "2026-01-01T00:02:00Z"


def test_transitions_emit_one_event_per_change():
    first = evaluate(Facts(generation=1, suspended=False, desired_hash="h1"))
    assert transitions(None, first.conditions) == [], "a new handoff's first status is no news"
    old = merge_conditions(None, first.conditions, 1, "t")
    assert transitions(old, first.conditions) == []
    running = evaluate(Facts(generation=1, suspended=False, desired_hash="h1", driver=RUNNING))
    reasons = {e.reason for e in transitions(old, running.conditions)}
    assert "Running" in reasons
    invalid = evaluate(Facts(generation=2, suspended=False, desired_hash=None, invalid=["spec.x: bad"]))
    warn = [e for e in transitions(old, invalid.conditions) if e.type == "Warning"]
    assert warn and all(e.reason == "InvalidSpec" for e in warn)


def test_first_rollout_is_a_start_not_a_restart():
    fresh = DriverFacts(desired_replicas=1, replicas=0, updated_replicas=0, rollout_observed=False)
    ev = evaluate(Facts(generation=1, suspended=False, desired_hash="h1", driver=fresh))
    assert _by_type(ev)["Progressing"].reason == "Starting"


def test_a_first_pod_that_has_not_reported_is_starting_though_its_template_hash_is_not_the_configs():
    """The pod template's hash leaves the query's own settings out, so before the first driver reports, its
    annotation ("p1") differs from the whole config's hash ("h1"): that is still a start, not a restart (CI of
    b7306cb saw a second Restarting Event, "restarting the driver to apply generation 1")."""
    pending = DriverFacts(desired_replicas=1, replicas=1, updated_replicas=1, pod_name="d-1", pod_phase="Running",
                          pod_config_hash="p1")
    c = _by_type(evaluate(Facts(generation=1, suspended=False, desired_hash="h1", desired_pod_hash="p1",
                                driver=pending)))
    assert (c["Progressing"].reason, c["Ready"].reason) == ("Starting", "DriverStarting")
    other = evaluate(Facts(generation=2, suspended=False, desired_hash="h2", desired_pod_hash="p2", driver=pending))
    assert _by_type(other)["Progressing"].reason == "Restarting"


def test_restart_stays_restarting_until_the_new_driver_runs():
    # Old pod gone, new pod not yet created: still the same controlled restart.
    between = DriverFacts(desired_replicas=1, replicas=0, updated_replicas=0)
    ev = evaluate(Facts(generation=2, suspended=False, desired_hash="h2", driver=between,
                        previous_hash="h2", restart_in_progress=True))
    assert _by_type(ev)["Progressing"].reason == "Restarting"
    done = evaluate(Facts(generation=2, suspended=False, desired_hash="h2", previous_hash="h2",
                          restart_in_progress=True,
                          driver=DriverFacts(desired_replicas=1, replicas=1, ready_replicas=1, updated_replicas=1,
                                             pod_name="d-2", pod_phase="Running", pod_ready=True,
                                             pod_config_hash="h2")))
    assert done.phase == "Running" and _by_type(done)["Progressing"].reason == "RolloutComplete"


def test_unreadable_truth_does_not_flap_on_a_child_triggered_reconcile():
    """A refresh found Kafka unreachable (Degraded=True StatusUnavailable); the driver pod then changes and a
    reconcile without a refresh runs from the status: Degraded must stay True until a refresh reads the truth."""
    from handoff_operator.handoff.status import status_progress as _status_progress

    status = {"lag": 5, "conditions": [
        {"type": "Degraded", "status": "True", "reason": "StatusUnavailable", "message": "kafka: timed out"}]}
    progress = _status_progress(status)
    assert progress.errors == ("kafka: timed out",)
    starting = DriverFacts(desired_replicas=1, replicas=1, updated_replicas=1, pod_name="d-1", pod_phase="Pending",
                           pod_config_hash="h1")
    for driver in (starting, RUNNING):
        c = _by_type(evaluate(Facts(generation=1, suspended=False, desired_hash="h1", driver=driver,
                                    progress=progress)))
        assert (c["Degraded"].status, c["Degraded"].reason) == ("True", "StatusUnavailable")
    assert _status_progress({"conditions": [{"type": "Degraded", "status": "False", "reason": "AsExpected"}]}
                            ).errors == ()


def test_a_first_status_that_is_wrong_is_told():
    invalid = evaluate(Facts(generation=1, suspended=False, desired_hash=None, invalid=["spec.x: bad"]))
    assert {(e.type, e.reason) for e in transitions(None, invalid.conditions)} == {("Warning", "InvalidSpec")}
    crashing = DriverFacts(desired_replicas=1, replicas=1, updated_replicas=1, pod_name="d", pod_phase="Running",
                           pod_config_hash="h1", waiting_reason="CrashLoopBackOff")
    failing = evaluate(Facts(generation=1, suspended=False, desired_hash="h1", driver=crashing))
    assert {(e.type, e.reason) for e in transitions(None, failing.conditions)} == {("Warning", "DriverFailing")}
    starting = evaluate(Facts(generation=1, suspended=False, desired_hash="h1",
                              driver=DriverFacts(desired_replicas=1, rollout_observed=False)))
    old = merge_conditions(None, starting.conditions, 1, "t")
    assert transitions(None, starting.conditions) == []
    assert {e.reason for e in transitions(old, failing.conditions)} >= {"DriverFailing"}


def test_the_driver_reports_the_config_it_runs_and_a_transform_it_refused():
    """A transform changes in the running driver (driver.query_config): the pod's annotation (its template, "p1") is
    not all it runs, its own record is (with_report). Until it runs the new config: Restarting, in that pod; a
    transform it refused: Degraded TransformInvalid while it runs the one before."""
    from handoff_operator.conditions import DriverReport, with_report

    pod = DriverFacts(desired_replicas=1, replicas=1, ready_replicas=1, updated_replicas=1, pod_name="d-1",
                      pod_phase="Running", pod_ready=True, pod_config_hash="p1")
    report = DriverReport(published_at_ms=1, driver_pod="d-1", config_hash="h1", config_since_ms=5)
    runs_h1 = with_report(pod, report)
    assert runs_h1 is not None and (runs_h1.config_hash, runs_h1.config_started_at_ms) == ("h1", 5)
    assert with_report(pod, DriverReport(published_at_ms=1, driver_pod="d-0", config_hash="h0")) == pod
    facts = dict(generation=2, suspended=False, desired_hash="h2", desired_pod_hash="p1")
    ev = evaluate(Facts(driver=runs_h1, **facts))
    c = _by_type(ev)
    assert ev.phase == "Starting" and c["Progressing"].reason == "Restarting"
    assert c["Progressing"].message == "restarting the query in driver pod d-1 to apply generation 2"
    assert evaluate(Facts(driver=with_report(pod, DriverReport(published_at_ms=1, driver_pod="d-1",
                                                               config_hash="h2")), **facts)).phase == "Running"
    line = "TransformInvalid: spec.transform.sql: [UNRESOLVED_COLUMN] nope cannot be resolved"
    refused = with_report(pod, DriverReport(published_at_ms=1, driver_pod="d-1", config_hash="h1",
                                            config_refused_hash="h2", config_refused=line))
    ev = evaluate(Facts(driver=refused, **facts))
    c = _by_type(ev)
    assert ev.phase == "Degraded" and (c["Degraded"].reason, c["Progressing"].reason) == ("TransformInvalid",) * 2
    assert c["Degraded"].message.startswith(line) and "keeps running config h1" in c["Degraded"].message
    assert c["Ready"].status == "True"  # the stream goes on with the transform before



def test_a_schema_the_running_driver_refused_is_degraded_schema_incompatible():
    """A refused query config's reason is its line's (driver.app.reconcile_schema: `SchemaIncompatible: …`), so a
    dashboard tells a schema the table cannot take from a SQL that does not plan; Ready stays True (the stream goes
    on with the schema before)."""
    from handoff_operator.conditions import DriverReport, with_report

    pod = DriverFacts(desired_replicas=1, replicas=1, ready_replicas=1, updated_replicas=1, pod_name="d-1",
                      pod_phase="Running", pod_ready=True, pod_config_hash="p1")
    line = "SchemaIncompatible: spec.schema: declared schema does not fit table db.t: column 'amount' is double"
    refused = with_report(pod, DriverReport(published_at_ms=1, driver_pod="d-1", config_hash="h1",
                                            config_refused_hash="h2", config_refused=line))
    ev = evaluate(Facts(generation=2, suspended=False, desired_hash="h2", desired_pod_hash="p1", driver=refused))
    c = _by_type(ev)
    assert ev.phase == "Degraded" and (c["Degraded"].reason, c["Progressing"].reason) == ("SchemaIncompatible",) * 2
    assert c["Ready"].status == "True" and c["Degraded"].message.startswith(line)
    assert {e.type for e in transitions(None, ev.conditions) if e.reason == "SchemaIncompatible"} == {"Warning"}