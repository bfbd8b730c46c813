"""Apply the operator's desired executor count to the running driver, live (I/O; driver only).

Why live: a restart to rescale costs a JVM start, a checkpoint read and a batch; the operator decides on lag
(operator/handoff_operator/scaling.py) and the driver changes its executors between batches, with the same
pod, the same SparkContext and the same query id.

Contract with the operator (handoff_operator.autoscale):
- the operator writes the desired count into the annotation `handoff.io/desired-executors` of the ConfigMap
  `<handoff>-progress` (the one this driver already publishes its progress into, and may `get`);
- the driver polls it every `HANDOFF_SCALE_POLL_SECONDS` (default 5) and asks Spark's scheduler backend for
  exactly that many executors (`SparkContext.requestTotalExecutors`, dynamic allocation off: the operator,
  not pending tasks, decides). Going down, it first kills the surplus executors (newest first, between
  batches when it can: a task on a killed executor is re-run, never lost), then sets the total;
- after every change it rewrites the source's `minPartitions` file with MIN_PARTITIONS_PER_CORE × the cores
  the executors have now, so the next batch is cut into enough ranges for them (kafka_source reads the file
  when it plans each batch).

Without the ConfigMap environment (local `handoff run`) nothing is polled. A failed poll is logged and
retried at the next beat, never raised: the stream goes on with the executors it has.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .progress_publisher import ENV_CONFIGMAP, ENV_NAMESPACE, REQUEST_TIMEOUT, api_client

ANNOTATION = "handoff.io/desired-executors"
ENV_POLL = "HANDOFF_SCALE_POLL_SECONDS"
DEFAULT_POLL = 5.0
#: How long a scale-down waits for a batch boundary before killing executors mid-batch.
IDLE_WAIT_SECONDS = 30.0

log = logging.getLogger("handoff.executor_scaler")


def parse_desired(annotations: Mapping[str, str] | None) -> int | None:
    """The operator's desired count; None when absent or not a count (then nothing changes)."""
    value = (annotations or {}).get(ANNOTATION)
    try:
        desired = int(value) if value is not None else None
    except ValueError:
        return None
    return desired if desired is not None and desired >= 0 else None


def surplus(executor_ids: list[str], desired: int) -> list[str]:
    """Which executors to kill to get down to `desired`: the newest (highest numeric id) first."""
    ordered = sorted(executor_ids, key=lambda e: (int(e) if e.isdigit() else -1, e))
    return ordered[desired:][::-1] if len(ordered) > desired else []


def to_apply(desired: int | None, applied: int | None, registered: int) -> int | None:
    """The count to apply now, or None: the operator's new desired count, or the applied one again when more
    executors registered than asked for (Spark retries a pod creation that timed out on a busy API server, and
    both pods may come up: the extra one would otherwise run for good)."""
    if desired is not None and desired != applied:
        return desired
    if applied is not None and registered > applied:
        return applied
    return None


def write_min_partitions(path: str, value: int) -> None:
    """Atomic rewrite: the source's planning never reads a half-written number."""
    target = Path(path)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(str(value))
    os.replace(tmp, target)


class SparkExecutors:
    """The running SparkContext's executors, through its scheduler backend (py4j)."""

    def __init__(self, sc: Any) -> None:
        self.sc = sc

    def ids(self) -> list[str]:
        jvm = self.sc._jvm
        seq = self.sc._jsc.sc().getExecutorIds()
        return [str(e) for e in jvm.scala.jdk.javaapi.CollectionConverters.asJava(seq)]

    def request_total(self, n: int) -> bool:
        jvm = self.sc._jvm
        empty = jvm.org.apache.spark.api.python.PythonUtils.toScalaMap(jvm.java.util.HashMap())
        return bool(self.sc._jsc.sc().requestTotalExecutors(n, 0, empty))

    def kill(self, ids: list[str]) -> bool:
        jvm = self.sc._jvm
        java_ids = jvm.java.util.ArrayList()
        for executor_id in ids:
            java_ids.add(executor_id)
        return bool(self.sc._jsc.sc().killExecutors(jvm.org.apache.spark.api.python.PythonUtils.toSeq(java_ids)))

    def cores(self) -> int:
        return int(self.sc.defaultParallelism)


class ExecutorScaler:
    """Polls the desired count and applies it (see the module docstring)."""

    def __init__(self, namespace: str, configmap: str, executors: SparkExecutors, *, min_partitions_file: str,
                 partitions_per_core: int, poll: float = DEFAULT_POLL, idle: Callable[[], bool] | None = None,
                 echo: Callable[[str], None] = print, api: Any = None) -> None:
        self.namespace, self.configmap, self.executors = namespace, configmap, executors
        self.min_partitions_file, self.partitions_per_core = min_partitions_file, partitions_per_core
        self.poll, self.idle, self.echo, self._api = poll, idle, echo, api
        self.applied: int | None = None
        self._min_partitions: int | None = None
        self._stop = threading.Event()
        self._failures = 0
        self._thread = threading.Thread(target=self._loop, name="handoff-executor-scaler", daemon=True)

    @classmethod
    def from_env(cls, executors: SparkExecutors, env: Mapping[str, str] | None = None,
                 **kwargs: Any) -> ExecutorScaler | None:
        env = os.environ if env is None else env
        configmap, namespace = env.get(ENV_CONFIGMAP), env.get(ENV_NAMESPACE)
        if not configmap or not namespace:
            return None
        return cls(namespace, configmap, executors, poll=float(env.get(ENV_POLL) or DEFAULT_POLL), **kwargs)

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
                self._failures = 0
            except Exception as exc:  # noqa: BLE001 - the stream goes on with the executors it has
                if self._stop.is_set():
                    return  # the driver is stopping (its SparkContext may be gone already): nothing to scale
                self._failures += 1
                if self._failures == 1 or self._failures % 20 == 0:
                    log.warning("executor scaling: %s (%d failures so far)", exc, self._failures)
            self._stop.wait(self.poll)

    def read_desired(self) -> int | None:
        if self._api is None:
            self._api = api_client()
        from kubernetes import client

        cm = client.CoreV1Api(self._api).read_namespaced_config_map(self.configmap, self.namespace,
                                                                    _request_timeout=REQUEST_TIMEOUT)
        return parse_desired(cm.metadata.annotations)

    def step(self) -> None:
        target = to_apply(self.read_desired(), self.applied, len(self.executors.ids()))
        if target is not None:
            self.apply(target)
        self.follow_cores()

    def apply(self, desired: int) -> None:
        running = self.executors.ids()
        doomed = surplus(running, desired)
        if doomed:
            self._wait_idle()
            self.executors.kill(doomed)
        self.executors.request_total(desired)
        self.echo(f"executors: {len(running)} → {desired} (operator's desired count"
                  + (f"; stopping executors {', '.join(doomed)})" if doomed else ")"))
        self.applied = desired

    def follow_cores(self) -> None:
        """Rewrite the source's minPartitions when the executors' cores changed."""
        value = self.partitions_per_core * max(1, self.executors.cores())
        if value != self._min_partitions:
            write_min_partitions(self.min_partitions_file, value)
            self._min_partitions = value

    def _wait_idle(self) -> None:
        if self.idle is None:
            return
        deadline = time.monotonic() + IDLE_WAIT_SECONDS
        while time.monotonic() < deadline and not self._stop.is_set():
            if self.idle():
                return
            time.sleep(0.2)
