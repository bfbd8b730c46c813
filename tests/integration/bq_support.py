"""Helpers for the BigQuery sink tests: app configs on the emulator; the exactly-once counts, the
dead-letter reader and the limited emulator are shared with the e2e drills (tests/bq_common.py)."""
from __future__ import annotations

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


def old_ledger_table(emulator: Any, tmp_path: Path, without: tuple[str, ...]) -> tuple[AppConfig, str]:
    """A handoff's config on a fresh dataset whose ledger table was made by an older Handoff: the current ledger
    columns but `without`. Returns (config, the ledger table's reference)."""
    from google.cloud import bigquery as bq

    from handoff_spark.bigquery import client as bigquery_client, ledger as bigquery_ledger

    dataset = f"oldledger_{uuid.uuid4().hex[:8]}"
    client = emulator.bq_client()
    client.create_dataset(f"{emulator.project}.{dataset}")
    cfg = bq_config(tmp_path, emulator, "127.0.0.1:9", "orders", dataset=dataset, table="orders",
                    handoffId="ns/orders")
    ref = bigquery_client.table_ref(cfg.sink, bigquery_ledger.ledger_table(cfg.sink))
    old = [f for f in bigquery_ledger._LEDGER_FIELDS if f[0] not in without]
    client.create_table(bq.Table(ref, schema=[bq.SchemaField(n, t, mode=m) for n, t, m in old]))
    return cfg, ref
