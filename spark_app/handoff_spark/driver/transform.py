"""The DataFrame path's query: decoded records (`sink.frames`) → the user's SQL → event time → dedupe → the sink.

Why Spark does it: users put Spark between Kafka and the table to transform, enrich, deduplicate by business key
and handle event time (issue 31). Records become Spark rows once, in the frame source's read task (decoded there,
dead letters and late records decided there); Spark runs the SQL, the watermark (`withWatermark`) and the dedupe
(`dropDuplicatesWithinWatermark`, its state in Spark's checkpoint) on the executors; each sink's rows writer
writes what comes out and the sink's commit records the batch's exact Kafka ranges from Spark's offset log,
whatever the transform dropped, so contiguity, replay and resume are unchanged.

`check` runs the same pipeline over an empty static frame before the query starts: a SQL that does not parse or
analyse, or an output that does not fit what the sink and the ledger need, refuses the start in one line
(`TransformInvalid: …`, contract.TRANSFORM_INVALID), with nothing written.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from handoff_spark.contract import KAFKA_METADATA_COLUMNS, TRANSFORM_INVALID
from handoff_spark.errors import HandoffConfigError
from handoff_spark.sink.frames import spark_delay_seconds, time_column

if TYPE_CHECKING:
    from handoff_spark.config import AppConfig

log = logging.getLogger("handoff.transform")

#: The view the SQL reads (`spec.transform.sql: SELECT … FROM source`).
SOURCE_VIEW = "source"
#: The sinks whose rows writer is built (`rows=true`).
ROWS_SINKS = frozenset({"iceberg", "bigquery"})
#: The sinks whose catalog can serve `transform.lookups` (BigQuery lookups are not built).
LOOKUP_SINKS = frozenset({"iceberg"})


class TransformInvalid(HandoffConfigError):
    """The transform cannot run as configured; the message names the field and the fix."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{TRANSFORM_INVALID}: {field}: {problem}")


@contextlib.contextmanager
def quiet_sql_errors() -> Iterator[None]:
    """PySpark logs every SQL error with its JVM stack as it converts it (its `SQLQueryContextLogger`); here the
    error is the answer (a user's SQL mistake: one line), so that log is off meanwhile. Through PySpark's own
    logger class: a plain `logging` logger of that name breaks PySpark's keyword arguments."""
    from pyspark.logger import PySparkLogger

    context_log = PySparkLogger.getLogger("SQLQueryContextLogger")
    level = context_log.level
    context_log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        context_log.setLevel(level)


def pipeline(spark: Any, cfg: AppConfig, frame: Any) -> Any:
    """`frame` (streaming or static) through the configured SQL, watermark and dedupe."""
    out = frame
    if cfg.transform is not None:
        register_lookups(spark, cfg)
        frame.createOrReplaceTempView(SOURCE_VIEW)
        out = required_keys_present(cfg, spark.sql(cfg.transform.sql))
    delay, column = spark_delay_seconds(cfg), time_column(cfg)
    if delay is not None and column is not None:
        out = out.withWatermark(column, f"{int(round(delay * 1000))} milliseconds")
    if cfg.dedupe is not None:
        out = out.dropDuplicatesWithinWatermark(list(cfg.dedupe.keys))
    return out


def required_dedupe_keys(cfg: AppConfig) -> list[str]:
    """The dedupe keys that are declared required columns."""
    if cfg.dedupe is None:
        return []
    required = {c.name for c in cfg.schema_.columns if c.required}
    return [k for k in cfg.dedupe.keys if k in required]


def required_keys_present(cfg: AppConfig, out: Any) -> Any:
    """The SQL's output, failing on a row whose required dedupe key the SQL left null.

    Why: Spark's dedupe, like SQL's DISTINCT, takes null for a key like any other, so such rows would be one key:
    the first kept (and sent to the dead letters by the rows writer, `missing-required`), every later one dropped as
    its duplicate. Failing here instead makes each of them a record the transform fails on, which the driver sends to
    the dead letters (`driver.quarantine`, reason `transform-error`) while the stream goes on. Only with a
    transform: without one, the decoder has already sent a record lacking a required column to the dead letters. A
    filter, not a new key column: the dedupe's state keeps its schema."""
    keys = required_dedupe_keys(cfg) if cfg.transform is not None else []
    if not keys:
        return out
    from functools import reduce

    from pyspark.sql import functions as F

    present = reduce(lambda a, b: a & b, [F.col(k).isNotNull() for k in keys])
    message = F.lit(f"the transform left a required dedupe key ({', '.join(keys)}) null")
    return out.where(F.assert_true(present, message).isNull())


def lookup_versions(cfg: AppConfig) -> dict[str, str | None]:
    """Each lookup's current version (its table's snapshot): the driver restarts the query, in the same session,
    when one changes, so the SQL joins the lookup's new content from the next batch on."""
    from handoff_spark.sink.registry import get as sink_backend

    backend = sink_backend(cfg.sink.kind)
    return {lookup.name: backend.table_version(cfg, lookup.table)
            for lookup in (cfg.transform.lookups if cfg.transform is not None else [])}


def register_lookups(spark: Any, cfg: AppConfig) -> None:
    """Each `transform.lookups` table as a view of its name: the table as of the query's start; the driver starts
    the query again when a lookup's table changes (`lookup_versions`). Iceberg's catalog only: the handoff's own."""
    if cfg.transform is None or not cfg.transform.lookups:
        return
    from handoff_spark.sink.registry import get as sink_backend

    for lookup in cfg.transform.lookups:
        arrow = sink_backend(cfg.sink.kind).read_table(cfg, lookup.table)
        spark.createDataFrame(arrow).createOrReplaceTempView(lookup.name)


def check(spark: Any, cfg: AppConfig) -> dict[str, str] | None:
    """Plan the pipeline over an empty static frame and check its output (see the module docstring). Returns the
    dedupe keys' Spark types in the output (None without a dedupe): Spark's state is keyed by them, and a key whose
    type changed under the same name needs a new state (`driver.resume.settle_key_types`)."""
    from pyspark.errors import AnalysisException, PySparkException
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    from handoff_spark.decode.frame import frame_schema

    if cfg.sink.kind not in ROWS_SINKS:
        raise TransformInvalid("spec.sink", f"transform, dedupe and eventTime run on the "
                                            f"{' and '.join(sorted(ROWS_SINKS))} sinks (not {cfg.sink.kind}); remove "
                                            f"them or write to one of those")
    if cfg.transform is not None and cfg.transform.lookups and cfg.sink.kind not in LOOKUP_SINKS:
        raise TransformInvalid("spec.transform.lookups", f"lookups are read from the Iceberg sink's catalog; the "
                                                         f"{cfg.sink.kind} sink has none (BigQuery lookups are not "
                                                         f"built); remove them or write to Iceberg")
    if not cfg.schema_.columns:
        raise TransformInvalid("spec.schema.columns", "transform, dedupe and eventTime need the records' columns "
                                                      "declared (or a Schema Registry format); declare them")
    frame = spark.createDataFrame([], schema=from_arrow_schema(frame_schema(cfg)))
    try:
        with quiet_sql_errors():
            out = pipeline(spark, cfg, frame)
            schema = out.schema
    except (AnalysisException, PySparkException) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        field = "spec.transform.sql" if cfg.transform is not None else (
            "spec.dedupe.keys" if cfg.dedupe is not None else "spec.eventTime.column")
        raise TransformInvalid(field, f"{first[:400]} (the input view is `{SOURCE_VIEW}` with columns "
                                      f"{', '.join(frame.columns)})") from None
    except Exception as exc:  # noqa: BLE001 - py4j errors of a SQL Spark cannot plan
        raise TransformInvalid("spec.transform.sql", f"{type(exc).__name__}: {str(exc).splitlines()[0][:400]}") \
            from None
    from handoff_spark.pyspark_private import plan_deterministic

    if cfg.transform is not None and not plan_deterministic(spark.sql(cfg.transform.sql)):
        raise TransformInvalid("spec.transform.sql", "uses a non-deterministic expression (rand(), uuid(), shuffle() "
                                                     "…); a replay must drop and derive what the first run did: "
                                                     "derive the value from the record instead (e.g. hash of a key)")
    names = schema.fieldNames()
    missing = [c for c in KAFKA_METADATA_COLUMNS if c not in names]
    if missing:
        raise TransformInvalid("spec.transform.sql", f"the output lacks {', '.join(missing)}; keep them (SELECT *, "
                                                     f"… or name them): the ledger and replays need each row's "
                                                     f"Kafka coordinates")
    arrow = to_arrow_schema(schema, timezone="UTC")
    declared = {c.name: c for c in cfg.schema_.columns}
    expected = frame_schema(cfg)
    for column in cfg.schema_.columns:
        if column.name not in names:
            if column.required:
                raise TransformInvalid("spec.transform.sql", f"the output lacks the required column "
                                                             f"{column.name}; select it")
            continue
        got, want = arrow.field(column.name).type, expected.field(column.name).type
        if got != want:
            raise TransformInvalid("spec.transform.sql", f"column {column.name} is {got} in the output, declared "
                                                         f"{column.type}; CAST it to the declared type")
    if cfg.event_time is not None and cfg.event_time.column in declared and \
            declared[cfg.event_time.column].type not in ("timestamp", "timestamptz"):  # both UTC instants
        raise TransformInvalid("spec.eventTime.column", f"{cfg.event_time.column} is declared "
                                                        f"{declared[cfg.event_time.column].type}; it must be a "
                                                        f"timestamp column")
    log.info("transform checked: output columns %s", names)
    if cfg.dedupe is None:
        return None
    return {key: schema[key].dataType.simpleString() for key in cfg.dedupe.keys}
