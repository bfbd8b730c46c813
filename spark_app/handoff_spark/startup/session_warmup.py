"""Warm a (re)started driver's Spark session ahead of the stream's first batch (I/O: driver and executors).

Why: Spark's first micro-batch of a session starts, one after another on that batch's path, a fresh Python
interpreter for each kind of Python work it does — PySpark keeps one daemon per worker module (the planner's
`plan_data_source_read` and `write_into_data_source`, the executors' worker daemon, the streaming sink's commit
runner) and forks from it — and its forked workers import what they run: the commit's worker imports PyIceberg
and opens the catalog. Every batch is Spark's, so a restarted driver's first commit waits for all of that
(docs/benchmarks.md, "Cold start").

How: one tiny streaming query of its own (AvailableNow, a throwaway checkpoint): Spark's JVM `rate-micro-batch`
source (one row, one task: `TASKS`; no Python planner on its way) into an Arrow stream writer like the table
sinks'. It leaves every daemon started and its workers idle for reuse: its write tasks run the executor warm-up's task
(`startup.executor_warmup.warm_task`: pyarrow's JSON/Parquet path, the Kafka reader's and the sink's set-up) and
its commit runs the sink's own `warm_up` (imports the sink, opens its catalog and table) in the commit runner's
worker. It writes nothing anywhere. By default it starts in a thread just before the stream's query
(`HANDOFF_SESSION_WARMUP_AT=beside`), where it reaches the writer's planner, the worker daemon and the commit
runner while the stream's query is still in its source's Python planning. `before` runs it to its end before the
stream's query starts instead: Spark's first batch then finds those started (1.8–3.0× a warm batch against
7.5–11×), but the first commit came 0.7 s later on average in three runs on 2 cores, so it is not the default
(docs/benchmarks.md, "Cold start"). Since Spark's Python processes are forks of a server that imported their
modules (`startup.fork_server`), a local restart's first commit measures the same with this warm-up, without it and
with lighter variants of it (within ±0.2 s over three runs, "Session 49" there); it stays for the slower starts of
a pod. These classes import only pyspark's (Spark unpickles them by reference in fresh planner interpreters); the
heavy modules are imported inside the methods.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from handoff_spark import switches
from handoff_spark.sink.datasource_api import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage
from handoff_spark.driver.temp_dirs import own_temp_dir_while

log = logging.getLogger("handoff.session_warmup")

ENV = switches.SESSION_WARMUP.name
SOURCE_NAME = "handoff-session-warmup"
#: The warm-up's source: one batch of `TASKS` rows (AvailableNow), made in the JVM.
RATE_SOURCE = "rate-micro-batch"
#: Rows and tasks of the warm-up's one batch. One: it starts the worker daemon, and one task per core took every
#: core just as the stream's first batch needed them. On a local master, Spark's FIFO order put its job (submitted
#: a millisecond before the stream's) ahead of the stream's second wave, which waited ~140 ms for it (Spark's task
#: log of a restart). Measured over eight restarts in runs of alternating order: the first batch 1145 ms against
#: 1196 ms, the first commit the same (4.04 s against 4.06 s; docs/benchmarks.md, "Session 50"). A cluster's
#: executors are each warmed by `startup.executor_warmup`, one task per core, pinned to them.
TASKS = "1"
#: The warm-up query's name: Spark's UI and REST API show it at the start of its jobs' and stages' descriptions.
QUERY_NAME = "handoff-session-warmup"
#: The warm-up query's checkpoint: `<tmp>/handoff-session-warmup-<pid>-<random>` (`temp_dirs`).
DIR_PREFIX = "handoff-session-warmup-"
#: How long the warm-up may run before it is stopped (and the stream's first batch starts cold): on Kubernetes
#: its tasks wait for the first executors to register, as the stream's would.
TIMEOUT_SECONDS = 120.0


def enabled() -> bool:
    return switches.SESSION_WARMUP()


def before_query() -> bool:
    """Whether the warm-up runs to its end before the stream's query starts (else beside its first batch)."""
    return switches.SESSION_WARMUP_AT() == "before"


@dataclass
class _Done(WriterCommitMessage):  # type: ignore[misc,valid-type]
    errors: list[str]


class _Writer(DataSourceStreamArrowWriter):  # type: ignore[misc,valid-type]
    def __init__(self, config: str) -> None:
        self.config = config

    def _cfg(self) -> Any:
        from handoff_spark.config import AppConfig

        return AppConfig.model_validate_json(self.config)

    def write(self, iterator: Iterator[Any]) -> _Done:
        from handoff_spark.startup.executor_warmup import warm_task

        targets = [t for batch in iterator for t in batch.column(0).to_pylist()]
        return _Done([r.error for r in warm_task(self._cfg(), targets) if r.error])

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        from handoff_spark.sink import registry as sinks

        for m in messages:
            for error in (m.errors if m is not None else []):
                log.warning("session warm-up task: %s", error)
        cfg = self._cfg()
        sinks.get(cfg.sink.kind).warm_up(cfg)  # the commit runner's worker imports the sink, opens its table

    def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        """Nothing was written anywhere."""


class SessionWarmUpDataSource(DataSource):  # type: ignore[misc,valid-type]
    """`.writeStream.format("handoff-session-warmup").option("config", AppConfig JSON)`: a sink only."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return "target string"

    def streamWriter(self, schema: Any, overwrite: bool) -> _Writer:  # noqa: N802
        return _Writer(self.options["config"])


def run(spark: Any, cfg: Any, stop: Callable[[], str | None], timeout: float = TIMEOUT_SECONDS) -> str:
    """Run the warm-up query on `spark` for `cfg`'s sink; returns what happened, for the driver's log. Stops early
    when `stop()` gives a reason, or after `timeout`; a failure is logged, never raised: the stream then starts
    cold."""
    started = time.monotonic()
    spark.dataSource.register(SessionWarmUpDataSource)
    with own_temp_dir_while(DIR_PREFIX) as tmp:
        query = None
        try:
            # Spark's own rate source (JVM): no Python planner on the way to the writer, so the warm-up reaches the
            # worker daemon and the commit runner well before the stream's first batch does. One task (`TASKS`).
            query = (spark.readStream.format(RATE_SOURCE).option("rowsPerBatch", TASKS)
                     .option("numPartitions", TASKS).load().selectExpr("'session' AS target")
                     .writeStream.format(SOURCE_NAME).option("config", cfg.to_json())
                     .option("checkpointLocation", tmp).trigger(availableNow=True)
                     .queryName(QUERY_NAME).start())
            why = None
            while query.isActive and why is None and time.monotonic() - started < timeout:
                query.awaitTermination(0.5)
                why = stop()
            if query.isActive:
                query.stop()
                why = why or f"not done in {timeout:.0f} s"
                return f"session warm-up stopped ({why}); the stream's first batch starts cold"
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
        except Exception as exc:  # noqa: BLE001 - a warm-up must never fail the driver
            log.warning("session warm-up failed", exc_info=True)
            if query is not None and query.isActive:
                query.stop()
            return f"session warm-up failed ({type(exc).__name__}); the stream's first batch starts cold"
    return f"session warm-up done in {time.monotonic() - started:.1f} s"


def start_beside(spark: Any, cfg: Any, stop: Callable[[], str | None]) -> threading.Thread:
    """`run` in a daemon thread, beside the stream's query (which starts at once); its outcome goes to the log."""
    from handoff_spark import pyspark_private

    def warm() -> None:
        pyspark_private.set_active_session(spark)  # Spark finds Python data sources in the thread's active session
        log.info(run(spark, cfg, stop))

    thread = threading.Thread(target=warm, name="handoff-session-warmup", daemon=True)
    thread.start()
    return thread
