"""The decide step of a StreamTableHandoff reconcile (pure): what to do to the world (`plan`), and the new status
and Events (`decide`).

handlers.reconcile reads like kopf's own processing: gather the facts (the handoff, its rendering, the API server,
the driver's report, the ledger, Kafka; `Gathered`), decide here with no I/O, then act. Two decisions, both here:
- `plan`, before anything is done: the rollout (keep, mark good or roll back: `upgrade.step.decide_step`), a
  controlled restart, the executor count (`scaling.step.decide_step`) and the retention raises
  (`retention.step.decide`);
- `decide`, last: the status and the Events, from the plan and what acting found (`observe`: the driver read back
  after a child changed, the retention a raise left), so the status says what is, not what was meant to be.
The status is built through the typed `StreamTableHandoffStatus` model, so a field the CRD does not have,
or a value of the wrong type, fails here in a unit test instead of being pruned by the API server.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from handoff_operator.conditions import (DriverFacts, DriverReport, Facts, ProgressFacts, evaluate, iso, iso_ms,
                                         live_report, merge_conditions, transitions)
from handoff_operator.handoff import cost as cost_figures
from handoff_operator.handoff.crash_backoff import crashed_pod_to_replace
from handoff_operator.models import StreamTableHandoffSpec, StreamTableHandoffStatus, format_duration
from handoff_operator.retention import report as retention_report
from handoff_operator.retention import step as retention_step
from handoff_operator.retention.report import RetentionCheck
from handoff_operator.runtime.settings import OperatorSettings
from handoff_operator.scaling import step as scaling_step
from handoff_operator.spec.render import REPLAY_ANNOTATION, Rendered
from handoff_operator.truth import driver_report
from handoff_operator.upgrade import step as upgrade_step
from handoff_operator.upgrade.step import overlay

Event = tuple[str, str, str]  # (type, reason, message)


@dataclass(frozen=True)
class Truth:
    """What a status refresh read of the ledger, Kafka and the topics' retention, outside the per-object lock. Read
    with the spec that runs (`spec`, `config`: the last good one while a failed change is rolled back)."""

    progress: ProgressFacts
    spec: StreamTableHandoffSpec
    config: Any                                 # the app config (handoff_spark.config.AppConfig)
    topics: retention_step.TopicsRead | None = None   # a due retention check's read (None: none due)


@dataclass(frozen=True)
class Gathered:
    """Everything one reconcile read before deciding (the gather step: nothing in the world changed yet)."""

    obj: Mapping[str, Any]                    # the handoff, as the merge base of its status
    spec: StreamTableHandoffSpec | None       # None: it does not parse
    problems: Sequence[Any]                   # validation.Problem
    rendered: Rendered | None                 # the current spec's children (None: it has problems)
    digests: tuple[str, ...] = ()             # of rendered.children (AppliedChildren.digest)
    deleting: bool = False
    refresh_truth: bool = False               # a status refresh: the ledger and Kafka were read (`truth`)
    truth: Truth | None = None
    report: DriverReport | None = None
    report_read: bool = False                 # the driver's progress ConfigMap could be read
    driver: DriverFacts | None = None         # before this reconcile's children step
    last_good: Rendered | None = None         # the last good spec's children, when they may be needed
    tried: upgrade_step.TriedCopy | None = None  # the stored copy of the spec tried until now, when it may be needed
    running: int = 0                          # executor pods running now
    measured: scaling_step.Measured | None = None
    settings: OperatorSettings = field(default_factory=OperatorSettings)
    now_ms: int = 0

    @property
    def acts_on_children(self) -> bool:
        """A workable spec of a handoff not being deleted: its children are rolled out, scaled."""
        return not self.deleting and self.rendered is not None and self.spec is not None


@dataclass(frozen=True)
class Plan:
    """What this reconcile does to the world, decided before anything is done."""

    rendered: Rendered | None = None          # the children to apply (the last good spec's while rolled back)
    upgrade: upgrade_step.Step | None = None
    app: Mapping[str, Any] = field(default_factory=dict)   # status.app after the children step
    restart: Event | None = None              # the Event of a controlled restart
    scaling: scaling_step.Step | None = None
    retention: retention_step.Plan | None = None
    #: A driver pod waiting out a crash back-off with another config than the one wanted: deleted, so that its
    #: Deployment starts a new one with it now (handoff.crash_backoff).
    replace_pod: str | None = None

    @property
    def rolls_out(self) -> bool:
        """The rollout changes what runs (a rollback, or marking the spec good)."""
        return self.upgrade is not None and self.upgrade.decision.action != "keep"


def restart(app: Mapping[str, Any], config_hash: str, suspended: bool, generation: int,
            rolling_back: bool, in_pod: str | None = None) -> tuple[dict[str, Any], Event | None]:
    """`status.app` after applying children of `config_hash`, and the Event of a restart: a config other than the
    one running restarts the driver (a rollback has its own Event; a suspended handoff runs nothing). `in_pod`: the
    driver pod that keeps running, when only the query-only part (the transform) changed: its query restarts."""
    out = dict(app)
    old_hash = out.get("configHash")
    changed = bool(old_hash) and old_hash != config_hash and not suspended
    if changed:
        out["restarts"] = int(out.get("restarts") or 0) + 1
    out["configHash"] = config_hash
    if not changed or rolling_back:
        return out, None
    if in_pod is not None:
        return out, ("Normal", "Restarting", (
            f"generation {generation} changed what the query does ({old_hash} → {config_hash}: its transform, "
            f"dedupe, event time, schema, dead-letter topic, replay window, source's servers, topics or query "
            f"settings, or pace): driver pod {in_pod} checks "
            f"it and restarts its query with it at a batch boundary"))
    return out, ("Normal", "Restarting", (
        f"generation {generation} changed the app config ({old_hash} → {config_hash}): stopping the driver at a "
        f"batch boundary, then starting it with the new config"))


def plan(seen: Gathered) -> Plan:
    """The rollout, a restart, the executor count and the retention raises, from what was gathered (pure)."""
    status = seen.obj.get("status") or {}
    app = dict(status.get("app") or {})
    truth = seen.truth
    retention = (retention_step.decide(truth.spec, truth.topics)
                 if truth is not None and truth.topics is not None else None)
    if not seen.acts_on_children:
        return Plan(app=app, retention=retention)
    assert seen.spec is not None and seen.rendered is not None
    progress = truth.progress if truth is not None else None
    upgrade = upgrade_step.decide_step(seen.obj, seen.spec, seen.rendered, status, seen.report, progress,
                                       seen.settings, seen.now_ms, seen.driver, seen.last_good, seen.tried)
    runs = upgrade.rendered
    driver = seen.driver
    in_pod = driver.pod_name if driver is not None and driver.restarts_query_in_place(runs.pod_hash) else None
    generation = int(seen.obj["metadata"].get("generation") or 0)
    before = app.get("configHash")
    app, restarting = restart(app, runs.config_hash, seen.spec.suspend, generation, upgrade.rolling_back, in_pod)
    replace_pod = crashed_pod_to_replace(driver, before, runs.config_hash, runs.pod_hash)
    if replace_pod is not None:
        assert driver is not None
        restarting = ("Normal", "CrashedDriverReplaced", (
            f"driver pod {replace_pod} waits out a crash back-off ({driver.restart_count} restarts) with config "
            f"{before}; {runs.config_hash} (generation {generation}) changes only what its query does: the pod is "
            f"deleted, so that a new one runs it now instead of after the back-off"))
    scaling = scaling_step.decide_step(
        seen.spec, status.get("executors") or {}, progress if seen.refresh_truth else None, seen.report,
        seen.running, seen.now_ms, seen.measured or scaling_step.Measured())
    return Plan(upgrade.rendered, upgrade, app, restarting, scaling, retention, replace_pod=replace_pod)


def observe(seen: Gathered, plan: Plan, driver: DriverFacts | None, retention: RetentionCheck | None,
            events: Sequence[Event], now: dt.datetime, now_ms: int) -> Observed:
    """The facts for the status decision (pure): the driver as acting left it, the progress (this refresh's truth,
    else the status's last known), the retention check as acting left it, the Events acting owes."""
    obj, spec = seen.obj, seen.spec
    rendered = plan.rendered if plan.rendered is not None else seen.rendered  # what runs (a rollback's, then)
    meta, status = obj["metadata"], obj.get("status") or {}
    generation = int(meta.get("generation") or 0)
    old_conditions = status.get("conditions") or []
    truth = seen.truth.progress if seen.truth is not None and rendered is not None else None
    facts = Facts(
        generation=generation,
        suspended=bool(spec.suspend) if spec is not None else False,
        desired_hash=rendered.config_hash if rendered is not None else None,
        desired_pod_hash=rendered.pod_hash if rendered is not None else None,
        invalid=[str(p) for p in seen.problems],
        driver=driver, progress=truth if truth is not None else status_progress(status),
        freshness_target_seconds=spec.freshness_target_seconds if spec is not None else None,
        deleting=seen.deleting, previous_hash=(status.get("app") or {}).get("configHash"),
        restart_in_progress=any(c.get("type") == "Progressing" and c.get("reason") == "Restarting"
                                for c in old_conditions),
        driver_report=seen.report, now_ms=now_ms,
        driver_report_max_age_seconds=seen.settings.driver_report_max_age,
        replay=(meta.get("annotations") or {}).get(REPLAY_ANNOTATION))
    retained = retention_step.report(spec if rendered is not None else None, retention, truth, old_conditions)
    upgrade = plan.upgrade
    # status.app names the newest driver pod this reconcile saw: the one acting left, else the one it found (a
    # rollback deletes a crash-looping pod before its replacement exists; that pod was missing from the timeline,
    # whose DriverReplaced then named the pod before it as the one replaced: the timeline drill of issue 35).
    return Observed(generation=generation, status=status, app=app_status(plan.app, seen.driver), facts=facts,
                    upgrade_decision=upgrade.decision if upgrade is not None else None,
                    upgrade_status=upgrade.status() if upgrade is not None else None, retained=retained,
                    refresh_truth=seen.refresh_truth,
                    executors=plan.scaling.status if plan.scaling is not None else None,
                    report_read=seen.report_read, events=list(events), now=now,
                    write_api_price_per_gib=seen.settings.bigquery_write_price_per_gib)


@dataclass(frozen=True)
class Observed:
    """Everything the decision needs, gathered by the handlers (plain data)."""

    generation: int
    status: Mapping[str, Any]                 # the status as read (the merge base)
    app: Mapping[str, Any]                    # status.app after this reconcile's children step
    facts: Facts                              # for conditions.evaluate
    upgrade_decision: Any = None              # upgrade.step.Step.decision (None: no rollout step this time)
    upgrade_status: Mapping[str, Any] | None = None
    retained: Any = None                      # retention.step.Report
    refresh_truth: bool = False               # the ledger and Kafka were read this time
    executors: Mapping[str, Any] | None = None
    report_read: bool = False                 # the driver's progress ConfigMap could be read
    events: Sequence[Event] = ()              # from the children step (restart, rollback, PVC, scaling)
    now: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc))
    write_api_price_per_gib: float = 0.0      # for status.cost's money estimate (settings)


@dataclass(frozen=True)
class Decision:
    status: dict[str, Any]                    # the merge patch body of `status` (null clears a key)
    phase: str | None
    events: list[Event]


def status_progress(status: Mapping[str, Any]) -> ProgressFacts:
    """The last known progress from the status (change handlers do not query the table and Kafka).

    That includes what the last refresh could *not* read: a child-triggered reconcile knows nothing new about the
    ledger or Kafka, so a Degraded=StatusUnavailable stands until the next refresh reads them (it flipped to
    AsExpected and back within a second before)."""
    committed = status.get("committed") or {}
    snapshot = committed.get("snapshot")
    unreadable = [c.get("message") or "status unavailable" for c in status.get("conditions") or []
                  if c.get("type") == "Degraded" and c.get("status") == "True"
                  and c.get("reason") == "StatusUnavailable"]
    # `at` kept as it was read, so a change handler's patch does not clear it (and the next refresh restore it).
    at_ms = iso_ms(committed.get("at"))
    return ProgressFacts(committed_snapshot=int(snapshot) if snapshot not in (None, "") else None,
                         committed_batch=committed.get("batch"), committed_at_ms=at_ms,
                         committed_offsets=committed.get("offsets"), lag=status.get("lag"),
                         freshness_seconds=status.get("freshnessSeconds"), errors=tuple(unreadable))


def progress_status(progress: ProgressFacts, clear_unknown: bool) -> dict[str, Any]:
    """`committed`, `lag`, `freshness*` from the progress; `clear_unknown`: unknown now = unknown (a refresh that
    could not read them clears what an earlier refresh found)."""
    out: dict[str, Any] = {}
    if progress.committed_snapshot is not None or progress.committed_offsets:
        at = (iso(dt.datetime.fromtimestamp(progress.committed_at_ms / 1000, dt.timezone.utc))
              if progress.committed_at_ms is not None else None)
        out["committed"] = {"snapshot": (str(progress.committed_snapshot)
                                         if progress.committed_snapshot is not None else None),
                            "batch": progress.committed_batch,
                            "offsets": dict(progress.committed_offsets or {}), "at": at}
    if clear_unknown:
        out.update(lag=None, freshness=None, freshnessSeconds=None)
    if progress.lag is not None:
        out["lag"] = progress.lag
    if progress.freshness_seconds is not None:
        out["freshnessSeconds"] = round(progress.freshness_seconds, 3)
        out["freshness"] = format_duration(progress.freshness_seconds)
    return out


def app_status(app: Mapping[str, Any], driver: DriverFacts | None) -> dict[str, Any]:
    out = dict(app)
    if driver is not None and driver.pod_name:
        out["driver"] = driver.pod_name
        if driver.last_termination_reason:
            detail = (driver.last_termination_message or "").strip()
            out["lastFailure"] = (driver.last_termination_reason + (f": {detail}" if detail else ""))[:4000]
    return out


def decide(seen: Observed) -> Decision:
    """Conditions (with the rollback overlay and retention's data-loss rule), the status and the Events."""
    facts = seen.facts
    old_conditions = seen.status.get("conditions") or []
    retained_conditions = list(seen.retained.conditions) if seen.retained is not None else []
    evaluation = overlay(evaluate(facts), seen.upgrade_decision, facts.driver,
                         facts.desired_pod_hash)  # a rollback's: the last good config's
    evaluation = retention_report.degrade_on_data_loss(evaluation, retained_conditions, old_conditions)
    conditions = merge_conditions(old_conditions, list(evaluation.conditions) + retained_conditions,
                                  seen.generation, iso(seen.now))
    events = list(seen.events)
    events += [(t.type, t.reason, t.message) for t in transitions(old_conditions, evaluation.conditions)]
    events += [(t.type, t.reason, t.message) for t in (seen.retained.events if seen.retained is not None else ())]

    status: dict[str, Any] = {
        "observedGeneration": seen.generation,
        "conditions": conditions,
        "app": app_status(seen.app, facts.driver),
        **progress_status(facts.progress, clear_unknown=seen.refresh_truth),
        **(seen.retained.status if seen.retained is not None else {}),
    }
    if evaluation.phase is not None:
        status["phase"] = evaluation.phase
    if seen.executors is not None:
        status["executors"] = dict(seen.executors)
    if seen.upgrade_status is not None:
        status.update(seen.upgrade_status)
    if seen.report_read:
        status["lastBatch"] = driver_report.last_batch_status(live_report(facts))  # None clears it
    cost = cost_figures.accumulate(seen.status.get("cost"), facts.driver_report, seen.now,
                                   seen.write_api_price_per_gib)
    if cost is not None:
        status["cost"] = cost
    typed = StreamTableHandoffStatus.model_validate(status)
    return Decision(typed.model_dump(mode="json", by_alias=True, exclude_unset=True), evaluation.phase,
                    _once_per_reason(events))


def _once_per_reason(events: Sequence[Event]) -> list[Event]:
    seen: set[str] = set()
    out = []
    for kind, reason, message in events:
        if reason not in seen:
            seen.add(reason)
            out.append((kind, reason, message[:1000]))
    return out


#: A status that differs from the stored one only in its freshness is written when the freshness moved by more
#: than this fraction or FRESHNESS_WRITE_MIN_SECONDS, whichever is more: an idle handoff's freshness grows every
#: refresh, and writing it each time made every refresh of every handoff an API write and a watch event (with the
#: fraction alone, every refresh of a handoff younger than ~10 intervals still was: issue 16). The
#: handoff_freshness_seconds gauge stays exact; conditions are decided from the fresh value, not the stored one.
FRESHNESS_WRITE_STEP = 0.1
FRESHNESS_WRITE_MIN_SECONDS = 60.0
FRESHNESS_KEYS = ("freshness", "freshnessSeconds")


def worth_writing(current: Mapping[str, Any], patch: Mapping[str, Any]) -> bool:
    """Patch the status? When anything but the freshness differs, or the freshness appeared, went, or moved by
    more than FRESHNESS_WRITE_STEP of its stored value and at least FRESHNESS_WRITE_MIN_SECONDS."""
    if differs(current, {k: v for k, v in patch.items() if k not in FRESHNESS_KEYS}):
        return True
    old, new = current.get("freshnessSeconds"), patch.get("freshnessSeconds")
    if old is None or new is None:
        return old is not None or new is not None
    return abs(float(new) - float(old)) > max(FRESHNESS_WRITE_STEP * float(old), FRESHNESS_WRITE_MIN_SECONDS)


def differs(current: Mapping[str, Any], patch: Mapping[str, Any]) -> bool:
    """Would this merge patch change anything? (No write, no watch event, when a refresh finds nothing new.)"""
    for key, value in patch.items():
        if isinstance(value, Mapping) and isinstance(current.get(key), Mapping):
            if differs(current[key], value):
                return True
        elif value is None:
            if current.get(key) is not None:
                return True
        elif current.get(key) != value:
            return True
    return False


__all__ = ["Gathered", "Observed", "Plan", "Truth", "Decision", "decide", "observe", "plan", "restart", "differs",
           "worth_writing", "status_progress", "progress_status", "app_status",
           "DriverReport"]
