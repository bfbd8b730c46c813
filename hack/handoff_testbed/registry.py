"""Component names → classes, imported lazily so one component's deps never block another."""
from __future__ import annotations

import importlib

from .base import Component

COMPONENTS: dict[str, str] = {
    "kafka": "handoff_testbed.kafka:Kafka",
    "apiserver": "handoff_testbed.apiserver:ApiServer",
    "postgres": "handoff_testbed.postgres:Postgres",
    "s3": "handoff_testbed.s3:S3",
    "gcs": "handoff_testbed.gcs:Gcs",
    "bigquery": "handoff_testbed.bigquery:BigQueryEmulator",
    "node": "handoff_testbed.node:Node",
    "schema-registry": "handoff_testbed.schema_registry:SchemaRegistry",
}


def component(name: str) -> Component:
    try:
        target = COMPONENTS[name]
    except KeyError:
        raise SystemExit(f"unknown component {name!r}; choose from {', '.join(COMPONENTS)}") from None
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)()
