"""The warm-up job a driver runs on a newly registered executor (handoff_spark.startup.executor_warmup), on a real
local Spark with a real broker and an Iceberg table in a SQLite catalog: a Python data source write whose
rows carry the executor's preferred location; its writer runs a write task's set-up in a Python worker of the
stream's worker daemon (decode, Parquet, the Kafka reader's metadata, the sink's catalog and table), reports
where it ran and what failed, and leaves the warm worker for the next write task."""
from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from handoff_spark.sink import registry as sinks
from handoff_spark.driver.executor_scaler import SparkExecutors
from handoff_spark.startup.executor_warmup import JOB_GROUP, Executor, located_frame, run_warmup
from sink_support import app_config

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]


def in_thread(fn: Any, *args: Any) -> Any:
    """`fn(*args)` on a thread of its own, as the executor_scaler runs the warm-up: py4j gives it a JVM thread
    of its own, with no active session (the driver on the test bed failed with DATA_SOURCE_NOT_FOUND there)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(300)
    if "error" in out:
        raise out["error"]
    return out["result"]


def test_warm_up_tasks_prefer_their_executor_and_set_up_the_write_path(kafka, tmp_path: Any, caplog) -> None:
    from handoff_spark.driver.app import build_session

    kafka.create_topic("warm", partitions=1)
    cfg = app_config(tmp_path, kafka.bootstrap, "warm", sparkConf={"spark.master": "local[2]"})
    sinks.get("iceberg").prepare(cfg)
    spark = build_session(cfg)
    try:
        sc = spark.sparkContext
        # One row (one task) per core of each target, each preferring exactly that executor (Spark's own form),
        # in the plan Spark runs for the write.
        frame = located_frame(spark, [Executor("7", "10.0.0.9", 2), Executor("8", "10.0.0.10", 1)])
        # (What the DAGScheduler places a task by: the narrow lineage's first preferred locations.)
        rdd = frame._jdf.queryExecution().toRdd()
        prefs = [[loc.toString() for loc in sc._jvm.scala.jdk.javaapi.CollectionConverters.asJava(
            sc._jsc.sc().getPreferredLocs(rdd, i))] for i in range(len(rdd.partitions()))]
        assert prefs == [["executor_10.0.0.9_7"], ["executor_10.0.0.9_7"], ["executor_10.0.0.10_8"]]
        assert sorted(r.target for r in frame.collect()) == ["7", "7", "8"]
        # The job itself, on the local executor ("driver"): local mode sets no SPARK_EXECUTOR_ID, so each
        # task reports its target and no executor (and warmed() counts it for its target).
        with caplog.at_level(logging.WARNING, logger="handoff.executor_warmup"):
            reports, group_after = in_thread(lambda: (run_warmup(spark, [Executor("driver", "localhost", 2)], cfg),
                                                      sc.getLocalProperty("spark.jobGroup.id")))
        assert [(r.target, r.ran_on, r.error) for r in reports] == [("driver", None, None)] * 2
        assert not caplog.records, [r.getMessage() for r in caplog.records]
        # A set-up that fails (here: the table is not in the catalog) is reported, not raised: the executor
        # still counts, and the write task that meets the problem fails with it.
        missing = app_config(tmp_path, kafka.bootstrap, "warm",
                             sink={**cfg.model_dump(by_alias=True)["sink"], "table": "ns.missing"})
        with caplog.at_level(logging.WARNING, logger="handoff.executor_warmup"):
            reports = in_thread(run_warmup, spark, [Executor("driver", "localhost", 1)], missing)
        assert [(r.target, r.ran_on) for r in reports] == [("driver", None)] and reports[0].error
        assert [r.getMessage() for r in caplog.records if "ns.missing" in r.getMessage()
                or "NoSuchTable" in r.getMessage()], [r.getMessage() for r in caplog.records]
        # Its jobs carry its group (the in-cluster tests tell its stages apart by it); the group is cleared
        # afterwards: later jobs of that thread are not tagged with it.
        assert sc.statusTracker().getJobIdsForGroup(JOB_GROUP)
        assert group_after is None
        # What the scaler asks of the scheduler: the local executor is alive (offered) and not listed as one
        # to warm; an unknown id is not alive.
        executors = SparkExecutors(sc)
        assert executors.alive("driver") and not executors.alive("99")
        assert executors.registered() == []
    finally:
        spark.stop()


def test_the_next_python_data_source_write_task_reuses_the_warm_worker(tmp_path: Any) -> None:
    """What the warm-up is for: the stream's next write task on the executor runs in the worker the warm-up
    warmed (same worker daemon, same idle worker), not in a new one. (The RDD job of an earlier version ran
    under a second daemon, Spark keeping one per worker environment, and warmed nothing the stream used.)"""
    from pyspark.sql.datasource import DataSource, DataSourceWriter, WriterCommitMessage

    from handoff_spark.driver.app import build_session
    from handoff_spark.config import AppConfig

    out = tmp_path / "worker"

    class Writer(DataSourceWriter):
        def write(self, iterator: Any) -> WriterCommitMessage:
            import os

            for _ in iterator:
                pass
            out.write_text(str(os.getpid()))
            return WriterCommitMessage()

    class Sink(DataSource):
        @classmethod
        def name(cls) -> str:
            return "worker-probe"

        def schema(self) -> str:
            return "id long"

        def writer(self, schema: Any, overwrite: bool) -> Writer:
            return Writer()

    cfg = AppConfig.model_validate({
        "handoffId": "test/workers", "source": {"bootstrapServers": "127.0.0.1:1", "topics": ["t"]},
        "sink": {"kind": "iceberg", "table": "t.t"}, "schema": {"onIncompatible": "halt"},
        "checkpointLocation": str(tmp_path / "ck"), "sparkConf": {"spark.master": "local[1]"}})
    spark = build_session(cfg)
    try:
        spark.dataSource.register(Sink)
        (warm,) = in_thread(run_warmup, spark, [Executor("driver", "localhost", 1)])
        spark.range(1).write.format("worker-probe").mode("append").save()
        assert int(out.read_text()) == warm.worker_pid
    finally:
        spark.stop()
