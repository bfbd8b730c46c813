"""Helpers for the Iceberg sink tests: app configs on a real catalog, raw Kafka-shaped Arrow batches, a fake
Spark offset log (the files Spark writes), and the exactly-once invariants every drill ends with."""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from handoff_spark.config import AppConfig
from handoff_spark.kafka.source import ARROW_SCHEMA


def app_config(tmp_path: Path, bootstrap: str, topic: str = "events", catalog_uri: str | None = None,
               warehouse: str | None = None, extra_catalog: dict[str, str] | None = None,
               partition_by: list[str] | None = None, columns: list[dict[str, Any]] | None = None,
               **overrides: Any) -> AppConfig:
    doc: dict[str, Any] = {
        "handoffId": "ns/h1",
        "source": {"bootstrapServers": bootstrap, "topics": [topic]},
        "sink": {"kind": "iceberg", "catalogName": "handoff",
                 "catalogProperties": {"type": "sql", "uri": catalog_uri or f"sqlite:///{tmp_path}/catalog.db",
                                       "warehouse": warehouse or f"file://{tmp_path}/warehouse",
                                       **(extra_catalog or {})},
                 "table": "ns.events", "partitionBy": partition_by or []},
        "schema": {"columns": columns if columns is not None else [
            {"name": "id", "type": "long", "required": True}, {"name": "ts", "type": "timestamp"},
            {"name": "region", "type": "string"}, {"name": "amount", "type": "double"}],
            "onIncompatible": "halt"},
        "checkpointLocation": str(tmp_path / "checkpoint"),
        "maintenance": {"orphanMinAgeSeconds": 0},
    }
    doc.update(overrides)
    return AppConfig.model_validate(doc)


def record(i: int, **extra: Any) -> bytes:
    doc = {"id": i, "ts": (dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(hours=i)).isoformat(),
           "region": ["eu", "us", "ap"][i % 3], "amount": i * 1.5, **extra}
    return json.dumps(doc).encode()


def raw_batch(topic: str, partition: int, start: int, values: list[bytes]) -> pa.RecordBatch:
    n = len(values)
    ts = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    return pa.RecordBatch.from_arrays([
        pa.array([topic] * n, pa.string()), pa.array([partition] * n, pa.int32()),
        pa.array(range(start, start + n), pa.int64()), pa.array([ts] * n, pa.timestamp("us", "UTC")),
        pa.array([None] * n, pa.binary()), pa.array(values, pa.binary()),
        pa.array([[]] * n, ARROW_SCHEMA.field("headers").type)], schema=ARROW_SCHEMA)


def write_offsets(checkpoint: Path, batch_id: int, offsets: dict[str, dict[str, int]],
                  initial: dict[str, dict[str, int]] | None = None,
                  query_id: str = "11111111-2222-3333-4444-555555555555") -> None:
    """What Spark (and the source, for batch 0) write before running batch `batch_id`."""
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}}
    (checkpoint / "offsets" / str(batch_id)).write_text(f"v1\n{json.dumps(meta)}\n{json.dumps(offsets)}")
    if initial is not None:
        (checkpoint / "sources").mkdir(parents=True, exist_ok=True)
        (checkpoint / "sources" / "handoff-initial.json").write_text(json.dumps(initial))
    if not (checkpoint / "metadata").exists():
        (checkpoint / "metadata").write_text(json.dumps({"id": query_id}))
