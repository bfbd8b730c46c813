"""Warm a newly registered executor before the stream hands it tasks (I/O: driver and executors).

Why: a micro-batch waits for its slowest task. An executor the autoscaler just added is cold: its Python
worker daemon is not started (forking it imports pyarrow, PyIceberg, confluent-kafka: ~3.4 s of CPU), and its
JVM has not run a Python data source task: the SQL task's classes, the Arrow and Python-runner path, their JIT
and the heap's first collections. A stream task that lands there first holds the whole batch for all of that.
Measured on the test bed at 0.2 CPU per executor (Spark's task metrics, docs/benchmarks.md "Scaling on lag"):
the first stream task on a fresh executor took 11-12 s (2 s deserializing, 0.7 s of the task thread's JVM CPU,
0.6 s in GC, the rest waiting for CPU), the next ones 0.5 s.

So the driver runs one small job per new executor, pinned to it, that is itself a Python data source write
(`WarmUpDataSource`, an Arrow writer like the sinks'): the JVM runs the same kind of task as a stream batch's
write, and the Python writer runs a write task's set-up without its data (`warm_task`) in a worker of the same
worker daemon the stream's tasks use (the same SQL runner environment), which a stream task then reuses.
Until it returns, the executor_scaler does not count the executor's cores when it cuts batches (see
`partitions_target`). (An earlier version ran a plain RDD job: it warmed the Python side only, and the first
stream task on the executor still took 11 s.)

Pinning uses Spark's own locality: the job's rows come from `SparkContext.makeRDD` with a preferred location
`executor_<host>_<id>` (Spark's ExecutorCacheTaskLocation), which the narrow write stage above inherits; a
free, preferred executor gets the task at PROCESS_LOCAL at once. Each task reports the executor it ran on
(`SPARK_EXECUTOR_ID`, set in every executor pod by Spark's Kubernetes backend), so a task that ran elsewhere
does not count as a warm-up of its target. The writer's commit (in a Python process Spark starts on the
driver) writes the tasks' reports to a file the driver reads back.
"""
from __future__ import annotations

import io
import json
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from handoff_spark import pyspark_private
from handoff_spark.sink.datasource_api import DataSource, DataSourceArrowWriter, WriterCommitMessage
from handoff_spark.driver.temp_dirs import own_temp_dir_while

log = logging.getLogger("handoff.executor_warmup")

ENV_EXECUTOR_ID = "SPARK_EXECUTOR_ID"
JOB_GROUP = "handoff-executor-warmup"
#: The warm-up's own Python data source (registered by run_warmup; it writes nowhere).
SOURCE_NAME = "handoff-executor-warmup"
#: Where the warm-up job's reports land: `<tmp>/handoff-warmup-<pid>-<random>` (`temp_dirs`).
DIR_PREFIX = "handoff-warmup-"
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


class WarmUp(NamedTuple):
    """One warm-up task's report."""

    target: str                 # the executor it was meant for
    ran_on: str | None          # the executor it ran on (None: local mode, no SPARK_EXECUTOR_ID)
    ms: float
    error: str | None           # the write path's set-up failed (reported, not raised)
    worker_pid: int             # the Python worker it ran in (a stream task on that executor reuses it)


def warmed(results: Iterable[WarmUp]) -> set[str]:
    """Targets whose warm-up task ran on them. A task that could not tell where it ran (no
    SPARK_EXECUTOR_ID: local mode) counts for its target."""
    return {r.target for r in results if r.ran_on is None or r.ran_on == r.target}


# -- executor side ---------------------------------------------------------------------------------------

def warm_task(cfg: Any, targets: Iterable[str]) -> Iterator[WarmUp]:
    """What each warm-up task runs in a Python worker: a write task's set-up without its data. A JSON decode
    and a Parquet write on sample rows (pyarrow's lazy initialisation), the range reader's consumer and the
    topics' metadata, and the sink's own set-up (`warm_up`: catalog connection, table metadata, file system,
    or the BigQuery write client), which a reused worker keeps for its next tasks.
    Yields a report per target: a set-up that fails is reported, not raised (the write task that meets it will
    fail with the real error)."""
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
        yield WarmUp(target, ran_on, round((time.perf_counter() - started) * 1000, 1), error, os.getpid())


def warm_write_path(cfg: Any) -> None:
    """The Kafka reader's and the sink's set-up, as a write task of `cfg` does it."""
    from handoff_spark.sink import registry as sinks
    from handoff_spark.kafka import source as kafka_source

    kafka_source.warm_reader(kafka_source.SourceOptions.parse(kafka_source.source_options(cfg, None)))
    sinks.get(cfg.sink.kind).warm_up(cfg)


# -- the warm-up's data source (executor side: write; driver side: commit) --------------------------------

@dataclass
class WarmUpMessage(WriterCommitMessage):
    reports: list[WarmUp] = field(default_factory=list)


class WarmUpWriter(DataSourceArrowWriter):
    """Runs `warm_task` for the targets in its rows; its commit hands the reports to the driver (a file)."""

    def __init__(self, config: str | None, results: str) -> None:
        self.config, self.results = config, results

    def write(self, iterator: Iterator[Any]) -> WarmUpMessage:
        targets = [t for batch in iterator for t in batch.column(0).to_pylist()]
        cfg = None
        if self.config:
            from handoff_spark.config import AppConfig

            cfg = AppConfig.model_validate_json(self.config)
        return WarmUpMessage(list(warm_task(cfg, targets)))

    def commit(self, messages: list[Any]) -> None:
        reports = [list(r) for m in messages if m is not None for r in m.reports]
        Path(self.results).write_text(json.dumps(reports))

    def abort(self, messages: list[Any]) -> None:
        """Nothing was written anywhere."""


class WarmUpDataSource(DataSource):
    """`df.write.format("handoff-executor-warmup").option("results", path)[.option("config", json)]`."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return "target string"

    def writer(self, schema: Any, overwrite: bool) -> WarmUpWriter:
        return WarmUpWriter(self.options.get("config"), self.options["results"])


# -- driver side -----------------------------------------------------------------------------------------

def located_frame(spark: Any, executors: list[Executor]) -> Any:
    """A DataFrame (`target string`) with one row per core of each executor, each row its own partition
    preferring that executor."""
    from pyspark.sql import DataFrame

    jvm = pyspark_private.jvm(spark.sparkContext)
    to_seq = jvm.org.apache.spark.api.python.PythonUtils.toSeq
    items = jvm.java.util.ArrayList()
    for executor in executors:
        where = jvm.java.util.ArrayList()
        where.add(executor.location)
        for _ in range(max(1, executor.cores)):
            items.add(jvm.scala.Tuple2(executor.id, to_seq(where)))
    class_tag = jvm.scala.reflect.ClassTag.apply(jvm.java.lang.Class.forName("java.lang.String"))
    rdd = pyspark_private.scala_context(spark.sparkContext).makeRDD(to_seq(items), class_tag)
    jdf = pyspark_private.java_session(spark).createDataset(rdd, jvm.org.apache.spark.sql.Encoders.STRING()).toDF()
    return DataFrame(jdf, spark).withColumnRenamed("value", "target")


def run_warmup(spark: Any, executors: list[Executor], cfg: Any = None) -> list[WarmUp]:
    """Run the warm-up write on `executors` (for the write path of `cfg`, when given) and return each task's
    report. Called from the executor_scaler's thread; the job is tagged with its own group so the UI and logs
    tell it apart."""
    # Spark looks a Python data source up in the *active* session of the calling JVM thread; this runs on the
    # scaler's thread, where that is not `spark` (measured on the test bed: DATA_SOURCE_NOT_FOUND right after
    # registering it), so make it the active one here.
    pyspark_private.set_active_session(spark)
    spark.dataSource.register(WarmUpDataSource)
    sc = spark.sparkContext
    sc.setJobGroup(JOB_GROUP, JOB_DESCRIPTION + ", ".join(e.id for e in executors), interruptOnCancel=True)
    with own_temp_dir_while(DIR_PREFIX) as tmp:
        results = Path(tmp) / "reports.json"
        try:
            writer = located_frame(spark, executors).write.format(SOURCE_NAME).mode("append")
            if cfg is not None:
                writer = writer.option("config", cfg.to_json())
            writer.option("results", str(results)).save()
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)
            sc.setLocalProperty("spark.job.description", None)
        reports = [WarmUp(*r) for r in json.loads(results.read_text())]
    for r in reports:
        if r.error:
            log.warning("warm-up on executor %s: %s", r.ran_on or r.target, r.error)
    return reports
