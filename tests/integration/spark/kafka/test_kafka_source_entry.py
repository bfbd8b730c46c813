"""Where the handoff-kafka source starts partitions it has no offset for, against real Kafka (kafka.source.entry_points):
one rule whether Spark's checkpoint survived (`latestOffset` on a kept checkpoint) or not (`initialOffset` on a fresh
one). A partition the table's ledger has resumes there; a new partition of a topic the handoff reads starts at its
earliest offset; a topic new to the handoff (added to spec.source.topics) at startingOffsets."""
from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer
from pyspark.sql.streaming.datasource import ReadAllAvailable

from handoff_spark.kafka.source import KafkaStreamReader, SourceOptions, from_offsets, to_offsets

pytestmark = [pytest.mark.kafka]


def _produce(bootstrap: str, topic: str, partition: int, n: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(n):
        producer.produce(topic, value=json.dumps({"id": i}).encode(), partition=partition)
    assert producer.flush(30) == 0


def _reader(bootstrap: str, topics: list[str], ledger: dict[tuple[str, int], int], tmp_path=None) -> KafkaStreamReader:
    options = {"subscribe": ",".join(topics), "kafka.bootstrap.servers": bootstrap, "startingOffsets": "latest"}
    if ledger:
        options["startOffsets"] = json.dumps(to_offsets(ledger))
    if tmp_path is not None:
        options["checkpointLocation"] = f"file://{tmp_path}/checkpoint"
    return KafkaStreamReader(SourceOptions.parse(options))


def test_new_topics_enter_at_starting_offsets_and_new_partitions_at_earliest_with_or_without_a_checkpoint(
        kafka, tmp_path):
    read, added = "entry-read", "entry-added"
    kafka.create_topic(read, partitions=2)  # partition 1 plays one added to the topic after the ledger's last batch
    kafka.create_topic(added, partitions=1)
    for topic, partition, n in ((read, 0, 5), (read, 1, 3), (added, 0, 4)):
        _produce(kafka.bootstrap, topic, partition, n)
    ledger = {(read, 0): 2}
    expected = {(read, 0): 2, (read, 1): 0, (added, 0): 4}

    # No checkpoint (a new one, or one that was lost): the ledger's partitions from the ledger, the rest by the rule.
    fresh = _reader(kafka.bootstrap, [read, added], ledger, tmp_path)
    assert from_offsets(fresh.initialOffset()) == expected

    # A kept checkpoint that knows only partition 0 of the first topic: the others enter at the same offsets, as
    # the end of an empty range, so the next batch reads them from there.
    kept = _reader(kafka.bootstrap, [read, added], ledger)
    end = from_offsets(kept.latestOffset(to_offsets({(read, 0): 2}), ReadAllAvailable()))
    assert end == {(read, 0): 5, (read, 1): 0, (added, 0): 4}

    # Without the ledger naming the first topic (a query restarted in the driver passes no start offsets), the
    # checkpoint's topics are the known ones.
    restarted = _reader(kafka.bootstrap, [read, added], {})
    end = from_offsets(restarted.latestOffset(to_offsets({(read, 0): 2}), ReadAllAvailable()))
    assert end == {(read, 0): 5, (read, 1): 0, (added, 0): 4}
