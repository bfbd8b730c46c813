"""BigQuery test helpers shared by the integration tests (tests/integration/bq_support.py) and the e2e
drills (tests/e2e/bq_drill_support.py): the exactly-once row counts, a dead-letter topic reader, and a second
emulator with small Storage Write API limits. It lives in tests/ because that directory is on sys.path for
every test (tests/conftest.py, rootdir-relative import), while each subdirectory is only on it for its own
tests."""
from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

from handoff_spark.config import AppConfig


def table_counts(cfg: AppConfig) -> tuple[int, int]:
    """(rows, distinct (topic, partition, offset)) — equal and == produced is the exactly-once invariant."""
    from handoff_spark.bigquery import client as bigquery_client

    client = bigquery_client.rest_client(cfg.sink)
    ref = bigquery_client.table_ref(cfg.sink)
    row = list(client.query(
        f"SELECT COUNT(*) AS n, COUNT(DISTINCT CONCAT(_kafka_topic, '/', CAST(_kafka_partition AS STRING), '/', "
        f"CAST(_kafka_offset AS STRING))) AS d FROM `{ref}`", retry=None).result())[0]
    return int(row["n"]), int(row["d"])


def read_dead_letters(bootstrap: str, topic: str, expect: int, timeout_s: float = 30.0) -> list[Any]:
    """Up to `expect` records of partition 0 of the dead-letter topic, from the start."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        out: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while len(out) < expect and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                out.append(msg)
        return out
    finally:
        consumer.close()


def limited_emulator(workdir: Path, max_request_bytes: int, max_stream_rows: int) -> Any:
    """A separate emulator whose Storage Write API refuses large requests and full PENDING streams with
    RESOURCE_EXHAUSTED (`BQEMU_WRITE_API_MAX_REQUEST_BYTES` / `BQEMU_WRITE_API_MAX_STREAM_ROWS`)."""
    from handoff_testbed.bigquery import BigQueryEmulator

    keys = ("BQEMU_WRITE_API_MAX_REQUEST_BYTES", "BQEMU_WRITE_API_MAX_STREAM_ROWS")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(dict(zip(keys, (str(max_request_bytes), str(max_stream_rows)))))
    try:
        emu = BigQueryEmulator()
        emu.build()
        emu.start(workdir)
        return emu
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
