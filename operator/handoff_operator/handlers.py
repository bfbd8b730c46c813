"""kopf handlers for StreamTableHandoff: thin glue between the API and the pure logic.

One idempotent `reconcile` does everything (validate → render → apply children → observe → status →
Events). The change handlers (create/update of spec/resume) and the status timer all call it. Why one
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
import threading
import time
from collections.abc import Mapping
from typing import Any

import kopf
from kubernetes.client.rest import ApiException

from . import autoscale, driver_report, metrics, retention_check, retention_report, rollback
from .bigquery_truth import service_account_key
from .conditions import (DriverReport, Facts, ProgressFacts, evaluate, live_report, merge_conditions,
                         transitions)
from .kube import Kube, in_cluster_server, new_api_client
from .models import format_duration
from .render import (COMPONENT_LABEL, GROUP, KIND, NAME_LABEL, PLURAL, REPLAY_ANNOTATION, VERSION, Rendered,
                     referenced_secrets, render)
from .retention_report import RetentionCheck
from .settings import OperatorSettings
from .truth import read_progress
from .validation import Problem, check, parse_spec

SETTINGS = OperatorSettings()
FINALIZER = f"{GROUP}/finalizer"
RESOURCE = dict(group=GROUP, version=VERSION, plural=PLURAL)
TRANSIENT_DELAY = 10.0

_locks: dict[tuple[str, str], threading.Lock] = {}
_locks_guard = threading.Lock()
log = logging.getLogger("handoff.operator")


def _lock(namespace: str, name: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault((namespace, name), threading.Lock())


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0)


def _iso(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _kube(memo: Any) -> Kube:
    kube = getattr(memo, "kube", None)
    if kube is None:
        kube = Kube(new_api_client())
        memo.kube = kube
    return kube


# ---------------------------------------------------------------------------------------- startup

@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    settings.posting.enabled = True
    settings.posting.level = logging.WARNING  # kopf's own log lines as Events only when they matter
    settings.watching.server_timeout = 300
    settings.execution.max_workers = 8
    memo.kube = Kube(new_api_client())
    memo.settings = SETTINGS


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

def _status_progress(status: Mapping[str, Any]) -> ProgressFacts:
    """The last known progress from the status (change handlers do not query the table and Kafka).

    That includes what the last refresh could *not* read: a child-triggered reconcile knows nothing new about the
    ledger or Kafka, so a Degraded=StatusUnavailable stands until the next refresh reads them (it flipped to
    AsExpected and back within a second before)."""
    committed = status.get("committed") or {}
    snapshot = committed.get("snapshot")
    unreadable = [c.get("message") or "status unavailable" for c in status.get("conditions") or []
                  if c.get("type") == "Degraded" and c.get("status") == "True"
                  and c.get("reason") == "StatusUnavailable"]
    return ProgressFacts(committed_snapshot=int(snapshot) if snapshot not in (None, "") else None,
                         committed_batch=committed.get("batch"),
                         committed_offsets=committed.get("offsets"), lag=status.get("lag"),
                         freshness_seconds=status.get("freshnessSeconds"), errors=tuple(unreadable))


def _progress_status(progress: ProgressFacts) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if progress.committed_snapshot is not None or progress.committed_offsets:
        at = (_iso(dt.datetime.fromtimestamp(progress.committed_at_ms / 1000, dt.timezone.utc))
              if progress.committed_at_ms is not None else None)
        out["committed"] = {"snapshot": (str(progress.committed_snapshot)
                                         if progress.committed_snapshot is not None else None),
                            "batch": progress.committed_batch,
                            "offsets": dict(progress.committed_offsets or {}), "at": at}
    if progress.lag is not None:
        out["lag"] = progress.lag
    if progress.freshness_seconds is not None:
        out["freshnessSeconds"] = round(progress.freshness_seconds, 3)
        out["freshness"] = format_duration(progress.freshness_seconds)
    return out


def _read_truth(namespace: str, name: str, kube: Kube) -> tuple[ProgressFacts, RetentionCheck | None] | None:
    """Committed progress (ledger) and Kafka offsets for the handoff's current spec, and the retention
    check when one is due (retention_check; it enforces in enforce mode); None if it has no workable spec."""
    obj = kube.get_handoff(namespace, name)
    if obj is None:
        return None
    spec, problems = parse_spec(obj.get("spec") or {})
    spec = rollback.held_spec(kube, obj) or spec  # a failed spec change rolled back: the last good one runs
    if spec is None:
        return None
    secrets = kube.read_secrets(namespace, sorted(referenced_secrets(spec)))
    resolved, problems = check(name, spec, secrets)
    if problems:
        return None
    config = render(obj, spec, SETTINGS.default_image, resolved).config
    progress = read_progress(config, bigquery_key=service_account_key(spec, secrets))
    return progress, retention_check.observe(namespace, name, spec, config, progress, kube.api, SETTINGS)


def _read_driver_report(kube: Kube, namespace: str, name: str) -> tuple[DriverReport | None, bool]:
    """The driver's published progress record (one GET, cheap enough for every reconcile, so a
    child-triggered reconcile does not flip a Degraded the daemon set). (report, whether it could be read);
    an unreadable ConfigMap only loses the driver's view, it must not fail the reconcile."""
    try:
        return driver_report.parse(kube.read_driver_report(namespace, name)), True
    except (ApiException, OSError) as exc:
        log.debug(f"cannot read the progress ConfigMap of {namespace}/{name}: {exc}")
        return None, False


def _differs(current: Mapping[str, Any], patch: Mapping[str, Any]) -> bool:
    """Would this merge patch change anything? (No write, no watch event, when a refresh finds nothing new.)"""
    for key, value in patch.items():
        if isinstance(value, Mapping) and isinstance(current.get(key), Mapping):
            if _differs(current[key], value):
                return True
        elif value is None:
            if current.get(key) is not None:
                return True
        elif current.get(key) != value:
            return True
    return False


def reconcile(namespace: str, name: str, kube: Kube, *, refresh_truth: bool,
              deleting: bool = False) -> list[Problem]:
    """Bring one handoff's children and status in line with its spec and the world. Idempotent.

    The table and Kafka are read first, outside the per-object lock: they can be slow (timeouts)
    and must not hold up a spec change waiting for the lock."""
    truth: ProgressFacts | None = None
    retention: RetentionCheck | None = None
    if refresh_truth and not deleting:
        truth, retention = _read_truth(namespace, name, kube) or (None, None)
    with _lock(namespace, name), metrics.observe_reconcile():
        obj = kube.get_handoff(namespace, name)
        if obj is None:
            return []
        meta = obj["metadata"]
        deleting = deleting or bool(meta.get("deletionTimestamp"))
        generation = int(meta.get("generation") or 0)
        status: dict[str, Any] = dict(obj.get("status") or {})
        old_conditions = status.get("conditions") or []
        app = dict(status.get("app") or {})

        spec, problems = parse_spec(obj.get("spec") or {})
        rendered: Rendered | None = None
        if spec is not None:
            secrets = kube.read_secrets(namespace, sorted(referenced_secrets(spec)))
            resolved, problems = check(name, spec, secrets)
            if not problems:
                rendered = render(obj, spec, SETTINGS.default_image, resolved)

        events: list[tuple[str, str, str]] = []
        old_hash = app.get("configHash")
        report, report_read = _read_driver_report(kube, namespace, name) if not deleting else (None, False)
        upgrade: rollback.Step | None = None
        if rendered is not None and not deleting:
            # Automatic rollback of a failed spec change: may swap in the last good spec's children.
            upgrade = rollback.step(kube, obj, spec, rendered, status, report, truth,  # type: ignore[arg-type]
                                    SETTINGS, int(time.time() * 1000))
            rendered = upgrade.rendered
            events += upgrade.events
            for child in rendered.unowned:
                if kube.create_if_missing(child):
                    events.append(("Normal", "CheckpointVolumeCreated",
                                   f"created PersistentVolumeClaim {child['metadata']['name']} for the "
                                   f"checkpoint (kept when the handoff is deleted)"))
            for child in rendered.children:
                kube.apply(child)
            suspended = spec.suspend  # type: ignore[union-attr]
            changed = bool(old_hash) and old_hash != rendered.config_hash and not suspended
            if changed:
                app["restarts"] = int(app.get("restarts") or 0) + 1
            if changed and not upgrade.rolling_back:  # a rollback has its own Event
                events.append(("Normal", "Restarting", (
                    f"generation {generation} changed the app config ({old_hash} → {rendered.config_hash}): "
                    f"stopping the driver at a batch boundary, then starting it with the new config")))
            app["configHash"] = rendered.config_hash

        driver = kube.driver_facts(namespace, name)
        if truth is not None and rendered is not None:
            progress = truth
        else:
            progress = _status_progress(status)
        facts = Facts(
            generation=generation,
            suspended=bool(spec.suspend) if spec is not None else False,
            desired_hash=rendered.config_hash if rendered is not None else None,
            invalid=[str(p) for p in problems],
            driver=driver, progress=progress,
            freshness_target_seconds=spec.freshness_target_seconds if spec is not None else None,
            deleting=deleting, previous_hash=old_hash,
            restart_in_progress=any(c.get("type") == "Progressing" and c.get("reason") == "Restarting"
                                    for c in old_conditions),
            driver_report=report, now_ms=int(time.time() * 1000),
            driver_report_max_age_seconds=SETTINGS.driver_report_max_age,
            replay=(meta.get("annotations") or {}).get(REPLAY_ANNOTATION))
        evaluation = rollback.overlay(evaluate(facts), upgrade.decision if upgrade is not None else None, driver)
        retained = retention_check.report(namespace, name, spec if rendered is not None else None, retention,
                                          truth if rendered is not None else None, old_conditions)
        evaluation = retention_report.degrade_on_data_loss(evaluation, retained.conditions, old_conditions)
        now = _iso(_now())
        conditions = merge_conditions(old_conditions, evaluation.conditions + retained.conditions, generation, now)
        for kind, reason, message in [(t.type, t.reason, t.message)
                                      for t in transitions(old_conditions, evaluation.conditions) + retained.events]:
            events.append((kind, reason, message))

        if driver is not None and driver.pod_name:
            app["driver"] = driver.pod_name
            if driver.last_termination_reason:
                detail = (driver.last_termination_message or "").strip()
                app["lastFailure"] = (driver.last_termination_reason + (f": {detail}" if detail else ""))[:4000]
        new_status: dict[str, Any] = {
            "observedGeneration": generation,
            "conditions": conditions,
            "app": app,
            **_progress_status(progress),
            **retained.status,
        }
        if refresh_truth:
            # Unknown now = unknown: clear what an earlier refresh found (merge patch: null deletes).
            for key in ("lag", "freshness", "freshnessSeconds"):
                new_status.setdefault(key, None)
        if evaluation.phase is not None:
            new_status["phase"] = evaluation.phase
        if rendered is not None and not deleting:
            executors, scaled = autoscale.refresh(
                kube, namespace, name, spec, status.get("executors") or {},  # type: ignore[arg-type]
                truth if refresh_truth else None, report, kube.executor_count(namespace, name), facts.now_ms)
            new_status["executors"] = executors
            if scaled is not None:
                events.append(scaled)
        if upgrade is not None:
            new_status.update(upgrade.status())
        if report_read:
            new_status["lastBatch"] = driver_report.last_batch_status(live_report(facts))  # None clears it
        if _differs(status, new_status):
            kube.patch_status(namespace, name, new_status)
        if evaluation.phase is not None:
            metrics.set_phase(namespace, name, evaluation.phase)
        metrics.set_progress(namespace, name, {"lag": progress.lag,
                                               "freshnessSeconds": progress.freshness_seconds})
        seen: set[str] = set()
        for kind, reason, message in events:
            if reason in seen:
                continue
            seen.add(reason)
            kopf.event(obj, type=kind, reason=reason, message=message[:1000])
        return list(problems)


def _run(namespace: str, name: str, memo: Any, *, refresh_truth: bool, permanent_on_invalid: bool) -> None:
    try:
        problems = reconcile(namespace, name, _kube(memo), refresh_truth=refresh_truth)
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
def on_spec(namespace: str, name: str, memo: Any, **_: Any) -> None:
    _run(namespace, name, memo, refresh_truth=False, permanent_on_invalid=True)


@kopf.daemon(**RESOURCE, initial_delay=1.0, cancellation_timeout=10.0)
async def refresh_status(namespace: str, name: str, memo: Any, stopped: kopf.DaemonStopped, logger: Any,
                         **_: Any) -> None:
    """Status from the truth (driver, ledger, Kafka, the driver's published progress record) every
    HANDOFF_STATUS_INTERVAL, and drift repair.

    An async daemon (not a timer) so the interval is read from the settings at run time; the blocking
    reconcile runs in a worker thread only while it works (`asyncio.to_thread` keeps kopf's context
    for Events), so a thousand idle handoffs hold no threads."""
    while not stopped:
        metrics.STATUS_REFRESHES.inc()
        try:
            await asyncio.to_thread(_run, namespace, name, memo, refresh_truth=True,
                                    permanent_on_invalid=False)
        except (kopf.TemporaryError, kopf.PermanentError) as exc:
            logger.warning(f"status refresh failed: {exc}")
        except Exception as exc:  # noqa: BLE001 - one bad refresh must not end the daemon
            metrics.RECONCILE_ERRORS.labels(kind=type(exc).__name__).inc()
            logger.exception(f"status refresh failed: {exc}")
        await stopped.wait(SETTINGS.status_interval)


def _owner_name(meta: Mapping[str, Any]) -> str | None:
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == KIND and ref.get("apiVersion", "").startswith(GROUP + "/"):
            return ref.get("name")
    return (meta.get("labels") or {}).get(NAME_LABEL)


def _on_child(namespace: str, meta: Mapping[str, Any], memo: Any, logger: Any) -> None:
    """A driver Deployment/pod changed (became ready, crashed, rolled): update the owner's status now
    instead of at the next refresh. No table/Kafka reads here: those are the daemon's."""
    name = _owner_name(meta)
    if not name:
        return
    try:
        reconcile(namespace, name, _kube(memo), refresh_truth=False)
    except Exception as exc:  # noqa: BLE001 - the daemon will try again
        logger.debug(f"child-triggered reconcile of {namespace}/{name} failed: {exc}")


_DRIVER_LABELS = {NAME_LABEL: kopf.PRESENT, COMPONENT_LABEL: "driver",
                  "app.kubernetes.io/managed-by": "handoff-operator"}


@kopf.on.event("apps", "v1", "deployments", labels=_DRIVER_LABELS)
def on_driver_deployment(namespace: str, meta: Mapping[str, Any], memo: Any, logger: Any,
                         type: str | None, **_: Any) -> None:
    if type is not None:  # None = the initial listing at startup; the resume handler covers it
        _on_child(namespace, meta, memo, logger)


@kopf.on.event("", "v1", "pods", labels=_DRIVER_LABELS)
def on_driver_pod(namespace: str, meta: Mapping[str, Any], memo: Any, logger: Any,
                  type: str | None, **_: Any) -> None:
    if type is not None:
        _on_child(namespace, meta, memo, logger)


@kopf.on.delete(**RESOURCE)
def on_delete(namespace: str, name: str, memo: Any, body: Mapping[str, Any], started: dt.datetime,
              **_: Any) -> None:
    """Stop the driver gracefully; keep the table and the checkpoint; then release the finalizer."""
    kube = _kube(memo)
    kube.scale_driver(namespace, name, 0)
    pods = [p for p in kube.driver_pods(namespace, name)]
    waited = (_now() - started.replace(tzinfo=started.tzinfo or dt.timezone.utc)).total_seconds()
    if pods and waited < SETTINGS.delete_grace_seconds:
        try:
            reconcile(namespace, name, kube, refresh_truth=False, deleting=True)
        except ApiException:
            pass
        raise kopf.TemporaryError(f"waiting for driver pod {pods[0].metadata.name} to stop at a batch "
                                  f"boundary", delay=5)
    kopf.event(body, type="Normal", reason="Deleted", message=(
        "driver stopped; the table and its checkpoint are kept (delete the table and the "
        f"PersistentVolumeClaim {name}-checkpoint yourself if they are no longer wanted)"))
    metrics.set_phase(namespace, name, None)
    autoscale.forget(namespace, name)
    retention_check.forget(namespace, name)
    with _locks_guard:
        _locks.pop((namespace, name), None)


from . import replay_handlers  # noqa: E402,F401 - registers the ReplayRequest handlers beside these
