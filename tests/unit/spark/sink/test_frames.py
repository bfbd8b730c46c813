"""The frame source's pure parts: the lateness line against Spark's watermark, and the per-batch counts."""
from __future__ import annotations

import json

from handoff_spark import checkpoint as ckpt
from handoff_spark.config import AppConfig
from handoff_spark.sink.frames import frame_counts, late_line_ms, spark_delay_seconds, time_column


def cfg(tmp_path, **fields):
    return AppConfig.model_validate({
        "handoffId": "ns/h", "source": {"bootstrapServers": "127.0.0.1:1", "topics": ["t"]},
        "sink": {"kind": "iceberg", "table": "db.t"}, "checkpointLocation": str(tmp_path / "ck"),
        "deadLetterTopic": "dlq", "schema": {"columns": [{"name": "id", "type": "long"},
                                                         {"name": "ts", "type": "timestamp"}]}, **fields})


def test_the_late_line_is_sparks_watermark_moved_by_the_difference_of_the_delays(tmp_path):
    both = cfg(tmp_path, dedupe={"keys": ["id"], "withinSeconds": 3600},
               eventTime={"column": "ts", "watermarkSeconds": 600})
    assert spark_delay_seconds(both) == 3600 and time_column(both) == "ts"
    # Spark's watermark = newest - 1 h; late = newest - 10 min = Spark's watermark + 50 min
    assert late_line_ms(both, 10_000_000) == 10_000_000 + 3_000_000
    assert late_line_ms(both, 0) is None  # before Spark's first watermark nothing is late (Spark drops nothing)


def test_without_event_time_the_dedupe_measures_on_the_kafka_timestamp_and_lateness_equals_sparks(tmp_path):
    only = cfg(tmp_path, dedupe={"keys": ["id"], "withinSeconds": 60})
    assert time_column(only) == "_kafka_timestamp"
    assert late_line_ms(only, 5_000) == 5_000


def test_event_time_alone_uses_its_own_watermark(tmp_path):
    et = cfg(tmp_path, eventTime={"column": "ts", "watermarkSeconds": 30})
    assert spark_delay_seconds(et) == 30 and late_line_ms(et, 1_000) == 1_000
    assert spark_delay_seconds(cfg(tmp_path, transform={"sql": "SELECT * FROM source"})) is None


def test_counts_are_complete_only_when_they_cover_every_offset_of_the_batch(tmp_path):
    c = cfg(tmp_path, transform={"sql": "SELECT * FROM source"})
    (tmp_path / "ck").mkdir()
    ranges = {("t", 0): (0, 100), ("t", 1): (10, 10)}
    ckpt.write_frame_stats(c.checkpoint_location, 4, "t-0-0-60", {"records": 60, "dlq_rows": 2, "late_rows": 1,
                                                                   "max_event_time_ms": 7, "offsets": 60})
    partial = frame_counts(c, 4, ranges)
    assert not partial.complete
    ckpt.write_frame_stats(c.checkpoint_location, 4, "t-0-60-100", {"records": 40, "dlq_rows": 0, "late_rows": 0,
                                                                     "max_event_time_ms": 9, "offsets": 40})
    full = frame_counts(c, 4, ranges)
    assert full.complete and (full.records, full.dlq_rows, full.late_rows, full.max_event_time_ms) == (100, 2, 1, 9)
    ckpt.clear_frame_stats(c.checkpoint_location, up_to=4)
    assert not frame_counts(c, 4, ranges).complete


def test_the_newest_planned_batch_and_its_watermark_come_from_sparks_offset_log(tmp_path):
    offsets = tmp_path / "ck" / "offsets"
    offsets.mkdir(parents=True)
    assert ckpt.latest_planned_batch(str(tmp_path / "ck")) is None
    for n, wm in ((0, 0), (1, 1234)):
        (offsets / str(n)).write_text("v1\n" + json.dumps({"batchWatermarkMs": wm, "batchTimestampMs": 1})
                                      + '\n{"t":{"0":5}}\n')
    assert ckpt.latest_planned_batch(str(tmp_path / "ck")) == (1, 1234)


def test_the_config_refuses_what_cannot_be_checked(tmp_path):
    import pytest

    with pytest.raises(ValueError, match="lateRecords=keep cannot be checked with a dedupe"):
        cfg(tmp_path, dedupe={"keys": ["id"], "withinSeconds": 60},
            eventTime={"column": "ts", "lateRecords": "keep"})
    with pytest.raises(ValueError, match="watermark is longer than dedupe.within"):
        cfg(tmp_path, dedupe={"keys": ["id"], "withinSeconds": 60}, eventTime={"column": "ts", "watermarkSeconds": 61})


def test_rows_with_a_required_column_left_null_are_split_off_as_dead_letters_by_position():
    import pyarrow as pa

    from handoff_spark.sink.dead_letters import split_missing_required

    rows = pa.table({"id": [1, None, 3, None], "name": ["a", "b", None, "d"], "_kafka_topic": ["t"] * 4,
                     "_kafka_partition": [0, 0, 1, 1], "_kafka_offset": [10, 11, 12, 13]})
    kept, dead = split_missing_required(rows, ["id", "absent"])
    assert kept["id"].to_pylist() == [1, 3]
    assert [(d.index, d.partition, d.offset, d.reason) for d in dead] == [(1, 0, 11, "missing-required"),
                                                                          (3, 1, 13, "missing-required")]
    assert dead[0].detail.startswith("missing required field id ")
    assert split_missing_required(rows, ["absent"]) == (rows, [])
