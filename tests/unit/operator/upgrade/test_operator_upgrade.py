"""upgrade.decide: keep, mark good or roll back a spec change, over plain data; overlay of the conditions;
the status round trip of the state (rollback.state_from_status / status_from_state)."""
from __future__ import annotations

from dataclasses import replace

from handoff_operator.conditions import DriverFacts, DriverReport, Facts, ProgressFacts, evaluate
from handoff_operator.upgrade.step import state_from_status, status_from_state
from handoff_operator.upgrade.rule import UpgradeFacts, UpgradeState, decide, overlay

NOW = 1_800_000_000_000
MIN = 60_000
GOOD = UpgradeState(last_good_generation=1, last_good_hash="h1")


def _driver(hash_: str = "h2", **kw) -> DriverFacts:
    base = dict(desired_replicas=1, replicas=1, ready_replicas=1, updated_replicas=1, pod_name=f"d-{hash_}",
                pod_phase="Running", pod_ready=True, pod_config_hash=hash_, pod_started_at_ms=NOW - 10 * MIN)
    base.update(kw)
    return DriverFacts(**base)


def _crashing(hash_: str = "h2", restarts: int = 3) -> DriverFacts:
    return _driver(hash_, ready_replicas=0, pod_ready=False, restart_count=restarts,
                   waiting_reason="CrashLoopBackOff", last_termination_reason="Error (exit code 1)",
                   last_termination_message="NoClassDefFoundError: org/apache/kafka")


def _facts(**kw) -> UpgradeFacts:
    base = dict(generation=2, desired_hash="h2", suspended=False, now_ms=NOW, timeout_seconds=300.0,
                crash_restarts=3, lag=100)
    base.update(kw)
    return UpgradeFacts(**base)


def _committed(pod: str, snapshot: int | None = 7) -> DriverReport:
    return DriverReport(published_at_ms=NOW, driver_pod=pod, batch_id=4, committed_snapshot=snapshot)


def test_first_spec_is_tried_then_marked_good_by_the_drivers_report():
    tried = decide(_facts(generation=1, desired_hash="h1", driver=_driver("h1", pod_ready=False)), UpgradeState())
    assert tried.action == "keep" and not tried.run_last_good
    assert (tried.state.trying_generation, tried.state.trying_hash, tried.state.trying_since_ms) == (1, "h1", NOW)

    good = decide(_facts(generation=1, desired_hash="h1", driver=_driver("h1"), report=_committed("d-h1")),
                  tried.state)
    assert good.action == "markGood"
    assert (good.state.last_good_generation, good.state.last_good_hash) == (1, "h1")
    assert good.state.trying_hash is None and "generation 1" in good.message
    # Marked once: the same evidence again changes nothing.
    assert decide(_facts(generation=1, desired_hash="h1", driver=_driver("h1"), report=_committed("d-h1")),
                  good.state).action == "keep"


def test_a_spec_change_that_keeps_the_app_config_is_good_without_claiming_a_new_commit():
    """A new generation rendering the same config (e.g. scaling.maxExecutors) is good at once, and says why: its
    config committed under the generation before (the timeline drill of issue 35 read "generation 2 committed a
    batch" at the moment of the change)."""
    same = decide(_facts(generation=2, desired_hash="h1", driver=_driver("h1"), report=_committed("d-h1")), GOOD)
    assert same.action == "markGood" and (same.state.last_good_generation, same.state.last_good_hash) == (2, "h1")
    assert same.message == ("generation 2 runs the app config of generation 1 (config h1), which committed a batch: "
                            "it is now the spec a failed change is rolled back to")


def test_a_report_without_a_commit_or_from_another_pod_is_no_evidence():
    tried = UpgradeState(last_good_generation=1, last_good_hash="h1", trying_generation=2, trying_hash="h2",
                         trying_since_ms=NOW - MIN)
    for report in (_committed("d-h2", snapshot=None),      # a batch the sink did not commit
                   _committed("d-h1"),                      # the old driver's last report
                   DriverReport(published_at_ms=NOW)):      # nothing yet
        assert decide(_facts(driver=_driver(), report=report), tried).action == "keep", report


def test_the_configs_newest_commit_is_evidence_through_an_idle_batch():
    """The driver's last batch committed nothing (an idle stream), but a batch of the config it runs did
    (`configCommittedSnapshot`): that config is good, also when the spec changed again since (the tried copy)."""
    tried = UpgradeState(last_good_generation=1, last_good_hash="h1", trying_generation=2, trying_hash="h2",
                         trying_since_ms=NOW - MIN)
    idle = replace(_committed("d-h2", snapshot=None), config_hash="h2", config_committed_snapshot=9)
    assert decide(_facts(driver=_driver(), report=idle), tried).action == "markGood"
    runs_h2 = _in_place("h2", NOW - 30_000)
    idle_in_place = replace(idle, driver_pod="d-p1")
    moved_on = decide(_facts(generation=3, desired_hash="h3", desired_pod_hash="p1", driver=runs_h2,
                             report=idle_in_place, tried_stored=True), tried)
    assert moved_on.action == "markGood" and moved_on.state.last_good_hash == "h2"


def test_a_ledger_commit_after_the_new_pod_started_marks_it_good():
    tried = replace(GOOD, trying_generation=2, trying_hash="h2", trying_since_ms=NOW - MIN)
    started = NOW - MIN
    driver = _driver(pod_started_at_ms=started)
    assert decide(_facts(driver=driver, ledger_committed_at_ms=started + 5_000), tried).action == "markGood"
    # The old driver's last commit (finished while it stopped) is older than the new pod: no evidence.
    assert decide(_facts(driver=driver, ledger_committed_at_ms=started - 2_000), tried).action == "keep"
    assert decide(_facts(driver=driver, ledger_committed_at_ms=started + 200), tried).action == "keep"


def test_crash_loop_of_a_changed_spec_rolls_back_to_the_last_good_one():
    tried = replace(GOOD, trying_generation=2, trying_hash="h2", trying_since_ms=NOW - MIN)
    decision = decide(_facts(driver=_crashing()), tried)
    assert decision.action == "rollBack" and decision.run_last_good
    st = decision.state
    assert (st.rolled_back_generation, st.rolled_back_hash, st.rolled_back_reason) == (2, "h2", "CrashLoop")
    assert st.trying_hash is None and st.last_good_generation == 1 and st.rolled_back_at_ms == NOW
    assert "generation 2" in decision.message and "generation 1" in decision.message
    assert "CrashLoopBackOff" in decision.message and "NoClassDefFoundError" in decision.message


def test_one_or_two_restarts_are_not_yet_a_crash_loop_but_an_image_error_is():
    tried = replace(GOOD, trying_generation=2, trying_hash="h2", trying_since_ms=NOW - MIN)
    assert decide(_facts(driver=_crashing(restarts=2)), tried).action == "keep"
    pull = _driver(pod_ready=False, ready_replicas=0, waiting_reason="ImagePullBackOff")
    assert decide(_facts(driver=pull), tried).state.rolled_back_reason == "CrashLoop"


def test_the_old_config_crashing_says_nothing_about_the_new_one():
    tried = replace(GOOD, trying_generation=2, trying_hash="h2", trying_since_ms=NOW - MIN)
    assert decide(_facts(driver=_crashing("h1")), tried).action == "keep"


def test_no_commit_within_the_readiness_timeout_rolls_back():
    tried = replace(GOOD, trying_generation=2, trying_hash="h2", trying_since_ms=NOW - 4 * MIN)
    pending = _driver(pod_ready=False, ready_replicas=0, pod_phase="Pending")
    assert decide(_facts(driver=pending), tried).action == "keep"
    late = decide(_facts(driver=pending, now_ms=NOW + MIN), tried)
    assert late.action == "rollBack" and late.state.rolled_back_reason == "ReadinessTimeout"
    assert "within 5m" in late.message and "is not ready (Pending)" in late.message
    # Ready but committing nothing while records wait fails the same way.
    busy = decide(_facts(driver=_driver(), lag=500, now_ms=NOW + MIN), tried)
    assert busy.action == "rollBack" and "500 records wait" in busy.message
    # The spec's own timeout is honoured.
    assert decide(_facts(driver=pending, timeout_seconds=600, now_ms=NOW + MIN), tried).action == "keep"


def test_a_ready_driver_with_nothing_to_commit_is_not_timed_out():
    tried = replace(GOOD, trying_generation=2, trying_hash="h2", trying_since_ms=NOW - 60 * MIN)
    idle = decide(_facts(driver=_driver(), lag=0), tried)
    assert idle.action == "keep" and idle.state.trying_since_ms is None
    # Records arrive: the clock starts from zero then.
    busy = decide(_facts(driver=_driver(), lag=10, now_ms=NOW + MIN), idle.state)
    assert busy.action == "keep" and busy.state.trying_since_ms == NOW + MIN


def test_the_rollback_holds_until_the_spec_changes_then_the_new_spec_is_tried():
    rolled = decide(_facts(driver=_crashing()), replace(GOOD, trying_generation=2, trying_hash="h2")).state
    # The last good config runs now; its driver committing does not make generation 2 good.
    hold = decide(_facts(driver=_driver("h1"), report=_committed("d-h1"), now_ms=NOW + 60 * MIN), rolled)
    assert hold.action == "keep" and hold.run_last_good and hold.state == rolled

    # Generation 3 (another config) is tried afresh; the rollback is forgotten.
    v3 = decide(_facts(generation=3, desired_hash="h3", driver=_driver("h1"), now_ms=NOW + 61 * MIN), rolled)
    assert v3.action == "keep" and not v3.run_last_good
    assert (v3.state.trying_generation, v3.state.trying_hash, v3.state.trying_since_ms) == (3, "h3", NOW + 61 * MIN)
    assert v3.state.rolled_back_generation is None and v3.state.message is None
    # ... and rolled back again if it fails too.
    again = decide(_facts(generation=3, desired_hash="h3", driver=_crashing("h3"), now_ms=NOW + 62 * MIN), v3.state)
    assert again.action == "rollBack" and again.state.rolled_back_generation == 3

    # A spec reverted to the good config needs nothing proven.
    back = decide(_facts(generation=3, desired_hash="h1", driver=_driver("h1")), rolled)
    assert back.action == "keep" and not back.run_last_good and back.state.trying_hash is None


def test_a_rollback_needs_a_good_spec_to_go_back_to():
    first = UpgradeState(trying_generation=1, trying_hash="h1", trying_since_ms=NOW - 60 * MIN)
    assert decide(_facts(generation=1, desired_hash="h1", driver=_crashing("h1")), first).action == "keep"
    tried = replace(GOOD, trying_generation=2, trying_hash="h2", trying_since_ms=NOW - 60 * MIN)
    assert decide(_facts(driver=_crashing(), last_good_available=False), tried).action == "keep"
    assert decide(_facts(driver=_crashing(), auto_rollback=False), tried).action == "keep"
    # A rollback whose last good spec can no longer be rendered lets the current spec run.
    rolled = decide(_facts(driver=_crashing()), tried).state
    lost = decide(_facts(driver=_crashing(), last_good_available=False), rolled)
    assert not lost.run_last_good and lost.state.rolled_back_generation is None


def test_suspended_neither_proves_nor_fails_and_stops_the_clock():
    tried = replace(GOOD, trying_generation=2, trying_hash="h2", trying_since_ms=NOW - 60 * MIN)
    suspended = decide(_facts(suspended=True, driver=None), tried)
    assert suspended.action == "keep" and suspended.state.trying_since_ms is None
    resumed = decide(_facts(driver=_driver(pod_ready=False), now_ms=NOW + MIN), suspended.state)
    assert resumed.action == "keep" and resumed.state.trying_since_ms == NOW + MIN


def test_a_replay_holding_the_driver_stopped_neither_counts_toward_the_timeout_nor_rolls_back():
    # A spec change (e.g. a fixed transform) is being tried when a RollbackAndReplay holds the driver at
    # 0 replicas for longer than the readiness timeout: no pod, no commit, lag growing.
    tried = replace(GOOD, trying_generation=2, trying_hash="h2", trying_since_ms=NOW - 4 * MIN)
    stopped = _driver(replicas=0, ready_replicas=0, desired_replicas=0, pod_name=None, pod_phase=None,
                      pod_ready=False, pod_config_hash=None)
    for minutes in (0, 10, 60):
        held = decide(_facts(held=True, driver=stopped, lag=5000, now_ms=NOW + minutes * MIN), tried)
        assert held.action == "keep" and not held.run_last_good and held.state.trying_since_ms is None
        tried = held.state
    # Without the hold the same facts roll back: the hold is what stops it.
    assert decide(_facts(driver=stopped, lag=5000, now_ms=NOW + MIN),
                  replace(GOOD, trying_generation=2, trying_hash="h2", trying_since_ms=NOW - 4 * MIN)
                  ).action == "rollBack"
    # The old config's pod still stopping (crash-looping even) during the hold is no verdict either.
    assert decide(_facts(held=True, driver=_crashing("h2")), tried).action == "keep"
    # Once the driver runs again the clock starts from zero.
    resumed = decide(_facts(driver=_driver(pod_ready=False), now_ms=NOW + 61 * MIN), tried)
    assert resumed.action == "keep" and resumed.state.trying_since_ms == NOW + 61 * MIN
    assert decide(_facts(driver=_driver(pod_ready=False), now_ms=NOW + 65 * MIN), resumed.state).action == "keep"
    assert decide(_facts(driver=_driver(pod_ready=False), now_ms=NOW + 66 * MIN), resumed.state).action == "rollBack"


def test_overlay_reports_the_rollback_as_degraded():
    rolled = decide(_facts(driver=_crashing()), replace(GOOD, trying_generation=2, trying_hash="h2"))
    running = evaluate(Facts(generation=2, suspended=False, desired_hash="h1", driver=_driver("h1"),
                             progress=ProgressFacts(lag=0)))
    shown = {c.type: c for c in overlay(running, rolled).conditions}
    assert overlay(running, rolled).phase == "Degraded"
    assert (shown["Degraded"].status, shown["Degraded"].reason) == ("True", "UpgradeRolledBack")
    assert "generation 2" in shown["Degraded"].message
    assert shown["Ready"].status == "True"     # the last good config runs and commits
    assert (shown["Progressing"].status, shown["Progressing"].reason) == ("False", "UpgradeRolledBack")
    # The last good driver failing too says more than the rollback.
    failing = evaluate(Facts(generation=2, suspended=False, desired_hash="h1", driver=_crashing("h1")))
    assert {c.type: c for c in overlay(failing, rolled, _crashing("h1")).conditions}["Degraded"].reason \
        == "DriverFailing"
    # So does a last good driver that now refuses its transform (e.g. a lookup table it joins is gone).
    refusing = replace(_crashing("h1"), last_termination_message="TransformInvalid: spec.transform.sql: no table")
    refused = evaluate(Facts(generation=2, suspended=False, desired_hash="h1", driver=refusing))
    assert {c.type: c for c in overlay(refused, rolled, refusing).conditions}["Degraded"].reason \
        == "TransformInvalid"
    # ... but the rolled back config's pod, crashing until the Deployment replaces it, is old news.
    leaving = evaluate(Facts(generation=2, suspended=False, desired_hash="h1", driver=_crashing("h2")))
    shown = {c.type: c for c in overlay(leaving, rolled, _crashing("h2")).conditions}
    assert shown["Degraded"].reason == "UpgradeRolledBack"
    # The same with pod templates whose hash is not the config's (it leaves the query's own settings out): the
    # crashing pod is of another template than the last good config's "p1", and reports no config.
    leaving = evaluate(Facts(generation=2, suspended=False, desired_hash="h1", desired_pod_hash="p1",
                             driver=_crashing("p2")))
    assert {c.type: c for c in overlay(leaving, rolled, _crashing("p2"), "p1").conditions}["Degraded"].reason \
        == "UpgradeRolledBack"
    failing = evaluate(Facts(generation=2, suspended=False, desired_hash="h1", desired_pod_hash="p1",
                             driver=_crashing("p1")))
    assert {c.type: c for c in overlay(failing, rolled, _crashing("p1"), "p1").conditions}["Degraded"].reason \
        == "DriverFailing"
    # Nothing rolled back: unchanged.
    assert overlay(running, decide(_facts(driver=_driver()), GOOD)) == running


def test_overlay_says_a_restart_after_the_rollback_goes_back_to_the_last_good_config():
    """The timeline drill (issue 35) read "restarting the driver to apply generation 2" right after generation 2
    was rolled back, while the driver was restarted with generation 1's config."""
    rolled = decide(_facts(driver=_crashing()), replace(GOOD, trying_generation=2, trying_hash="h2"))
    restarting = evaluate(Facts(generation=2, suspended=False, desired_hash="h1", previous_hash="h2",
                                driver=_driver("h1", pod_ready=False, ready_replicas=0)))
    assert {c.type: c.message for c in restarting.conditions}["Ready"] == "restarting the driver to apply generation 2"
    shown = {c.type: c for c in overlay(restarting, rolled, _driver("h1", pod_ready=False)).conditions}
    for type_ in ("Ready", "Progressing"):
        assert shown[type_].reason == "Restarting"
        assert shown[type_].message == ("restarting the driver with the config of generation 1 (h1), the last one "
                                        "that committed a batch: generation 2 was rolled back")
    # The last good config's own driver failing keeps what its failure says.
    failing = evaluate(Facts(generation=2, suspended=False, desired_hash="h1", previous_hash="h2",
                             driver=_crashing("h1")))
    kept = {c.type: c for c in overlay(failing, rolled, _crashing("h1")).conditions}
    assert kept["Ready"].reason == "DriverFailing" and "NoClassDefFoundError" in kept["Progressing"].message


def test_state_round_trips_through_the_status():
    rolled = decide(_facts(driver=_crashing()), replace(GOOD, trying_generation=2, trying_hash="h2")).state
    for state in (UpgradeState(), GOOD, rolled, replace(GOOD, trying_generation=2, trying_hash="h2",
                                                       trying_since_ms=NOW)):
        status = status_from_state(state)
        assert state_from_status(status) == state
        assert set(status["upgrade"]) >= {"lastGoodConfigHash", "rolledBackGeneration", "tryingSince"}


# A transform changed in place: the pod keeps its template (pod hash "p1"), the driver reports the config it runs.
def _in_place(running: str | None, since_ms: int | None = None, **kw) -> DriverFacts:
    return _driver("p1", pod_name="d-p1", running_config_hash=running, running_since_ms=since_ms, **kw)


def test_a_transform_changed_in_place_is_good_once_the_driver_runs_it_and_a_batch_of_it_commits():
    """The pod started long ago: its old config's commits must not prove the new one. What counts is the driver's
    word that it runs the new config, and a commit since it does (its record, or the ledger after `since`)."""
    tried = replace(GOOD, trying_generation=2, trying_hash="h2", trying_since_ms=NOW - MIN)
    facts = dict(desired_pod_hash="p1")
    still_old = _in_place("h1")
    assert decide(_facts(driver=still_old, report=_committed("d-p1"), ledger_committed_at_ms=NOW, **facts),
                  tried).action == "keep"
    since = NOW - 30_000
    runs_new = _in_place("h2", since)
    # Its record drops the old batch's snapshot when its query restarts: no snapshot, no evidence yet.
    assert decide(_facts(driver=runs_new, report=_committed("d-p1", snapshot=None),
                         ledger_committed_at_ms=since - 5_000, **facts), tried).action == "keep"
    assert decide(_facts(driver=runs_new, ledger_committed_at_ms=since + 5_000, **facts), tried).action == "markGood"
    assert decide(_facts(driver=runs_new, report=_committed("d-p1"), **facts), tried).action == "markGood"


def test_a_starting_pod_is_judged_by_its_template_until_it_reports_what_it_runs():
    """Before its first record a new pod of the desired template is the tried config's: a crash loop of it rolls back
    (the pod hash differs from the config hash when the spec has a transform)."""
    tried = replace(GOOD, trying_generation=2, trying_hash="h2", trying_since_ms=NOW - MIN)
    crashing = _driver("p2", ready_replicas=0, pod_ready=False, restart_count=3, waiting_reason="CrashLoopBackOff")
    assert decide(_facts(driver=crashing, desired_pod_hash="p2"), tried).action == "rollBack"
    assert decide(_facts(driver=crashing, desired_pod_hash="p3"), tried).action == "keep"


def test_a_transform_the_running_driver_refused_rolls_back_at_once():
    tried = replace(GOOD, trying_generation=2, trying_hash="h2", trying_since_ms=NOW)
    line = "TransformInvalid: spec.transform.sql: [UNRESOLVED_COLUMN] nope cannot be resolved"
    refused = _in_place("h1", NOW - 10 * MIN, refused_config_hash="h2", refused_message=line)
    decision = decide(_facts(driver=refused, desired_pod_hash="p1"), tried)
    assert decision.action == "rollBack" and decision.state.rolled_back_reason == "TransformInvalid"
    assert "refused by the running driver pod d-p1" in decision.message and "UNRESOLVED_COLUMN" in decision.message
    stored = status_from_state(decision.state)
    assert stored["upgrade"]["rolledBackReason"] == "TransformInvalid"
    assert state_from_status(stored).rolled_back_reason == "TransformInvalid"
    # Without a good spec to go back to it waits (the conditions say why), as a crash loop does.
    assert decide(_facts(driver=refused, desired_pod_hash="p1", auto_rollback=False), tried).action == "keep"
    # A refusal of another config says nothing about this one.
    other = replace(refused, refused_config_hash="h9")
    assert decide(_facts(driver=other, desired_pod_hash="p1"), tried).action == "keep"


def test_a_schema_the_running_driver_refused_rolls_back_at_once_with_its_own_reason():
    """A declared schema the table cannot take is refused by the running driver at the batch boundary
    (driver.app.reconcile_schema): rolled back at once, its reason SchemaIncompatible, kept through the status."""
    tried = replace(GOOD, trying_generation=2, trying_hash="h2", trying_since_ms=NOW)
    line = ("SchemaIncompatible: spec.schema: handoff ns/x: declared schema does not fit table db.t: column 'amount' "
            "is double in the table but string arrives")
    refused = _in_place("h1", NOW - 10 * MIN, refused_config_hash="h2", refused_message=line)
    decision = decide(_facts(driver=refused, desired_pod_hash="p1"), tried)
    assert decision.action == "rollBack" and decision.state.rolled_back_reason == "SchemaIncompatible"
    assert "column 'amount'" in decision.message
    stored = status_from_state(decision.state)
    assert stored["upgrade"]["rolledBackReason"] == "SchemaIncompatible"
    assert state_from_status(stored).rolled_back_reason == "SchemaIncompatible"


def test_a_change_applied_before_the_tried_one_was_seen_committing_makes_the_tried_one_the_last_good():
    """Two changes seconds apart: generation 2's driver runs it in place and committed a batch of it, but the spec
    changed to generation 3 before the operator saw that. Generation 2 (its stored copy) becomes the last good spec,
    so a refusal of generation 3 goes back to it, not to generation 1 (the e2e drill on the real node saw that)."""
    tried = replace(GOOD, trying_generation=2, trying_hash="h2", trying_since_ms=NOW - MIN)
    runs_h2 = _in_place("h2", NOW - 30_000)
    facts = dict(generation=3, desired_hash="h3", desired_pod_hash="p1", driver=runs_h2, report=_committed("d-p1"))
    good = decide(_facts(tried_stored=True, **facts), tried)
    assert good.action == "markGood" and good.good_from_tried and not good.run_last_good
    assert (good.state.last_good_generation, good.state.last_good_hash) == (2, "h2")
    assert good.state.trying_hash is None
    assert "generation 2 (config h2) committed a batch" in good.message and "generation 3 is tried next" in good.message
    # The next reconcile tries generation 3; the driver refuses it: back to generation 2.
    trying3 = decide(_facts(**facts), good.state)
    assert trying3.action == "keep" and trying3.state.trying_hash == "h3"
    refused = replace(runs_h2, refused_config_hash="h3", refused_message="TransformInvalid: spec.transform.sql: x")
    back = decide(_facts(**{**facts, "driver": refused}), trying3.state)
    assert back.action == "rollBack" and "running the config of generation 2 (h2)" in back.message
    # Without the stored copy there is nothing to go back to but generation 1: generation 3 is tried as before.
    assert decide(_facts(**facts), tried).action == "keep"
    # Evidence of generation 2 is needed: a driver that moved on to generation 3 (or one without a commit of
    # generation 2) says nothing of it.
    assert decide(_facts(tried_stored=True, **{**facts, "driver": _in_place("h3", NOW - 5_000),
                                                "report": _committed("d-p1", snapshot=None)}), tried).action == "keep"
    assert decide(_facts(tried_stored=True, **{**facts, "report": _committed("d-p1", snapshot=None)}),
                  tried).action == "keep"
