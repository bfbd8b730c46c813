"""The warm-up job a driver runs on a newly registered executor (handoff_spark.executor_warmup), on a real
local Spark: its tasks carry the executor's preferred location, run a write task's decode and Parquet write
in a Python worker forked from Handoff's daemon, and report where they ran."""
from __future__ import annotations

from typing import Any

import pytest

from handoff_spark.config import AppConfig
from handoff_spark.executor_scaler import SparkExecutors
from handoff_spark.executor_warmup import Executor, located_rdd, run_warmup

pytestmark = pytest.mark.e2e


def test_warm_up_tasks_prefer_their_executor_and_run_in_a_python_worker(tmp_path: Any) -> None:
    from handoff_spark.app import build_session

    cfg = AppConfig.model_validate({
        "handoffId": "test/warmup", "source": {"bootstrapServers": "127.0.0.1:1", "topics": ["t"]},
        "sink": {"kind": "iceberg", "table": "t.t"}, "schema": {"onIncompatible": "halt"},
        "checkpointLocation": str(tmp_path), "sparkConf": {"spark.master": "local[2]"}})
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
        assert run_warmup(spark, [Executor("driver", "localhost", 2)]) == [("driver", None), ("driver", None)]
        # Its job group is cleared afterwards: the stream's own jobs on this thread are not tagged with it.
        assert sc.getLocalProperty("spark.jobGroup.id") is None
        # What the scaler asks of the scheduler: the local executor is alive (offered) and not listed as one
        # to warm; an unknown id is not alive.
        executors = SparkExecutors(sc)
        assert executors.alive("driver") and not executors.alive("99")
        assert executors.registered() == []
    finally:
        spark.stop()
