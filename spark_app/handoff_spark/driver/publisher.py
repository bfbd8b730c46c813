"""The driver's latest progress record, published into a ConfigMap the operator reads (I/O; driver only).

Why: the progress file and the Prometheus endpoint live inside the driver pod, where the operator cannot
see them. The operator turns the record's `degradedReason` (quota / transient trouble the sink met) into
its Degraded condition, so the driver hands the record over through the API server it already talks to.

Contract with the operator (operator/handoff_operator/spec/render.py and conditions.py; the names are in
`handoff_spark.contract`):
- the operator creates the ConfigMap `<handoff>-progress` (owned, no `data`) and tells the driver where it
  is: `HANDOFF_PROGRESS_CONFIGMAP` and `HANDOFF_PROGRESS_NAMESPACE`. Without them (local `handoff run`)
  nothing is published;
- the driver merge-patches only `data["progress.json"]` (field manager `handoff-driver`), so the operator's
  server-side apply, which never sets `data`, and the driver never fight over a field;
- the document is the progress record plus `driverPod` (this pod) and `publishedAtMs`. It is republished
  every `interval` seconds even without a new batch: that heartbeat is how the operator tells a live
  report from one a stopped driver left behind. A change of `degradedReason` is published at once.

Publishing happens on a background thread: the streaming query never waits for the API server, and a
failure is logged, counted (`on_error`) and retried at the next beat, never raised.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from handoff_spark import switches
from handoff_spark.contract import (CONFIG_HASH_KEY, CONFIG_REFUSED_HASH_KEY, PROGRESS_DATA_KEY, QUERY_HELD_KEY,
                                   QUERY_HOLDING_KEY)

FIELD_MANAGER = "handoff-driver"
DEFAULT_INTERVAL = switches.PROGRESS_PUBLISH_SECONDS.default
REQUEST_TIMEOUT = 10.0

log = logging.getLogger("handoff.progress_publisher")


def publish_due(record_key: object, published_key: object, published_at: float | None, now: float,
                interval: float) -> bool:
    """Publish now? At once when nothing was published yet or the degraded state changed; else once per
    `interval` (a new batch's numbers and the heartbeat both ride on that beat)."""
    if published_at is None or record_key != published_key:
        return True
    return now - published_at >= interval


def state_key(record: Mapping[str, Any]) -> object:
    """What makes a record urgent: the sink's degraded reason appearing, changing or clearing, the query
    stopping under the operator's hold or starting again (`driver.hold`: the operator waits for it), and the config
    the driver runs or refused changing (`driver.query_config`: the operator's rollout rule reads it)."""
    return (record.get("degradedReason"), record.get(QUERY_HELD_KEY), record.get(QUERY_HOLDING_KEY),
            record.get(CONFIG_HASH_KEY), record.get(CONFIG_REFUSED_HASH_KEY))


def document(record: Mapping[str, Any], pod: str | None, now_ms: int) -> str:
    return json.dumps({**record, "driverPod": pod, "publishedAtMs": now_ms}, sort_keys=True)


def import_kubernetes() -> None:
    """Import the Kubernetes client on the calling thread, before a thread that uses it starts.

    Why: `kubernetes.config` imports `requests` (through requests_oauthlib). A first import of `requests` in a
    background thread while the main thread imports it too (google-cloud-bigquery does, preparing the sink) can
    fail with "partially initialized module 'requests.utils'", which crashed a driver at its start."""
    import kubernetes.client  # noqa: F401
    import kubernetes.config  # noqa: F401


def api_client() -> Any:
    """In-cluster service account, else $KUBECONFIG (read now: the client reads it only at import)."""
    from kubernetes import client, config

    try:
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        return client.ApiClient(configuration)
    except config.ConfigException:
        path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        return config.new_client_from_config(config_file=path.split(os.pathsep)[0])


class ProgressPublisher:
    """Keeps the newest record and publishes it from its own thread (see the module docstring)."""

    def __init__(self, namespace: str, configmap: str, *, interval: float = DEFAULT_INTERVAL,
                 pod: str | None = None, api: Any = None,
                 on_error: Callable[[BaseException], None] | None = None,
                 on_published: Callable[[], None] | None = None) -> None:
        self.namespace, self.configmap, self.interval, self.pod = namespace, configmap, interval, pod
        self._api = api
        self._on_error, self._on_published = on_error, on_published
        self._cond = threading.Condition()
        self._record: dict[str, Any] | None = None
        self._published_key: object = None
        self._published_at: float | None = None
        self._closed = False
        self._sent: dict[str, Any] | None = None
        self._failures = 0
        import_kubernetes()
        self._thread = threading.Thread(target=self._loop, name="handoff-progress-publisher", daemon=True)
        self._thread.start()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **kwargs: Any) -> ProgressPublisher | None:
        """A publisher when the operator rendered where to publish, else None (local runs)."""
        configmap, namespace = switches.PROGRESS_CONFIGMAP(env), switches.PROGRESS_NAMESPACE(env)
        if not configmap or not namespace:
            return None
        return cls(namespace, configmap, interval=switches.PROGRESS_PUBLISH_SECONDS(env),
                   pod=switches.DRIVER_POD_NAME(env), **kwargs)

    # -- called from the driver's progress path: never blocks on I/O ---------------------------------

    def offer(self, record: Mapping[str, Any]) -> None:
        with self._cond:
            self._record = dict(record)
            self._cond.notify()

    def close(self, timeout: float = 20.0) -> None:
        """Publish the newest record if it is not out yet (best effort), then stop the thread. The wait covers a
        first publish (API client set-up) on a busy node: an AvailableNow run that exits right after its last
        commit otherwise lost its final record (seen with 5 s)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)

    # -- the publishing thread ---------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    record, now = self._record, time.monotonic()
                    if self._closed:
                        # The newest record goes out on close unless it already did.
                        if record is None or record is self._sent:
                            return
                        break
                    if record is not None and publish_due(state_key(record), self._published_key,
                                                          self._published_at, now, self.interval):
                        break
                    wait = (None if record is None or self._published_at is None
                            else max(0.05, self._published_at + self.interval - now))
                    self._cond.wait(wait)
                closing = self._closed
            self._publish(record)
            if closing:
                return

    def _publish(self, record: dict[str, Any]) -> None:
        ok = True
        try:
            if self._api is None:
                self._api = api_client()
            from kubernetes import client

            body = {"data": {PROGRESS_DATA_KEY: document(record, self.pod, int(time.time() * 1000))}}
            client.CoreV1Api(self._api).patch_namespaced_config_map(
                self.configmap, self.namespace, body, field_manager=FIELD_MANAGER,
                _content_type="application/merge-patch+json", _request_timeout=REQUEST_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - the stream must go on; the next beat tries again
            ok = False
            self._failures += 1
            if self._failures == 1 or self._failures % 20 == 0:
                log.warning("could not publish progress to ConfigMap %s/%s (%d failures so far): %s",
                            self.namespace, self.configmap, self._failures, exc)
            if self._on_error is not None:
                self._on_error(exc)
        if ok and self._failures:
            log.info("progress published to ConfigMap %s/%s again", self.namespace, self.configmap)
            self._failures = 0
        with self._cond:
            # A failed attempt counts too: a failing API server is asked once per interval (or on the next
            # state change), not in a loop; the next beat republishes the newest record.
            self._published_at = time.monotonic()
            self._published_key = state_key(record)
            if ok:
                self._sent = record
        if ok and self._on_published is not None:
            self._on_published()
