"""One bad record never halts a hand-off: the worst records a producer can write, among valid ones, through the
real driver into Iceberg and into BigQuery, on Spark's query. Every valid
record lands exactly once, every bad one is in the dead-letter topic with its reason, and the driver runs to the
end in one life."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from handoff_spark.bigquery import client as bigquery_client
from handoff_spark.bigquery import ledger as bigquery_ledger
from handoff_spark.sink.dead_letters import TRUNCATED_BYTES
from handoff_spark.iceberg import ledger

from bq_drill_support import assert_exactly_once as assert_bq_exactly_once, bq_drill_config, run_bq_to_completion
from iceberg_drill_support import Run, assert_exactly_once, drill_config, run_to_completion, value

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]

TEN_MB = 10 * 1024 * 1024
BIG_VALID = "y" * (2 * 1024 * 1024)
#: (value, the dead-letter reason, or None for a valid record that must land).
WORST: list[tuple[bytes | None, str | None]] = [
    (b'{"id": -1, "v": ' + b"[" * 5000 + b"]" * 5000 + b"}", "too-deep"),
    (b'{"id": -2, "region": "' + b"x" * TEN_MB + b'"}', "too-large"),
    (b'{"id": -3, "region": "\xff\xfe\xfd"}', "unparseable"),             # invalid UTF-8
    (b'{"id": -4, "region": "a\x00b"}', "unparseable"),                    # a raw NUL inside a string
    (b'{"id": -5, "region": "a\\u0000b"}', None),                          # an escaped NUL: valid text
    (b'{"id": 1180591620717411303424}', "type-mismatch"),                  # 2**70 for a long
    (b'{"id": -6, "amount": 1e400}', "type-mismatch"),                     # beyond a double
    (b'{"id": -7, "ts": 99999999999999999}', "type-mismatch"),             # epoch ms past year 9999
    (b'{"id": -8, "region": "\\ud800"}', "unparseable"),                   # an unpaired surrogate
    (b'{"id": -9}{"id": -10}', "unparseable"),                             # two objects in one value
    (b"", "unparseable"),                                                  # an empty value
    (None, "null-value"),                                                  # a tombstone
    (b'{"id": -11, "region": "' + BIG_VALID.encode() + b'"}', None),      # big, within the 8 MiB limit
    (b'{"id": -12, "amount": NaN}', "unparseable"),
]
SCHEMA = {"columns": [{"name": "id", "type": "long", "required": True}, {"name": "ts", "type": "timestamp"},
                      {"name": "region", "type": "string"}, {"name": "amount", "type": "double"}],
          "onIncompatible": "deadLetter"}


@dataclass
class Produced:
    """What the drill wrote: how many records must land, and each bad one's (partition, offset) → reason and the
    `handoff.truncated` header a cut dead letter must carry."""

    good: int = 0
    reasons: dict[tuple[int, int], str] = field(default_factory=dict)
    lengths: dict[tuple[int, int], str] = field(default_factory=dict)


def topics(kafka: Any) -> tuple[str, str]:
    topic = f"poison-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=2, config={"max.message.bytes": str(16 * 1024 * 1024)})
    kafka.create_topic(f"{topic}-dlq", partitions=1)  # the broker's default 1 MB limit: the 10 MB one arrives cut
    return topic, f"{topic}-dlq"


def produce_the_worst(bootstrap: str, topic: str, n: int = 600) -> Produced:
    """`n` records over two partitions; every 40th from the 7th on is the next of WORST."""
    p = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 16 * 1024 * 1024, "enable.idempotence": True})
    out = Produced()
    worst = iter(WORST)
    offsets = {0: 0, 1: 0}
    for i in range(n):
        partition = i % 2
        where = (partition, offsets[partition])
        offsets[partition] += 1
        bad, reason = next(worst, (None, "done")) if i % 40 == 7 else (None, "done")
        if reason == "done":
            p.produce(topic, value=value(i), key=str(i).encode(), partition=partition)
            out.good += 1
            continue
        key = b"poison-%d" % i
        p.produce(topic, value=bad, key=key, partition=partition)
        if reason is None:
            out.good += 1
        else:
            out.reasons[where] = reason
            out.lengths[where] = f"key={len(key)},value={len(bad or b'')}"
    assert p.flush(60) == 0
    assert len(out.reasons) == sum(1 for _, r in WORST if r is not None)
    return out


def assert_one_clean_life(runs: list[Run]) -> None:
    assert len(runs) == 1 and runs[0].returncode == 0
    log = runs[0].log.read_text()
    assert "Traceback" not in log, log[-4000:]


def assert_dead_letters(bootstrap: str, dlq: str, produced: Produced) -> None:
    """Each bad record is in the DLQ with its reason and detail; the 10 MB one cut, with its full lengths."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{dlq}", "auto.offset.reset": "earliest"})
    c.subscribe([dlq])
    letters: dict[tuple[int, int], dict[str, bytes]] = {}
    sizes: dict[tuple[int, int], int] = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(letters) < len(produced.reasons):
        m = c.poll(1)
        if m is not None and m.error() is None:
            h = dict(m.headers())
            where = (int(h["handoff.source.partition"]), int(h["handoff.source.offset"]))
            letters[where] = h
            sizes[where] = len(m.value() or b"")
    c.close()
    assert {k: h["handoff.reason"].decode() for k, h in letters.items()} == produced.reasons
    assert all(h["handoff.error"] for h in letters.values())
    (big,) = [k for k, r in produced.reasons.items() if r == "too-large"]
    assert letters[big]["handoff.truncated"].decode() == produced.lengths[big]
    assert sizes[big] == TRUNCATED_BYTES


def test_iceberg_the_worst_records_are_dead_letters_and_the_driver_never_exits(kafka, tmp_path: Path) -> None:
    topic, dlq = topics(kafka)
    cfg = drill_config(tmp_path, kafka.bootstrap, topic, max_records=150, schema=SCHEMA, deadLetterTopic=dlq)
    produced = produce_the_worst(kafka.bootstrap, topic)
    assert_one_clean_life(run_to_completion(tmp_path, max_runs=1))
    table = assert_exactly_once(cfg, kafka.bootstrap, produced.good, topic)
    assert sum(c.dlq_rows for c in ledger.list_commits(table)) == len(produced.reasons)
    regions = set(table.scan(selected_fields=("region",)).to_arrow().column("region").to_pylist())
    assert "a\x00b" in regions and BIG_VALID in regions
    assert_dead_letters(kafka.bootstrap, dlq, produced)


@pytest.mark.bigquery
def test_bigquery_the_worst_records_are_dead_letters_and_the_driver_never_exits(kafka, bigquery,
                                                                                tmp_path: Path) -> None:
    topic, dlq = topics(kafka)
    cfg = bq_drill_config(tmp_path, bigquery, kafka.bootstrap, topic, max_records=150, schema=SCHEMA,
                          deadLetterTopic=dlq)
    produced = produce_the_worst(kafka.bootstrap, topic)
    assert_one_clean_life(run_bq_to_completion(tmp_path, cfg, max_runs=1))
    assert_bq_exactly_once(cfg, kafka.bootstrap, produced.good, topic)
    assert sum(c.dlq_rows for c in bigquery_ledger.list_commits(cfg.sink, cfg.handoff_id)) == len(produced.reasons)
    client = bigquery_client.rest_client(cfg.sink)
    ref = bigquery_client.table_ref(cfg.sink)
    found = list(client.query(f"SELECT id, LENGTH(region) AS n FROM `{ref}` WHERE id IN (-5, -11) ORDER BY id").result())
    assert [(r["id"], r["n"]) for r in found] == [(-11, len(BIG_VALID)), (-5, 3)]
    assert_dead_letters(kafka.bootstrap, dlq, produced)
