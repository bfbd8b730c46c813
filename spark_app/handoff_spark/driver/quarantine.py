"""Find the records a transform's SQL fails on, so that one record never stops a stream.

Why: a SQL that fails on one record (an ANSI cast of a malformed value, a division by zero, `assert_true`, a UDF
error) fails its Spark task, and so the batch and the query, for ever: every restart replays the same batch. When
the DataFrame path's query fails, the driver reads the failed batch's records again (Spark's offset log says
which: the batch planned and not committed), runs the SQL over them as small static jobs, and halves the failing
part until single records remain (O(k log n) jobs for k bad records of n; the rule of `iceberg.misfits`). Those
records go to `<checkpoint>/handoff/quarantine.json` with the error's first line; the frame source then sends
them to the dead-letter topic with reason `transform-error` (counted in the batch's dead letters) instead of
handing them to Spark, and the driver starts the query again, in the same session. When the batch runs cleanly as
static jobs, the failure was not a record's (Kafka, the catalog, a bug) and the driver exits as before.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from handoff_spark import checkpoint as ckpt
from handoff_spark.sink.frames import FrameStats, frames_of, late_line_ms

if TYPE_CHECKING:
    import pyarrow as pa

    from handoff_spark.config import AppConfig

log = logging.getLogger("handoff.quarantine")

#: The most records one search quarantines: more means the SQL, not the data, is wrong.
MAX_QUARANTINED = 1000


def failed_batch(cfg: AppConfig) -> tuple[int, dict[tuple[str, int], tuple[int, int]], int] | None:
    """(batch id, its ranges, its Spark watermark) of the batch Spark planned and did not commit, or None."""
    point = ckpt.resume_point(cfg.checkpoint_location)
    if point.pending_batch is None:
        return None
    newest = ckpt.latest_planned_batch(cfg.checkpoint_location)
    watermark = newest[1] if newest is not None and newest[0] == point.pending_batch else 0
    return point.pending_batch, ckpt.batch_range(cfg.checkpoint_location, point.pending_batch), watermark


def batch_frame(cfg: AppConfig, ranges: dict[tuple[str, int], tuple[int, int]], watermark_ms: int) -> pa.Table:
    """The batch's records as the frame source hands them to Spark (decoded, late and known-bad ones left out),
    read again on the driver; nothing is sent."""
    import pyarrow as pa

    from handoff_spark.decode.frame import frame_schema
    from handoff_spark.kafka.source import OffsetRange, SourceOptions, read_range, source_options

    opts = SourceOptions.parse(source_options(cfg, None))
    schema = frame_schema(cfg)
    known = {(q["topic"], int(q["partition"]), int(q["offset"])): str(q.get("reason", ""))
             for q in ckpt.read_quarantine(cfg.checkpoint_location)}
    batches = []
    for (topic, partition), (start, end) in sorted(ranges.items()):
        if end > start:
            batches += list(frames_of(read_range(opts, OffsetRange(topic, partition, start, end)), cfg, schema,
                                      late_line_ms(cfg, watermark_ms), FrameStats(), known, send=False))
    return pa.Table.from_batches(batches, schema=schema)


def sql_error(spark: Any, cfg: AppConfig, rows: pa.Table) -> str | None:
    """Run the transform over `rows` as a static job; the error's first line, or None when it ran."""
    from handoff_spark.driver.transform import SOURCE_VIEW, quiet_sql_errors, register_lookups, required_keys_present

    assert cfg.transform is not None
    try:
        with quiet_sql_errors():
            register_lookups(spark, cfg)
            spark.createDataFrame(rows).createOrReplaceTempView(SOURCE_VIEW)
            required_keys_present(cfg, spark.sql(cfg.transform.sql)).write.format("noop").mode("overwrite").save()
        return None
    except Exception as exc:  # noqa: BLE001 - any failure of the job is the answer
        text = str(exc).strip()
        return (text.splitlines()[0] if text else type(exc).__name__)[:500]


def find_bad_records(spark: Any, cfg: AppConfig, rows: pa.Table) -> list[dict[str, Any]]:
    """The single records of `rows` the SQL fails on, by halving (see the module docstring)."""
    from handoff_spark.contract import KAFKA_OFFSET, KAFKA_PARTITION, KAFKA_TOPIC

    found: list[dict[str, Any]] = []

    def search(part: pa.Table, error: str) -> None:
        if len(found) >= MAX_QUARANTINED:
            return
        if part.num_rows == 1:
            row = part.to_pylist()[0]
            found.append({"topic": row[KAFKA_TOPIC], "partition": int(row[KAFKA_PARTITION]),
                          "offset": int(row[KAFKA_OFFSET]), "reason": error})
            return
        half = part.num_rows // 2
        for piece in (part.slice(0, half), part.slice(half)):
            piece_error = sql_error(spark, cfg, piece)
            if piece_error is not None:
                search(piece, piece_error)

    error = sql_error(spark, cfg, rows) if rows.num_rows else None
    if error is not None:
        search(rows, error)
    return found


def quarantine_failed_batch(spark: Any, cfg: AppConfig) -> list[dict[str, Any]]:
    """After the DataFrame path's query failed: the records of the failed batch the transform fails on, recorded
    in the checkpoint's quarantine (empty: the failure was not a record's)."""
    if cfg.transform is None:
        return []
    failed = failed_batch(cfg)
    if failed is None:
        return []
    batch_id, ranges, watermark = failed
    bad = find_bad_records(spark, cfg, batch_frame(cfg, ranges, watermark))
    if bad:
        ckpt.add_quarantine(cfg.checkpoint_location, bad)
        log.warning("batch %s: the transform fails on %d record(s) (first: %s[%s]@%s: %s); they go to the "
                    "dead-letter topic", batch_id, len(bad), bad[0]["topic"], bad[0]["partition"],
                    bad[0]["offset"], bad[0]["reason"])
    return bad
