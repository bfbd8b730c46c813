"""From retention verdicts, enforcement outcomes and lost ranges to conditions, status and Events (pure).

Two conditions, beside Ready/Progressing/Degraded:
- `RetentionSufficient`: True when every topic keeps records at least as long as the handoff needs
  (retention.TopicVerdict); False with the topic, the need, what it has and the fix; False with reason
  EnforceRefused when enforce mode was refused (Kafka ACL, apiserver 403), saying what to grant;
  Unknown when the configs could not be read.
- `DataLoss`: True while a partition's ledger position is below Kafka's earliest offset, with the
  lost range and what the driver does about it (`source.onOffsetOutOfRange`).

Events: the handlers' `conditions.transitions` stays quiet about a condition's first appearance unless it
is Degraded, so these two get their own rule here: any change of status or reason is an Event, a first
appearance too when it is bad news.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from handoff_operator.conditions import Condition, Evaluation, Transition, condition_events
from handoff_operator.models.stream_table_handoff import RetentionStatus
from handoff_operator.retention.rule import DATA_LOSS, RETENTION_SUFFICIENT, LostRange, TopicVerdict


@dataclass(frozen=True)
class EnforceOutcome:
    """What enforce mode did for one topic."""

    topic: str
    action: str                     # raised (Kafka) / patched (KafkaTopic) / refused / failed
    before_ms: int | None
    after_ms: int | None
    where: str                      # "Kafka" or "KafkaTopic <namespace>/<name>"
    error: str | None = None


@dataclass(frozen=True)
class RetentionCheck:
    """One retention check of a handoff's topics (cached between checks by the I/O side)."""

    checked_at_ms: int
    verdicts: tuple[TopicVerdict, ...] = ()
    enforced: tuple[EnforceOutcome, ...] = ()
    errors: tuple[str, ...] = ()
    cleanup_policies: Mapping[str, str] | None = None


def _cond(type_: str, status: str, reason: str, message: str) -> Condition:
    return Condition(type_, status, reason, message[:8000])


def retention_condition(check: RetentionCheck) -> Condition:
    refused = [o for o in check.enforced if o.action in ("refused", "failed")]
    pending = [o for o in check.enforced if o.action in ("patched", "pending")]
    short = [v for v in check.verdicts if not v.sufficient]
    if check.errors and not check.verdicts:
        return _cond(RETENTION_SUFFICIENT, "Unknown", "RetentionUnknown",
                     "cannot check retention: " + "; ".join(check.errors))
    if refused:
        parts = []
        for o in refused:
            verdict = next((v for v in short if v.topic == o.topic), None)
            parts.append(f"could not raise retention.ms of topic {o.topic} in {o.where}: {o.error}"
                         + (f"; {verdict.message}; fix: {verdict.fix}" if verdict else ""))
        return _cond(RETENTION_SUFFICIENT, "False", "EnforceRefused", "; ".join(parts))
    if pending:
        return _cond(RETENTION_SUFFICIENT, "False", "WaitingForStrimzi", "; ".join(
            f"patched {o.where} spec.config retention.ms {o.before_ms} → {o.after_ms}; waiting for the Strimzi "
            f"Topic Operator to apply it to topic {o.topic}" for o in pending))
    if short:
        return _cond(RETENTION_SUFFICIENT, "False", "RetentionTooShort",
                     "; ".join(f"{v.message}; fix: {v.fix}" for v in short))
    raised = [o for o in check.enforced if o.action == "raised"]
    reason = ("RetentionRaised" if raised else
              "Compacted" if check.verdicts and all(not v.deletes for v in check.verdicts) else "Sufficient")
    prefix = "".join(f"raised retention.ms of topic {o.topic} from {o.before_ms} to {o.after_ms}; " for o in raised)
    return _cond(RETENTION_SUFFICIENT, "True", reason, prefix + "; ".join(v.message for v in check.verdicts))


def data_loss_condition(lost: Sequence[LostRange], on_offset_out_of_range: str) -> Condition:
    if not lost:
        return _cond(DATA_LOSS, "False", "NoDataLoss",
                     "every partition's ledger position is still in Kafka")
    ranges = ", ".join(str(r) for r in lost)
    then = ("the driver stops at these partitions (source.onOffsetOutOfRange=fail): set it to earliest to skip "
            "the lost range and record the gap, or restore the records and replay" if on_offset_out_of_range == "fail"
            else "the driver skips to Kafka's earliest offset and records the gap (Iceberg: in the batch's ledger "
                 "entry, handoff.lost; source.onOffsetOutOfRange=earliest)")
    return _cond(DATA_LOSS, "True", "RecordsDeleted",
                 f"Kafka deleted records before the handoff read them: {ranges}; {then}")


def degrade_on_data_loss(evaluation: Evaluation, fresh: Sequence[Condition],
                         old_conditions: Sequence[Mapping[str, Any]]) -> Evaluation:
    """DataLoss=True makes the handoff Degraded (reason DataLoss) unless it is already Degraded for another cause:
    dashboards and Argo CD read Degraded, and lost records are the worst news a handoff has. `fresh`: this
    refresh's retention conditions (none: the last known DataLoss condition stands). Pure."""
    loss = next((c for c in fresh if c.type == DATA_LOSS), None)
    if loss is None:
        old = next((c for c in old_conditions if c.get("type") == DATA_LOSS), None)
        loss = Condition(DATA_LOSS, old.get("status", "Unknown"), old.get("reason", ""), old.get("message", "")) \
            if old else None
    if loss is None or loss.status != "True":
        return evaluation
    if any(c.type == "Degraded" and c.status == "True" for c in evaluation.conditions):
        return evaluation
    conds = tuple(Condition("Degraded", "True", "DataLoss", loss.message) if c.type == "Degraded" else c
                  for c in evaluation.conditions)
    phase = "Degraded" if evaluation.phase == "Running" else evaluation.phase
    return Evaluation(phase, conds)


def conditions(check: RetentionCheck | None, lost: Sequence[LostRange] | None,
               on_offset_out_of_range: str) -> tuple[Condition, ...]:
    """The conditions these facts decide (None: not known this time; the old condition stays)."""
    out = []
    if check is not None:
        out.append(retention_condition(check))
    if lost is not None:
        out.append(data_loss_condition(lost, on_offset_out_of_range))
    return tuple(out)


def events(old: Sequence[Mapping[str, Any]] | None, new: Sequence[Condition],
           check: RetentionCheck | None) -> list[Transition]:
    """Events for these conditions' changes, plus one per retention.ms the operator raised or patched."""
    out = condition_events(old, new, abnormal=lambda c: (c.type == RETENTION_SUFFICIENT and c.status == "False")
                           or (c.type == DATA_LOSS and c.status == "True"))
    for o in (check.enforced if check is not None else ()):
        if o.action in ("raised", "patched"):
            out.append(Transition("Normal", "RetentionEnforced" if o.action == "raised" else "KafkaTopicPatched",
                                  f"retention.ms of topic {o.topic} {o.before_ms} → {o.after_ms} in {o.where}"))
    return out


def status(check: RetentionCheck | None, lost: Sequence[LostRange] | None) -> dict[str, Any]:
    """`status.retention` as a merge patch (only the parts known this time)."""
    out: dict[str, Any] = {}
    if check is not None:
        headrooms = [v.headroom_seconds for v in check.verdicts if v.deletes and v.headroom_seconds is not None]
        policies = check.cleanup_policies or {}
        out["checkedAt"] = dt.datetime.fromtimestamp(check.checked_at_ms / 1000, dt.timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%SZ")
        out["headroomSeconds"] = round(min(headrooms), 3) if headrooms else None
        out["topics"] = [{
            "topic": v.topic, "sufficient": v.sufficient, "needSeconds": round(v.need_seconds, 3),
            "haveSeconds": None if v.have_seconds is None else round(v.have_seconds, 3),
            "headroomSeconds": None if v.headroom_seconds is None else round(v.headroom_seconds, 3),
            "limitedBy": v.limited_by, "lagAgeSeconds": round(v.lag_age_seconds, 3),
            "cleanupPolicy": policies.get(v.topic, "delete")} for v in check.verdicts]
        # The typed model drops the None entries (merge patch would otherwise keep stale lists' shapes).
        out["topics"] = RetentionStatus.model_validate({"topics": out["topics"]}).to_dict().get("topics", [])
    if lost is not None:
        out["lost"] = [{"topic": r.topic, "partition": r.partition, "fromOffset": r.start, "toOffset": r.end}
                       for r in lost]
    return out
