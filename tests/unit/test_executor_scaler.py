"""The driver's side of live scaling: the operator's annotation → a count, which executors go on the way
down, and the source's minPartitions following the executors' cores through a file."""
from __future__ import annotations

from handoff_spark.executor_scaler import ANNOTATION, parse_desired, surplus, to_apply, write_min_partitions
from handoff_spark.kafka_source import OffsetRange, SourceOptions, split_ranges


def test_parse_desired_ignores_what_is_not_a_count():
    assert parse_desired({ANNOTATION: "4"}) == 4
    assert parse_desired({ANNOTATION: "0"}) == 0
    assert parse_desired({ANNOTATION: "-1"}) is None
    assert parse_desired({ANNOTATION: "many"}) is None
    assert parse_desired({}) is None and parse_desired(None) is None


def test_surplus_kills_the_newest_executors_first():
    assert surplus(["1", "2", "10", "3"], 2) == ["10", "3"]
    assert surplus(["1", "2"], 2) == [] and surplus(["1"], 3) == []
    assert surplus(["4", "5", "6"], 0) == ["6", "5", "4"]


def test_a_new_count_applies_once_and_extra_executors_are_stopped():
    assert to_apply(3, None, 1) == 3 and to_apply(3, 1, 1) == 3       # a new desired count
    assert to_apply(3, 3, 1) is None and to_apply(3, 3, 3) is None    # asked for; Spark is still starting them
    assert to_apply(1, 1, 2) == 1                                     # one more registered than asked: stop it
    assert to_apply(None, 2, 3) == 2 and to_apply(None, None, 3) is None


def test_the_min_partitions_file_wins_and_is_read_at_each_plan(tmp_path):
    path = tmp_path / "min-partitions"
    opts = SourceOptions.parse({"subscribe": "t", "kafka.bootstrap.servers": "x:1", "minPartitions": "6",
                                "minPartitionsFile": str(path)})
    assert opts.current_min_partitions() == 6  # no file yet: the start-time value
    ranges = [OffsetRange("t", 0, 0, 240_000)]
    write_min_partitions(str(path), 12)
    assert opts.current_min_partitions() == 12
    assert len(split_ranges(ranges, opts.current_min_partitions())) == 12
    write_min_partitions(str(path), 3)  # executors went away: fewer, larger ranges
    assert len(split_ranges(ranges, opts.current_min_partitions())) == 3
    path.write_text("garbage")
    assert opts.current_min_partitions() == 6
