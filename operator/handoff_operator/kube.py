"""Kubernetes API access for the handlers (I/O only; the decisions live in render/conditions/validation).

Why the synchronous `kubernetes` client in kopf's sync handlers (which kopf runs in a thread pool) and not
kubernetes_asyncio: it is already pinned for the whole project, and a reconcile is a handful of
requests, so threads cost nothing that matters. Children are written with server-side apply
(`fieldManager: handoff-operator`, force): the same request creates or updates, so a reconcile that is
interrupted and repeated (operator restart) converges on the same objects, never duplicates.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.dynamic import DynamicClient

from .conditions import DriverFacts
from .driver_report import DATA_KEY as DRIVER_REPORT_KEY
from .render import (CONFIG_HASH_ANNOTATION, COMPONENT_LABEL, GROUP, NAME_LABEL, PLURAL, VERSION,
                     driver_name, progress_configmap_name)

FIELD_MANAGER = "handoff-operator"


def in_cluster_server(env: Mapping[str, str]) -> str | None:
    """The API server as a pod reaches it, from the `kubernetes` Service's environment (what client-go and
    the kubernetes client use), or None outside a pod. Not `kubernetes.default.svc`: that needs cluster DNS,
    which a pod with another dnsPolicy, or a cluster without DNS, does not have."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def new_api_client() -> client.ApiClient:
    """In-cluster credentials when running in a pod, else $KUBECONFIG (read now, not at import)."""
    try:
        config.load_incluster_config()
        return client.ApiClient()
    except config.ConfigException:
        path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        return config.new_client_from_config(config_file=path.split(os.pathsep)[0])


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
    applies everything once."""

    def __init__(self, resync: float) -> None:
        self.resync = resync
        self._applied: dict[tuple[str, str, str, str], tuple[str, float]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(obj: Mapping[str, Any]) -> tuple[str, str, str, str]:
        meta = obj["metadata"]
        return obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"]

    @staticmethod
    def digest(obj: Mapping[str, Any]) -> str:
        return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()

    def current(self, obj: Mapping[str, Any], now: float) -> bool:
        with self._lock:
            seen = self._applied.get(self.key(obj))
        return seen is not None and seen[0] == self.digest(obj) and now < seen[1]

    def remember(self, obj: Mapping[str, Any], now: float) -> None:
        with self._lock:
            self._applied[self.key(obj)] = (self.digest(obj), now + self.resync * random.uniform(0.9, 1.1))

    def forget_owner(self, namespace: str, owner: str) -> None:
        """Forget the children of handoff `owner` (named `<owner>-…`): it is gone, and a new one of the same name
        must get all its children applied."""
        with self._lock:
            for key in [k for k in self._applied if k[2] == namespace and k[3].startswith(owner + "-")]:
                del self._applied[key]

    def forget(self, namespace: str, kind: str | None = None, name: str | None = None) -> None:
        """Forget children in `namespace` (of `kind` named `name`; all of them when None)."""
        with self._lock:
            for key in [k for k in self._applied if k[2] == namespace and (kind is None or k[1] == kind)
                        and (name is None or k[3] == name)]:
                del self._applied[key]


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

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any], plural: str = PLURAL) -> None:
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, plural, name, {"status": dict(status)},
            _content_type="application/merge-patch+json")

    # -- children --------------------------------------------------------------------------------

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        resource = self.dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        meta = obj["metadata"]
        result = resource.server_side_apply(body=dict(obj), name=meta["name"], namespace=meta["namespace"],
                                            field_manager=FIELD_MANAGER, force_conflicts=True)
        return result.to_dict()

    def apply_if_changed(self, obj: Mapping[str, Any]) -> bool:
        """`apply` unless this process applied the same body recently (AppliedChildren); True if it applied."""
        now = time.monotonic()
        if self.applied.current(obj, now):
            return False
        self.apply(obj)
        self.applied.remember(obj, now)
        return True

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

    def scale_driver(self, namespace: str, name: str, replicas: int) -> bool:
        try:
            self.apps.patch_namespaced_deployment_scale(driver_name(name), namespace,
                                                        {"spec": {"replicas": replicas}})
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    def driver_pods(self, namespace: str, name: str) -> list[client.V1Pod]:
        selector = f"{NAME_LABEL}={name},{COMPONENT_LABEL}=driver"
        return list(self.core.list_namespaced_pod(namespace, label_selector=selector).items)

    def executor_count(self, namespace: str, name: str) -> int:
        selector = f"{NAME_LABEL}={name},{COMPONENT_LABEL}=executor"
        pods = self.core.list_namespaced_pod(namespace, label_selector=selector).items
        return sum(1 for p in pods if p.status and p.status.phase == "Running"
                   and p.metadata.deletion_timestamp is None)

    def driver_facts(self, namespace: str, name: str) -> DriverFacts | None:
        deployment = unless_gone(self.apps.read_namespaced_deployment, driver_name(name), namespace)
        if deployment is None:
            return None
        return driver_facts(deployment, self.driver_pods(namespace, name))


def driver_facts(deployment: client.V1Deployment, pods: list[client.V1Pod]) -> DriverFacts:
    """Facts from the Deployment and its pods (the newest live pod speaks for the driver)."""
    st = deployment.status or client.V1DeploymentStatus()
    live = [p for p in pods if p.metadata.deletion_timestamp is None]
    pod = max(live, key=lambda p: p.metadata.creation_timestamp, default=None)
    facts: dict[str, Any] = dict(
        desired_replicas=deployment.spec.replicas or 0,
        replicas=len(pods),
        ready_replicas=st.ready_replicas or 0,
        updated_replicas=st.updated_replicas or 0,
        rollout_observed=(st.observed_generation or 0) >= (deployment.metadata.generation or 0),
    )
    if pod is not None:
        status = pod.status or client.V1PodStatus()
        ready = any(c.type == "Ready" and c.status == "True" for c in (status.conditions or []))
        containers = [c for c in (status.container_statuses or []) if c.name == "driver"]
        facts.update(pod_name=pod.metadata.name, pod_phase=status.phase, pod_ready=ready,
                     pod_config_hash=(pod.metadata.annotations or {}).get(CONFIG_HASH_ANNOTATION),
                     pod_started_at_ms=(int(status.start_time.timestamp() * 1000) if status.start_time
                                        else None))
        if containers:
            c = containers[0]
            facts["restart_count"] = c.restart_count or 0
            if c.state and c.state.waiting:
                facts["waiting_reason"] = c.state.waiting.reason
            term = (c.state.terminated if c.state and c.state.terminated else
                    c.last_state.terminated if c.last_state else None)
            if term is not None:
                facts["last_termination_reason"] = f"{term.reason or 'Terminated'} (exit code {term.exit_code})"
                facts["last_termination_message"] = term.message
    return DriverFacts(**facts)
