"""Warm a newly registered executor before the stream hands it tasks (I/O: driver and executors).

Why: a micro-batch waits for its slowest task. An executor the autoscaler just added is cold: its Python
worker daemon is not started (forking it imports pyarrow, PyIceberg, confluent-kafka: ~3.4 s of CPU), its
JVM has not loaded the Arrow/Python-runner classes or compiled them. A stream task that lands there first
holds the whole batch for all of that (measured on the test bed: the lag grew for ~70 s after two new 200m
executors registered, docs/benchmarks.md "Scaling on lag"). So the driver runs one small job per new
executor, pinned to it, that runs a write task's set-up without its data (`warm_task`) in a Python worker
forked from Handoff's daemon (worker_daemon). Until it returns, the executor_scaler does not count the
executor's cores when it cuts batches (see `partitions_target`). The JVM side of a stream task (the Python
data source's Arrow path) is not warmed by it.

The job's Python functions carry the SQL runners' worker environment (`share_sql_workers`), so its tasks run
under the same worker daemon as the stream's, and a stream task can reuse the warmed worker.

Pinning uses Spark's own locality: the job's partitions come from `SparkContext.makeRDD` with a preferred
location `executor_<host>_<id>` (Spark's ExecutorCacheTaskLocation), which the narrow stages above inherit;
a free, preferred executor gets the task at PROCESS_LOCAL at once. Each task reports the executor it ran on
(`SPARK_EXECUTOR_ID`, set in every executor pod by Spark's Kubernetes backend), so a task that ran elsewhere
does not count as a warm-up of its target.
"""
from __future__ import annotations

import functools
import io
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("handoff.executor_warmup")

ENV_EXECUTOR_ID = "SPARK_EXECUTOR_ID"
JOB_GROUP = "handoff-executor-warmup"
#: The warm-up job's description (Spark's UI and REST API show it on its stages), then the executor ids.
JOB_DESCRIPTION = "handoff: warm up executors "
#: Rows each warm-up task decodes and writes: enough to run every code path once, little enough to be cheap.
SAMPLE_ROWS = 2_000


@dataclass(frozen=True)
class Executor:
    """A registered executor as the driver's status store sees it."""

    id: str
    host: str
    cores: int

    @property
    def location(self) -> str:
        """Spark's preferred-location string for exactly this executor (TaskLocation's `executor_` form)."""
        return f"executor_{self.host}_{self.id}"


def partitions_target(per_core: int, registered: Mapping[str, int], warm: Iterable[str], *,
                      more_coming: bool) -> tuple[int, bool]:
    """How many tasks the source cuts the next batch into, and whether exactly that many (one wave), from the
    registered executors' cores (`registered`: id → cores) and which of them are warm.

    - Nothing warm yet (a driver's start): at least `per_core` per registered core; nothing to protect.
    - Some executor cold, or more on the way (`more_coming`): exactly one task per warm core, a single wave.
      With more tasks than cores a batch has pending tasks, and an executor that registers mid-batch takes
      them at once, cold; a single wave leaves it nothing to take before its warm-up job does.
    - All warm: at least `per_core` per core, as always."""
    warm = set(warm)
    warm_cores = sum(cores for executor_id, cores in registered.items() if executor_id in warm)
    if warm_cores == 0:
        return per_core * max(1, sum(registered.values())), False
    if more_coming or any(executor_id not in warm for executor_id in registered):
        return warm_cores, True
    return per_core * warm_cores, False


def to_warm(registered: Iterable[str], warm: Iterable[str], failures: Mapping[str, int],
            max_failures: int) -> list[str]:
    """Registered executors still to warm up: not warm, and not given up on after `max_failures` tries."""
    done = set(warm)
    return sorted((e for e in registered if e not in done and failures.get(e, 0) < max_failures),
                  key=lambda e: (int(e) if e.isdigit() else -1, e))


def warmed(results: Iterable[tuple[str, str | None]]) -> set[str]:
    """Targets whose warm-up task ran on them. A task that could not tell where it ran (no
    SPARK_EXECUTOR_ID: local mode) counts for its target."""
    return {target for target, ran_on in results if ran_on is None or ran_on == target}


# -- executor side ---------------------------------------------------------------------------------------

def warm_task(cfg: Any, targets: Iterator[str]) -> Iterator[tuple[str, str | None, float, str | None]]:
    """What each warm-up task runs in a Python worker: a write task's set-up without its data. A JSON decode
    and a Parquet write on sample rows (pyarrow's lazy initialisation), the range reader's consumer and the
    topics' metadata, and the sink's own set-up (`warm_up`: catalog connection, table metadata, file system,
    or the BigQuery write client), which a reused worker keeps for its next tasks.
    Yields (target, executor it ran on, ms, error or None) per element: a set-up that fails is reported,
    not raised (the write task that meets it will fail with the real error)."""
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    ran_on = os.environ.get(ENV_EXECUTOR_ID)
    lines = b"\n".join(b'{"id": %d, "ts": "2026-01-01T00:00:00Z", "region": "eu"}' % i for i in range(SAMPLE_ROWS))
    for target in targets:
        started, error = time.perf_counter(), None
        pq.write_table(pj.read_json(io.BytesIO(lines)), io.BytesIO(), compression="zstd")
        if cfg is not None:
            try:
                warm_write_path(cfg)
            except Exception as exc:  # noqa: BLE001 - reported to the driver's log
                error = f"{type(exc).__name__}: {exc}"
        yield target, ran_on, round((time.perf_counter() - started) * 1000, 1), error


def warm_write_path(cfg: Any) -> None:
    """The Kafka reader's and the sink's set-up, as a write task of `cfg` does it."""
    from . import kafka_source, sinks

    kafka_source.warm_reader(kafka_source.SourceOptions.parse(kafka_source.source_options(cfg, None)))
    sinks.get(cfg.sink.kind).warm_up(cfg)


# -- driver side -----------------------------------------------------------------------------------------

def located_rdd(sc: Any, executors: list[Executor]) -> Any:
    """A PySpark RDD with one element (the target's id) per core of each executor, each preferring it."""
    from pyspark import RDD
    from pyspark.serializers import UTF8Deserializer

    jvm = sc._jvm
    to_seq = jvm.org.apache.spark.api.python.PythonUtils.toSeq
    items = jvm.java.util.ArrayList()
    for executor in executors:
        where = jvm.java.util.ArrayList()
        where.add(executor.location)
        for _ in range(max(1, executor.cores)):
            items.add(jvm.scala.Tuple2(executor.id, to_seq(where)))
    class_tag = jvm.scala.reflect.ClassTag.apply(jvm.java.lang.Class.forName("java.lang.String"))
    return RDD(sc._jsc.sc().makeRDD(to_seq(items), class_tag).toJavaRDD(), sc, UTF8Deserializer())


#: What Spark's SQL Python runners (the Python data sources' tasks among them) add to a worker's environment
#: when simplified tracebacks are on (the default), and the conf that turns it off.
SQL_WORKER_ENV = "SPARK_SIMPLIFIED_TRACEBACK"
SIMPLIFIED_TRACEBACK_CONF = "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled"


def share_sql_workers(spark: Any) -> None:
    """Give the driver's Python RDD functions the environment the SQL runners give theirs.

    Why: an executor keeps one worker daemon (and one pool of idle, reusable workers) per Python executable,
    module and *environment*. The SQL runners add SPARK_SIMPLIFIED_TRACEBACK=1, the RDD API does not, so an
    RDD job would start a second daemon beside the one the stream's tasks use, and warm nothing of theirs
    (measured: an RDD task and a Python data source write task ran under different daemons; with this,
    under the same one, and the write task's worker was then reused by the next RDD job)."""
    if str(spark.conf.get(SIMPLIFIED_TRACEBACK_CONF, "true")).lower() == "true":
        spark.sparkContext.environment[SQL_WORKER_ENV] = "1"


def run_warmup(spark: Any, executors: list[Executor], cfg: Any = None) -> list[tuple[str, str | None]]:
    """Run the warm-up job on `executors` (for the write path of `cfg`, when given) and return (target,
    executor it ran on) per task. Called from the executor_scaler's thread; the job is tagged with its own
    group so the UI and logs tell it apart."""
    share_sql_workers(spark)
    sc = spark.sparkContext
    sc.setJobGroup(JOB_GROUP, JOB_DESCRIPTION + ", ".join(e.id for e in executors), interruptOnCancel=True)
    try:
        result = located_rdd(sc, executors).mapPartitions(functools.partial(warm_task, cfg)).collect()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)
    for target, ran_on, _ms, error in result:
        if error:
            log.warning("warm-up on executor %s: %s", ran_on or target, error)
    return [(target, ran_on) for target, ran_on, _ms, _error in result]
