"""Status conditions of a StreamTableHandoff, computed from observed facts (pure; no I/O), and the facts
themselves (`DriverFacts`, `ProgressFacts`, `DriverReport`, `Facts`) and status timestamps (`iso`, `iso_ms`).

The vocabulary every controller and decision folder shares, so it sits at the top: imports nothing of the
package; imported by `truth`, `runtime`, `scaling`, `upgrade`, `retention`, `replay` and `handoff`.

Conventions (Kubernetes API conventions, kstatus, Argo CD):
- every condition has type, status ("True"/"False"/"Unknown"), reason (CamelCase), message,
  lastTransitionTime (changes only when `status` changes) and observedGeneration;
- `Ready` is the summary users `kubectl wait` on; `Progressing` is True while the operator is moving
  the app towards the spec (first start, controlled restart, suspending); `Degraded` is True when the app
  runs but is not doing its job (crash loop, the sink reporting quota/transient trouble in the driver's
  own progress record, freshness target missed while records wait, truth sources unreachable);
- the top-level `status.observedGeneration` is set by the caller, so kstatus sees staleness.

The handlers gather `Facts` from the API server (incl. the driver's published progress record), the
ledger and Kafka, call `evaluate`, merge with
`merge_conditions` and emit one Event per entry of `transitions`.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from handoff_spark.contract import (DEGRADED_REASONS, REFUSAL_REASONS, SCHEMA_INCOMPATIBLE, SOURCE_INVALID,
                                    TRANSFORM_INVALID)

READY, PROGRESSING, DEGRADED = "Ready", "Progressing", "Degraded"

#: Reasons of a driver that fails now (`evaluate`): DriverFailing, or TransformInvalid when its last line says the
#: spec's transform cannot run (handoff_spark.driver.transform, exit 3), or the reason of a query config the running
#: driver refused (TransformInvalid, SchemaIncompatible, SourceInvalid). Someone must act on each.
DRIVER_FAILING_REASONS = frozenset({"DriverFailing", TRANSFORM_INVALID, SCHEMA_INCOMPATIBLE, SOURCE_INVALID})


def refusal_reason(line: str) -> str:
    """The reason a refused query config's line gives (`SchemaIncompatible: …`); TransformInvalid otherwise."""
    prefix = line.strip().split(":", 1)[0]
    return prefix if prefix in REFUSAL_REASONS else TRANSFORM_INVALID

# Container waiting/termination reasons that mean "the driver cannot run as configured".
CRASH_REASONS = frozenset({"CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "InvalidImageName",
                           "CreateContainerConfigError", "CreateContainerError", "RunContainerError",
                           "OOMKilled"})


@dataclass(frozen=True)
class DriverFacts:
    """What the API server says about the driver Deployment and its pod (None fields = unknown)."""

    desired_replicas: int = 0                  # spec.replicas of the Deployment
    replicas: int = 0                          # pods that exist (any hash)
    ready_replicas: int = 0
    updated_replicas: int = 0                  # pods of the current pod template
    rollout_observed: bool = True              # Deployment status.observedGeneration >= generation
    pod_name: str | None = None
    pod_phase: str | None = None               # Pending/Running/Succeeded/Failed
    pod_ready: bool = False
    pod_config_hash: str | None = None         # handoff.io/config-hash of the running pod
    pod_started_at_ms: int | None = None       # the pod's status.startTime (upgrade.committed_by)
    restart_count: int = 0
    waiting_reason: str | None = None
    last_termination_reason: str | None = None
    last_termination_message: str | None = None
    # What the driver pod reports of its own config (`with_report`): a transform, dedupe or event time changes in the
    # running driver (handoff_spark.driver.query_config), so its pod's annotation no longer says all it runs.
    running_config_hash: str | None = None     # the whole app config's hash it runs now
    running_since_ms: int | None = None        # since when (a ledger commit after it is that config's)
    refused_config_hash: str | None = None     # a config it refused to apply (its check failed)
    refused_message: str | None = None         # the refusal's one line (`TransformInvalid: …`, `SchemaIncompatible: …`)

    @property
    def config_hash(self) -> str | None:
        """The app config this driver runs: what it reports, else its pod's annotation."""
        return self.running_config_hash or self.pod_config_hash

    @property
    def config_started_at_ms(self) -> int | None:
        """When this driver started running its config: the pod's start, or a later change in place."""
        times = [t for t in (self.pod_started_at_ms, self.running_since_ms) if t is not None]
        return max(times) if times else None

    def restarts_query_in_place(self, desired_pod: str | None) -> bool:
        """Does this driver apply a config of pod template `desired_pod` by restarting its query, not its pod? It is
        ready, of that very template, and reports the config it runs (it takes the operator's query configs)."""
        return (self.pod_ready and self.running_config_hash is not None and desired_pod is not None and
                self.pod_config_hash == desired_pod)

    def runs(self, desired: str | None, desired_pod: str | None = None) -> bool:
        """Does this driver run config `desired`? What it reports says so; before it reports (a pod starting), its
        pod's template is the one `desired` renders to (`desired_pod`, the hash without the query-only part)."""
        if self.running_config_hash is not None:
            return self.running_config_hash == desired
        return self.pod_config_hash == (desired_pod or desired)


def with_report(driver: DriverFacts | None, report: DriverReport | None) -> DriverFacts | None:
    """The driver with what its own published record says of its config (pure). Only a record of this very pod
    counts: another pod's says nothing about this one."""
    if driver is None or report is None or driver.pod_name is None or report.driver_pod != driver.pod_name:
        return driver
    return replace(driver, running_config_hash=report.config_hash, running_since_ms=report.config_since_ms,
                   refused_config_hash=report.config_refused_hash, refused_message=report.config_refused)


@dataclass(frozen=True)
class ProgressFacts:
    """What the ledger (table) and Kafka say; None = not known (yet)."""

    committed_snapshot: int | None = None
    committed_batch: int | None = None
    committed_at_ms: int | None = None
    committed_offsets: Mapping[str, Mapping[str, int]] | None = None   # {topic: {partition: next}}
    end_offsets: Mapping[str, Mapping[str, int]] | None = None
    end_read_at_ms: int | None = None         # when end_offsets were read (a shared snapshot: truth.OffsetsRead)
    earliest_offsets: Mapping[str, Mapping[str, int]] | None = None   # Kafka's log start offsets
    lag: int | None = None
    max_event_time_ms: int | None = None
    freshness_seconds: float | None = None
    errors: Sequence[str] = ()                 # truth sources that could not be read, with why


@dataclass(frozen=True)
class DriverReport:
    """The driver's own progress record, as published into `<name>-progress` (progress.json).

    Used only for what the table and Kafka cannot tell: trouble the sink met while committing
    (`degraded_reason`, e.g. BigQueryResourceExhausted) and the last batch's numbers. Committed progress
    always comes from the ledger, never from here."""

    published_at_ms: int                     # the driver republishes every ~15 s: a heartbeat
    driver_pod: str | None = None
    batch_id: int | None = None
    degraded_reason: str | None = None
    degraded_detail: str | None = None       # the error behind it at the driver's start, one line (table_wait)
    timestamp_ms: int | None = None          # when the batch finished
    rows: int | None = None
    duration_ms: int | None = None
    input_rows_per_second: float | None = None
    work_ms: int | None = None               # the batch's parallel part (Spark's addBatch − the table commit)
    first_of_driver: bool = False            # the driver's first batch: it paid the start-up costs
    dlq_rows: int | None = None
    committed_snapshot: int | None = None    # the batch's table commit (upgrade.committed_by)
    #: What this driver committed since it started, running sums (`handoff_spark.driver.progress.Totals`:
    #: records, kafkaBytes, tableBytes, writeApiBytes, files, snapshots); None: not published.
    totals: Mapping[str, int] | None = None
    checkpoint_discarded: str | None = None  # why this driver discarded its checkpoint at start (resume)
    query_held: str | None = None            # the replay whose hold stopped this driver's query (driver.hold)
    query_holding: str | None = None         # the replay this driver is stopping its query for (a batch still runs)
    config_hash: str | None = None           # the app config it runs (handoff_spark.driver.query_config)
    config_since_ms: int | None = None       # since when
    config_committed_snapshot: int | None = None  # the newest commit a batch of that config made (through idle ones)
    config_refused: str | None = None        # a query config it refused: the one line
    config_refused_hash: str | None = None   # that config's hash


# What a sink's degradedReason means, for the condition message.
SINK_TROUBLE = DEGRADED_REASONS


@dataclass(frozen=True)
class Facts:
    generation: int
    suspended: bool
    desired_hash: str | None
    invalid: Sequence[str] = ()                # InvalidSpec messages ("spec.x: problem; fix: ...")
    desired_pod_hash: str | None = None        # the pod template's hash desired_hash renders to (None: the same)
    driver: DriverFacts | None = None          # None = no Deployment (yet)
    progress: ProgressFacts = field(default_factory=ProgressFacts)
    freshness_target_seconds: float | None = None
    deleting: bool = False
    previous_hash: str | None = None           # config hash the driver ran before this reconcile
    restart_in_progress: bool = False          # the last status said Progressing=Restarting
    driver_report: DriverReport | None = None  # None = nothing published (yet)
    now_ms: int = 0                            # the operator's clock, for the report's age
    driver_report_max_age_seconds: float = 60.0
    replay: str | None = None                  # the ReplayRequest rewinding the table now (annotation)


def iso(moment: dt.datetime) -> str:
    """A status timestamp (`lastTransitionTime`, `committed.at`, `executors.lastScaleTime`): UTC, whole seconds."""
    return moment.replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso_ms(value: Any) -> int | None:
    """Epoch ms of a status timestamp as `iso` writes it (None: absent or not a timestamp)."""
    if not value:
        return None
    try:
        return int(dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return None


def condition_true(status: Mapping[str, Any], type_: str) -> bool:
    """Does an object's `status.conditions` (a pod's, a handoff's: Kubernetes' convention) say `type_` is True?"""
    return any(c.get("type") == type_ and c.get("status") == "True" for c in status.get("conditions") or [])


def live_report(facts: Facts) -> DriverReport | None:
    """The driver's report if it speaks for the driver running now: published by the current driver pod
    (a report left by an earlier pod says nothing about this one) and not older than the max age (the
    driver republishes every ~15 s while it lives, so an old report means it stopped publishing)."""
    report, driver = facts.driver_report, facts.driver
    if report is None or driver is None:
        return None
    if report.driver_pod and driver.pod_name and report.driver_pod != driver.pod_name:
        return None
    if facts.now_ms - report.published_at_ms > facts.driver_report_max_age_seconds * 1000:
        return None
    return report


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str


@dataclass(frozen=True)
class Evaluation:
    phase: str | None          # None: leave the phase as it is (deleting)
    conditions: tuple[Condition, ...]


def _cond(type_: str, ok: bool | None, reason: str, message: str) -> Condition:
    status = "Unknown" if ok is None else ("True" if ok else "False")
    return Condition(type_, status, reason, message)


def evaluate(facts: Facts) -> Evaluation:
    """Phase + Ready/Progressing/Degraded from the facts. Order of checks = order of precedence.

    Phases are the CRD's: an unworkable spec is Failed (reason InvalidSpec), a controlled restart is
    Starting (Progressing reason Restarting)."""
    if facts.invalid:
        message = "; ".join(facts.invalid)
        return Evaluation("Failed", (
            _cond(READY, False, "InvalidSpec", message),
            _cond(PROGRESSING, False, "InvalidSpec", "waiting for a spec change: " + message),
            _cond(DEGRADED, True, "InvalidSpec", message),
        ))

    driver = facts.driver
    progress = facts.progress
    summary = _progress_summary(progress)

    if facts.deleting:
        return Evaluation(None, (
            _cond(READY, False, "Terminating", "stopping the driver; table and checkpoint are kept"),
            _cond(PROGRESSING, True, "Terminating", "stopping the driver at a batch boundary"),
            _cond(DEGRADED, False, "Terminating", "deleting"),
        ))

    if facts.replay is not None and not facts.suspended:
        return _replaying(facts)

    if facts.suspended:
        stopped = driver is None or driver.replicas == 0
        return Evaluation("Suspended", (
            _cond(READY, False, "Suspended", "spec.suspend is true; the driver is stopped" + summary),
            _cond(PROGRESSING, not stopped, "Suspending" if not stopped else "Suspended",
                  "waiting for the driver to stop at a batch boundary" if not stopped
                  else "suspended; resuming continues from the checkpoint"),
            _cond(DEGRADED, False, "Suspended", "suspended by spec.suspend"),
        ))

    if driver is None:
        return Evaluation("Pending", (
            _cond(READY, False, "DriverPending", "the driver Deployment does not exist yet"),
            _cond(PROGRESSING, True, "Creating", "creating the driver and its resources"),
            _cond(DEGRADED, False, "AsExpected", "starting"),
        ))

    crash = _crash_reason(driver)
    current = (driver.rollout_observed and driver.updated_replicas >= 1 and
               driver.replicas == driver.updated_replicas and
               (facts.desired_hash is None or driver.pod_config_hash is None or
                driver.runs(facts.desired_hash, facts.desired_pod_hash)))
    running = current and driver.pod_ready and driver.ready_replicas >= 1

    if crash:
        detail = driver.last_termination_message or driver.last_termination_reason or ""
        message = (f"driver pod {driver.pod_name} is failing ({crash}, {driver.restart_count} restarts)"
                   + (f": {detail.strip()[:300]}" if detail else "")
                   + "; it is restarted automatically and resumes from the checkpoint")
        reason = "DriverFailing"
        refusal = next((line.strip() for line in detail.splitlines()
                        if line.strip().startswith(TRANSFORM_INVALID + ":")), None)
        if refusal is not None:  # the driver refused the transform (driver.transform): the spec must change
            reason, message = TRANSFORM_INVALID, f"{refusal[:400]} (driver pod {driver.pod_name}; fix the spec)"
        ready = _cond(READY, False, reason, message)
        degraded = _cond(DEGRADED, True, reason, message)
        progressing = _cond(PROGRESSING, not current, "Restarting" if not current else reason,
                            message)
        return Evaluation("Degraded", (ready, progressing, degraded))

    if (facts.desired_hash is not None and driver.refused_config_hash == facts.desired_hash
            and driver.refused_message and not driver.runs(facts.desired_hash)):
        # The running driver refused the changed query config (its check failed) and runs the one it ran.
        message = (f"{driver.refused_message.strip()[:400]} (driver pod {driver.pod_name} keeps running config "
                   f"{driver.config_hash}; fix the spec)")
        reason = refusal_reason(driver.refused_message)
        return Evaluation("Degraded", (
            _cond(READY, driver.pod_ready, "Running" if driver.pod_ready else reason,
                  f"driver pod {driver.pod_name} runs the previous query config" + summary),
            _cond(PROGRESSING, False, reason, message),
            _cond(DEGRADED, True, reason, message),
        ))

    if not running:
        # A restart replaces a driver that ran another config; the very first rollout is a start. A pod that has not
        # reported yet is known by its template's hash, which leaves the query's own settings out: `runs` compares
        # that with the desired template's (comparing it with the whole config's called a first start a restart).
        restarting = ((driver.config_hash is not None
                       and not driver.runs(facts.desired_hash, facts.desired_pod_hash)) or
                      facts.previous_hash not in (None, facts.desired_hash) or facts.restart_in_progress)
        if restarting:
            message = (f"restarting the query in driver pod {driver.pod_name} to apply generation {facts.generation}"
                       if driver.restarts_query_in_place(facts.desired_pod_hash or facts.desired_hash)
                       else f"restarting the driver to apply generation {facts.generation}")
            return Evaluation("Starting", (
                _cond(READY, False, "Restarting", message),
                _cond(PROGRESSING, True, "Restarting", message),
                _cond(DEGRADED, False, "AsExpected", "controlled restart"),
            ))
        where = f"driver pod {driver.pod_name} is {driver.pod_phase or 'not created'}" if driver.pod_name \
            else "waiting for the driver pod"
        return Evaluation("Starting", (
            _cond(READY, False, "DriverStarting", where),
            _cond(PROGRESSING, True, "Starting", where),
            _cond(DEGRADED, True, "StatusUnavailable", "; ".join(progress.errors)) if progress.errors
            else _cond(DEGRADED, False, "AsExpected", "starting"),
        ))

    ready = _cond(READY, True, "Running", f"driver pod {driver.pod_name} is running" + summary)
    progressing = _cond(PROGRESSING, False, "RolloutComplete",
                        f"generation {facts.generation} is running")
    degraded = _degraded_while_running(facts)
    return Evaluation("Degraded" if degraded.status == "True" else "Running",
                      (ready, progressing, degraded))


def _replaying(facts: Facts) -> Evaluation:
    """A ReplayRequest holds the handoff: the table is being rewound and re-filled, so it is not Ready
    (not whole) until the request finishes; a crashing driver still shows as Degraded."""
    driver = facts.driver
    crash = _crash_reason(driver) if driver is not None else None
    message = f"ReplayRequest {facts.replay} is rewinding the table" + _progress_summary(facts.progress)
    degraded = (_cond(DEGRADED, True, "DriverFailing", f"driver pod {driver.pod_name} is failing ({crash})")
                if crash and driver is not None else _cond(DEGRADED, False, "Replaying", message))
    return Evaluation("Replaying", (_cond(READY, False, "Replaying", message),
                                    _cond(PROGRESSING, True, "Replaying", message), degraded))


def _degraded_while_running(facts: Facts) -> Condition:
    progress = facts.progress
    target = facts.freshness_target_seconds
    report = live_report(facts)
    if report is not None and report.degraded_reason:
        # First: it is the cause a missed freshness target would only be the symptom of.
        what = SINK_TROUBLE.get(report.degraded_reason, "the sink reported trouble")
        batch = f" in batch {report.batch_id}" if report.batch_id is not None else ""
        error = f" ({report.degraded_detail})" if report.degraded_detail else ""
        return _cond(DEGRADED, True, "SinkDegraded",
                     f"driver reports degradedReason={report.degraded_reason}{batch}: {what}{error}; the sink "
                     f"retries with backoff, so records are delayed, not lost")
    if (target is not None and progress.freshness_seconds is not None and
            progress.freshness_seconds > target and (progress.lag or 0) > 0):
        return _cond(DEGRADED, True, "FreshnessTargetMissed",
                     f"newest committed event is older than the target {target:.0f}s (status.freshness has its "
                     f"age), {progress.lag} records waiting; raise scaling.maxExecutors or lower the load")
    if progress.errors:
        return _cond(DEGRADED, True, "StatusUnavailable", "; ".join(progress.errors))
    return _cond(DEGRADED, False, "AsExpected", "committing within target")


def _crash_reason(driver: DriverFacts) -> str | None:
    if driver.waiting_reason in CRASH_REASONS:
        return driver.waiting_reason
    if driver.pod_phase == "Failed":
        return driver.last_termination_reason or "Failed"
    return None


def _progress_summary(progress: ProgressFacts) -> str:
    parts = []
    if progress.committed_snapshot is not None:
        parts.append(f"snapshot {progress.committed_snapshot}")
    if progress.lag is not None:
        parts.append(f"lag {progress.lag}")
    return ("; " + ", ".join(parts)) if parts else ""


def merge_conditions(old: Sequence[Mapping[str, Any]] | None, new: Sequence[Condition],
                     generation: int, now: str) -> list[dict[str, Any]]:
    """New conditions as dicts; lastTransitionTime kept from `old` when the status did not change.

    Conditions of other types in `old` (set by someone else) are kept as they are.
    """
    previous = {c.get("type"): c for c in (old or [])}
    merged = []
    for cond in new:
        before = previous.pop(cond.type, None)
        changed = before is None or before.get("status") != cond.status
        merged.append({
            "type": cond.type, "status": cond.status, "reason": cond.reason, "message": cond.message,
            "lastTransitionTime": now if changed else before.get("lastTransitionTime", now),
            "observedGeneration": generation,
        })
    merged.extend(dict(c) for c in previous.values())
    return merged


@dataclass(frozen=True)
class Transition:
    type: str           # Event type: Normal / Warning
    reason: str
    message: str


def condition_events(old: Sequence[Mapping[str, Any]] | None, new: Sequence[Condition],
                     abnormal: Callable[[Condition], bool]) -> list[Transition]:
    """One Event per condition whose status or reason changed (the reason carries the meaning): a Warning when
    `abnormal`, else Normal. A condition's first appearance is told only when abnormal."""
    previous = {c.get("type"): c for c in (old or [])}
    events = []
    for cond in new:
        before = previous.get(cond.type)
        if before is not None and before.get("status") == cond.status and before.get("reason") == cond.reason:
            continue
        bad = abnormal(cond)
        if before is None and not bad:
            continue
        events.append(Transition("Warning" if bad else "Normal", cond.reason,
                                 f"{cond.type}={cond.status}: {cond.message}"))
    return events


def transitions(old: Sequence[Mapping[str, Any]] | None, new: Sequence[Condition]) -> list[Transition]:
    """The handoff's Events: one per change of a condition's status or reason, a Warning when something is wrong.
    A handoff's first status gets none unless something is wrong: "the driver is starting" is what every new
    handoff says, and `kubectl get` shows it; the Event that it runs (Ready=True) follows. (An Event per new
    handoff was 1,000 POSTs in a bulk apply's busiest minute: issue 16.)"""
    return condition_events(
        old, new,
        abnormal=lambda c: (c.type == DEGRADED and c.status == "True") or c.reason == "InvalidSpec"
        or c.reason in DRIVER_FAILING_REASONS)
