"""Executor autoscaling in reconcile's three steps: gather (`measure`: the facts into the kept measurements),
decide (`decide_step`, pure: `scaling.rule.decide`, the status block and the Event), act (`act`: the desired count
for the driver, the gauges).

Facts: lag per partition and Kafka's end offsets (from the truth the refresh read), the input rate (growth of
the end offsets between two reads of them, remembered here), the processing rate per executor (the driver's last
busy batches: rows / wall time / executors, the best of the last RATE_WINDOW_MS), the current count (`status.executors.desired`) and the last change
(`status.executors.lastScaleTime`). What is remembered in this process only (the previous end offsets, the
last measured rate, the stabilization window) is lost on an operator restart; the rule then holds until it
has measured again, never guesses.

Act: `status.executors.{desired,lastScaleTime,reason,message}`, an Event per change, the gauges, and the
annotation `handoff.io/desired-executors` on the ConfigMap `<name>-progress`, which the driver polls and
applies live (handoff_spark.driver.executor_scaler).
"""
from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client.rest import ApiException

from handoff_spark import ledger
from handoff_spark.contract import DESIRED_EXECUTORS_ANNOTATION

from handoff_operator.runtime import metrics
from handoff_operator.conditions import DriverReport, ProgressFacts, iso_ms
from handoff_operator.runtime.kube import Kube
from handoff_operator.runtime.state import HandoffMemory
from handoff_operator.models import StreamTableHandoffSpec
from handoff_operator.spec.render import progress_configmap_name
from handoff_operator.scaling.rule import ScalingDecision, ScalingInput, decide

#: A batch smaller than this says more about fixed costs than about an executor's capacity.
MIN_BUSY_ROWS = 1000
#: How long a measured capacity stands. The estimate is the best per-executor rate of the batches in this
#: window: a batch's wall time includes fixed costs (planning, the commit) that do not shrink when executors
#: are added, so a small batch run by many executors understates what each can do. Taking the latest batch
#: alone locked a scaled-up job at its size (measured on the real node: 3 executors sharing 3,000-row batches
#: each "did" a third of what one did, so the input rate alone seemed to need all three, for good).
RATE_WINDOW_MS = 10 * 60 * 1000
#: How much older than two commit intervals the driver's last batch may be and still tell whether it keeps up
#: (the progress record travels through a ConfigMap the refresh reads every status interval).
BATCH_MAX_AGE_MS = 5000
#: What the Event of a change is called, by the decision's reason.
EVENT_REASONS = {"ScaleUp": "ScaledUp", "ScaleDown": "ScaledDown", "Bounds": "ScaledToBounds"}

log = logging.getLogger("handoff.operator.autoscale")


@dataclass
class _Memory:
    end_total: int | None = None
    end_at_ms: int | None = None
    input_rate: float | None = None
    rated_batch: int | None = None
    rates: tuple[tuple[int, float], ...] = ()  # (time, records/s per executor) of busy batches in the window
    history: tuple[tuple[int, int], ...] = ()
    annotated: int | None = None      # the desired count last written onto the ConfigMap by this process

    @property
    def rate_per_executor(self) -> float | None:
        """The best of `rates` (see RATE_WINDOW_MS); None before a busy batch was measured."""
        return max((r for _, r in self.rates), default=None)


_memory: HandoffMemory[_Memory] = HandoffMemory("scaling")


def lag_per_partition(progress: ProgressFacts) -> dict[str, int]:
    """`handoff_spark.ledger.lag_per_partition` keyed `topic/partition`, as the scaling decision takes it."""
    per = ledger.lag_per_partition(ledger.flat(progress.committed_offsets), ledger.flat(progress.end_offsets))
    return {f"{t}/{p}": n for (t, p), n in per.items()}


def _observe(memory: _Memory, progress: ProgressFacts | None, report: DriverReport | None, executors: int,
             now_ms: int) -> None:
    """Update the measured input rate and per-executor rate from this refresh's facts. `executors`: those
    running now, or the count asked for while none runs yet."""
    if progress is not None and progress.end_offsets:
        total = sum(int(o) for parts in progress.end_offsets.values() for o in parts.values())
        # Over the times the offsets were read, not the refreshes' (a refresh may reuse the cluster's last
        # snapshot: then there is no new measurement, and the rate stands; dividing by the refresh's time
        # measured 0/s, or twice the rate on the next one).
        at = progress.end_read_at_ms if progress.end_read_at_ms is not None else now_ms
        if memory.end_at_ms is None or at > memory.end_at_ms:
            if memory.end_total is not None and memory.end_at_ms is not None:
                memory.input_rate = max(0.0, (total - memory.end_total) * 1000 / (at - memory.end_at_ms))
            memory.end_total, memory.end_at_ms = total, at
    rates = tuple((t, r) for t, r in memory.rates if now_ms - t <= RATE_WINDOW_MS)
    if (report is not None and report.batch_id is not None and report.batch_id != memory.rated_batch
            and (report.rows or 0) >= MIN_BUSY_ROWS and report.input_rows_per_second and executors > 0
            and not report.first_of_driver):
        rates += ((now_ms, batch_rate(report) / executors),)
        memory.rated_batch = report.batch_id
    memory.rates = rates


def recent_batch(report: DriverReport | None, trigger_seconds: float, now_ms: int) -> dict[str, Any]:
    """The driver's last batch for `scaling.keeping_up` (duration, rows), if it finished within the last
    two commit intervals + BATCH_MAX_AGE_MS: an older one says nothing about a batch running long now. A
    driver's first batch paid the start-up costs and says nothing either."""
    if (report is None or report.duration_ms is None or report.timestamp_ms is None or report.first_of_driver
            or now_ms - report.timestamp_ms > 2 * trigger_seconds * 1000 + BATCH_MAX_AGE_MS):
        return {}
    return {"batch_seconds": report.duration_ms / 1000, "batch_rows": report.rows}


def batch_rate(report: DriverReport) -> float:
    """Records/s the executors processed in the batch: over its parallel part (`workMs`: Spark's addBatch
    minus the table commit) when the driver reports it, else over the whole batch (the record's rate)."""
    if report.work_ms and report.rows:
        return report.rows * 1000 / report.work_ms
    return float(report.input_rows_per_second or 0.0)


@dataclass(frozen=True)
class Measured:
    """What the kept measurements say after this reconcile's facts (`measure`)."""

    input_rate: float | None = None
    rate_per_executor: float | None = None
    history: tuple[tuple[int, int], ...] = ()
    annotated: int | None = None


@dataclass(frozen=True)
class Step:
    """The scaling step of one reconcile, as decided (`decide_step`) before anything is done."""

    status: dict[str, Any]                           # status.executors
    event: tuple[str, str, str] | None               # (type, reason, message) when the count changed
    desired: int
    running: int
    annotate: bool = False                           # write `desired` onto the driver's ConfigMap
    history: tuple[tuple[int, int], ...] | None = None   # the rule's history to keep (None: keep the kept one)


def _current(executors: Mapping[str, Any], spec: StreamTableHandoffSpec) -> int:
    previous = executors.get("desired")
    return int(previous) if previous is not None and "reason" in executors else spec.scaling.min_executors


def _usable(spec: StreamTableHandoffSpec, progress: ProgressFacts | None) -> ProgressFacts | None:
    """The truth the rule may scale on: none while Kafka is unreadable or nothing runs (only the bounds apply)."""
    return None if progress is None or progress.end_offsets is None or spec.suspend else progress


def measure(namespace: str, name: str, spec: StreamTableHandoffSpec, executors: Mapping[str, Any],
            progress: ProgressFacts | None, report: DriverReport | None, running: int, now_ms: int) -> Measured:
    """Gather: this reconcile's facts into the measurements kept per handoff (input rate, rate per executor), and
    what they say now. `progress`: this refresh's truth (None in change handlers); `running`: executor pods
    running now. Changes nothing but the measurements (the rule's history and the annotation are kept by `act`)."""
    memory = _memory.setdefault((namespace, name), _Memory)
    held = held_without_truth(executors, spec.scaling.min_executors, spec.scaling.max_executors, running) \
        if progress is None else None
    count = running or (int(held["desired"]) if held is not None else _current(executors, spec))
    _observe(memory, _usable(spec, progress), report, count, now_ms)
    return Measured(memory.input_rate, memory.rate_per_executor, memory.history, memory.annotated)


def decide_step(spec: StreamTableHandoffSpec, executors: Mapping[str, Any], progress: ProgressFacts | None,
                report: DriverReport | None, running: int, now_ms: int, measured: Measured) -> Step:
    """How many executors (pure): the `status.executors` block, the Event of a change and whether the driver's
    ConfigMap needs the count. Without this refresh's truth (a change handler) the last decision stands while it
    is within the bounds (held_without_truth); otherwise `scaling.rule.decide`."""
    if progress is None:
        held = held_without_truth(executors, spec.scaling.min_executors, spec.scaling.max_executors, running)
        if held is not None:
            return Step(held, None, int(held["desired"]), running)
    progress = _usable(spec, progress)
    current = _current(executors, spec)
    decision: ScalingDecision = decide(ScalingInput(
        now_ms=now_ms, current=current, min_executors=spec.scaling.min_executors,
        max_executors=spec.scaling.max_executors, target_catch_up_seconds=spec.target_catch_up_seconds,
        cooldown_seconds=spec.scaling_cooldown_seconds, cores_per_executor=spec.spark.executor.cores,
        lag=lag_per_partition(progress) if progress is not None else {},
        input_rate=measured.input_rate if progress is not None else None,
        rate_per_executor=measured.rate_per_executor, trigger_seconds=spec.commit_interval_seconds,
        max_records_per_batch=spec.source.max_records_per_batch,
        last_scale_ms=iso_ms(executors.get("lastScaleTime")), history=measured.history,
        **recent_batch(report, spec.commit_interval_seconds, now_ms)))
    status = {"current": running, "desired": decision.desired, "reason": decision.reason,
              "message": decision.message[:1024], "lastScaleTime": executors.get("lastScaleTime")}
    event = None
    changed = decision.desired != current
    if changed:
        status["lastScaleTime"] = dt.datetime.fromtimestamp(now_ms / 1000, dt.timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%SZ")
        event = ("Normal", EVENT_REASONS.get(decision.reason, "Scaled"), decision.message)
    return Step(status, event, decision.desired, running, annotate=changed or measured.annotated != decision.desired,
                history=decision.history if progress is not None else None)


def act(kube: Kube, namespace: str, name: str, step: Step) -> None:
    """Keep the rule's history, tell the driver the count (the annotation) and set the gauges."""
    memory = _memory.setdefault((namespace, name), _Memory)
    if step.history is not None:
        memory.history = step.history
    if step.annotate and _annotate(kube, namespace, name, step.desired):
        memory.annotated = step.desired
    metrics.set_executors(namespace, name, step.desired, step.running)


def held_without_truth(executors: Mapping[str, Any], min_executors: int, max_executors: int,
                       running: int) -> dict[str, Any] | None:
    """The last refresh's decision, as it stands, for a change handler (no lag or rate read): only `current`
    is new. A change handler re-deciding without measurements wrote a different reason/message than the refresh
    ("the input rate is not measured yet"), and each child event then cost two status writes, the handler's and
    the next refresh's putting it back (issue 16). None: no decision yet, or the bounds moved past it (then the
    rule applies them at once)."""
    desired = executors.get("desired")
    if desired is None or "reason" not in executors or not min_executors <= int(desired) <= max_executors:
        return None
    return {"current": running, "desired": int(desired), "reason": executors.get("reason"),
            "message": executors.get("message") or "", "lastScaleTime": executors.get("lastScaleTime")}


def _annotate(kube: Kube, namespace: str, name: str, desired: int) -> bool:
    """The driver's instruction: a merge patch of one annotation (the operator's apply never sets it)."""
    body = {"metadata": {"annotations": {DESIRED_EXECUTORS_ANNOTATION: str(desired)}}}
    try:
        kube.core.patch_namespaced_config_map(progress_configmap_name(name), namespace, body,
                                              field_manager="handoff-operator-scaling")
    except ApiException as exc:
        if exc.status != 404:  # not created yet: the next refresh writes it
            raise
        return False
    return True
