"""One bad record never halts a hand-off: the worst records a producer can write, among valid ones, through the
real driver (Spark's query, and the driver's bootstrap batch) into Iceberg. Every valid record lands exactly
once, every bad one is in the dead-letter topic with its reason, and the driver runs to the end in one life."""
from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer

from handoff_spark.dlq import TRUNCATED_BYTES
from handoff_spark.iceberg import ledger

from iceberg_drill_support import assert_exactly_once, drill_config, run_to_completion, value

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]

TEN_MB = 10 * 1024 * 1024
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
    (b'{"id": -11, "region": "' + b"y" * (2 * 1024 * 1024) + b'"}', None),  # big, within the 8 MiB limit
    (b'{"id": -12, "amount": NaN}', "unparseable"),
]


@pytest.mark.parametrize("bootstrap_batch", [False, True], ids=["spark", "bootstrap"])
def test_the_worst_records_are_dead_letters_and_the_driver_never_exits(kafka, tmp_path, bootstrap_batch):
    topic = f"poison-{uuid.uuid4().hex[:6]}"
    dlq = f"{topic}-dlq"
    kafka.create_topic(topic, partitions=2, config={"max.message.bytes": str(16 * 1024 * 1024)})
    kafka.create_topic(dlq, partitions=1)  # the broker's default 1 MB limit: the 10 MB one arrives cut
    cfg = drill_config(tmp_path, kafka.bootstrap, topic, max_records=150, schema={
        "columns": [{"name": "id", "type": "long", "required": True}, {"name": "ts", "type": "timestamp"},
                    {"name": "region", "type": "string"}, {"name": "amount", "type": "double"}],
        "onIncompatible": "deadLetter"}, deadLetterTopic=dlq, bootstrapBatch=bootstrap_batch)
    p = Producer({"bootstrap.servers": kafka.bootstrap, "message.max.bytes": 16 * 1024 * 1024,
                  "enable.idempotence": True})
    where: dict[tuple[int, int], str] = {}
    lengths: dict[tuple[int, int], str] = {}
    worst = iter(WORST)
    offsets = {0: 0, 1: 0}
    good = 0
    for i in range(600):
        partition = i % 2
        if i % 40 == 7:
            bad, reason = next(worst, (None, "done"))
            if reason != "done":
                p.produce(topic, value=bad, key=b"poison-%d" % i, partition=partition)
                if reason is None:
                    good += 1
                else:
                    where[(partition, offsets[partition])] = reason
                    lengths[(partition, offsets[partition])] = f"key={len(b'poison-%d' % i)},value={len(bad or b'')}"
                offsets[partition] += 1
                continue
        p.produce(topic, value=value(i), key=str(i).encode(), partition=partition)
        offsets[partition] += 1
        good += 1
    assert p.flush(60) == 0
    assert len(where) == sum(1 for _, r in WORST if r is not None)

    runs = run_to_completion(tmp_path, max_runs=1)  # one life: any exit but a clean one fails here
    log = runs[0].log.read_text()
    assert "Traceback" not in log, log[-4000:]
    table = assert_exactly_once(cfg, kafka.bootstrap, good, topic)
    assert sum(c.dlq_rows for c in ledger.list_commits(table)) == len(where)
    regions = set(table.scan(selected_fields=("region",)).to_arrow().column("region").to_pylist())
    assert "a\x00b" in regions and "y" * (2 * 1024 * 1024) in regions

    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": f"check-{topic}", "auto.offset.reset": "earliest"})
    c.subscribe([dlq])
    letters: dict[tuple[int, int], dict[str, bytes]] = {}
    sizes: dict[tuple[int, int], int] = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(letters) < len(where):
        m = c.poll(1)
        if m is not None and m.error() is None:
            h = dict(m.headers())
            key = (int(h["handoff.source.partition"]), int(h["handoff.source.offset"]))
            letters[key] = h
            sizes[key] = len(m.value() or b"")
    c.close()
    assert {k: h["handoff.reason"].decode() for k, h in letters.items()} == where
    assert all(h["handoff.error"] for h in letters.values())
    (big,) = [k for k, r in where.items() if r == "too-large"]
    assert letters[big]["handoff.truncated"].decode() == lengths[big]
    assert sizes[big] == TRUNCATED_BYTES
