"""Apply the operator's desired executor count to the running driver, live (I/O; driver only).

Why live: a restart to rescale costs a JVM start, a checkpoint read and a batch; the operator decides on lag
(operator/handoff_operator/scaling/rule.py) and the driver changes its executors between batches, with the same
pod, the same SparkContext and the same query id.

Contract with the operator (handoff_operator.scaling.step):
- the operator writes the desired count into the annotation `handoff.io/desired-executors` of the ConfigMap
  `<handoff>-progress` (the one this driver already publishes its progress into, and may `get`);
- the driver polls it every `HANDOFF_SCALE_POLL_SECONDS` (default 5) and asks Spark's scheduler backend for
  exactly that many executors (`SparkContext.requestTotalExecutors`, dynamic allocation off: the operator,
  not pending tasks, decides). Going down, it first kills the surplus executors (newest first, between
  batches when it can: a task on a killed executor is re-run, never lost), then sets the total;
- a newly registered executor is warmed before it counts (executor_warmup): a small job pinned to it starts
  its Python worker under the stream's daemon and runs a write task's set-up. Meanwhile batches run as one
  wave on the warm cores, so the new executor has no stream task to take cold;
- it rewrites the source's `minPartitions` file when the warm cores change (`startup.executor_warmup.partitions_target`:
  MIN_PARTITIONS_PER_CORE × the warm cores, or exactly one task per warm core while some are cold or on the
  way), so the next batch is cut for the executors that can run it now (kafka_source reads the file when it
  plans each batch).

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

from handoff_spark import pyspark_private, switches
from handoff_spark.contract import DESIRED_EXECUTORS_ANNOTATION
from handoff_spark.startup.executor_warmup import Executor, WarmUp, partitions_target, run_warmup, to_warm, warmed
from handoff_spark.driver.publisher import REQUEST_TIMEOUT, api_client, import_kubernetes

DEFAULT_POLL = switches.SCALE_POLL_SECONDS.default
#: How long a scale-down waits for a batch boundary before killing executors mid-batch.
IDLE_WAIT_SECONDS = 30.0
#: How often registrations are checked (a local py4j call): a new executor's warm-up should start before
#: the next batch is planned.
REGISTRATION_POLL = 0.1
#: How long executors asked for but not registered keep batches at one wave (Spark may fail to start a pod).
PENDING_WINDOW_SECONDS = 180.0
#: Spark conf (spec.spark.sparkConf) that turns the warm-up of new executors off.
WARMUP_CONF = "spark.handoff.executorWarmup"
#: Warm-up tries per executor before it counts anyway, and how long one may take before it counts anyway
#: (a failing or hung warm-up must not keep an executor out of the batches).
WARMUP_TRIES = 3
WARMUP_TIMEOUT_SECONDS = 120.0

log = logging.getLogger("handoff.executor_scaler")


def parse_desired(annotations: Mapping[str, str] | None) -> int | None:
    """The operator's desired count; None when absent or not a count (then nothing changes)."""
    value = (annotations or {}).get(DESIRED_EXECUTORS_ANNOTATION)
    try:
        desired = int(value) if value is not None else None
    except ValueError:
        return None
    return desired if desired is not None and desired >= 0 else None


def scalable_master(master: str) -> bool:
    """Can Spark's scheduler under `master` change its executor count? Not local mode's (`local`, `local[N]`,
    `local[N,F]`); every cluster manager's, and `local-cluster`'s, can."""
    return not (master == "local" or master.startswith("local["))


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


def write_min_partitions(path: str, value: int, *, one_wave: bool = False) -> None:
    """Atomic rewrite: the source's planning never reads a half-written number. `one_wave`: exactly `value`
    tasks (kafka.source.SourceOptions.task_bounds)."""
    target = Path(path)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(f"{value} wave" if one_wave else str(value))
    os.replace(tmp, target)


class SparkExecutors:
    """The running SparkContext's executors, through its scheduler backend (py4j; `pyspark_private`: PySpark
    wraps none of these calls)."""

    def __init__(self, sc: Any) -> None:
        self.sc = sc

    def ids(self) -> list[str]:
        jvm = pyspark_private.jvm(self.sc)
        seq = pyspark_private.scala_context(self.sc).getExecutorIds()
        return [str(e) for e in jvm.scala.jdk.javaapi.CollectionConverters.asJava(seq)]

    def request_total(self, n: int) -> bool:
        jvm = pyspark_private.jvm(self.sc)
        empty = jvm.org.apache.spark.api.python.PythonUtils.toScalaMap(jvm.java.util.HashMap())
        return bool(pyspark_private.scala_context(self.sc).requestTotalExecutors(n, 0, empty))

    def kill(self, ids: list[str]) -> bool:
        jvm = pyspark_private.jvm(self.sc)
        java_ids = jvm.java.util.ArrayList()
        for executor_id in ids:
            java_ids.add(executor_id)
        return bool(pyspark_private.scala_context(self.sc).killExecutors(
            jvm.org.apache.spark.api.python.PythonUtils.toSeq(java_ids)))

    def cores(self) -> int:
        return int(self.sc.defaultParallelism)

    def alive(self, executor_id: str) -> bool:
        """Whether the task scheduler offers this executor's cores yet (it does from its first resource offer,
        a moment after registration)."""
        return bool(pyspark_private.scala_context(self.sc).taskScheduler().isExecutorAlive(executor_id))

    def registered(self) -> list[Executor]:
        """The active executors (not the driver) with their host and cores, from Spark's status store."""
        jvm = pyspark_private.jvm(self.sc)
        summaries = jvm.scala.jdk.javaapi.CollectionConverters.asJava(
            pyspark_private.scala_context(self.sc).statusStore().executorList(True))
        # hostPort is set once the executor's block manager has registered: until then it is not listed.
        return [Executor(str(e.id()), str(e.hostPort()).rsplit(":", 1)[0], int(e.totalCores()))
                for e in summaries if str(e.id()) != "driver" and e.hostPort() is not None]


class ExecutorScaler:
    """Polls the desired count and applies it (see the module docstring)."""

    def __init__(self, namespace: str, configmap: str, executors: SparkExecutors, *, min_partitions_file: str,
                 partitions_per_core: int, poll: float = DEFAULT_POLL, idle: Callable[[], bool] | None = None,
                 echo: Callable[[str], None] = print, api: Any = None,
                 warmup: Callable[[list[Executor]], list[WarmUp]] | None = None) -> None:
        self.namespace, self.configmap, self.executors = namespace, configmap, executors
        self.min_partitions_file, self.partitions_per_core = min_partitions_file, partitions_per_core
        self.poll, self.idle, self.echo, self._api, self.warmup = poll, idle, echo, api, warmup
        self.applied: int | None = None
        self.applied_at = 0.0
        self.warm: set[str] = set()
        self.warmup_failures: dict[str, int] = {}
        self._registered: dict[str, Executor] = {}
        self._ids: tuple[str, ...] = ()
        self._warming: dict[str, float] = {}  # executors whose warm-up job runs now → when it started
        self._lock = threading.Lock()  # warm, _warming and warmup_failures change in warm-up threads
        self._min_partitions: tuple[int, bool] | None = None
        self._stop = threading.Event()
        self._failures = 0
        self._thread = threading.Thread(target=self._loop, name="handoff-executor-scaler", daemon=True)

    @classmethod
    def from_env(cls, executors: SparkExecutors, env: Mapping[str, str] | None = None,
                 **kwargs: Any) -> ExecutorScaler | None:
        configmap, namespace = switches.PROGRESS_CONFIGMAP(env), switches.PROGRESS_NAMESPACE(env)
        if not configmap or not namespace:
            return None
        return cls(namespace, configmap, executors, poll=switches.SCALE_POLL_SECONDS(env), **kwargs)

    @classmethod
    def for_session(cls, spark: Any, cfg: Any = None, **kwargs: Any) -> ExecutorScaler | None:
        """The scaler of a driver the operator manages, warming new executors for `cfg`'s write path with
        `run_warmup` unless the handoff's Spark conf sets `spark.handoff.executorWarmup` to false (then every
        executor counts as it registers, as before warm-ups existed). None in local mode (`local`, `local[N]`):
        its one in-process executor cannot be scaled, and Spark answers every request with a warning."""
        if not scalable_master(str(spark.sparkContext.master)):
            return None
        enabled = str(spark.conf.get(WARMUP_CONF, "true")).strip().lower() != "false"
        return cls.from_env(SparkExecutors(spark.sparkContext),
                            warmup=(lambda executors: run_warmup(spark, executors, cfg)) if enabled else None,
                            **kwargs)

    def start(self) -> None:
        import_kubernetes()
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        next_read = 0.0
        while not self._stop.is_set():
            try:
                if time.monotonic() >= next_read:
                    next_read = time.monotonic() + self.poll
                    self.step()
                else:
                    self.follow_executors()
                self._failures = 0
            except Exception as exc:  # noqa: BLE001 - the stream goes on with the executors it has
                if self._stop.is_set():
                    return  # the driver is stopping (its SparkContext may be gone already): nothing to scale
                self._failures += 1
                if self._failures == 1 or self._failures % 20 == 0:
                    log.warning("executor scaling: %s (%d failures so far)", exc, self._failures)
            self._stop.wait(min(self.poll, REGISTRATION_POLL))

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
        self.follow_executors()

    def apply(self, desired: int) -> None:
        running = self.executors.ids()
        doomed = surplus(running, desired)
        if doomed:
            self._wait_idle()
            self.executors.kill(doomed)
        self.executors.request_total(desired)
        self.echo(f"executors: {len(running)} → {desired} (operator's desired count"
                  + (f"; stopping executors {', '.join(doomed)})" if doomed else ")"))
        self.applied, self.applied_at = desired, time.monotonic()
        with self._lock:
            self.warm -= set(doomed)

    def follow_executors(self) -> None:
        """Warm new executors, then rewrite the source's minPartitions for the cores that can run batches now."""
        if self.warmup is None:  # nothing to warm with: every core counts as it registers
            self._write(self.partitions_per_core * max(1, self.executors.cores()), one_wave=False)
            return
        ids = tuple(sorted(self.executors.ids()))
        if ids != self._ids:
            self._registered = {e.id: e for e in self.executors.registered()}
            self._ids = ids if set(self._registered) == set(ids) else ()  # the status store may lag: look again
            with self._lock:
                self.warm &= set(self._registered)
        self._start_warmup()
        more_coming = (self.applied is not None and self.applied > len(self._registered)
                       and time.monotonic() - self.applied_at < PENDING_WINDOW_SECONDS)
        cores = {e.id: e.cores for e in self._registered.values()}
        with self._lock:
            warm = set(self.warm)
        self._write(*partitions_target(self.partitions_per_core, cores, warm, more_coming=more_coming))

    def _write(self, value: int, one_wave: bool) -> None:
        if (value, one_wave) != self._min_partitions:
            write_min_partitions(self.min_partitions_file, value, one_wave=one_wave)
            self._min_partitions = (value, one_wave)

    def _start_warmup(self) -> None:
        """A warm-up job, in its own thread, for every executor that is registered, alive in the task scheduler
        (before that, the job's preferred location would not count yet and its task could run anywhere) and
        neither warm nor warming. Jobs for executors that register later start at once, beside it: an executor
        waiting for its warm-up is an idle slot a batch may fill."""
        now = time.monotonic()
        with self._lock:
            targets = [e for e in to_warm(self._registered, self.warm | set(self._warming), self.warmup_failures,
                                          WARMUP_TRIES) if self.executors.alive(e)]
            # Tried WARMUP_TRIES times, or warming for too long: it counts, cold or not.
            self.warm.update(e for e in self._registered
                             if e not in self.warm and (self.warmup_failures.get(e, 0) >= WARMUP_TRIES
                                                        or now - self._warming.get(e, now) > WARMUP_TIMEOUT_SECONDS))
            self._warming.update(dict.fromkeys(targets, now))
        if targets:
            threading.Thread(target=self._warm, args=([self._registered[e] for e in targets],),
                             name="handoff-executor-warmup", daemon=True).start()

    def _warm(self, executors: list[Executor]) -> None:
        assert self.warmup is not None
        started = time.monotonic()
        try:
            done = warmed(self.warmup(executors))
        except Exception as exc:  # noqa: BLE001 - a failed warm-up is retried, then the executor counts anyway
            done = set()
            if not self._stop.is_set():
                log.warning("warm-up of executors %s failed: %s", ", ".join(e.id for e in executors), exc)
        with self._lock:
            for e in executors:
                if e.id not in done:
                    self.warmup_failures[e.id] = self.warmup_failures.get(e.id, 0) + 1
            self.warm.update(done)
            for e in executors:
                self._warming.pop(e.id, None)
        if done:
            self.echo(f"executors {', '.join(sorted(done, key=lambda e: (len(e), e)))} warm "
                      f"({time.monotonic() - started:.1f} s warm-up)")

    def _wait_idle(self) -> None:
        if self.idle is None:
            return
        deadline = time.monotonic() + IDLE_WAIT_SECONDS
        while time.monotonic() < deadline and not self._stop.is_set():
            if self.idle():
                return
            time.sleep(0.2)
