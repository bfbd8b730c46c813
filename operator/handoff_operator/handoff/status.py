"""The decide step of a StreamTableHandoff reconcile: observed facts in, the new status and Events out (pure).

handlers.reconcile reads like kopf's own processing: gather the facts (API server, driver report, ledger,
Kafka), decide here with no I/O, then act (patch the status when it differs, post the Events, set gauges).
The status is built through the typed `StreamTableHandoffStatus` model, so a field the CRD does not have,
or a value of the wrong type, fails here in a unit test instead of being pruned by the API server.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from handoff_operator.retention import report as retention_report
from handoff_operator.truth import driver_report
from handoff_operator.conditions import (DriverFacts, DriverReport, Facts, ProgressFacts, evaluate, iso, iso_ms,
                                         live_report, merge_conditions, transitions)
from handoff_operator.models import StreamTableHandoffStatus, format_duration
from handoff_operator.upgrade.step import overlay

Event = tuple[str, str, str]  # (type, reason, message)


@dataclass(frozen=True)
class Observed:
    """Everything the decision needs, gathered by the handlers (plain data)."""

    generation: int
    status: Mapping[str, Any]                 # the status as read (the merge base)
    app: Mapping[str, Any]                    # status.app after this reconcile's children step
    facts: Facts                              # for conditions.evaluate
    upgrade_decision: Any = None              # rollback.Step.decision (None: no rollout step this time)
    upgrade_status: Mapping[str, Any] | None = None
    retained: Any = None                      # retention_check.Report
    refresh_truth: bool = False               # the ledger and Kafka were read this time
    executors: Mapping[str, Any] | None = None
    report_read: bool = False                 # the driver's progress ConfigMap could be read
    events: Sequence[Event] = ()              # from the children step (restart, rollback, PVC, scaling)
    now: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc))


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
    evaluation = overlay(evaluate(facts), seen.upgrade_decision, facts.driver)
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


__all__ = ["Observed", "Decision", "decide", "differs", "worth_writing", "status_progress", "progress_status", "app_status",
           "DriverReport"]
