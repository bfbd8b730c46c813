"""Kubernetes API access for the handlers (I/O only; the decisions live in render/conditions/validation).

Why the synchronous `kubernetes` client in kopf's sync handlers (which kopf runs in a thread pool) and not
kubernetes_asyncio: it is already pinned for the whole project, and a reconcile is a handful of
requests, so threads cost nothing that matters. Children are written with server-side apply
(`fieldManager: handoff-operator`, force): the same request creates or updates, so a reconcile that is
interrupted and repeated (operator restart) converges on the same objects, never duplicates.
"""
from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.dynamic import DynamicClient

from handoff_operator.conditions import DriverFacts, condition_true
from handoff_operator.runtime.settings import current_settings
from handoff_operator.runtime.state import STORE
from handoff_operator.truth.driver_report import DATA_KEY as DRIVER_REPORT_KEY
from handoff_operator.spec.render import (CONFIG_HASH_ANNOTATION, COMPONENT_LABEL, GROUP, NAME_LABEL, PLURAL, VERSION,
                     TIMELINE_DATA_KEY, driver_name, progress_configmap_name, timeline_configmap,
                     timeline_configmap_name)

FIELD_MANAGER = "handoff-operator"


def in_cluster_server(env: Mapping[str, str]) -> str | None:
    """The API server as a pod reaches it, from the `kubernetes` Service's environment (what client-go and
    the kubernetes client use), or None outside a pod. Not `kubernetes.default.svc`: that needs cluster DNS,
    which a pod with another dnsPolicy, or a cluster without DNS, does not have."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


#: HTTP connections kept to the API server: at least the threads that talk to it at once (kopf's handler
#: executor, asyncio's default executor running the status refreshes). The client's default (5 × CPUs) is fewer on
#: a small node, and every request beyond the pool then opens and drops its own TLS connection.
CONNECTION_POOL_SIZE = 32


def new_api_client() -> client.ApiClient:
    """In-cluster credentials when running in a pod, else $KUBECONFIG (read now, not at import)."""
    try:
        config.load_incluster_config()
        configuration = client.Configuration.get_default_copy()
    except config.ConfigException:
        path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        configuration = type.__call__(client.Configuration)  # a fresh one, as config.new_client_from_config
        config.load_kube_config(config_file=path.split(os.pathsep)[0], client_configuration=configuration)
    configuration.connection_pool_maxsize = CONNECTION_POOL_SIZE
    return client.ApiClient(configuration)


def is_not_found(exc: BaseException) -> bool:
    return isinstance(exc, ApiException) and exc.status == 404


T = TypeVar("T")


def unless_gone(call: Callable[..., T], *args: Any) -> T | None:
    """`call(*args)`, or None when the API answers 404 (the object is gone, or not made yet)."""
    try:
        return call(*args)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


class AppliedChildren:
    """What this process last applied per child, so a refresh that renders the same body sends nothing.

    A server-side apply of an unchanged body is a no-op on the server but still a PATCH the operator serializes
    and the API server authorizes and diffs: ~8 children per handoff per refresh were most of the operator's
    API traffic. A child is applied again when its body changes, when it is forgotten (its Deployment changed:
    the driver watch calls `forget`), and at the latest `resync` seconds (±10%) after it was last applied, which
    repairs drift in children the operator does not watch (ConfigMaps, Service, RBAC). A restarted operator
    applies everything once. Part of the handoff store (runtime.state): a handoff's children are forgotten with it."""

    name = "kube.applied"

    def __init__(self, resync: float) -> None:
        self.resync = resync
        self._applied: dict[tuple[str, str, str, str], tuple[str, float]] = {}
        self._generations: dict[tuple[str, str, str], int] = {}  # (namespace, kind, name) → after our last apply
        self._lock = threading.Lock()
        STORE.join(self)

    @staticmethod
    def key(obj: Mapping[str, Any]) -> tuple[str, str, str, str]:
        meta = obj["metadata"]
        return obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"]

    @staticmethod
    def digest(obj: Mapping[str, Any]) -> str:
        return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()

    def current(self, obj: Mapping[str, Any], now: float, digest: str | None = None) -> bool:
        """`digest`: this body's `digest`, when the caller has it already (spec.rendered.Prepared)."""
        with self._lock:
            seen = self._applied.get(self.key(obj))
        return seen is not None and now < seen[1] and seen[0] == (digest or self.digest(obj))

    def remember(self, obj: Mapping[str, Any], now: float, digest: str | None = None,
                 generation: int | None = None) -> None:
        """`generation`: the object's metadata.generation as our apply left it (see `ours`)."""
        with self._lock:
            key = self.key(obj)
            self._applied[key] = (digest or self.digest(obj), now + self.resync * random.uniform(0.9, 1.1))
            if generation is not None:
                self._generations[(key[2], key[1], key[3])] = generation

    def ours(self, namespace: str, kind: str, name: str, generation: int | None) -> bool:
        """Is `generation` the one our last apply of that child produced? A watch event of a Deployment whose
        spec changed (generation ahead of observedGeneration) is then our own apply being rolled out, not
        somebody's edit to repair: at creation, forgetting it re-applied every Deployment twice more."""
        with self._lock:
            return generation is not None and self._generations.get((namespace, kind, name)) == int(generation)

    def forget_owner(self, namespace: str, owner: str) -> None:
        """Forget the children of handoff `owner` (named `<owner>-…`): it is gone, and a new one of the same name
        must get all its children applied."""
        with self._lock:
            for key in [k for k in self._applied if k[2] == namespace and k[3].startswith(owner + "-")]:
                del self._applied[key]
            for gen in [k for k in self._generations if k[0] == namespace and k[2].startswith(owner + "-")]:
                del self._generations[gen]

    def held(self, namespace: str, owner: str) -> list[str] | None:
        """The children of handoff `owner` this process remembers applying, as `Kind/name` (None: none)."""
        with self._lock:
            children = sorted(f"{k[1]}/{k[3]}" for k in self._applied if k[2] == namespace
                              and k[3].startswith(owner + "-"))
            children += sorted(f"{k[1]}/{k[2]}@generation" for k in self._generations if k[0] == namespace
                               and k[2].startswith(owner + "-"))
        return children or None

    def forget_handoff(self, namespace: str, name: str) -> None:
        self.forget_owner(namespace, name)

    def forget(self, namespace: str, kind: str | None = None, name: str | None = None) -> None:
        """Forget children in `namespace` (of `kind` named `name`; all of them when None)."""
        with self._lock:
            for key in [k for k in self._applied if k[2] == namespace and (kind is None or k[1] == kind)
                        and (name is None or k[3] == name)]:
                del self._applied[key]
                self._generations.pop((key[2], key[1], key[3]), None)


class Kube:
    def __init__(self, api: client.ApiClient, resync: float = 600.0) -> None:
        self.api = api
        self.applied = AppliedChildren(resync)
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self._dynamic: DynamicClient | None = None

    @property
    def dynamic(self) -> DynamicClient:
        if self._dynamic is None:
            self._dynamic = DynamicClient(self.api)
        return self._dynamic

    # -- the handoff itself ----------------------------------------------------------------------

    def get_handoff(self, namespace: str, name: str, plural: str = PLURAL) -> dict[str, Any] | None:
        """A Handoff custom object (a StreamTableHandoff unless `plural` names another kind), None if gone."""
        return unless_gone(self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, plural, name)

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any], plural: str = PLURAL
                     ) -> dict[str, Any] | None:
        """Merge-patch the status; the object as it is after it (None: the answer had none)."""
        result = self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, plural, name, {"status": dict(status)},
            _content_type="application/merge-patch+json")
        return result if isinstance(result, dict) else None

    # -- children --------------------------------------------------------------------------------

    def apply(self, obj: Mapping[str, Any], field_manager: str = FIELD_MANAGER) -> dict[str, Any]:
        """Server-side apply of `obj` as `field_manager` (the fields it set before and omits now are removed; another
        manager's are left)."""
        resource = self.dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        meta = obj["metadata"]
        result = resource.server_side_apply(body=dict(obj), name=meta["name"], namespace=meta["namespace"],
                                            field_manager=field_manager, force_conflicts=True)
        return result.to_dict()

    def apply_if_changed(self, obj: Mapping[str, Any], digest: str | None = None) -> bool:
        """`apply` unless this process applied the same body recently (AppliedChildren); True if it applied."""
        now = time.monotonic()
        if self.applied.current(obj, now, digest):
            return False
        result = self.apply(obj)
        generation = (result.get("metadata") or {}).get("generation") if isinstance(result, dict) else None
        self.applied.remember(obj, now, digest, int(generation) if generation is not None else None)
        return True

    def delete_if_owned(self, obj: Mapping[str, Any], owner_uid: str) -> bool:
        """Delete a child the spec turned off (the UI Service of `spark.ui.service: false`, the UI Ingress once
        spark.ui.ingress is removed) when it exists and the handoff `owner_uid` owns it: an object of that name
        someone else made is left alone. Not repeated before the resync (AppliedChildren); True if it deleted."""
        now = time.monotonic()
        marker = {**obj, "absent": owner_uid}
        if self.applied.current(marker, now):
            return False
        resource = self.dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        meta = obj["metadata"]
        deleted = False
        try:
            live = resource.get(name=meta["name"], namespace=meta["namespace"]).to_dict()
            if any(ref.get("uid") == owner_uid for ref in live["metadata"].get("ownerReferences") or ()):
                resource.delete(name=meta["name"], namespace=meta["namespace"])
                deleted = True
        except ApiException as exc:
            if exc.status != 404:
                raise
        self.applied.remember(marker, now)
        return deleted

    def create_if_missing(self, obj: Mapping[str, Any]) -> bool:
        """For objects the operator must never change or delete afterwards (the checkpoint PVC). Once it exists,
        the POST is not repeated before the resync (AppliedChildren)."""
        now = time.monotonic()
        if self.applied.current(obj, now):
            return False
        resource = self.dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        try:
            resource.create(body=dict(obj), namespace=obj["metadata"]["namespace"])
            created = True
        except ApiException as exc:
            if exc.status != 409:
                raise
            created = False
        self.applied.remember(obj, now)
        return created

    def read_secrets(self, namespace: str, names: Iterable[str]) -> dict[str, dict[str, str] | None]:
        out: dict[str, dict[str, str] | None] = {}
        for name in names:
            secret = unless_gone(self.core.read_namespaced_secret, name, namespace)
            if secret is None:
                out[name] = None
                continue
            data = {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}
            data.update(secret.string_data or {})
            out[name] = data
        return out

    def read_driver_report(self, namespace: str, name: str) -> str | None:
        """`progress.json` of the ConfigMap the driver publishes into (None: not there or not yet)."""
        cm = unless_gone(self.core.read_namespaced_config_map, progress_configmap_name(name), namespace)
        return None if cm is None else (cm.data or {}).get(DRIVER_REPORT_KEY)

    def read_timeline(self, namespace: str, name: str) -> tuple[str | None, str | None]:
        """The timeline record's text and the ConfigMap's resourceVersion ((None, None): not made yet)."""
        cm = unless_gone(self.core.read_namespaced_config_map, timeline_configmap_name(name), namespace)
        if cm is None:
            return None, None
        return (cm.data or {}).get(TIMELINE_DATA_KEY), cm.metadata.resource_version

    def write_timeline(self, owner: Mapping[str, Any], text: str, resource_version: str | None) -> None:
        """Create the timeline record, or replace it at `resource_version` (a 409 means another writer came
        first: the caller reads it again)."""
        body = timeline_configmap(owner, text)
        namespace = body["metadata"]["namespace"]
        if resource_version is None:
            self.core.create_namespaced_config_map(namespace, body)
        else:
            body["metadata"]["resourceVersion"] = resource_version
            self.core.replace_namespaced_config_map(body["metadata"]["name"], namespace, body)

    def scale_driver(self, namespace: str, name: str, replicas: int) -> bool:
        try:
            self.apps.patch_namespaced_deployment_scale(driver_name(name), namespace,
                                                        {"spec": {"replicas": replicas}})
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    def delete_pod(self, namespace: str, name: str) -> bool:
        """Delete a pod (its ReplicaSet starts another); False when it is gone already."""
        try:
            self.core.delete_namespaced_pod(name, namespace)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    def driver_pods(self, namespace: str, name: str) -> list[client.V1Pod]:
        selector = f"{NAME_LABEL}={name},{COMPONENT_LABEL}=driver"
        return list(self.core.list_namespaced_pod(namespace, label_selector=selector).items)

    def _raw(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """`call`'s answer as the API server's JSON (dicts, camelCase keys): the client's model deserialization of
        a Deployment or a pod list costs several times the request itself, and the facts need a few fields."""
        return json.loads(call(*args, _preload_content=False, **kwargs).data)

    def _pods(self, namespace: str, name: str, component: str) -> list[dict[str, Any]]:
        selector = f"{NAME_LABEL}={name},{COMPONENT_LABEL}={component}"
        return self._raw(self.core.list_namespaced_pod, namespace, label_selector=selector).get("items") or []

    def executor_count(self, namespace: str, name: str) -> int:
        return executors_running(self._pods(namespace, name, "executor"))

    def driver_facts(self, namespace: str, name: str) -> DriverFacts | None:
        deployment = unless_gone(self._raw, self.apps.read_namespaced_deployment, driver_name(name), namespace)
        if deployment is None:
            return None
        return driver_facts(deployment, self._pods(namespace, name, "driver"))


_operator_kube_lock = threading.Lock()


def operator_kube(memo: Any) -> Kube:
    """The operator's one `Kube`, shared by every controller (the handoffs', the ReplayRequests'): kept in kopf's
    `memo` (one per operator run), made at first use. One, so all of them share one connection pool and one
    record of what was applied (AppliedChildren)."""
    kube = getattr(memo, "kube", None)
    if kube is None:
        with _operator_kube_lock:
            kube = getattr(memo, "kube", None)
            if kube is None:
                kube = Kube(new_api_client(), resync=current_settings().children_resync_interval)
                memo.kube = kube
    return kube


def executors_running(pods: Iterable[Mapping[str, Any]]) -> int:
    """Executor pods that run and are not being deleted (JSON bodies, as the API server or a watch gives them)."""
    return sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running"
               and not (p.get("metadata") or {}).get("deletionTimestamp"))


def _ms(timestamp: str | None) -> int | None:
    if not timestamp:
        return None
    return int(dt.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1000)


def driver_facts(deployment: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> DriverFacts:
    """Facts from the Deployment and its pods, as JSON bodies (from a GET/LIST or from kopf's watch; the newest
    live pod speaks for the driver)."""
    st, dmeta = deployment.get("status") or {}, deployment.get("metadata") or {}
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    pod = max(live, key=lambda p: p["metadata"].get("creationTimestamp") or "", default=None)
    facts: dict[str, Any] = dict(
        desired_replicas=(deployment.get("spec") or {}).get("replicas") or 0,
        replicas=len(pods),
        ready_replicas=st.get("readyReplicas") or 0,
        updated_replicas=st.get("updatedReplicas") or 0,
        rollout_observed=(st.get("observedGeneration") or 0) >= (dmeta.get("generation") or 0),
    )
    if pod is not None:
        meta, status = pod["metadata"], pod.get("status") or {}
        ready = condition_true(status, "Ready")
        containers = [c for c in status.get("containerStatuses") or [] if c.get("name") == "driver"]
        facts.update(pod_name=meta.get("name"), pod_phase=status.get("phase"), pod_ready=ready,
                     pod_config_hash=(meta.get("annotations") or {}).get(CONFIG_HASH_ANNOTATION),
                     pod_started_at_ms=_ms(status.get("startTime")))
        if containers:
            c = containers[0]
            state, last = c.get("state") or {}, c.get("lastState") or {}
            facts["restart_count"] = c.get("restartCount") or 0
            if state.get("waiting"):
                facts["waiting_reason"] = state["waiting"].get("reason")
            term = state.get("terminated") or last.get("terminated")
            if term:
                facts["last_termination_reason"] = (f"{term.get('reason') or 'Terminated'} "
                                                    f"(exit code {term.get('exitCode')})")
                facts["last_termination_message"] = term.get("message")
    return DriverFacts(**facts)
