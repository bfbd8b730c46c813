"""An ASan + UBSan build of `_kafka_native` reads the test bed's Kafka (issue 33): the native reader, sanitized, gives
the same batches as confluent-kafka's Consumer for every record shape a topic holds, with no sanitizer report.

The child process (tests/sanitizers.py) loads the sanitized module as `handoff_spark.kafka._kafka_native`, so
`kafka_native.module()` runs its librdkafka checks (version, functions, struct layouts) against the sanitized code
too before any read."""
from __future__ import annotations

import json
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

import sanitizers

pytestmark = [pytest.mark.kafka,
              pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc (hack/install-system-deps.sh)")]

CHILD = """
import json, sys
import pyarrow as pa
from handoff_spark.kafka import native as kafka_native
from handoff_spark.kafka.source import ARROW_SCHEMA, OffsetRange, SourceOptions, read_range
assert kafka_native.module() is not None, kafka_native.load_error()
args = json.loads(sys.argv[1] if len(sys.argv) > 1 else {args!r})
opts = SourceOptions.parse({{"subscribe": args["topic"], "kafka.bootstrap.servers": args["bootstrap"],
                             "consumeBatch": "64"}})
import os
from handoff_spark.kafka.source import reader_conf
os.environ[kafka_native.READER_ENV] = "native"
assert kafka_native.consumer_factory(reader_conf(opts)) is kafka_native.NativeConsumer
for start, end in args["ranges"]:
    tables = {{}}
    for reader in ("native", "python"):
        os.environ[kafka_native.READER_ENV] = reader
        tables[reader] = pa.Table.from_batches(list(read_range(opts, OffsetRange(args["topic"], 0, start, end))),
                                               schema=ARROW_SCHEMA)
    assert tables["native"].equals(tables["python"]), (start, end)
    print("range", start, end, tables["native"].num_rows)
"""


def test_the_native_reader_under_asan_and_ubsan_reads_every_record_shape(kafka: Any, tmp_path: Path) -> None:
    topic = f"sanitized-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, partitions=1)
    base_ms = int(time.time() * 1000) - 60_000
    p = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"tx-{topic}"})
    p.init_transactions()
    p.begin_transaction()
    for i in range(400):  # null and empty keys and values, headers (a null one too), every byte value, big values
        key = None if i % 7 == 0 else (b"" if i % 11 == 0 else bytes(range(i % 256)))
        value = None if i % 13 == 0 else (b"" if i % 17 == 0 else bytes((i + j) % 256 for j in range(i * 3)))
        if i % 97 == 0:
            value = b"v" * (256 << 10)
        headers = [("h", b"\x00\xff" * (i % 4)), ("empty", None)] if i % 5 == 0 else None
        p.produce(topic, value, key=key, headers=headers, timestamp=base_ms + i)
    p.commit_transaction()
    p.begin_transaction()
    for i in range(30):
        p.produce(topic, b"aborted-%d" % i)
    p.flush()
    p.abort_transaction()
    p.begin_transaction()
    for i in range(20):
        p.produce(topic, b"after-%d" % i)
    p.commit_transaction()
    del p
    # 400 records + marker, 30 aborted + marker, 20 records + marker: offsets 0..452
    args = {"topic": topic, "bootstrap": kafka.bootstrap, "ranges": [[0, 453], [100, 300], [3, 4], [399, 453]]}
    built = sanitizers.build("handoff_spark.kafka._kafka_native", tmp_path, libraries=("dl",))
    proc = sanitizers.run(CHILD.format(args=json.dumps(args)), {"handoff_spark.kafka._kafka_native": built})
    assert proc.returncode == 0 and not sanitizers.findings(proc), (proc.returncode, proc.stderr[-6000:])
    assert proc.stdout.count("range ") == 4 and "range 0 453 420" in proc.stdout, proc.stdout
