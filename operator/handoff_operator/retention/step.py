"""The retention check of one handoff, in reconcile's three steps: gather (`gather`: the topics' facts), decide
(`decide`, pure: verdicts and raises), act (`act`: enforce, then the check as it stands), and the report into
conditions, status and gauges (`report`, pure).

Gather (`retention_kafka.topic_facts`) costs a DescribeConfigs, three ListOffsets and a record sample, so
it runs at most every HANDOFF_RETENTION_CHECK_INTERVAL per handoff (and at once when the parts of the
spec it depends on change); between checks `gather` returns None and the status keeps the last answer.
Data loss needs only the ledger position and Kafka's earliest offsets, which every refresh reads anyway,
so it is decided on every refresh.

Enforce (`spec.retention.mode: enforce`) only ever raises `retention.ms`, to the need rounded up to whole
hours: in the KafkaTopic when Strimzi manages the topic, else in Kafka. A refusal (Kafka ACL, apiserver
403) becomes the condition's message; nothing is raised past it.
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from confluent_kafka import KafkaException
from kubernetes import client
from kubernetes.client.rest import ApiException

from handoff_spark.config import AppConfig

from handoff_operator.retention import kafka as retention_kafka
from handoff_operator.retention import report as retention_report
from handoff_operator.retention import strimzi
from handoff_operator.conditions import Condition, ProgressFacts, Transition
from handoff_operator.models import StreamTableHandoffSpec
from handoff_operator.retention.rule import (LostRange, Requirement, TopicFacts, TopicVerdict, lost_from_offsets, may_raise,
                                            verdict)
from handoff_operator.retention.report import EnforceOutcome, RetentionCheck
from handoff_operator.runtime.settings import OperatorSettings
from handoff_operator.runtime.state import HandoffMemory

#: Per handoff: the parts of the spec the last check depended on (`_signature`) and when it ran (monotonic).
_last: HandoffMemory[tuple[tuple[Any, ...], float]] = HandoffMemory("retention.checked")


def requirement(spec: StreamTableHandoffSpec) -> Requirement:
    return Requirement(spec.replay_window_seconds, spec.replay_max_outage_seconds,
                       enforce=spec.retention.mode == "enforce")


def _signature(spec: StreamTableHandoffSpec) -> tuple[Any, ...]:
    return (spec.source.bootstrap_servers, tuple(spec.source.topics), spec.replay.window, spec.replay.max_outage,
            spec.retention.mode)


def _due(namespace: str, name: str, spec: StreamTableHandoffSpec, interval: float) -> bool:
    last = _last.get((namespace, name))
    return last is None or last[0] != _signature(spec) or time.monotonic() - last[1] >= interval


def _checked(namespace: str, name: str, spec: StreamTableHandoffSpec) -> None:
    _last.set((namespace, name), (_signature(spec), time.monotonic()))


def _enforce(config: AppConfig, facts: TopicFacts, target_ms: int, api: client.ApiClient,
             settings: OperatorSettings) -> EnforceOutcome:
    topic, current = facts.topic, facts.retention_ms
    try:
        refs = strimzi.find(api, topic, settings.kafka_topic_namespaces)
        if len(refs) > 1:
            return EnforceOutcome(topic, "failed", current, None, "KafkaTopic",
                                  f"{len(refs)} KafkaTopics name the topic ({', '.join(map(str, refs))}): raise "
                                  f"retention.ms in the one that manages it")
        if refs:
            ref = refs[0]
            if ref.retention_ms is not None and not may_raise(ref.retention_ms, target_ms):
                return EnforceOutcome(topic, "pending", ref.retention_ms, ref.retention_ms, str(ref))
            strimzi.patch_retention(api, ref, target_ms)
            return EnforceOutcome(topic, "patched", ref.retention_ms if ref.retention_ms is not None else current,
                                  target_ms, str(ref))
        retention_kafka.raise_retention_ms(config, topic, target_ms)
        return EnforceOutcome(topic, "raised", current, target_ms, "Kafka")
    except (strimzi.KafkaTopicRefused, retention_kafka.RetentionRefused) as exc:
        where = "KafkaTopic" if isinstance(exc, strimzi.KafkaTopicRefused) else "Kafka"
        return EnforceOutcome(topic, "refused", current, None, where, str(exc))
    except (KafkaException, ApiException, OSError) as exc:
        return EnforceOutcome(topic, "failed", current, None, "Kafka", f"{type(exc).__name__}: {exc}")


@dataclass(frozen=True)
class TopicsRead:
    """The topics' retention facts as one due check read them (`gather`), or why they could not be read."""

    now_ms: int
    facts: Mapping[str, TopicFacts] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True)
class Raise:
    """A topic whose retention enforce mode raises to `target_ms`."""

    facts: TopicFacts
    target_ms: int


@dataclass(frozen=True)
class Plan:
    """What one check decided (`decide`, pure): each topic's verdict and the raises enforce mode makes."""

    read: TopicsRead
    verdicts: tuple[TopicVerdict, ...] = ()
    raises: tuple[Raise, ...] = ()


def gather(namespace: str, name: str, spec: StreamTableHandoffSpec, config: AppConfig, progress: ProgressFacts,
           settings: OperatorSettings) -> TopicsRead | None:
    """The topics' facts when a check is due, else None (the status keeps the last answer). Reads only. Never
    raises: a failed read is the check's error (RetentionSufficient=Unknown), tried again at the next interval like
    a success, so an unreachable cluster does not add its timeouts to every refresh. Not tried while this refresh
    could not read Kafka's offsets at all (Degraded=StatusUnavailable already says so)."""
    if progress.end_offsets is None or not _due(namespace, name, spec, settings.retention_check_interval):
        return None
    now_ms = int(time.time() * 1000)
    _checked(namespace, name, spec)
    try:
        facts = retention_kafka.topic_facts(config, progress.committed_offsets, now_ms,
                                            config_max_age=settings.retention_check_interval,
                                            end=progress.end_offsets, earliest_offsets=progress.earliest_offsets)
    except Exception as exc:  # noqa: BLE001 - reported in the status, never raised
        return TopicsRead(now_ms, error=f"{type(exc).__name__}: {exc}")
    return TopicsRead(now_ms, facts)


def decide(spec: StreamTableHandoffSpec, read: TopicsRead) -> Plan:
    """Each topic's verdict and, in enforce mode, the raises of those that keep records too briefly (pure)."""
    if read.error is not None:
        return Plan(read)
    need = requirement(spec)
    verdicts: list[TopicVerdict] = []
    raises: list[Raise] = []
    for topic in spec.source.topics:
        topic_facts = read.facts[topic]
        result = verdict(topic_facts, need, read.now_ms)
        if need.enforce and not result.sufficient and may_raise(topic_facts.retention_ms, result.target_retention_ms):
            raises.append(Raise(topic_facts, result.target_retention_ms))  # type: ignore[arg-type]
        verdicts.append(result)
    return Plan(read, tuple(verdicts), tuple(raises))


def checked(spec: StreamTableHandoffSpec, plan: Plan, enforced: Sequence[EnforceOutcome] = ()) -> RetentionCheck:
    """The check as the status reports it (pure): the plan's verdicts, a raised topic's taken again with the
    retention it has now."""
    read = plan.read
    if read.error is not None:
        return RetentionCheck(read.now_ms, errors=(read.error,))
    need = requirement(spec)
    raised = {o.topic: o for o in enforced if o.action == "raised"}
    verdicts = tuple(verdict(replace(read.facts[v.topic], retention_ms=raised[v.topic].after_ms), need, read.now_ms)
                     if v.topic in raised else v for v in plan.verdicts)
    return RetentionCheck(read.now_ms, verdicts, tuple(enforced),
                          cleanup_policies={t: ",".join(f.cleanup_policy) for t, f in read.facts.items()})


def act(config: AppConfig, spec: StreamTableHandoffSpec, plan: Plan, api: client.ApiClient,
        settings: OperatorSettings) -> RetentionCheck:
    """Raise what the plan says (only ever up: in the KafkaTopic when Strimzi manages the topic, else in Kafka),
    then the check as it stands after it."""
    enforced = [_enforce(config, r.facts, r.target_ms, api, settings) for r in plan.raises]
    return checked(spec, plan, enforced)


@dataclass(frozen=True)
class Report:
    conditions: tuple[Condition, ...] = ()
    events: list[Transition] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)   # merged into the status patch
    gauges: tuple[RetentionCheck | None, Sequence[LostRange] | None] | None = None  # for metrics.set_retention


def report(spec: StreamTableHandoffSpec | None, check: RetentionCheck | None, progress: ProgressFacts | None,
           old_conditions: Sequence[Mapping[str, Any]]) -> Report:
    """Conditions, Events, `status.retention` and what the gauges show, from this refresh's check (None: nothing
    new) and the truth's progress (None: not read this time, e.g. a change handler). Pure."""
    lost = None
    if progress is not None and progress.earliest_offsets is not None:
        lost = lost_from_offsets(progress.committed_offsets, progress.earliest_offsets)
    if spec is None or (check is None and lost is None):
        return Report()
    conditions = retention_report.conditions(check, lost, spec.source.on_offset_out_of_range)
    status = retention_report.status(check, lost)
    return Report(conditions, retention_report.events(old_conditions, conditions, check),
                  {"retention": status} if status else {}, (check, lost))
