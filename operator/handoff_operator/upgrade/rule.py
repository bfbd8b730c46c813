"""Automatic rollback of a failed upgrade: keep, mark good, or roll back (pure; no I/O).

A spec change is an upgrade of the running app. The operator cannot know in advance whether the new app
config works, so it learns it the only way that counts: a spec is *good* once a driver of its config has
committed a batch to the table. Until then the change is being *tried*; if its driver crash-loops, or
neither commits nor becomes ready within the readiness timeout, the operator goes back to the last good
spec's app config (`rollback.py` renders the children from it) and says so (Degraded=True reason
UpgradeRolledBack, an Event). The user's spec is never rewritten (Argo CD would put it back): the last good
config runs until the spec changes again (a new generation), which is then tried afresh.

Evidence that a config committed, both read from what the operator already sees:
- the driver's published progress record (`<name>-progress`) from the current driver pod, whose config
  hash is the tried one, naming a committed table snapshot (its last batch's, or the newest a batch of that config
  committed: an idle stream's empty batches commit none);
- a ledger commit (the table's truth) newer than the start of that driver pod (a commit the old driver
  finished while stopping is older: the Deployment's Recreate strategy starts the new pod after the old
  one is gone).

The readiness clock runs while the tried driver is not ready, or is ready while records wait; a ready
driver with nothing to commit (lag 0) has nothing to prove, so the clock is stopped (and restarts from
zero when records arrive). A suspended handoff runs nothing, so it neither proves nor fails anything; nor
does a driver a ReplayRequest holds at 0 replicas while it rewinds the table (`held`): the clock stops and
starts from zero once the driver runs again, so a replay never rolls back the spec change it follows.

When the spec changes again before the tried change was seen committing, and the driver still runs the tried
config and committed a batch of it, the tried change becomes the last good spec first (its copy stored when it
started being tried: `step.py`), so a rollback of the newer change does not undo one that worked.

`decide` is the whole policy; the state it reads and returns is what `status.upgrade` and
`status.lastGoodGeneration` hold, so an operator restart continues where it stopped.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from handoff_operator.conditions import (CRASH_REASONS, DEGRADED, DRIVER_FAILING_REASONS, PROGRESSING, READY,
                                         Condition, DriverFacts, DriverReport, Evaluation, refusal_reason)
from handoff_operator.models import format_duration
from handoff_operator.models.stream_table_handoff import RolledBackReason

UPGRADE_ROLLED_BACK = "UpgradeRolledBack"
# The container waiting reason of a driver that crashed and is waiting to be restarted: transient once,
# a crash loop after `crash_restarts` restarts. Other CRASH_REASONS (image, config errors) never heal.
CRASH_LOOP_BACK_OFF = "CrashLoopBackOff"
# Pod startTime has second precision; a commit must be clearly after the pod started to be its own.
START_SLACK_MS = 1000

Action = Literal["keep", "markGood", "rollBack"]


@dataclass(frozen=True)
class UpgradeState:
    """What the status remembers (`status.lastGoodGeneration` + `status.upgrade`)."""

    last_good_generation: int | None = None
    last_good_hash: str | None = None
    trying_generation: int | None = None
    trying_hash: str | None = None
    trying_since_ms: int | None = None       # None: the readiness clock is not running
    rolled_back_generation: int | None = None
    rolled_back_hash: str | None = None
    rolled_back_reason: RolledBackReason | None = None
    rolled_back_at_ms: int | None = None
    message: str | None = None


@dataclass(frozen=True)
class UpgradeFacts:
    generation: int
    desired_hash: str                       # config hash the current spec renders to
    suspended: bool
    now_ms: int
    timeout_seconds: float
    crash_restarts: int
    auto_rollback: bool = True
    driver: DriverFacts | None = None       # the driver pod now (None: no Deployment yet)
    report: DriverReport | None = None      # the driver's published progress record
    ledger_committed_at_ms: int | None = None   # newest ledger commit of this handoff (None: unknown)
    lag: int | None = None                  # records waiting in Kafka (None: unknown)
    last_good_available: bool = True        # the last good spec is stored and still renders
    held: bool = False                      # a ReplayRequest holds the driver at 0 replicas (replay-hold)
    desired_pod_hash: str | None = None     # its pod template's hash (without the query-only part; None: the same)
    tried_stored: bool = False              # the spec of the tried config (state.trying_hash) is stored (step.py)


@dataclass(frozen=True)
class Decision:
    action: Action
    state: UpgradeState
    run_last_good: bool        # render the children from the last good spec, not the current one
    message: str = ""          # for the Event of a markGood/rollBack
    good_from_tried: bool = False  # markGood of the config tried before the current spec (its stored copy)


def committed_by(facts: UpgradeFacts, config_hash: str) -> bool:
    """Has a driver of `config_hash` committed a batch? (See the module docstring for the evidence.) A driver that
    changed its query in place reports the config it runs and since when (DriverFacts.with_report): its record
    names a snapshot only once a batch of that config committed, and a ledger commit counts from that moment."""
    driver = facts.driver
    desired_pod = facts.desired_pod_hash if config_hash == facts.desired_hash else None
    if driver is None or driver.pod_name is None or not driver.runs(config_hash, desired_pod):
        return False
    report = facts.report
    if report is not None and report.driver_pod == driver.pod_name and (
            report.committed_snapshot is not None or report.config_committed_snapshot is not None):
        return True
    started = driver.config_started_at_ms
    return (facts.ledger_committed_at_ms is not None and started is not None and
            facts.ledger_committed_at_ms >= started + START_SLACK_MS)


def crash_loop(driver: DriverFacts, crash_restarts: int) -> str | None:
    """Why the driver cannot run as configured (None: it is not crash-looping)."""
    if driver.pod_phase == "Failed":
        return driver.last_termination_reason or "Failed"
    reason = driver.waiting_reason
    if reason not in CRASH_REASONS:
        return None
    if reason == CRASH_LOOP_BACK_OFF and driver.restart_count < crash_restarts:
        return None
    return reason


def _rolled_back(state: UpgradeState, facts: UpgradeFacts,
                 reason: RolledBackReason,
                 what: str) -> Decision:
    message = (f"generation {facts.generation} (config {facts.desired_hash}) {what}; running the config of "
               f"generation {state.last_good_generation} ({state.last_good_hash}), the last one that committed "
               f"a batch, until the spec changes again")
    return Decision("rollBack", replace(
        state, trying_generation=None, trying_hash=None, trying_since_ms=None,
        rolled_back_generation=facts.generation, rolled_back_hash=facts.desired_hash, rolled_back_reason=reason,
        rolled_back_at_ms=facts.now_ms, message=message), run_last_good=True, message=message)


def decide(facts: UpgradeFacts, state: UpgradeState) -> Decision:
    # A rollback holds until the spec changes (a new generation); then the new spec is tried. (Also when
    # the last good spec can no longer be rendered, e.g. a Secret it names was deleted: the current one runs.)
    if state.rolled_back_generation is not None:
        if facts.generation == state.rolled_back_generation and facts.last_good_available:
            return Decision("keep", state, run_last_good=True)
        state = replace(state, rolled_back_generation=None, rolled_back_hash=None, rolled_back_reason=None,
                        rolled_back_at_ms=None, message=None)

    tried = state.trying_hash
    if (tried is not None and state.trying_generation is not None and tried not in (facts.desired_hash,
                                                                                   state.last_good_hash)
            and facts.tried_stored and committed_by(facts, tried)):
        # The spec changed again before the change tried until now was seen committing, which it did (its driver
        # runs it, in place, and a batch of it committed): that one is the last good spec, not the one before it,
        # which a rollback of the new change would otherwise restore. The new spec is tried from the next reconcile.
        message = (f"generation {state.trying_generation} (config {tried}) committed a batch: it is now the spec a "
                   f"failed change is rolled back to (generation {facts.generation} is tried next)")
        return Decision("markGood", replace(
            state, last_good_generation=state.trying_generation, last_good_hash=tried, trying_generation=None,
            trying_hash=None, trying_since_ms=None, message=None), run_last_good=False, message=message,
            good_from_tried=True)

    if committed_by(facts, facts.desired_hash) and (state.last_good_generation != facts.generation or
                                                    state.last_good_hash != facts.desired_hash):
        if state.last_good_hash == facts.desired_hash and state.last_good_generation is not None:
            # A spec change that leaves the app config as it was: nothing new committed (the timeline drill of
            # issue 35 read "generation 2 committed a batch" at the very moment of the change).
            message = (f"generation {facts.generation} runs the app config of generation "
                       f"{state.last_good_generation} (config {facts.desired_hash}), which committed a batch: it "
                       f"is now the spec a failed change is rolled back to")
        else:
            message = (f"generation {facts.generation} (config {facts.desired_hash}) committed a batch: it is now "
                       f"the spec a failed change is rolled back to")
        return Decision("markGood", replace(
            state, last_good_generation=facts.generation, last_good_hash=facts.desired_hash,
            trying_generation=None, trying_hash=None, trying_since_ms=None, message=None),
            run_last_good=False, message=message)

    if facts.desired_hash == state.last_good_hash:
        # The known good config (again): nothing to prove.
        return Decision("keep", replace(state, trying_generation=None, trying_hash=None, trying_since_ms=None,
                                        message=None), run_last_good=False)

    if state.trying_hash != facts.desired_hash:
        state = replace(state, trying_hash=facts.desired_hash, trying_since_ms=None)
    state = replace(state, trying_generation=facts.generation)
    if facts.suspended or facts.held:
        return Decision("keep", replace(state, trying_since_ms=None), run_last_good=False)

    driver = facts.driver
    ours = driver is not None and driver.runs(facts.desired_hash, facts.desired_pod_hash)
    can_roll_back = facts.auto_rollback and state.last_good_hash is not None and facts.last_good_available
    if (can_roll_back and driver is not None and driver.refused_config_hash == facts.desired_hash
            and driver.refused_message and not ours):
        # The running driver refused the changed query config and still runs the one before: waiting cannot help.
        return _rolled_back(state, facts, refusal_reason(driver.refused_message), (
            f"was refused by the running driver pod {driver.pod_name} ({driver.refused_message.strip()[:300]})"))
    if ours and can_roll_back:
        assert driver is not None
        crash = crash_loop(driver, facts.crash_restarts)
        if crash:
            detail = (driver.last_termination_message or driver.last_termination_reason or "").strip()
            return _rolled_back(state, facts, "CrashLoop", (
                f"crash-looped ({crash}, {driver.restart_count} restarts"
                + (f": {detail[:300]}" if detail else "") + ")"))

    idle = ours and driver is not None and driver.pod_ready and facts.lag == 0
    if idle:
        return Decision("keep", replace(state, trying_since_ms=None), run_last_good=False)
    since = state.trying_since_ms if state.trying_since_ms is not None else facts.now_ms
    state = replace(state, trying_since_ms=since)
    if can_roll_back and facts.now_ms - since >= facts.timeout_seconds * 1000:
        if driver is None or not ours:
            where = "its driver pod was not created"
        elif not driver.pod_ready:
            where = f"driver pod {driver.pod_name} is not ready ({driver.pod_phase or 'no phase'})"
        else:
            where = f"driver pod {driver.pod_name} is ready but committed nothing while {facts.lag} records wait" \
                if facts.lag is not None else f"driver pod {driver.pod_name} is ready but committed nothing"
        return _rolled_back(state, facts, "ReadinessTimeout", (
            f"did not commit a batch within {format_duration(facts.timeout_seconds)} ({where})"))
    return Decision("keep", state, run_last_good=False)


def overlay(evaluation: Evaluation, decision: Decision | None, driver: DriverFacts | None = None,
            last_good_pod: str | None = None) -> Evaluation:
    """The conditions while the last good config runs instead of the current spec: Degraded=True reason
    UpgradeRolledBack (unless the last good driver fails too: DriverFailing says more; the failed config's
    pod, crashing until the rollback replaces it, does not count), Progressing does not claim the
    current generation runs, and a restart says it goes back to the last good config (not "to apply" the
    generation it leaves: the timeline showed that right after the rollback)."""
    if decision is None or not decision.run_last_good:
        return evaluation
    message = decision.state.message or "the current spec was rolled back"
    state = decision.state
    back = (f"restarting the driver with the config of generation {state.last_good_generation} "
            f"({state.last_good_hash}), the last one that committed a batch"
            + (f": generation {state.rolled_back_generation} was rolled back"
               if state.rolled_back_generation is not None else ""))
    # The failed config's pod: it says it runs that config, or (before it reports) its pod template is not the last
    # good config's (`last_good_pod`: that template's hash, which leaves the query's own settings out).
    failed_pod = driver is not None and (
        driver.config_hash == decision.state.rolled_back_hash
        or (last_good_pod is not None and driver.config_hash is not None
            and not driver.runs(state.last_good_hash, last_good_pod)))
    # The last good config's own driver failing: its Progressing=Restarting names the failure; kept.
    last_good_failing = not failed_pod and any(c.type == READY and c.status == "False" and c.reason in
                                               DRIVER_FAILING_REASONS for c in evaluation.conditions)
    conditions: list[Condition] = []
    degraded_overlaid = False
    for cond in evaluation.conditions:
        urgent = cond.status == "True" and (cond.reason in DRIVER_FAILING_REASONS or cond.reason == "InvalidSpec") \
            and not failed_pod
        if cond.type == DEGRADED and not urgent:
            cond = Condition(DEGRADED, "True", UPGRADE_ROLLED_BACK, message)
            degraded_overlaid = True
        elif cond.type == PROGRESSING and cond.status == "False":
            cond = Condition(PROGRESSING, "False", UPGRADE_ROLLED_BACK, message)
        elif cond.type in (READY, PROGRESSING) and cond.reason == "Restarting" and not last_good_failing:
            cond = Condition(cond.type, cond.status, cond.reason, back)
        conditions.append(cond)
    phase = "Degraded" if degraded_overlaid and evaluation.phase == "Running" else evaluation.phase
    return Evaluation(phase, tuple(conditions))
