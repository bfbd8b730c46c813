"""The operator's hold on the stream's query, read by the running driver (I/O; driver only).

Why: a Rollback or RollbackAndReplay needs the table quiet while it tags and rolls it back, then the stream to
resume from the table's ledger. Stopping the driver pod for that costs a JVM start, a Spark session and cold
Python workers (~10 s or more on a busy node) for what is only a change of where the query starts. Held in the
running driver, the query stops at a batch boundary and starts again from the ledger in the same session.

Contract with the operator (`handoff_operator.replay.handlers`, names in `handoff_spark.contract`):
- the operator writes `QUERY_HOLD_ANNOTATION` (the request's name) on the progress ConfigMap, the one this
  driver publishes into and already reads for its executor count;
- the driver polls it every `HANDOFF_HOLD_POLL_SECONDS` (default 1). While it is there the driver runs no
  query: a running one says `QUERY_HOLDING_KEY` = the request's name and stops at a batch boundary; a driver
  starting (a pod restarted mid-replay) waits before its first one. Once stopped it publishes `QUERY_HELD_KEY` =
  the request's name: the operator's cue that no batch can commit;
- when the operator removes the annotation, the driver plans its start again (the ledger is the truth: a
  checkpoint ahead of the rolled-back table is discarded, `driver.resume`) and starts the query again.
The ledger's contiguity check still guards the table whatever the driver does: a batch that does not start
where the rolled-back ledger ends is refused.

The same read brings the operator's query config (`QUERY_CONFIG_ANNOTATION`, a changed transform), which
`driver.query_config` applies: one request a second serves both.

A failed poll keeps the last answer and is retried (a hold never lifts because the API server was briefly
unreachable). Without the ConfigMap environment (local `handoff run`) there is no hold.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from handoff_spark import switches
from handoff_spark.contract import QUERY_CONFIG_ANNOTATION, QUERY_HOLD_ANNOTATION
from handoff_spark.driver.publisher import REQUEST_TIMEOUT, api_client, import_kubernetes

log = logging.getLogger("handoff.hold")


def parse_hold(annotations: Mapping[str, str] | None) -> str | None:
    """The request holding the query, or None. Pure."""
    value = (annotations or {}).get(QUERY_HOLD_ANNOTATION)
    return (value.strip() or None) if isinstance(value, str) else None


class QueryHold:
    """Polls the hold from its own thread; `requested()` is the newest answer (never blocks on I/O)."""

    def __init__(self, namespace: str, configmap: str, *, poll: float, api: Any = None) -> None:
        self.namespace, self.configmap, self.poll, self._api = namespace, configmap, poll, api
        self._request: str | None = None
        self._query_config: str | None = None  # the operator's QUERY_CONFIG_ANNOTATION, as read
        self._known = threading.Event()  # set after the first successful read
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._failures = 0
        self._thread = threading.Thread(target=self._loop, name="handoff-query-hold", daemon=True)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **kwargs: Any) -> QueryHold | None:
        configmap, namespace = switches.PROGRESS_CONFIGMAP(env), switches.PROGRESS_NAMESPACE(env)
        if not configmap or not namespace:
            return None
        # 0 would ask the API server in a tight loop: at most ten times a second.
        return cls(namespace, configmap, poll=max(0.1, switches.HOLD_POLL_SECONDS(env)), **kwargs)

    def start(self) -> QueryHold:
        import_kubernetes()
        self._thread.start()
        return self

    def first_answer(self, timeout: float = REQUEST_TIMEOUT) -> str | None:
        """The hold after the first read (waited for, bounded): a driver restarted mid-replay must see the hold
        before its first batch, not after it."""
        self._known.wait(timeout)
        return self._request

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._changed.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def requested(self) -> str | None:
        return self._request

    def query_config(self) -> str | None:
        """The operator's query config as last read (`QUERY_CONFIG_ANNOTATION`'s text; None: there is none)."""
        return self._query_config

    def wait_released(self, stopping: Callable[[], bool]) -> bool:
        """Block until the hold is gone (True) or `stopping()` says the driver stops (False)."""
        while self._request is not None:
            if stopping() or self._stop.is_set():
                return False
            self._changed.wait(0.2)
            self._changed.clear()
        return True

    def read(self) -> tuple[str | None, str | None]:
        """One read of the hold and the query config: a list by name at `resourceVersion=0`, which the API server
        answers from its watch cache. Why not a GET: a GET is a quorum read of etcd, and every driver asks once a
        second."""
        if self._api is None:
            self._api = api_client()
        from kubernetes import client

        found = client.CoreV1Api(self._api).list_namespaced_config_map(
            self.namespace, field_selector=f"metadata.name={self.configmap}", resource_version="0",
            _request_timeout=REQUEST_TIMEOUT)
        annotations = (found.items[0].metadata.annotations or {}) if found.items else {}
        return parse_hold(annotations), annotations.get(QUERY_CONFIG_ANNOTATION)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                request, self._query_config = self.read()
            except Exception as exc:  # noqa: BLE001 - keep the last answer; the next poll tries again
                self._failures += 1
                if self._failures == 1 or self._failures % 20 == 0:
                    log.warning("could not read the query hold from ConfigMap %s/%s (%d failures so far): %s",
                                self.namespace, self.configmap, self._failures, exc)
            else:
                self._failures = 0
                if request != self._request:
                    self._request = request
                    self._changed.set()
                self._known.set()
            self._stop.wait(self.poll)
