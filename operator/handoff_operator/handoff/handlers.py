"""kopf handlers for StreamTableHandoff: thin glue between the API and the pure logic.

One idempotent `reconcile` does everything, in three steps: gather (read only: the handoff, its rendering, the
driver, its report, on a refresh the ledger, Kafka and the topics' retention), decide (`status.plan`, pure: the
rollout, a restart, the executor count, the retention raises) and act (`_act`, the one place that changes
anything: the children, the driver's executor count, the raises, then the status decided from what that found
(`status.decide`), its patch, the Events and gauges). The change handlers (create/update of spec/resume) and the
status daemon all call it. Why one
function under a per-object lock, reading the object fresh and writing status itself:
- kopf runs timers concurrently with change handlers; without the lock both could see the old config
  hash and both announce the same restart;
- kopf's `patch` would be applied after the handler returns, i.e. outside the lock;
- a reconcile cut short by an operator restart is simply run again by the resume handler; server-side
  apply with deterministic names makes the repeat converge on the same children.

Deletion: a finalizer (`handoff.io/finalizer`) scales the driver to 0, waits for the pod to go (the
app stops at a batch boundary on SIGTERM within terminationGracePeriodSeconds), then lets go; the
children are garbage-collected through their ownerReferences. The table and the checkpoint (its own
PVC, not owned by the handoff) stay.
"""
from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import os
import random
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf
from kubernetes.client.rest import ApiException

from handoff_operator.runtime import metrics, state
from handoff_operator.retention import step as retention_check
from handoff_operator.upgrade import step as rollback
from handoff_operator.scaling import step as autoscale
from handoff_operator.truth import driver_report
from handoff_operator.spec import rendered as rendering
from handoff_operator.truth.bigquery import service_account_key
from handoff_operator.conditions import READY, DriverReport, condition_true, with_report
from handoff_operator.handoff import journal
from handoff_operator.handoff.diffbase import SlimAnnotationsDiffBaseStorage
from handoff_operator.retention.report import retention_condition
from handoff_operator.handoff import cost as cost_figures
from handoff_operator.runtime.controllers import serve_handoff_reconcile, serve_reread_recorder
from handoff_operator.runtime.kube import Kube, in_cluster_server, operator_kube
from handoff_operator.spec.render import (COMPONENT_LABEL, GROUP, KIND, NAME_LABEL, PLURAL, VERSION, referenced_secrets,
                                          render)
from handoff_operator.runtime.settings import current_settings
from handoff_operator.handoff.status import Gathered, Plan, Truth, decide, observe, plan, worth_writing
from handoff_operator.truth.reading import offsets_max_age, read_progress
from handoff_operator.spec.validation import Problem, check
from handoff_operator.truth.watched import UNKNOWN, Views, current_enough, reconciled_view

FINALIZER = f"{GROUP}/finalizer"
RESOURCE = dict(group=GROUP, version=VERSION, plural=PLURAL)
TRANSIENT_DELAY = 10.0

#: Threads for blocking reconciles, in kopf's handler pool and in the pool of `asyncio.to_thread` each: a bulk apply
#: of 1,000 handoffs is bound by requests in flight, not by the operator's CPU (it held the GIL ~35% of the time;
#: docs/benchmarks.md, operator scale). kube.CONNECTION_POOL_SIZE covers both.
WORKER_THREADS = 16

#: Each handoff's lock: a reconcile runs under it (see the module's docstring).
_locks: state.HandoffMemory[threading.Lock] = state.HandoffMemory("handoff.locks")
#: Each handoff as this process last read it under its lock or made it by a status patch (its
#: watched.reconciled_view; _handoff_under_lock).
_known: state.HandoffMemory[Mapping[str, Any]] = state.HandoffMemory("handoff.known")
#: Each handoff's driver container restart count as last seen (pod, count): a rise is a timeline entry.
_restarts_seen: state.HandoffMemory[tuple[str, int]] = state.HandoffMemory("handoff.restarts_seen")
#: Each handoff's driver pod whose checkpoint discard this process recorded.
_discards_seen: state.HandoffMemory[str] = state.HandoffMemory("handoff.discards_seen")
log = logging.getLogger("handoff.operator")


def _lock(namespace: str, name: str) -> threading.Lock:
    return _locks.setdefault((namespace, name), threading.Lock)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0)


# ---------------------------------------------------------------------------------------- startup

@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = SlimAnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    settings.posting.enabled = True
    settings.posting.level = logging.WARNING  # kopf's own log lines as Events only when they matter
    settings.watching.server_timeout = 300
    settings.execution.max_workers = WORKER_THREADS
    operator_kube(memo)  # made now, not in the first handler
    memo.loop = asyncio.get_running_loop()  # the sync change handlers read the watch indexes through it (Views)
    # Status refreshes and child reconciles (`asyncio.to_thread`): the loop's default pool has min(32, CPUs + 4)
    # threads, 6 on a 2-CPU node, and a reconcile mostly waits on the API server, Kafka or a catalog.
    memo.loop.set_default_executor(ThreadPoolExecutor(WORKER_THREADS, thread_name_prefix="handoff-reconcile"))


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster service account, else $KUBECONFIG read now (the kubernetes client reads it at import).
    kopf's service-account login names `kubernetes.default.svc`; the Service's address from the pod's
    environment works without cluster DNS too (kube.in_cluster_server)."""
    info = kopf.login_with_service_account(**kwargs)
    if info is not None:
        server = in_cluster_server(os.environ)
        return dataclasses.replace(info, server=server) if server else info
    return kopf.login_with_kubeconfig(**kwargs)


# --------------------------------------------------------------------------------------- reconcile
#
# reconcile: gather (read only) → decide (status.plan, pure) → act (_act: the one place that changes anything, and
# decides the status last, from what acting found: status.observe, status.decide).

def _read_truth(namespace: str, name: str, kube: Kube, obj: Mapping[str, Any] | None = None) -> Truth | None:
    """Gather, outside the lock: committed progress (ledger) and Kafka offsets for the spec that runs, and the
    topics' retention facts when a check is due (retention.step.gather); None if it has no workable spec.
    `obj`: the handoff as the daemon's watch last saw it (else read here). Reads only."""
    obj = obj if obj is not None else kube.get_handoff(namespace, name)
    if obj is None:
        return None
    settings = current_settings()
    held = rollback.held_spec(kube, obj)  # a failed spec change rolled back: the last good one runs
    if held is None:
        prepared = rendering.prepare(kube, obj, settings.default_image)
        spec, rendered, secrets = prepared.spec, prepared.rendered, prepared.secrets
    else:
        spec, secrets = held, kube.read_secrets(namespace, sorted(referenced_secrets(held)))
        resolved, problems = check(name, spec, secrets)
        rendered = None if problems else render(obj, spec, settings.default_image, resolved)
    if spec is None or rendered is None:
        return None
    progress = read_progress(rendered.config, bigquery_key=service_account_key(spec, secrets),
                             offsets_max_age=offsets_max_age(settings.status_interval))
    return Truth(progress, spec, rendered.config,
                 retention_check.gather(namespace, name, spec, rendered.config, progress, settings))


def _read_driver_report(kube: Kube, namespace: str, name: str) -> tuple[DriverReport | None, bool]:
    """The driver's published progress record (one GET, cheap enough for every reconcile, so a
    child-triggered reconcile does not flip a Degraded the daemon set). (report, whether it could be read);
    an unreadable ConfigMap only loses the driver's view, it must not fail the reconcile."""
    try:
        return driver_report.parse(kube.read_driver_report(namespace, name)), True
    except (ApiException, OSError) as exc:
        log.debug(f"cannot read the progress ConfigMap of {namespace}/{name}: {exc}")
        return None, False


def _gather(kube: Kube, obj: dict[str, Any], truth: Truth | None, refresh_truth: bool, deleting: bool,
            views: Views | None) -> Gathered:
    """Gather, under the lock: the handoff's rendering, the driver's report and facts, its executors, the last good
    spec when a rollback may need it (and the tried spec's copy when the spec changed while it was tried), and
    scaling's measurements (`views`: the watch's, else the API server's). Changes nothing in the world (scaling
    keeps its measurements in this process's memory)."""
    meta = obj["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    settings = current_settings()
    status: Mapping[str, Any] = obj.get("status") or {}
    prepared = rendering.prepare(kube, obj, settings.default_image)
    seen = views.seen(namespace, name) if views is not None and not deleting else None
    if seen is not None:
        report, report_read = driver_report.parse(seen.progress_record), True
    else:
        report, report_read = _read_driver_report(kube, namespace, name) if not deleting else (None, False)
    gathered = Gathered(obj, prepared.spec, list(prepared.problems), prepared.rendered, prepared.digests,
                        deleting=deleting, refresh_truth=refresh_truth, truth=truth, report=report,
                        report_read=report_read, settings=settings, now_ms=int(time.time() * 1000))
    if not gathered.acts_on_children:
        return dataclasses.replace(gathered, driver=with_report(kube.driver_facts(namespace, name), report))
    assert prepared.spec is not None and prepared.rendered is not None
    driver = with_report((seen.settled_driver(condition_true(status, READY)) if seen is not None else None)
                         or kube.driver_facts(namespace, name), report)
    running = seen.executors_running() if seen is not None else kube.executor_count(namespace, name)
    progress = truth.progress if truth is not None and refresh_truth else None
    return dataclasses.replace(
        gathered, driver=driver, running=running,
        last_good=rollback.gather_last_good(kube, obj, status, prepared.rendered, settings.default_image),
        tried=rollback.gather_tried(kube, obj, status, prepared.rendered),
        measured=autoscale.measure(namespace, name, prepared.spec, status.get("executors") or {}, progress,
                                   report, running, gathered.now_ms))


def reconcile(namespace: str, name: str, kube: Kube, *, refresh_truth: bool,
              deleting: bool = False, views: Views | None = None, body: Mapping[str, Any] | None = None
              ) -> list[Problem]:
    """Bring one handoff's children and status in line with its spec and the world. Idempotent.

    Gather (the handoff, its rendering, the driver's report and pods; on a refresh the ledger, Kafka and the topics'
    retention), decide (status.plan, pure: rollout, restart, executors, retention raises), act (_act: the children,
    the driver's executor count, the raises, then the status decided from what that found, its patch, Events,
    gauges). The table and Kafka are read first, outside the per-object lock: they can be slow (timeouts) and must
    not hold up a spec change waiting for the lock. The status refresh passes `views` (the children as kopf's
    watches see them, watched.Views) and `body` (the handoff as its daemon last saw it, for the truth read, and as
    the merge base of its status when it is the version this process last knew: _handoff_under_lock); otherwise the
    handoff is read fresh under the lock, as the merge base of its status."""
    truth = _read_truth(namespace, name, kube, body) if refresh_truth and not deleting else None
    with _lock(namespace, name), metrics.observe_reconcile():
        obj = _handoff_under_lock(kube, namespace, name, body)
        if obj is None:  # gone (a child's event after its deletion): nothing of it is kept any more
            state.forget(namespace, name)
            return []
        deleting = deleting or bool(obj["metadata"].get("deletionTimestamp"))
        gathered = _gather(kube, obj, truth, refresh_truth, deleting, views)
        _act(kube, gathered, plan(gathered))
        return list(gathered.problems)


def _handoff_under_lock(kube: Kube, namespace: str, name: str, body: Mapping[str, Any] | None
                        ) -> dict[str, Any] | None:
    """The handoff as the merge base of its status: `body` (a change handler's, the daemon's live body, the watch
    index's) when it is current enough (watched.current_enough: what this process last read or wrote under the
    lock, but for kopf's own metadata patches, or a handoff this process never reconciled), else a GET. A
    reconcile that ran in between (a spec change, a child's event) patched the status and recorded it, so a body
    taken before it is not used: its old `status.app.configHash` would announce a restart twice (why the GET
    under the lock exists)."""
    key = (namespace, name)
    if body is not None and current_enough(body, _known.get(key)):
        return dict(body)
    obj = kube.get_handoff(namespace, name)
    if obj is None:
        _known.pop(key)
    else:
        _known.set(key, reconciled_view(obj))
    return obj


def _act(kube: Kube, seen: Gathered, plan: Plan) -> None:
    """Act: the one place a reconcile changes anything, in this order: the rollout's own step (the last good spec
    stored before the status says so), the children (the checkpoint PVC created once, the rest applied when
    changed), the driver's executor count, the retention raises; then the driver is read back if a child changed,
    the status decided from all that (status.observe, status.decide, pure) and written, the Events posted and the
    gauges set."""
    obj = seen.obj
    meta = obj["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    events: list[tuple[str, str, str]] = []
    driver = seen.driver
    if plan.upgrade is not None:
        rollback.act(kube, obj, plan.upgrade)
        events += plan.upgrade.events
    if plan.rendered is not None:
        for child in plan.rendered.unowned:
            if kube.create_if_missing(child):
                events.append(("Normal", "CheckpointVolumeCreated",
                               f"created PersistentVolumeClaim {child['metadata']['name']} for the "
                               f"checkpoint (kept when the handoff is deleted)"))
        digests = seen.digests if plan.rendered is seen.rendered else ()
        applied = [kube.apply_if_changed(child, digests[i] if digests else None)
                   for i, child in enumerate(plan.rendered.children)]
        for child in plan.rendered.absent:
            kube.delete_if_owned(child, meta["uid"])
        if plan.replace_pod is not None:
            kube.delete_pod(namespace, plan.replace_pod)
        # The driver as gathered still stands unless this step changed one of its children.
        if any(applied) or plan.rolls_out or driver is None or plan.replace_pod is not None:
            driver = with_report(kube.driver_facts(namespace, name), seen.report)
    if plan.restart is not None:
        events.append(plan.restart)
    if plan.scaling is not None:
        autoscale.act(kube, namespace, name, plan.scaling)
        if plan.scaling.event is not None:
            events.append(plan.scaling.event)
    check = None
    if plan.retention is not None and seen.truth is not None:
        check = retention_check.act(seen.truth.config, seen.truth.spec, plan.retention, kube.api, seen.settings)
    observed = observe(seen, plan, driver, check, events, _now(), int(time.time() * 1000))
    decision = decide(observed)
    if worth_writing(obj.get("status") or {}, decision.status):
        patched = kube.patch_status(namespace, name, decision.status)
        _known.set((namespace, name), reconciled_view(patched) if patched is not None else UNKNOWN)
    if decision.phase is not None:
        metrics.set_phase(namespace, name, decision.phase)
    status, facts = decision.status, observed.facts
    metrics.set_progress(namespace, name, {"lag": status.get("lag"),
                                           "freshnessSeconds": status.get("freshnessSeconds"),
                                           "freshnessTargetSeconds": facts.freshness_target_seconds})
    restarts = facts.driver.restart_count if facts.driver is not None and facts.driver.pod_name else None
    metrics.set_driver_restarts(namespace, name, restarts)
    metrics.set_cost(namespace, name, status.get("cost") or (obj.get("status") or {}).get("cost"))
    if observed.retained is not None and observed.retained.gauges is not None:
        metrics.set_retention(namespace, name, *observed.retained.gauges)
    for kind, reason, message in decision.events:
        kopf.event(obj, type=kind, reason=reason, message=message)
    if not seen.deleting:
        _record(kube, obj, decision.status, decision.events, check, facts.driver, seen.report,
                seen.driver.pod_name if seen.driver is not None else None)


def _record(kube: Kube, obj: Mapping[str, Any], status: Mapping[str, Any], events: list[tuple[str, str, str]],
            check: Any, driver: Any, report: DriverReport | None, seen_pod: str | None = None) -> None:
    """Append what this reconcile owes to the handoff's timeline record (handoff.journal), when it owes
    anything. A record that cannot be written loses that history, never the reconcile: logged, not raised.
    `seen_pod`: the driver pod gathered before acting (`driver` is read back after)."""
    meta = obj["metadata"]
    key = (meta["namespace"], meta["name"])
    before = _restarts_seen.get(key)
    now_count = driver.restart_count if driver is not None and driver.pod_name else None
    if now_count is not None:
        _restarts_seen.set(key, (driver.pod_name, now_count))
    verdict = retention_condition(check) if check is not None else None
    last_verdict = next((c.get("reason") for c in (obj.get("status") or {}).get("conditions") or []
                         if c.get("type") == verdict.type), None) if verdict is not None else None
    discarded = None
    if report is not None and report.checkpoint_discarded and report.driver_pod \
            and _discards_seen.get(key) != report.driver_pod:
        _discards_seen.set(key, report.driver_pod)  # once per driver by this process; the ring dedupes after that
        discarded = (report.driver_pod, report.checkpoint_discarded)
    owed = journal.owed(
        now_ms=int(time.time() * 1000), generation=int(meta.get("generation") or 0),
        old_status=obj.get("status") or {}, new_status=status, events=events,
        retention_checked=f"{verdict.reason}: {verdict.message}" if verdict is not None else None,
        retention_before=last_verdict,
        driver_restarts=(before[1] if before is not None and driver is not None and before[0] == driver.pod_name
                         else None, now_count),
        last_termination=driver.last_termination_reason if driver is not None else None,
        checkpoint_discarded=discarded, seen_pod=seen_pod)
    if not owed:
        return
    for _attempt in range(2):
        try:
            text, version = kube.read_timeline(*key)
            kube.write_timeline(obj, journal.dumps(journal.appended(journal.parse(text), owed)), version)
            return
        except ApiException as exc:
            if exc.status != 409:
                log.warning(f"cannot write the timeline record of {key[0]}/{key[1]}: {exc.status} {exc.reason}")
                return
        except OSError as exc:
            log.warning(f"cannot write the timeline record of {key[0]}/{key[1]}: {exc}")
            return


def _run(namespace: str, name: str, memo: Any, *, refresh_truth: bool, permanent_on_invalid: bool,
         views: Views | None = None, body: Mapping[str, Any] | None = None) -> None:
    try:
        problems = reconcile(namespace, name, operator_kube(memo), refresh_truth=refresh_truth, views=views, body=body)
    except ApiException as exc:
        if exc.status in (400, 422):
            raise kopf.PermanentError(f"the API server refused a request: {exc.reason}: {exc.body}") from exc
        raise kopf.TemporaryError(f"API error {exc.status} {exc.reason}; retrying", delay=TRANSIENT_DELAY) from exc
    except (OSError, TimeoutError) as exc:
        raise kopf.TemporaryError(f"{type(exc).__name__}: {exc}; retrying", delay=TRANSIENT_DELAY) from exc
    if problems and permanent_on_invalid:
        # Status already says Ready=False/InvalidSpec; this only stops kopf from retrying a spec that
        # cannot work. The next spec change runs the handler again.
        raise kopf.PermanentError("InvalidSpec: " + "; ".join(str(p) for p in problems))


@kopf.on.resume(**RESOURCE)
@kopf.on.create(**RESOURCE)
@kopf.on.update(**RESOURCE, field="spec")
def on_spec(namespace: str, name: str, memo: Any, body: kopf.Body, **kwargs: Any) -> None:
    """Creation, a spec change, the operator's start. The handoff as kopf got it is the merge base when it is
    current enough (_handoff_under_lock); the driver's report, its executors and a driver that is settled (or
    not Ready yet) come from the watch indexes, as for the status refresh (watched.py): at creation they saved a
    GET of the handoff, of its progress ConfigMap and a LIST of its executor pods per handoff (issue 16)."""
    loop = getattr(memo, "loop", None)
    views = Views.from_kwargs(kwargs, loop) if loop is not None else None
    _run(namespace, name, memo, refresh_truth=changes_a_tried_spec(body), permanent_on_invalid=True, views=views,
         body=dict(body))


def changes_a_tried_spec(body: Mapping[str, Any]) -> bool:
    """Does this spec change come while another generation is being tried (pure)? Then its reconcile reads the
    table's ledger, as a status refresh does: a tried change that committed is marked good from it before the new
    one is tried (upgrade.rule.decide), also when the driver's record has not said so yet, so a rollback of the new
    change never goes back past it."""
    trying = ((body.get("status") or {}).get("upgrade") or {}).get("tryingGeneration")
    return trying is not None and trying != (body.get("metadata") or {}).get("generation")


@kopf.daemon(**RESOURCE, initial_delay=1.0, cancellation_timeout=10.0)
async def refresh_status(namespace: str, name: str, memo: Any, stopped: kopf.DaemonStopped, logger: Any,
                         body: kopf.Body, **kwargs: Any) -> None:
    """Status from the truth (driver, ledger, Kafka, the driver's published progress record) every
    HANDOFF_STATUS_INTERVAL, and drift repair.

    An async daemon (not a timer) so the interval is read from the settings at run time; the blocking
    reconcile runs in a worker thread only while it works (`asyncio.to_thread` keeps kopf's context
    for Events), so a thousand idle handoffs hold no threads. The driver's Deployment and pods, the executors
    and the progress record come from kopf's indexes (watched.py), the handoff for the truth read from the
    daemon's live body: per refresh, one GET of the handoff and a status patch only when something changed."""
    views = Views.from_kwargs(kwargs)
    first = True
    while not stopped:
        metrics.STATUS_REFRESHES.inc()
        try:
            await asyncio.to_thread(_run, namespace, name, memo, refresh_truth=True,
                                    permanent_on_invalid=False, views=views, body=dict(body))
        except (kopf.TemporaryError, kopf.PermanentError) as exc:
            logger.warning(f"status refresh failed: {exc}")
        except Exception as exc:  # noqa: BLE001 - one bad refresh must not end the daemon
            metrics.RECONCILE_ERRORS.labels(kind=type(exc).__name__).inc()
            logger.exception(f"status refresh failed: {exc}")
        await stopped.wait(refresh_wait(current_settings().status_interval, first, random.random()))
        first = False


def refresh_wait(interval: float, after_first: bool, draw: float) -> float:
    """Seconds from one status refresh to the next; `draw` uniform in [0, 1). The first refresh comes at once (a
    new handoff's lag waited 1 + 0–10 s for it before: issue 16); the wait after it is spread over up to
    min(interval, 10 s) more, and every later one over ±10%, so handoffs that started together (a bulk apply, an
    operator restart) do not refresh in lockstep every interval. The first refreshes themselves need no spread:
    they run in the event loop's worker threads, WORKER_THREADS at a time, and a bulk apply's handoffs arrive over the
    seconds the apply takes."""
    if after_first:
        return interval + draw * min(interval, 10.0)
    return interval * (0.9 + 0.2 * draw)


def _owner_name(meta: Mapping[str, Any]) -> str | None:
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == KIND and ref.get("apiVersion", "").startswith(GROUP + "/"):
            return ref.get("name")
    return (meta.get("labels") or {}).get(NAME_LABEL)


#: Owners with a child-triggered reconcile due (_on_child), and how long a child's events are gathered into one.
_children_due: state.HandoffMemory[bool] = state.HandoffMemory("handoff.children_due")
CHILD_EVENTS_WINDOW = 1.0


async def _on_child(namespace: str, meta: Mapping[str, Any], memo: Any, logger: Any, views: Views | None) -> None:
    """A driver Deployment/pod changed (became ready, crashed, rolled): update the owner's status now
    instead of at the next refresh. No table/Kafka reads here: those are the daemon's.

    A driver's start is a burst of events (the Deployment, its ReplicaSet's status, the pod created, scheduled,
    running, ready): they are gathered for CHILD_EVENTS_WINDOW into one reconcile of the owner, which reads its
    children fresh, so it sees all of them. An event arriving while that reconcile runs makes another one due
    (nothing is missed). With a reconcile per event, a bulk apply of 1,000 handoffs queued ~8,000 of them in
    front of the handoffs' own creation (issue 16). The reconcile reads the driver's report, its executors and a
    settled driver from the watch indexes, and the handoff from its index when that is the version this process
    last knew (`views`, as the status refresh does)."""
    name = _owner_name(meta)
    if not name:
        return
    key = (namespace, name)
    if not _children_due.put_new(key, True):
        return  # a reconcile of the owner is due and will read this change
    try:
        await asyncio.sleep(CHILD_EVENTS_WINDOW)
    finally:
        _children_due.pop(key)
    body = views.handoff(namespace, name) if views is not None else None  # read here, in the event loop
    try:
        await asyncio.to_thread(reconcile, namespace, name, operator_kube(memo), refresh_truth=False, views=views,
                                body=body)
    except Exception as exc:  # noqa: BLE001 - the daemon will try again
        logger.debug(f"child-triggered reconcile of {namespace}/{name} failed: {exc}")


_DRIVER_LABELS = {NAME_LABEL: kopf.PRESENT, COMPONENT_LABEL: "driver",
                  "app.kubernetes.io/managed-by": "handoff-operator"}


@kopf.on.event("apps", "v1", "deployments", labels=_DRIVER_LABELS)
async def on_driver_deployment(namespace: str, meta: Mapping[str, Any], status: Mapping[str, Any], memo: Any,
                               logger: Any, type: str | None, **kwargs: Any) -> None:
    if type is None:  # None = the initial listing at startup; the resume handler covers it
        return
    generation = int(meta.get("generation") or 0)
    kube = operator_kube(memo)
    if type == "DELETED" or (generation != int((status or {}).get("observedGeneration") or 0)
                             and not kube.applied.ours(namespace, "Deployment", meta.get("name"), generation)):
        # Its spec changed by someone else's hand, or it is gone: apply it again next time instead of trusting
        # what this process applied last (drift repair). Our own apply being rolled out is not a change.
        kube.applied.forget(namespace, "Deployment", meta.get("name"))
    await _on_child(namespace, meta, memo, logger, Views.from_kwargs(kwargs))


@kopf.on.event("", "v1", "pods", labels=_DRIVER_LABELS)
async def on_driver_pod(namespace: str, meta: Mapping[str, Any], memo: Any, logger: Any,
                        type: str | None, **kwargs: Any) -> None:
    if type is not None:
        await _on_child(namespace, meta, memo, logger, Views.from_kwargs(kwargs))


@kopf.on.delete(**RESOURCE)
def on_delete(namespace: str, name: str, memo: Any, body: Mapping[str, Any], started: dt.datetime,
              **_: Any) -> None:
    """Stop the driver gracefully; keep the table and the checkpoint; then release the finalizer."""
    kube = operator_kube(memo)
    kube.scale_driver(namespace, name, 0)
    pods = [p for p in kube.driver_pods(namespace, name)]
    waited = (_now() - started.replace(tzinfo=started.tzinfo or dt.timezone.utc)).total_seconds()
    if pods and waited < current_settings().delete_grace_seconds:
        try:
            reconcile(namespace, name, kube, refresh_truth=False, deleting=True)
        except ApiException:
            pass
        raise kopf.TemporaryError(f"waiting for driver pod {pods[0].metadata.name} to stop at a batch "
                                  f"boundary", delay=5)
    kopf.event(body, type="Normal", reason="Deleted", message=(
        "driver stopped; the table and its checkpoint are kept (delete the table and the "
        f"PersistentVolumeClaim {name}-checkpoint yourself if they are no longer wanted)"))
    state.forget(namespace, name)  # its phase and series, locks, rendering, scaling, retention, applied children


def record_reread(namespace: str, name: str, kube: Kube, records: int, estimated_bytes: int | None) -> None:
    """Add a finished RollbackAndReplay's or Backfill's re-read to the handoff's status.cost
    (`cost.add_reread`), under the handoff's lock and from a fresh read, so that no reconcile's status patch works
    from a version without it (the reconciles carry the figures forward: `cost.accumulate`)."""
    with _lock(namespace, name):
        obj = kube.get_handoff(namespace, name)
        if obj is None:
            return
        cost = cost_figures.add_reread((obj.get("status") or {}).get("cost"), records, estimated_bytes, _now())
        patched = kube.patch_status(namespace, name, {"cost": cost})
        _known.set((namespace, name), reconciled_view(patched) if patched is not None else UNKNOWN)


serve_handoff_reconcile(lambda namespace, name, kube: reconcile(namespace, name, kube, refresh_truth=False))
serve_reread_recorder(record_reread)
