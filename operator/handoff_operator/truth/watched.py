"""Each handoff's driver Deployment, driver and executor pods and published progress record, as kopf's watches
see them (kopf indexes), so the status refresh reads them without a GET, two LISTs and a GET per handoff per
refresh (issue 16: those requests, and the client deserializing their answers, were most of a refresh's CPU).

Why the watch is good enough for the refresh: it is the same watch whose events already trigger a reconcile of
the owner when a driver Deployment or pod changes (handlers.on_driver_*), so a fact the index does not have yet
is a fact whose reconcile is on its way. kopf fills every index from its initial listing before any handler
runs, and drops an object's entries when it is deleted.

Who reads what: the status refresh (the daemon) and the reconciles a child's event triggers (handlers._on_child)
use these views, and read the indexes in the event loop, where kopf changes them (a worker thread iterating a Store while kopf replaces an entry could fail), and
hands the reconcile thread plain data. The driver's facts are taken from the index only when they show a settled
driver, or when the handoff's driver Deployment and pods have had no watch event for QUIET_SECONDS
(Seen.settled_driver): the steady states, a running driver or one stuck unready; otherwise, and after a
reconcile has just applied a changed child (handlers._observe), the API server is read, as the spec-change
handlers do. The handoffs themselves are indexed too, as the merge base of a child-triggered reconcile's status
patch when this process knows that version is current (handlers._handoff_under_lock).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import kopf

from handoff_operator.conditions import DriverFacts
from handoff_operator.truth.driver_report import DATA_KEY
from handoff_operator.runtime.kube import driver_facts, executors_running
from handoff_operator.spec.render import (COMPONENT_LABEL, CONFIG_HASH_ANNOTATION, GROUP, MANAGED_BY, NAME_LABEL, PLURAL,
                     REPLAY_ANNOTATION, REPLAY_HOLD_ANNOTATION, VERSION)

_MANAGED = {"app.kubernetes.io/managed-by": MANAGED_BY["app.kubernetes.io/managed-by"]}
Key = tuple[str, str]  # (namespace, handoff name)

#: A handoff whose driver Deployment and pods had no watch event for this long has index entries that agree
#: with each other (the controllers update a Deployment's status within moments of its pods' changes), so the
#: refresh reads them even when the driver is not settled: a driver stuck unready (a node NotReady, Pending for
#: capacity) cost a GET and a LIST at every refresh (issue 16: all 200 drivers of the bench on a flapping kwok
#: node, 40% of the refresh time).
QUIET_SECONDS = 10.0
#: Each indexed Deployment's and pod's entry carries the monotonic time of its last watch event under this key, so
#: a handoff's last child event is the newest of its children's entries, and it goes with them: kopf drops an
#: object's entries when the object is deleted (a dict of last events per handoff, beside the indexes, kept an
#: entry of every deleted handoff for good). A deleted child's own last event then counts no more: what follows it
#: (the Deployment's status, a new pod) is an event of its own.
CHANGED_AT = "changedAt"


def quiet(last_change: float | None, now: float) -> bool:
    """No child event since the operator started watching counts as a change now (the initial listing is one)."""
    return last_change is not None and now - last_change >= QUIET_SECONDS


def last_change(entries: Sequence[Mapping[str, Any] | None]) -> float | None:
    """The newest CHANGED_AT of a handoff's index entries (None: it has none)."""
    return max((e[CHANGED_AT] for e in entries if e is not None and e.get(CHANGED_AT) is not None), default=None)


def _slim_pod(body: Mapping[str, Any]) -> dict[str, Any]:
    """What driver_facts/executors_running read of a pod (a watch event's body is kept small: 1,000s of them)."""
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    annotations = meta.get("annotations") or {}
    return {"metadata": {"name": meta.get("name"), "creationTimestamp": meta.get("creationTimestamp"),
                         "deletionTimestamp": meta.get("deletionTimestamp"),
                         "annotations": {k: v for k, v in annotations.items() if k == CONFIG_HASH_ANNOTATION}},
            "status": {"phase": status.get("phase"), "startTime": status.get("startTime"),
                       "conditions": [{"type": c.get("type"), "status": c.get("status")}
                                      for c in status.get("conditions") or []],
                       "containerStatuses": [dict(c) for c in status.get("containerStatuses") or []
                                             if c.get("name") == "driver"]}}


def _slim_deployment(body: Mapping[str, Any]) -> dict[str, Any]:
    return {"metadata": {"generation": (body.get("metadata") or {}).get("generation")},
            "spec": {"replicas": (body.get("spec") or {}).get("replicas")},
            "status": dict(body.get("status") or {})}


@kopf.index("apps", "v1", "deployments", labels={NAME_LABEL: kopf.PRESENT, COMPONENT_LABEL: "driver", **_MANAGED})
async def handoff_driver_deployments(namespace: str, labels: Mapping[str, str], body: Mapping[str, Any],
                                     **_: Any) -> dict[Key, dict[str, Any]]:
    return {(namespace, labels[NAME_LABEL]): {**_slim_deployment(body), CHANGED_AT: time.monotonic()}}


@kopf.index("", "v1", "pods", labels={NAME_LABEL: kopf.PRESENT, **_MANAGED})
async def handoff_pods(namespace: str, labels: Mapping[str, str], body: Mapping[str, Any],
                       **_: Any) -> dict[tuple[str, str, str], dict[str, Any]]:
    component = labels.get(COMPONENT_LABEL)
    if component not in ("driver", "executor"):
        return {}
    return {(namespace, labels[NAME_LABEL], component): {**_slim_pod(body), CHANGED_AT: time.monotonic()}}


@kopf.index("", "v1", "configmaps", labels={NAME_LABEL: kopf.PRESENT, COMPONENT_LABEL: "progress", **_MANAGED})
async def handoff_progress_records(namespace: str, labels: Mapping[str, str], body: Mapping[str, Any],
                                   **_: Any) -> dict[Key, str | None]:
    """`progress.json` of `<name>-progress` (the driver publishes into it; None while it has not)."""
    return {(namespace, labels[NAME_LABEL]): (body.get("data") or {}).get(DATA_KEY)}


@kopf.index(GROUP, VERSION, PLURAL)
async def handoff_bodies(namespace: str, name: str, body: Mapping[str, Any], **_: Any) -> dict[Key, dict[str, Any]]:
    """Each handoff as the watch last saw it: the merge base of a child-triggered reconcile's status patch when it
    is the version this process last read or wrote (handlers._handoff_under_lock), instead of a GET per event.
    A shallow copy of the event's body, which nobody changes (the daemon's body is used the same way)."""
    return {(namespace, name): dict(body)}


#: The annotations of a handoff that its reconcile reads (render, rollback, the replay phase). kopf's own (the
#: handlers' progress, `last-handled-configuration`) and anybody else's are not among them.
READ_ANNOTATIONS = (REPLAY_ANNOTATION, REPLAY_HOLD_ANNOTATION)


def reconciled_view(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What a reconcile reads of a handoff: its identity, generation, deletion, the annotations it acts on, spec
    and status. Two versions with the same view reconcile alike; kopf's own patches (its finalizer, its progress
    and last-handled-configuration annotations) change the resourceVersion but not the view."""
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    return {"uid": meta.get("uid"), "generation": meta.get("generation"),
            "deletionTimestamp": meta.get("deletionTimestamp"),
            "annotations": {k: annotations[k] for k in READ_ANNOTATIONS if k in annotations},
            "spec": obj.get("spec"), "status": obj.get("status")}


#: `known` of a handoff whose version after this process's own status patch is not known (no answer to read it
#: from): no body is current enough then, the next reconcile reads it.
UNKNOWN: Mapping[str, Any] = {"unknown": True}


def current_enough(body: Mapping[str, Any], known: Mapping[str, Any] | None) -> bool:
    """May a reconcile take `body` (the handoff as a handler or a watch index got it) as the merge base of its
    status patch instead of a GET? `known`: the reconciled_view of the version this process last read or wrote
    itself under the handoff's lock, None if it never did.

    A GET is there so a reconcile never works from a version older than this process's own last status patch (the
    old `status.app.configHash` of such a body would announce a restart twice). A body whose view is the one last
    read or written is that version or one that differs from it only in what the reconcile does not read — kopf's
    own finalizer and annotation patches, which follow each change handler: taking the body at creation saved a
    GET in the first refresh of every handoff (issue 16). With nothing known (this process never reconciled it),
    the body is as good as a GET a moment earlier."""
    return known is None or (known is not UNKNOWN and reconciled_view(body) == known)


INDEXES = ("handoff_driver_deployments", "handoff_pods", "handoff_progress_records", "handoff_bodies")


@dataclass(frozen=True)
class Seen:
    """One handoff's children as the watch saw them (plain data, safe to hand to a worker thread)."""

    deployment: Mapping[str, Any] | None
    driver_pods: Sequence[Mapping[str, Any]] = ()
    executor_pods: Sequence[Mapping[str, Any]] = ()
    progress_record: str | None = None        # None: no ConfigMap, or the driver has not published yet
    quiet: bool = False                       # no event of the driver Deployment or pods for QUIET_SECONDS

    def driver(self) -> DriverFacts | None:
        return None if self.deployment is None else driver_facts(self.deployment, list(self.driver_pods))

    def settled_driver(self, was_ready: bool = True) -> DriverFacts | None:
        """The driver's facts when they show it settled (rolled out, one ready pod, nothing waiting), when its
        objects have been quiet (`quiet`), or when the handoff was not Ready (`was_ready`: its status said
        Ready=True), else None: read the API server then. The Deployment's and the pods' watches are separate
        streams, so during a rollout or a crash the index may hold a new pod beside an old Deployment status for a
        moment; a status built from such a mix could flip Ready back for one patch. A settled driver is what a
        steady refresh sees, and what it reads from the index; so is a driver whose objects have not changed for a
        while, whatever state they show. A handoff that is not Ready has no Ready to flip back: a mix can only
        show its driver's start a step late (Running needs the pod and the Deployment's status to agree), and the
        event the index has not taken in yet brings its own reconcile. That is every driver of a bulk apply while
        it starts (issue 16: 3 GETs of its Deployment and 3 LISTs of its pods per handoff before)."""
        driver = self.driver()
        if driver is not None and (self.quiet or not was_ready):
            return driver
        if driver is None or not (driver.rollout_observed and driver.pod_ready and driver.ready_replicas >= 1
                                  and driver.desired_replicas == driver.replicas == driver.updated_replicas
                                  and driver.waiting_reason is None and driver.pod_phase == "Running"):
            return None
        return driver

    def executors_running(self) -> int:
        return executors_running(self.executor_pods)


def _one(store: Any) -> Any:
    return next(iter(store), None) if store is not None else None


@dataclass
class Views:
    """The indexes as kopf passes them to a handler, read from a worker thread through the event loop."""

    loop: asyncio.AbstractEventLoop
    indexes: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any], loop: asyncio.AbstractEventLoop | None = None) -> Views | None:
        """From a handler's kwargs (None: kopf passed no indexes, e.g. a test calling a handler directly). `loop`:
        kopf's event loop, for a sync handler (running in a worker thread); an async one runs in it."""
        indexes = {name: kwargs[name] for name in INDEXES if name in kwargs}
        if len(indexes) != len(INDEXES):
            return None
        return cls(loop or asyncio.get_running_loop(), indexes)

    def _read(self, namespace: str, name: str) -> Seen:
        deployments, pods = self.indexes["handoff_driver_deployments"], self.indexes["handoff_pods"]
        records = self.indexes["handoff_progress_records"]
        deployment = _one(deployments.get((namespace, name)))
        driver_pods = list(pods.get((namespace, name, "driver")) or ())
        executor_pods = list(pods.get((namespace, name, "executor")) or ())
        return Seen(deployment=deployment, driver_pods=driver_pods, executor_pods=executor_pods,
                    progress_record=_one(records.get((namespace, name))),
                    quiet=quiet(last_change([deployment, *driver_pods, *executor_pods]), time.monotonic()))

    def handoff(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The handoff as the watch last saw it. Call it in the event loop (a handler's own coroutine)."""
        return _one(self.indexes["handoff_bodies"].get((namespace, name)))

    def seen(self, namespace: str, name: str) -> Seen:
        """Called from a worker thread: the read runs in the event loop (see the module's docstring).

        A plain callback, not a coroutine: once the loop has stopped (the operator shutting down), a coroutine
        handed to it is never awaited and Python warns about it; a callback on a closed loop raises here instead."""
        done: concurrent.futures.Future[Seen] = concurrent.futures.Future()

        def read() -> None:
            if done.set_running_or_notify_cancel():
                try:
                    done.set_result(self._read(namespace, name))
                except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                    done.set_exception(exc)

        self.loop.call_soon_threadsafe(read)
        return done.result(timeout=30)
