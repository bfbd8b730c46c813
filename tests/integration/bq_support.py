"""Helpers for the BigQuery sink tests: app configs on the emulator, the exactly-once invariants, a consumer
for the dead-letter topic, and a second emulator with small Storage Write API limits (the emulator's way of
answering RESOURCE_EXHAUSTED)."""
from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from handoff_spark.config import AppConfig

COLUMNS = [{"name": "id", "type": "long", "required": True}, {"name": "ts", "type": "timestamp"},
           {"name": "region", "type": "string"}, {"name": "amount", "type": "double"}]


def bq_config(tmp_path: Path, emulator: Any, bootstrap: str, topic: str, *, dataset: str | None = None,
              table: str = "events", columns: list[dict[str, Any]] | None = None, **overrides: Any) -> AppConfig:
    sink_over = overrides.pop("sink", {})
    doc: dict[str, Any] = {
        "handoffId": "ns/bq1",
        "source": {"bootstrapServers": bootstrap, "topics": [topic]},
        "sink": {"kind": "bigquery", "project": emulator.project,
                 "dataset": dataset or f"ds_{uuid.uuid4().hex[:8]}", "table": table,
                 "restEndpoint": emulator.rest_endpoint, "grpcEndpoint": emulator.grpc_endpoint,
                 "partitionBy": "ts", **sink_over},
        "schema": {"columns": columns if columns is not None else COLUMNS, "onIncompatible": "halt"},
        "checkpointLocation": str(tmp_path / "checkpoint"),
    }
    doc.update(overrides)
    return AppConfig.model_validate(doc)


def table_counts(cfg: AppConfig) -> tuple[int, int]:
    """(rows, distinct (topic, partition, offset)) — equal and == produced is the exactly-once invariant."""
    from handoff_spark import bigquery_client

    client = bigquery_client.rest_client(cfg.sink)
    ref = bigquery_client.table_ref(cfg.sink)
    row = list(client.query(
        f"SELECT COUNT(*) AS n, COUNT(DISTINCT CONCAT(_kafka_topic, '/', CAST(_kafka_partition AS STRING), '/', "
        f"CAST(_kafka_offset AS STRING))) AS d FROM `{ref}`", retry=None).result())[0]
    return int(row["n"]), int(row["d"])


def read_dead_letters(bootstrap: str, topic: str, expect: int, timeout_s: float = 30.0) -> list[Any]:
    import time

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

    saved = {k: os.environ.get(k) for k in ("BQEMU_WRITE_API_MAX_REQUEST_BYTES", "BQEMU_WRITE_API_MAX_STREAM_ROWS")}
    os.environ["BQEMU_WRITE_API_MAX_REQUEST_BYTES"] = str(max_request_bytes)
    os.environ["BQEMU_WRITE_API_MAX_STREAM_ROWS"] = str(max_stream_rows)
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
