"""The warm-up job a driver runs on a newly registered executor (handoff_spark.executor_warmup), on a real
local Spark with a real broker and an Iceberg table in a SQLite catalog: its tasks carry the executor's
preferred location, run a write task's set-up in a Python worker forked from Handoff's daemon (decode,
Parquet, the Kafka reader's metadata, the sink's catalog and table), and report where they ran and what
failed."""
from __future__ import annotations

import logging
from typing import Any

import pytest

from handoff_spark import sinks
from handoff_spark.executor_scaler import SparkExecutors
from handoff_spark.executor_warmup import Executor, located_rdd, run_warmup
from sink_support import app_config

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]


def test_warm_up_tasks_prefer_their_executor_and_set_up_the_write_path(kafka, tmp_path: Any, caplog) -> None:
    from handoff_spark.app import build_session

    kafka.create_topic("warm", partitions=1)
    cfg = app_config(tmp_path, kafka.bootstrap, "warm", sparkConf={"spark.master": "local[2]"})
    sinks.get("iceberg").prepare(cfg)
    spark = build_session(cfg)
    try:
        sc = spark.sparkContext
        # One task per core of each target, each preferring exactly that executor (Spark's own form).
        rdd = located_rdd(sc, [Executor("7", "10.0.0.9", 2), Executor("8", "10.0.0.10", 1)])
        jrdd = rdd._jrdd.rdd()
        prefs = [list(sc._jvm.scala.jdk.javaapi.CollectionConverters.asJava(jrdd.preferredLocations(p)))
                 for p in jrdd.partitions()]
        assert prefs == [["executor_10.0.0.9_7"], ["executor_10.0.0.9_7"], ["executor_10.0.0.10_8"]]
        assert sorted(rdd.collect()) == ["7", "7", "8"]
        # The job itself, on the local executor ("driver"): local mode sets no SPARK_EXECUTOR_ID, so each
        # task reports its target and no executor (and warmed() counts it for its target).
        with caplog.at_level(logging.WARNING, logger="handoff.executor_warmup"):
            assert run_warmup(spark, [Executor("driver", "localhost", 2)], cfg) == [("driver", None)] * 2
        assert not caplog.records, [r.getMessage() for r in caplog.records]
        # A set-up that fails (here: the table is not in the catalog) is reported, not raised: the executor
        # still counts, and the write task that meets the problem fails with it.
        missing = app_config(tmp_path, kafka.bootstrap, "warm",
                             sink={**cfg.model_dump(by_alias=True)["sink"], "table": "ns.missing"})
        with caplog.at_level(logging.WARNING, logger="handoff.executor_warmup"):
            assert run_warmup(spark, [Executor("driver", "localhost", 1)], missing) == [("driver", None)]
        assert [r.getMessage() for r in caplog.records if "ns.missing" in r.getMessage()
                or "NoSuchTable" in r.getMessage()], [r.getMessage() for r in caplog.records]
        # Its job group is cleared afterwards: the stream's own jobs on this thread are not tagged with it.
        assert sc.getLocalProperty("spark.jobGroup.id") is None
        # What the scaler asks of the scheduler: the local executor is alive (offered) and not listed as one
        # to warm; an unknown id is not alive.
        executors = SparkExecutors(sc)
        assert executors.alive("driver") and not executors.alive("99")
        assert executors.registered() == []
    finally:
        spark.stop()


def _daemon_of_rdd_task(spark: Any) -> int:
    def parent(items: Any) -> Any:
        import os

        for _ in items:  # read to the end: a worker that left input unread is not reused
            yield os.getppid()

    return spark.sparkContext.parallelize([0], 1).mapPartitions(parent).collect()[0]


def test_warm_up_tasks_run_under_the_same_worker_daemon_as_a_python_data_source_write(tmp_path: Any) -> None:
    """Spark keeps a worker daemon per environment: without share_sql_workers an RDD task (the warm-up's
    kind) and a Python data source's write task (the stream's kind) run under two daemons."""
    from pyspark.sql.datasource import DataSource, DataSourceWriter, WriterCommitMessage

    from handoff_spark.app import build_session
    from handoff_spark.config import AppConfig
    from handoff_spark.executor_warmup import share_sql_workers

    out = tmp_path / "daemon"

    class Writer(DataSourceWriter):
        def write(self, iterator: Any) -> WriterCommitMessage:
            import os

            for _ in iterator:
                pass
            with open(out, "w") as f:
                f.write(str(os.getppid()))
            return WriterCommitMessage()

    class Sink(DataSource):
        @classmethod
        def name(cls) -> str:
            return "daemon-probe"

        def schema(self) -> str:
            return "id long"

        def writer(self, schema: Any, overwrite: bool) -> Writer:
            return Writer()

    cfg = AppConfig.model_validate({
        "handoffId": "test/daemons", "source": {"bootstrapServers": "127.0.0.1:1", "topics": ["t"]},
        "sink": {"kind": "iceberg", "table": "t.t"}, "schema": {"onIncompatible": "halt"},
        "checkpointLocation": str(tmp_path / "ck"), "sparkConf": {"spark.master": "local[1]"}})
    spark = build_session(cfg)
    try:
        spark.dataSource.register(Sink)
        spark.range(1).write.format("daemon-probe").mode("append").save()
        write_daemon = int(out.read_text())
        assert _daemon_of_rdd_task(spark) != write_daemon  # Spark's default: two daemons
        share_sql_workers(spark)
        assert _daemon_of_rdd_task(spark) == write_daemon
    finally:
        spark.stop()
