"""Warming the driver's Python machinery while the query starts, so the first micro-batch does not pay for it.

Why: every Python piece of a PySpark data source runs in its own Python process, started on first use — a
daemon per planner module (`create_data_source`, `plan_data_source_read`, …) and the executors' worker daemon
(`handoff_spark.worker_daemon`, which imports pyarrow/PyIceberg before it forks workers). A fresh driver starts
them one after the other on the query's critical path: the first batch after every (re)start took ~16 s
whatever its size, the next ones under a second. A tiny batch read of `handoff-warmup` (one row per task, read
by a Python data source reader like the sink's write tasks) starts the same daemons and workers from a
background thread while the main thread starts the query, so the two overlap instead of queueing.

Nothing here touches Kafka, the table or the checkpoint: a failed warm-up is logged and ignored (the query
then starts what it needs itself). Off unless `HANDOFF_PREWARM=1`: not yet shown to pay on this project's
2-core machine (docs/benchmarks.md, "Cold start"), and under heavy overload the extra Python processes made a
query's own worker miss Spark's connect-back timeout once.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import LongType, StructField, StructType

log = logging.getLogger("handoff.warmup")

WARMUP_SOURCE_NAME = "handoff-warmup"
SCHEMA = StructType([StructField("pid", LongType(), False)])


class WarmupDataSource(DataSource):
    """`handoff-warmup`: `tasks` partitions of one row each (the worker's pid)."""

    @classmethod
    def name(cls) -> str:
        return WARMUP_SOURCE_NAME

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> "WarmupReader":
        return WarmupReader(int(self.options.get("tasks", "2")))


class WarmupReader(DataSourceReader):
    def __init__(self, tasks: int) -> None:
        self.tasks = tasks

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(i) for i in range(self.tasks)]

    def read(self, partition: InputPartition) -> Iterator[tuple[int]]:
        # What a write task imports first (preloaded in the worker daemon, so this is cheap once warm).
        import handoff_spark.sink_common  # noqa: F401

        yield (os.getpid(),)


def enabled() -> bool:
    return os.environ.get("HANDOFF_PREWARM", "0") == "1"


def start(spark: Any) -> threading.Thread | None:
    """Run the warm-up read in a daemon thread (never blocks the driver, never outlives it). The data source is
    registered with the others (`app.register_data_sources`), before any query starts."""
    if not enabled():
        return None

    def run() -> None:
        t = time.perf_counter()
        try:
            tasks = spark.sparkContext.defaultParallelism
            rows = spark.read.format(WARMUP_SOURCE_NAME).option("tasks", str(tasks)).load().collect()
            log.info("warm-up: %d Python workers ready in %.1f s", len({r.pid for r in rows}),
                     time.perf_counter() - t)
        except Exception as exc:  # noqa: BLE001 - a warm-up is an optimisation, never a failure
            log.info("warm-up skipped: %s", exc)

    thread = threading.Thread(target=run, name="handoff-warmup", daemon=True)
    thread.start()
    return thread
