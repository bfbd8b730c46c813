"""kopf handlers for ReplayRequest: plan, then run the request one idempotent step at a time.

One daemon per request (`run_replay`, whose docstring draws the states) calls `advance` until the request is
final. `advance` reads the request, the handoff and the table fresh each time, does at most the next step, and
records it in `status.steps` before the next one, so an operator restarted mid-replay goes on where it stopped
and repeats nothing (each table step also checks the table itself, see `replay.table`).

The run of a Rollback / RollbackAndReplay:
1. plan (`replay_plan.plan`); a plan that cannot succeed ends Failed here, before anything changes;
   `dryRun` ends at phase Planned;
2. claim the handoff: annotations `handoff.io/replay=<request>` (phase Replaying) and `handoff.io/replay-hold`,
   written with the handoff's resourceVersion so two requests cannot both claim it, after the hold annotation
   `handoff.io/query-hold=<request>` on the driver's progress ConfigMap. How the stream is quieted (`replay.hold`):
   a driver that publishes now holds its query itself (replay-hold `query`: the pod, JVM and Spark session stay,
   `handoff_spark.driver.hold`); otherwise render keeps the driver Deployment at 0 replicas (replay-hold `true`),
   as it also does when the driver has said neither that it is stopping its query nor that it stopped it within
   `replay_hold_ack_seconds`;
3. DriverStopped: the driver said its query is held for this request, or its pod is gone (SIGTERM: the app
   finishes its batch). The plan is made again against the now quiet table, since the driver may have committed
   batches meanwhile;
4. Tagged: the head gets the tag `handoff-undo-<namespace>-<request>` (status.undoTag), the undo point;
5. RolledBack: `manage_snapshots().rollback_to_snapshot(target)`;
6. GapRecorded (Rollback only): the discarded offsets are recorded in the ledger as a deliberate gap,
   so the stream goes on from where it was and the discarded records never come back;
7. DriverStarted: both holds are lifted; the driver (its query again in the same pod, or a new pod) resumes from
   the table's ledger;
8. Replayed (RollbackAndReplay): the ledger has passed the offsets the table held before
   (status.progress meanwhile); then Succeeded and the claim is released.

The run of a Backfill (after the plan, phase Planned; the stream's driver keeps running, the handoff is not
claimed: a backfill moves neither the stream's position nor its table history):
1. JobCreated: a batch/v1 Job (`replay_backfill.backfill_job`) runs `handoff_spark backfill` under ledger
   query `backfill-<request>`; a Job already there (an operator restarted in between) is adopted;
2. status.progress follows that query's ledger; Backfilled (Succeeded) once the Job succeeded and the
   ledger reached `to`; Failed (BackfillJobFailed, naming the Job's failure) when the Job failed.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Mapping
from typing import Any

import kopf
from kubernetes import client
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from handoff_operator.runtime import metrics
from handoff_operator.replay import backfill as replay_backfill
from handoff_operator.replay import plan as replay_plan
from handoff_operator.replay import cost as replay_cost
from handoff_operator.replay import table as replay_table
from handoff_operator.upgrade import step as rollback
from handoff_operator.conditions import DEGRADED, PROGRESSING, READY, Condition, DriverReport, merge_conditions
from handoff_operator.runtime.controllers import reconcile_handoff, record_reread
from handoff_operator.runtime.kube import Kube, operator_kube, unless_gone
from handoff_operator.runtime.settings import current_settings
from handoff_operator.models import ReplayRequest, ReplayRequestSpec
from handoff_operator.spec.render import (GROUP, PLURAL, QUERY_HOLD_VALUE, REPLAY_ANNOTATION, REPLAY_HOLD_ANNOTATION,
                                         VERSION, driver_name, referenced_secrets, render)
from handoff_operator.replay import hold as replay_hold
from handoff_operator.truth import driver_report
from handoff_spark.contract import QUERY_HOLD_ANNOTATION, progress_configmap_name
from handoff_operator.truth.bigquery import service_account_key
from handoff_operator.truth.reading import kafka_offsets
from handoff_operator.spec.validation import check, parse_spec

REPLAY_PLURAL = ReplayRequest.plural
RESOURCE = dict(group=GROUP, version=VERSION, plural=REPLAY_PLURAL)
FINAL = ("Succeeded", "Failed")
log = logging.getLogger("handoff.operator.replay")


class Refused(Exception):
    """The request cannot go on: it ends Failed with this reason and message."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


class Wait(Exception):
    """Not yet (driver still stopping, Kafka unreachable ...): try again at the next tick."""


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _now_ms() -> str:
    """A step's, start's or end's time to the millisecond: the timeline orders a replay's steps among the operator's
    other entries (ms) and the ledger's commits (ms); whole seconds put a step before what happened just before it."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


# ------------------------------------------------------------------------------------------- API access

def _get(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    return kube.get_handoff(namespace, name, plural=REPLAY_PLURAL)


def _patch_status(kube: Kube, namespace: str, name: str, status: Mapping[str, Any]) -> None:
    kube.patch_status(namespace, name, status, plural=REPLAY_PLURAL)


def _annotate_handoff(kube: Kube, handoff: Mapping[str, Any], annotations: Mapping[str, str | None],
                      *, guarded: bool) -> None:
    """Merge-patch annotations (None deletes); `guarded`: only if the handoff did not change since read."""
    meta: dict[str, Any] = {"annotations": dict(annotations)}
    if guarded:
        meta["resourceVersion"] = handoff["metadata"]["resourceVersion"]
    kube.custom.patch_namespaced_custom_object(GROUP, VERSION, handoff["metadata"]["namespace"], PLURAL,
                                               handoff["metadata"]["name"], {"metadata": meta},
                                               _content_type="application/merge-patch+json")


def _apply_handoff(kube: Kube, namespace: str, name: str) -> None:
    """Let the handoff's reconcile apply what the annotations now say (driver replicas, phase)."""
    reconcile_handoff(namespace, name, kube)


class HandoffConfig:
    """The app config the driver runs, and a BigQuery sink's service-account key from `credentialsFrom` (the
    operator reads the table with it: the driver's key file is mounted in the driver pod, not here)."""

    def __init__(self, config: Any, key_json: str | None) -> None:
        self.config, self.key_json = config, key_json

    def table(self) -> replay_table.ReplayTable | None:
        """The handoff's table through the sink contract, freshly read (None: it does not exist yet)."""
        return replay_table.open_table(self.config, self.key_json)


def _handoff_config(kube: Kube, handoff: Mapping[str, Any]) -> HandoffConfig:
    """The app config the driver runs (the last good spec's while a failed upgrade is rolled back)."""
    meta = handoff["metadata"]
    spec, problems = parse_spec(handoff.get("spec") or {})
    if spec is not None:
        spec = rollback.held_spec(kube, handoff) or spec  # a failed spec change rolled back: the last good runs
        secrets = kube.read_secrets(meta["namespace"], sorted(referenced_secrets(spec)))
        resolved, problems = check(meta["name"], spec, secrets)
        if not problems:
            return HandoffConfig(render(handoff, spec, current_settings().default_image, resolved).config,
                                 service_account_key(spec, secrets))
    raise Refused("HandoffInvalid", f"StreamTableHandoff {meta['name']} has an invalid spec ("
                  + "; ".join(str(p) for p in problems) + "); fix it, then create a new ReplayRequest")


# ---------------------------------------------------------------------------------------------- status

def _conditions(phase: str, reason: str, message: str, dry_run: bool) -> list[Condition]:
    if phase == "Failed":
        return [Condition(READY, "False", reason, message), Condition(PROGRESSING, "False", reason, message),
                Condition(DEGRADED, "True", reason, message)]
    if phase == "Succeeded" or (phase == "Planned" and dry_run):
        return [Condition(READY, "True", reason, message), Condition(PROGRESSING, "False", reason, message),
                Condition(DEGRADED, "False", reason, message)]
    return [Condition(READY, "False", reason, message), Condition(PROGRESSING, "True", reason, message),
            Condition(DEGRADED, "False", "AsExpected", message)]


class Request:
    """One ReplayRequest as read now, with the status changes of this tick."""

    def __init__(self, kube: Kube, obj: dict[str, Any]) -> None:
        self.kube, self.obj = kube, obj
        self.namespace, self.name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        self.generation = int(obj["metadata"].get("generation") or 1)
        self.status: dict[str, Any] = dict(obj.get("status") or {})
        self.dry_run = bool((obj.get("spec") or {}).get("dryRun"))

    @property
    def phase(self) -> str:
        return self.status.get("phase") or "Pending"

    @property
    def reason(self) -> str | None:
        return next((c.get("reason") for c in self.status.get("conditions") or [] if c.get("type") == READY), None)

    @property
    def steps(self) -> list[str]:
        return [s.get("name") for s in self.status.get("steps") or []]

    def write(self, phase: str, reason: str, message: str, **fields: Any) -> None:
        """Phase + conditions (+ fields) in one status patch; an Event when the reason changes."""
        old = self.status.get("conditions") or []
        before = self.reason
        patch = {"observedGeneration": self.generation, "phase": phase, **fields,
                 "conditions": merge_conditions(old, _conditions(phase, reason, message, self.dry_run),
                                                self.generation, _now())}
        ended = (phase in FINAL and not self.status.get("completedAt")) or (
            phase == "Planned" and self.dry_run and self.phase != "Planned")
        if phase in FINAL and not self.status.get("completedAt"):
            patch["completedAt"] = _now_ms()
        _patch_status(self.kube, self.namespace, self.name, patch)
        self.status.update(patch)
        if ended:
            metrics.REPLAYS_ENDED.labels(self.namespace, phase).inc()
            if phase == "Succeeded" and not self.dry_run:
                self._count_reread()
        if before != reason:
            kopf.event(self.obj, type="Warning" if phase == "Failed" else "Normal", reason=reason,
                       message=message[:1000])

    def _count_reread(self) -> None:
        """What a finished RollbackAndReplay or Backfill re-read, for the handoff's cost (issue 35): the records
        its progress counted in the table's ledger, and the plan's byte estimate for them. (A RollbackAndReplay's
        re-reads are also inside the stream driver's totals; a Backfill Job's are only here and in rereadRecords.)"""
        spec = self.obj.get("spec") or {}
        handoff = (spec.get("handoffRef") or {}).get("name")
        plan = self.status.get("plan") or {}
        records = (self.status.get("progress") or {}).get("records", plan.get("records"))
        if handoff and isinstance(records, int) and records > 0:
            estimate = (plan.get("cost") or {}).get("bytesToReread")
            metrics.count_reread(self.namespace, handoff, str(spec.get("mode") or ""), records, estimate)
            try:  # and in the handoff's status.cost (rereadRecords, rereadBytes: since counting began, per day)
                record_reread(self.namespace, handoff, self.kube, records, estimate)
            except Exception:  # noqa: BLE001 - the request succeeded; a cost figure never fails it
                log.warning("could not add the re-read of %s/%s to handoff %s's status.cost", self.namespace,
                            self.name, handoff, exc_info=True)

    def step(self, name: str, message: str, **fields: Any) -> None:
        steps = list(self.status.get("steps") or []) + [{"name": name, "at": _now_ms(), "message": message}]
        fields.setdefault("startedAt", self.status.get("startedAt") or _now_ms())
        self.write("Running", name, message, steps=steps, **fields)


def _plan_status(p: replay_plan.Plan, cost: replay_cost.Cost | None = None) -> dict[str, Any]:
    gap = p.gap or {}
    summary = p.summary + (f"; cost: {cost.summary()}" if cost is not None and cost.summary() else "")
    return {k: v for k, v in {
        "headSnapshot": str(p.head_snapshot) if p.head_snapshot is not None else None,
        "rollbackToSnapshot": str(p.target_snapshot) if p.target_snapshot is not None else None,
        "discardedSnapshots": p.discarded_snapshots if p.mode != "Backfill" else None,
        "resumeOffsets": replay_plan.wire(p.resume_offsets),
        "replayFrom": replay_plan.wire(p.replay_from), "replayTo": replay_plan.wire(p.replay_to),
        "gapFrom": replay_plan.wire({t: {q: r[0] for q, r in parts.items()} for t, parts in gap.items()}) if gap else None,
        "gapTo": replay_plan.wire({t: {q: r[1] for q, r in parts.items()} for t, parts in gap.items()}) if gap else None,
        "records": p.records, "summary": summary[:4096],
        "cost": cost.status() if cost is not None else None}.items() if v is not None}


def _offsets(wire_: Mapping[str, Mapping[str, int]] | None) -> replay_plan.Offsets:
    return {t: {int(p): int(o) for p, o in parts.items()} for t, parts in (wire_ or {}).items()}


# ------------------------------------------------------------------------------------------- planning

def _active_others(kube: Kube, handoff: Mapping[str, Any], me: str) -> list[str]:
    """Other requests running for this handoff: the one holding the claim, unless it is gone or final."""
    holder = (handoff["metadata"].get("annotations") or {}).get(REPLAY_ANNOTATION)
    if not holder or holder == me:
        return []
    other = _get(kube, handoff["metadata"]["namespace"], holder)
    if other is None or (other.get("status") or {}).get("phase") in FINAL:
        return []
    return [holder]


def _make_plan(req: Request, spec: ReplayRequestSpec, handoff: Mapping[str, Any], hc: HandoffConfig,
               claimed: bool) -> tuple[replay_plan.Plan, replay_cost.Cost | None]:
    """The plan against the table and Kafka as they are now, the sink's own refusals, and what it will cost."""
    config = hc.config
    request = replay_plan.request_from_spec(spec, config.handoff_id, config.query_name, config.source.topics,
                                            config.sink.kind, config.source.starting_offsets)
    kafka = None
    try:
        table = hc.table()
        facts = table.facts() if table is not None else None
    except Exception as exc:  # noqa: BLE001 - the catalog may come back: plan again next tick
        raise Wait(f"cannot read the table: {type(exc).__name__}: {exc}") from exc
    try:
        latest, earliest = kafka_offsets(config)
        kafka = replay_plan.KafkaFacts(earliest=earliest, latest=latest)
    except Exception as exc:  # noqa: BLE001 - reported as KafkaUnavailable when the plan needs it
        log.info(f"{req.namespace}/{req.name}: cannot read Kafka offsets: {exc}")
    others = [] if claimed else _active_others(req.kube, handoff, req.name)
    result = replay_plan.plan(request, facts, kafka, others)
    if isinstance(result, replay_plan.Plan) and table is not None:
        result = table.refusal(result) or result
    if isinstance(result, replay_plan.Failure):
        if result.reason == "KafkaUnavailable":
            raise Wait(result.message)
        raise Refused(result.reason, result.message)
    assert table is not None
    try:
        cost = replay_cost.estimate(table.cost(result), result.records, current_settings().bigquery_write_price_per_gib)
    except Exception as exc:  # noqa: BLE001 - the estimate is information; the plan stands without it
        log.info(f"{req.namespace}/{req.name}: cannot estimate the cost: {exc}")
        cost = None
    return result, cost


# ---------------------------------------------------------------------------------------------- steps

def _hold_query(kube: Kube, namespace: str, handoff_name: str, request: str | None) -> None:
    """Set (request) or lift (None) the hold the running driver obeys: an annotation of its progress ConfigMap
    (`handoff_spark.driver.hold`), merge-patched; the handoff's apply never sets it. No ConfigMap yet: nothing to
    hold (the driver that will read it is not running)."""
    body = {"metadata": {"annotations": {QUERY_HOLD_ANNOTATION: request}}}
    try:
        kube.core.patch_namespaced_config_map(progress_configmap_name(handoff_name), namespace, body,
                                              field_manager="handoff-operator-replay")
    except ApiException as exc:
        if exc.status != 404:
            raise


def _driver_now(kube: Kube, namespace: str, handoff_name: str) -> tuple[DriverReport | None, list[str]]:
    """The driver's published report and the names of its pods."""
    report = driver_report.parse(kube.read_driver_report(namespace, handoff_name))
    return report, [pod.metadata.name for pod in kube.driver_pods(namespace, handoff_name)]


def _release(req: Request, handoff: Mapping[str, Any] | None) -> None:
    """Drop the claim (if ours) and let the handoff's driver run again. The driver's hold is lifted if it is ours
    even without the claim: `_claim` sets the hold first, and a request that ends between the two (refused,
    deleted, the claim lost to another request) must not leave the stream held."""
    if handoff is None:
        return
    ns, handoff_name = handoff["metadata"]["namespace"], handoff["metadata"]["name"]
    cm = unless_gone(req.kube.core.read_namespaced_config_map, progress_configmap_name(handoff_name), ns)
    if cm is not None and (cm.metadata.annotations or {}).get(QUERY_HOLD_ANNOTATION) == req.name:
        _hold_query(req.kube, ns, handoff_name, None)
    annotations = handoff["metadata"].get("annotations") or {}
    if annotations.get(REPLAY_ANNOTATION) != req.name:
        return
    _annotate_handoff(req.kube, handoff, {REPLAY_ANNOTATION: None, REPLAY_HOLD_ANNOTATION: None}, guarded=False)
    _apply_handoff(req.kube, handoff["metadata"]["namespace"], handoff["metadata"]["name"])


def _claim(req: Request, handoff: Mapping[str, Any]) -> None:
    """Claim the handoff for this request and hold its stream: the query inside a driver that publishes now, else
    the driver pod (`replay.hold`)."""
    others = _active_others(req.kube, handoff, req.name)
    if others:
        raise Refused("AnotherReplayRunning", f"ReplayRequest {others[0]} is running for this handoff; create "
                      f"this request again once it has finished")
    ns, handoff_name = handoff["metadata"]["namespace"], handoff["metadata"]["name"]
    report, pods = _driver_now(req.kube, ns, handoff_name)
    now_ms = int(dt.datetime.now(dt.timezone.utc).timestamp() * 1000)
    hold_mode = replay_hold.mode(report, pods, now_ms, current_settings().driver_report_max_age)
    # First the driver's hold, then the claim: a claimed handoff's driver never runs a batch unheld.
    _hold_query(req.kube, ns, handoff_name, req.name)
    try:
        _annotate_handoff(req.kube, handoff, {REPLAY_ANNOTATION: req.name,
                                              REPLAY_HOLD_ANNOTATION: QUERY_HOLD_VALUE if hold_mode == "query"
                                              else "true"}, guarded=True)
    except ApiException as exc:
        if exc.status == 409:
            raise Wait("the handoff changed while claiming it; trying again") from exc
        raise


def _waited_seconds(started_at: str | None) -> float:
    """Seconds since the request's `startedAt` (its claim); 0 when unreadable."""
    try:
        started = dt.datetime.fromisoformat(str(started_at).replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return max(0.0, (dt.datetime.now(dt.timezone.utc) - started).total_seconds())


def _run(req: Request, spec: ReplayRequestSpec, handoff: dict[str, Any], hc: HandoffConfig) -> None:
    """The next step of a running request (each returns; the daemon calls again)."""
    config = hc.config
    if spec.mode == "Backfill":
        _run_backfill(req, handoff, hc)
        return
    ns, handoff_name = handoff["metadata"]["namespace"], handoff["metadata"]["name"]
    annotations = handoff["metadata"].get("annotations") or {}
    steps = req.steps
    if annotations.get(REPLAY_ANNOTATION) != req.name:
        if steps and steps[-1] != "DriverStarted":
            # Claimed, then the annotation was removed by someone: take it back before going on.
            _claim(req, handoff)
            _apply_handoff(req.kube, ns, handoff_name)
            raise Wait("claimed the handoff again")
        if not steps:
            _claim(req, handoff)
            _apply_handoff(req.kube, ns, handoff_name)
            req.write("Running", "StoppingDriver", f"stopping the driver of {handoff_name} at a batch boundary",
                      startedAt=req.status.get("startedAt") or _now_ms())
            return
    if "DriverStopped" not in steps:
        value = annotations.get(REPLAY_HOLD_ANNOTATION)
        if value is None:
            value = "true"
            _hold_query(req.kube, ns, handoff_name, req.name)
            _annotate_handoff(req.kube, handoff, {REPLAY_HOLD_ANNOTATION: value}, guarded=False)
        _apply_handoff(req.kube, ns, handoff_name)
        report, pods = _driver_now(req.kube, ns, handoff_name)
        quiet = replay_hold.stopped("query" if value == QUERY_HOLD_VALUE else "pod", req.name, report, pods,
                                    _waited_seconds(req.status.get("startedAt")),
                                    current_settings().replay_hold_ack_seconds)
        if quiet.escalate:
            _annotate_handoff(req.kube, handoff, {REPLAY_HOLD_ANNOTATION: "true"}, guarded=False)
            _apply_handoff(req.kube, ns, handoff_name)
        if not quiet.done:
            raise Wait(quiet.message)
        # The driver may have committed batches since the plan: plan again against the quiet table.
        p, cost = _make_plan(req, spec, handoff, hc, claimed=True)
        req.step("DriverStopped", f"driver of {handoff_name}: {quiet.message}; plan: {p.summary}",
                 plan=_plan_status(p, cost))
        return
    plan = req.status.get("plan") or {}
    head, target = int(plan["headSnapshot"]), int(plan["rollbackToSnapshot"])
    table = hc.table()
    if table is None:
        raise Refused("TableGone", f"the table {config.sink.table} no longer exists")
    if "Tagged" not in steps:
        tag = table.undo_point_name(req.namespace, req.name)
        try:
            table.ensure_undo_point(tag, head)
        except replay_table.UndoPointTaken as exc:
            raise Refused("UndoTagExists", f"{exc} (left by an earlier request of this name?); nothing was "
                          f"rolled back: remove it or create the request under another name") from exc
        req.step("Tagged", f"kept snapshot {head} (the table before the rollback) as {tag}", undoTag=tag)
        return
    if "RolledBack" not in steps:
        current = table.current()
        if current == head:
            try:
                table.rollback(replay_table.RollbackStep(config.handoff_id, config.query_name, head, target,
                                                         replay_table.cut_of(plan)))
            except replay_table.RollbackRefused as exc:
                raise Wait(str(exc)) from exc
        elif current != target:
            raise Refused("TableMoved", f"the table's current snapshot is {current}, neither {head} (planned) "
                          f"nor {target} (target): another writer changed it; nothing was rolled back")
        req.step("RolledBack", f"rolled the table back from snapshot {head} to {target}")
        return
    if spec.mode == "Rollback" and "GapRecorded" not in steps:
        gap = {t: {int(p): (int(plan["gapFrom"][t][p]), int(plan["gapTo"][t][p])) for p in parts}
               for t, parts in (plan.get("gapFrom") or {}).items()}
        now = table.stream_offsets(config.handoff_id, config.query_name)
        pending = {t: {p: r for p, r in parts.items() if now.get(t, {}).get(p, r[0]) < r[1]}
                   for t, parts in gap.items()}
        pending = {t: parts for t, parts in pending.items() if parts}
        if pending:
            table.record_gap(config.handoff_id, config.query_name, pending,
                             f"ReplayRequest {req.namespace}/{req.name} (mode Rollback)")
        req.step("GapRecorded", "recorded the discarded offsets as a deliberate gap in the ledger: "
                 + ", ".join(f"{t}[{p}] {s}-{e}" for t, parts in gap.items() for p, (s, e) in parts.items()))
        return
    if "DriverStarted" not in steps:
        in_place = annotations.get(REPLAY_HOLD_ANNOTATION) == QUERY_HOLD_VALUE
        _hold_query(req.kube, ns, handoff_name, None)
        _annotate_handoff(req.kube, handoff, {REPLAY_HOLD_ANNOTATION: None}, guarded=False)
        _apply_handoff(req.kube, ns, handoff_name)
        req.step("DriverStarted", (f"the driver of {handoff_name} starts its query again in the same pod"
                                   if in_place else f"driver of {handoff_name} started again")
                 + "; it resumes from the table's ledger")
        return
    if spec.mode == "Rollback":
        _release(req, handoff)
        req.write("Succeeded", "Succeeded", f"table rolled back to snapshot {target}; the stream goes on from "
                  f"where it was", steps=req.status.get("steps"))
        return
    start, end = _offsets(plan.get("replayFrom")), _offsets(plan.get("replayTo"))
    now = table.stream_offsets(config.handoff_id, config.query_name)
    done, finished = replay_plan.progress(start, end, now)
    snapshot = table.current()
    progress = {"offsets": replay_plan.wire({t: {p: now.get(t, {}).get(p, o) for p, o in parts.items()}
                                             for t, parts in start.items()}),
                "records": done, "total": int(plan.get("records") or 0),
                "snapshot": str(snapshot) if snapshot is not None and snapshot != target else None}
    progress = {k: v for k, v in progress.items() if v is not None}
    if not finished:
        if progress != req.status.get("progress"):
            req.write("Running", "Replaying", f"re-read {done} of {progress['total']} records", progress=progress)
        return
    steps_done = list(req.status.get("steps") or []) + [
        {"name": "Replayed", "at": _now_ms(), "message": f"the ledger passed {replay_plan.fmt_offsets(end)}"}]
    _release(req, handoff)
    req.write("Succeeded", "Succeeded", f"re-read {done} records; the table holds again everything up to "
              f"{replay_plan.fmt_offsets(end)}", progress=progress, steps=steps_done)


def _read_job(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        job = client.BatchV1Api(kube.api).read_namespaced_job(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return kube.api.sanitize_for_serialization(job)


def _run_backfill(req: Request, handoff: Mapping[str, Any], hc: HandoffConfig) -> None:
    """The next step of a running Backfill: its Job (replay_backfill) runs while the stream's driver goes on;
    progress and the end come from the table's ledger of the backfill's own query."""
    plan = req.status.get("plan") or {}
    start, end = _offsets(plan.get("replayFrom")), _offsets(plan.get("replayTo"))
    query, job_name = replay_backfill.backfill_query(req.name), replay_backfill.job_name(req.name)
    job = _read_job(req.kube, req.namespace, job_name)
    config = hc.config
    table = hc.table()
    if table is None:
        raise Refused("TableGone", f"the table {config.sink.table} no longer exists")
    now = table.stream_offsets(config.handoff_id, query)
    done, reached = replay_plan.progress(start, end, now)
    progress = {"offsets": replay_plan.wire({t: {p: now.get(t, {}).get(p, o) for p, o in parts.items()}
                                             for t, parts in start.items()}),
                "records": done, "total": int(plan.get("records") or 0)}
    nxt = replay_backfill.next_step(req.steps, replay_backfill.job_state(job) if job is not None else None,
                                    reached, job_name, query, req.obj["metadata"].get("uid", ""))
    if nxt.action == "create":
        handoff_name = handoff["metadata"]["name"]
        try:
            deployment = req.kube.apps.read_namespaced_deployment(driver_name(handoff_name), req.namespace)
        except ApiException as exc:
            if exc.status == 404:
                raise Wait(f"the driver Deployment of {handoff_name} does not exist yet") from exc
            raise
        body = replay_backfill.backfill_job(req.kube.api.sanitize_for_serialization(deployment), req.obj,
                                            handoff_name, plan["replayFrom"], plan["replayTo"])
        try:
            client.BatchV1Api(req.kube.api).create_namespaced_job(req.namespace, body)
        except ApiException as exc:
            if exc.status == 409:
                raise Wait(f"Job {job_name} exists already; adopting it") from exc
            raise
        req.step(nxt.reason, nxt.message, progress=progress)
    elif nxt.action == "adopt":
        req.step(nxt.reason, nxt.message, progress=progress)
    elif nxt.action == "succeed":
        steps = list(req.status.get("steps") or []) + [
            {"name": replay_backfill.BACKFILLED, "at": _now_ms(), "message": nxt.message}]
        req.write("Succeeded", "Succeeded", f"re-read {done} records into the table under ledger query {query}; "
                  f"the stream's position is unchanged", progress=progress, steps=steps)
    elif nxt.action == "fail":
        req.write("Failed", nxt.reason, nxt.message, progress=progress)
    elif nxt.message:
        raise Wait(nxt.message)
    elif progress != req.status.get("progress") or req.reason != "Backfilling":
        req.write("Running", "Backfilling", f"Job {job_name}: re-read {done} of {progress['total']} records",
                  progress=progress)


def advance(namespace: str, name: str, kube: Kube) -> bool:
    """Do the next thing for this request. True once it is final (nothing more will happen)."""
    obj = _get(kube, namespace, name)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return True
    req = Request(kube, obj)
    if req.phase in FINAL or (req.phase == "Planned" and req.dry_run):
        return True
    handoff: dict[str, Any] | None = None
    try:
        try:
            spec = ReplayRequestSpec.model_validate(obj.get("spec") or {})
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            raise Refused("InvalidSpec", f"spec.{'.'.join(str(x) for x in first['loc'])}: {first['msg']}; create "
                          f"a new ReplayRequest") from exc
        handoff = kube.get_handoff(namespace, spec.handoff_ref.name)
        if handoff is None:
            raise Refused("HandoffNotFound", f"StreamTableHandoff {spec.handoff_ref.name} not found in namespace "
                          f"{namespace}; correct spec.handoffRef.name in a new ReplayRequest")
        config = _handoff_config(kube, handoff)
        if req.phase == "Pending":
            p, cost = _make_plan(req, spec, handoff, config, claimed=False)
            status = _plan_status(p, cost)
            req.write("Planned", "DryRun" if req.dry_run else "Planned",
                      ("dry run, nothing changed: " if req.dry_run else "planned: ") + status["summary"],
                      plan=status)
            return req.dry_run
        _run(req, spec, handoff, config)
        return req.phase in FINAL
    except Refused as refused:
        _release(req, handoff)
        req.write("Failed", refused.reason, refused.message)
        return True


async def _tick(namespace: str, name: str, memo: Any, logger: Any) -> bool:
    try:
        return await asyncio.to_thread(advance, namespace, name, operator_kube(memo))
    except Wait as wait:
        logger.info(f"replay {namespace}/{name}: {wait}")
    except (ApiException, OSError, TimeoutError) as exc:
        logger.warning(f"replay {namespace}/{name}: {type(exc).__name__}: {exc}; retrying")
    except Exception as exc:  # noqa: BLE001 - one broken request must not end the daemon; it retries
        logger.exception(f"replay {namespace}/{name} step failed: {exc}; retrying")
    return False


@kopf.daemon(**RESOURCE, initial_delay=0.2, cancellation_timeout=10.0)
async def run_replay(namespace: str, name: str, memo: Any, stopped: kopf.DaemonStopped, logger: Any,
                     **_: Any) -> None:
    """Advance the request until it is final. Runs again after an operator restart: a final request
    returns at once, a running one goes on from its recorded steps.

    Each tick (`advance`, every min(status interval, 2 s)) reads the request, its handoff and the table afresh
    and takes at most one arrow below: `status.phase`, and while Running the Ready condition's reason (the last
    step recorded in `status.steps`, or StoppingDriver, Replaying, Backfilling between steps). A tick that cannot
    go on yet (the driver still stopping, the table or Kafka unreadable, the handoff changed while claiming it, an
    API error) leaves the state as it is and the next tick tries again.

        Pending ──plan──▶ Planned ──dryRun──▶ (Planned: final, nothing changed)
           ↺ table or Kafka unreadable

        Rollback, RollbackAndReplay (phase Running from StoppingDriver on):
        Planned ──claim: the driver's query-hold, annotations replay + replay-hold──▶ StoppingDriver
        StoppingDriver ──the driver says its query is held, or its pod is gone; plan again──▶ DriverStopped
        StoppingDriver ──query hold unanswered in time: replay-hold true (pod to 0)──▶ StoppingDriver
        DriverStopped ──tag the head handoff-undo-<namespace>-<request>──▶ Tagged
        Tagged ──rollback_to_snapshot(target)──▶ RolledBack
        RolledBack ──Rollback: the discarded offsets as a gap in the ledger──▶ GapRecorded
        RolledBack, GapRecorded ──lift query-hold and replay-hold──▶ DriverStarted
        DriverStarted ──Rollback: release the claim──▶ Succeeded
        DriverStarted ──RollbackAndReplay──▶ Replaying ↺ status.progress
        DriverStarted, Replaying ──the ledger passed replayTo (step Replayed), release the claim──▶ Succeeded
        StoppingDriver … GapRecorded ──the claim annotation was removed──▶ claim again, same state

        Backfill (the stream's driver runs on, the handoff is not claimed):
        Planned ──create the Job, or adopt the one there──▶ JobCreated
        JobCreated ──the Job runs──▶ Backfilling ↺ status.progress
        JobCreated, Backfilling ──the ledger reached `to`, the Job succeeded or is gone──▶ Succeeded (step Backfilled)
        JobCreated, Backfilling ──Job failed──▶ Failed (BackfillJobFailed)
        JobCreated, Backfilling ──Job succeeded, the ledger short of `to`──▶ Failed (BackfillIncomplete)
        JobCreated, Backfilling ──Job deleted before the range was in the table──▶ JobCreated (created again)

        any ──Refused (invalid request or handoff, handoff or table gone, another replay running, plan
              impossible, undo tag taken, table moved)──▶ Failed (its reason; the claim released)

    Succeeded and Failed are final; deleting a request mid-run releases its claim (`on_replay_delete`)."""
    while not stopped:
        if await _tick(namespace, name, memo, logger):
            return
        await stopped.wait(min(current_settings().status_interval, 2.0))


@kopf.on.delete(**RESOURCE)
def on_replay_delete(namespace: str, name: str, spec: Mapping[str, Any], memo: Any, **_: Any) -> None:
    """A request deleted mid-run releases its claim, so the driver runs again (the table stays as it is)."""
    kube = operator_kube(memo)
    handoff = kube.get_handoff(namespace, (spec.get("handoffRef") or {}).get("name", ""))
    if handoff is None:
        return
    obj = _get(kube, namespace, name)
    if obj is not None:
        _release(Request(kube, obj), handoff)
