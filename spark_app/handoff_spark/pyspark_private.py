"""Every PySpark private API Handoff uses, behind one name each, so a PySpark upgrade is checked here.

Why private APIs at all: PySpark wraps only part of Spark's Scala API, and these needs have no public Python
equivalent (see the callers):
* `jvm(sc)` (`SparkContext._jvm`) and `scala_context(sc)` (`SparkContext._jsc.sc()`): py4j's view of the driver
  JVM and its Scala SparkContext, for what PySpark does not wrap: executor ids, `requestTotalExecutors`,
  `killExecutors`, the task scheduler and the status store (`executor_scaler`), and an RDD with preferred
  locations (`executor_warmup`); the class path an archive was made with (`jvm_cds`).
* `java_session(spark)` (`SparkSession._jsparkSession`) and `set_active_session(spark)`
  (`SparkSession._get_j_spark_session_class`): a Dataset from that RDD, and the active session of the calling JVM
  thread, where Spark looks a Python data source up (`executor_warmup`, on the scaler's thread).
* `gateway_process(sc)` (`SparkContext._gateway.proc`): the driver JVM's process, whose exit `jvm_cds` waits for
  (the JVM writes its class-data archive as it exits).
* `spark_home()` (`pyspark.find_spark_home._find_spark_home`): the Spark whose jars spark-submit puts on the
  class path, by PySpark's own rules (`jvm_cds`'s cache key).
* `plan_deterministic(df)` (`DataFrame._jdf`): whether a transform's analysed plan is deterministic
  (`driver.transform`: a replay must drop and derive what the first run did).
* `watermark_output_operators(df)` (`DataFrame._jdf`): whether a transform's streaming plan has an operator whose
  output waits on the watermark (`driver.app`: without one, Spark's no-data batches are turned off).
* `daemon_manager()` (`pyspark.daemon.manager`): PySpark's worker daemon loop, which Handoff's daemon runs after
  preloading modules (`worker_daemon`). Not underscored, but `pyspark.daemon` is the internal entry point
  `spark.python.daemon.module` names, not documented API.
* `PROCESS_MODULES`: the internal modules Spark's JVM runs as Python processes for a Python data source (the
  planners, the streaming source and sink runners, the workers), which the driver's fork server imports before
  it forks them (`fork_server`).

Every import is inside its function: `worker_daemon` sets the Arrow memory pool before pyarrow (which pyspark
imports) loads, and `jvm_cds` runs as a script before a session exists. `PRIVATE_APIS` lists the names that
resolve without a live session; tests/unit/spark/test_private_api_fences.py resolves them and calls every accessor on a
real local session. Pinned: requirements.lock.
"""
from __future__ import annotations

from subprocess import Popen
from typing import Any, Callable

from handoff_spark.private_api import attribute

FENCE = "handoff_spark/pyspark_private.py"

#: The private names below that exist without a running session (module and class attributes).
PRIVATE_APIS = (
    "pyspark.SparkContext._jvm",
    "pyspark.SparkContext._gateway",
    "pyspark.sql.SparkSession._get_j_spark_session_class",
    "pyspark.find_spark_home._find_spark_home",
    "pyspark.daemon.manager",
)

#: The modules Spark 4.3's JVM runs as `python -m …` for a Python data source, and their daemon's.
PROCESS_MODULES = (
    "pyspark.daemon",
    "pyspark.worker",
    "pyspark.sql.worker.lookup_data_sources",
    "pyspark.sql.worker.create_data_source",
    "pyspark.sql.worker.plan_data_source_read",
    "pyspark.sql.worker.write_into_data_source",
    "pyspark.sql.worker.commit_data_source_write",
    "pyspark.sql.worker.python_streaming_sink_runner",
    "pyspark.sql.streaming.python_streaming_source_runner",
)


def jvm(sc: Any) -> Any:
    """py4j's view of the driver JVM (`jvm.org.apache.spark...`)."""
    return attribute(sc, "_jvm", api="pyspark.SparkContext._jvm", fence=FENCE)


def scala_context(sc: Any) -> Any:
    """The JVM's Scala `org.apache.spark.SparkContext` behind the Python one."""
    return attribute(sc, "_jsc", api="pyspark.SparkContext._jsc", fence=FENCE).sc()


def java_session(spark: Any) -> Any:
    """The JVM's `org.apache.spark.sql.SparkSession` behind the Python one."""
    return attribute(spark, "_jsparkSession", api="pyspark.sql.SparkSession._jsparkSession", fence=FENCE)


def set_active_session(spark: Any) -> None:
    """Make `spark` the active session of the calling thread in the JVM too."""
    from pyspark.sql import SparkSession

    session_class = attribute(SparkSession, "_get_j_spark_session_class",
                              api="pyspark.sql.SparkSession._get_j_spark_session_class", fence=FENCE)
    session_class(jvm(spark.sparkContext)).setActiveSession(java_session(spark))


def gateway_process(sc: Any) -> Popen[bytes]:
    """The driver JVM's process (PySpark started it; it exits when its stdin closes)."""
    gateway = attribute(sc, "_gateway", api="pyspark.SparkContext._gateway", fence=FENCE)
    return attribute(gateway, "proc", api="pyspark.SparkContext._gateway.proc", fence=FENCE)  # type: ignore[no-any-return]


def spark_home() -> str:
    """The Spark installation spark-submit runs (SPARK_HOME, else pyspark's bundled one)."""
    from pyspark import find_spark_home

    find: Callable[[], str] = attribute(find_spark_home, "_find_spark_home",
                                        api="pyspark.find_spark_home._find_spark_home", fence=FENCE)
    return find()


def plan_deterministic(df: Any) -> bool:
    """Whether the DataFrame's analysed plan is deterministic (Catalyst's `LogicalPlan.deterministic`: no `rand()`,
    `uuid()`, `shuffle()` … anywhere), through the JVM Dataset behind it (PySpark has no Python equivalent)."""
    jdf = attribute(df, "_jdf", api="pyspark.sql.DataFrame._jdf", fence=FENCE)
    return bool(jdf.queryExecution().analyzed().deterministic())


#: Logical operators whose output waits on the watermark when they read a stream (Spark's no-data batches emit it:
#: an append-mode aggregation's closed windows, a stream-stream outer join's unmatched rows, a session window).
_WATERMARK_OUTPUT_NODES = frozenset({"Aggregate", "Distinct", "Deduplicate", "Join", "FlatMapGroupsWithState",
                                     "TransformWithState", "FlatMapGroupsInPandasWithState", "SessionWindowing"})


def watermark_output_operators(df: Any) -> list[str]:
    """The operators of the DataFrame's analysed plan (through `DataFrame._jdf`, as `plan_deterministic`) whose
    output may wait on a streaming watermark: an aggregation, deduplication or state over a stream, or a join of two
    streams. Empty: only a dedupe within the watermark (`DeduplicateWithinWatermark`, which emits each row at once)
    or stateless operators, so Spark's no-data batches would only evict state (`driver.app.frame_path_conf`)."""
    jdf = attribute(df, "_jdf", api="pyspark.sql.DataFrame._jdf", fence=FENCE)
    found: list[str] = []
    stack = [jdf.queryExecution().analyzed()]
    while stack:
        node = stack.pop()
        children = node.children()
        kids = [children.apply(i) for i in range(children.size())]
        name = node.getClass().getSimpleName()
        if name in _WATERMARK_OUTPUT_NODES and node.isStreaming() and \
                (name != "Join" or all(k.isStreaming() for k in kids)):
            found.append(name)
        stack.extend(kids)
    return found


def daemon_manager() -> Callable[[], None]:
    """PySpark's worker daemon loop (forks a worker per task)."""
    from pyspark import daemon

    return attribute(daemon, "manager", api="pyspark.daemon.manager", fence=FENCE)  # type: ignore[no-any-return]


__all__ = ["PRIVATE_APIS", "jvm", "scala_context", "java_session", "set_active_session", "gateway_process",
           "spark_home", "daemon_manager", "plan_deterministic", "watermark_output_operators"]
