"""Pure planning logic of the handoff-kafka source: admission control, new partitions, ranges, schema."""
from __future__ import annotations

from pyspark.sql.pandas.types import to_arrow_schema

from handoff_spark.kafka.source import (ARROW_SCHEMA, CONSUME_WAIT_S, SPARK_SCHEMA, OffsetRange, SourceOptions,
                                        add_new_partitions, admit, entry_points, from_offsets, plan_ranges,
                                        reader_conf, split_ranges, to_offsets)

A, B, C = ("t", 0), ("t", 1), ("u", 0)


def test_arrow_schema_equals_what_spark_expects() -> None:
    assert to_arrow_schema(SPARK_SCHEMA, timezone="UTC").equals(ARROW_SCHEMA)


def test_offsets_round_trip_through_json_form() -> None:
    doc = to_offsets({A: 5, B: 7, C: 0})
    assert doc == {"t": {"0": 5, "1": 7}, "u": {"0": 0}}
    assert from_offsets(doc) == {A: 5, B: 7, C: 0}


def test_admit_without_limit_takes_everything() -> None:
    assert admit({A: 0, B: 10}, {A: 100, B: 12}, None) == {A: 100, B: 12}


def test_admit_caps_total_and_shares_by_backlog() -> None:
    end = admit({A: 0, B: 10, C: 0}, {A: 900, B: 110, C: 0}, 100)
    taken = {tp: end[tp] - s for tp, s in {A: 0, B: 10, C: 0}.items()}
    assert sum(taken.values()) == 100
    assert taken[A] == 90 and taken[B] == 10 and taken[C] == 0


def test_admit_never_exceeds_limit_and_drains_eventually() -> None:
    start, latest = {A: 0, B: 0, C: 0}, {A: 1000, B: 3, C: 1}
    batches = 0
    while start != latest:
        end = admit(start, latest, 7)
        assert sum(end[tp] - start[tp] for tp in start) <= 7
        assert all(start[tp] <= end[tp] <= latest[tp] for tp in start)
        start, batches = end, batches + 1
    assert batches == 144  # ceil(1004 / 7): every batch is full until the end


def test_admit_ignores_partitions_behind_start() -> None:
    assert admit({A: 50}, {A: 40}, 10) == {A: 50}


def test_new_partitions_enter_at_earliest_with_an_empty_range() -> None:
    start = {A: 5}
    end = add_new_partitions(start, {A: 9}, {A: 0, B: 3})
    assert end == {A: 9, B: 3}
    assert plan_ranges(start, end) == [OffsetRange("t", 0, 5, 9)]
    # next batch reads the new partition from where it entered
    assert plan_ranges(end, {A: 9, B: 8}) == [OffsetRange("t", 1, 3, 8)]


def test_options_parse_and_validate() -> None:
    opts = SourceOptions.parse({"subscribe": "a, b", "kafka.bootstrap.servers": "h:1", "maxrecordsperbatch": "10",
                                "kafka.security.protocol": "SSL", "onoffsetoutofrange": "earliest"})
    assert opts.topics == ("a", "b") and opts.max_records_per_batch == 10
    assert opts.client_conf()["isolation.level"] == "read_committed"
    assert opts.client_conf()["security.protocol"] == "SSL"
    for bad in ({"kafka.bootstrap.servers": "h:1"}, {"subscribe": "a"},
                {"subscribe": "a", "kafka.bootstrap.servers": "h", "onoffsetoutofrange": "skip"}):
        try:
            SourceOptions.parse(bad)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad}")


# -- minPartitions: splitting large ranges so every core has work -----------------------------------------
def test_split_ranges_cuts_each_range_in_proportion_into_contiguous_pieces() -> None:
    ranges = [OffsetRange("t", 0, 0, 300_000), OffsetRange("t", 1, 50, 150_050)]
    pieces = split_ranges(ranges, 6)
    by_partition: dict[int, list[OffsetRange]] = {}
    for p in pieces:
        by_partition.setdefault(p.partition, []).append(p)
    assert [len(by_partition[0]), len(by_partition[1])] == [4, 2]  # 2/3 and 1/3 of the offsets
    for original in ranges:
        parts = by_partition[original.partition]
        # Contiguous, no overlap, no gap, exactly the original range.
        assert parts[0].start == original.start and parts[-1].end == original.end
        assert all(a.end == b.start for a, b in zip(parts, parts[1:]))
        sizes = [p.end - p.start for p in parts]
        assert max(sizes) - min(sizes) <= 1


def test_split_ranges_leaves_small_or_enough_ranges_alone() -> None:
    small = [OffsetRange("t", 0, 0, 500), OffsetRange("t", 1, 0, 700)]
    assert split_ranges(small, 12) == small  # pieces would be under MIN_SPLIT_OFFSETS
    many = [OffsetRange("t", p, 0, 1_000_000) for p in range(4)]
    assert split_ranges(many, 4) == many
    assert split_ranges(many, None) == many


def test_split_ranges_never_cuts_below_the_minimum_piece() -> None:
    pieces = split_ranges([OffsetRange("t", 0, 0, 25_000)], 100, min_split=10_000)
    assert len(pieces) == 2
    assert all(p.end - p.start >= 10_000 for p in pieces)


def test_a_range_reader_refills_its_queue_within_one_consume_call_unless_the_user_says_otherwise() -> None:
    """librdkafka pauses a partition whose local queue is full and looks again after `fetch.queue.backoff.ms`
    (1 s by default): a reader drained its queue in ~0.1 s and then waited out the second, on every refill of a
    range longer than its fetches (a 900,000-record range: 3.3 s instead of 0.8 s). The reader's backoff must
    be shorter than one `consume` wait; a user's own `kafka.fetch.queue.backoff.ms` still wins."""
    opts = SourceOptions.parse({"subscribe": "t", "kafka.bootstrap.servers": "h:1"})
    assert int(reader_conf(opts)["fetch.queue.backoff.ms"]) < CONSUME_WAIT_S * 1000
    mine = SourceOptions.parse({"subscribe": "t", "kafka.bootstrap.servers": "h:1",
                                "kafka.fetch.queue.backoff.ms": "500"})
    assert reader_conf(mine)["fetch.queue.backoff.ms"] == "500"


def test_a_kept_readers_first_fetch_does_not_wait_out_the_last_ranges_unless_the_user_says_otherwise() -> None:
    """A reader's consumer is kept for its process's next range (kafka_readers); its first fetch there waits for the
    one still in flight from the last range, which the broker holds up to `fetch.wait.max.ms` (500 ms by default:
    0.5 s before the first record, measured). The reader's must be shorter than one `consume` wait; a user's own
    `kafka.fetch.wait.max.ms` still wins."""
    opts = SourceOptions.parse({"subscribe": "t", "kafka.bootstrap.servers": "h:1"})
    assert int(reader_conf(opts)["fetch.wait.max.ms"]) < CONSUME_WAIT_S * 1000
    mine = SourceOptions.parse({"subscribe": "t", "kafka.bootstrap.servers": "h:1", "kafka.fetch.wait.max.ms": "500"})
    assert reader_conf(mine)["fetch.wait.max.ms"] == "500"


def test_a_topic_new_to_the_handoff_enters_at_starting_offsets_a_new_partition_of_a_known_one_at_earliest() -> None:
    new = [("orders", 3), ("refunds", 0), ("refunds", 1)]
    assert entry_points(new, {"orders"}, "latest") == {("orders", 3): "earliest", ("refunds", 0): "latest",
                                                       ("refunds", 1): "latest"}
    assert entry_points(new, {"orders", "refunds"}, "latest") == dict.fromkeys(new, "earliest")
    assert entry_points(new, set(), "earliest") == dict.fromkeys(new, "earliest")
