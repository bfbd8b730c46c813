"""The table sinks and what the driver needs of each: one explicit registry, no module scanning.

Each sink names two modules, which may be one: its data source module provides
- `DATA_SOURCE`: the PySpark Python data source class (its `name()` is the `writeStream.format`);
and its sink module (`iceberg.sink`, `bigquery.sink`) provides:
- `prepare(cfg)`: driver, before the query: create the table, reconcile the declared schema;
- `ledger_end(cfg) -> {(topic, partition): next offset}`: where the table's ledger ends for this handoff's
  stream query (the truth a query resumes from);
- `ledger_identity(cfg) -> (cluster id, {topic: topic id})`: the Kafka identity the ledger recorded;
- `record_epoch(cfg, ranges, reason, kafka) -> str`: `handoff ledger accept-kafka`'s `epoch` marker in the
  ledger (what was recorded, for the person who ran it);
- `backfill_overlap(cfg) -> [problem]`: what of `cfg.backfill`'s range the table already holds;
- `commit_batch(cfg, messages, batch_id) -> CommitResult` (a subclass of `sink.common.CommitResult`): the
  driver-side commit (called by the writer);
- `is_outage(exc) -> bool`, `OUTAGE_REASON`, `OUTAGE_FIELD`, `forget_clients(cfg)`: whether an error at a driver's
  start means the table's service did not answer (waited for: `driver.table_wait`), the degraded reason published
  meanwhile, the spec's field that holds the service's address, and dropping cached clients between tries;
- `warm_up(cfg)`: executors, what a fresh Python worker sets up before its first write (clients, catalog
  connections), done ahead on a new executor by `executor_warmup`; writes nothing;
- optionally `read_table(cfg, identifier) -> pyarrow.Table` and `table_version(cfg, identifier) -> str | None`:
  another table of the sink's catalog and its current version (a transform's lookup, `driver.transform`); the DataFrame path's writer takes option `rows=true` (rows, not records).
Modules are imported on first use, so the operator can import this package without pyspark or a sink's client.
Iceberg keeps its data source apart (`iceberg.stream`, light for Spark's planner interpreters, which import it
to unpickle the class); the writer there imports `iceberg.sink` when it runs, so `iceberg.sink` does not import
it back.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from handoff_spark.errors import HandoffConfigError

#: kind → (sink module, data source module)
_MODULES = {
    "iceberg": ("handoff_spark.iceberg.sink", "handoff_spark.iceberg.stream"),
    "bigquery": ("handoff_spark.bigquery.sink", "handoff_spark.bigquery.sink"),
}


class SinkUnavailable(HandoffConfigError):
    """The sink's module (or its client library) cannot be imported."""


@dataclass(frozen=True)
class SinkBackend:
    kind: str
    module: ModuleType
    data_source_module: ModuleType

    @property
    def data_source(self) -> type:
        return self.data_source_module.DATA_SOURCE

    @property
    def format(self) -> str:
        return self.data_source.name()

    def prepare(self, cfg: Any) -> Any:
        return self.module.prepare(cfg)

    def ledger_end(self, cfg: Any) -> dict[tuple[str, int], int]:
        return self.module.ledger_end(cfg)

    def ledger_identity(self, cfg: Any) -> tuple[str | None, dict[str, str]]:
        return self.module.ledger_identity(cfg)

    def record_epoch(self, cfg: Any, ranges: dict[str, dict[str, list[int]]], reason: str,
                     kafka: dict[str, Any]) -> str:
        return self.module.record_epoch(cfg, ranges, reason, kafka)

    def backfill_overlap(self, cfg: Any) -> list[str]:
        return self.module.backfill_overlap(cfg)

    def warm_up(self, cfg: Any) -> None:
        self.module.warm_up(cfg)

    def is_outage(self, exc: BaseException) -> bool:
        return bool(self.module.is_outage(exc))

    @property
    def outage_reason(self) -> str:
        return str(self.module.OUTAGE_REASON)

    @property
    def outage_field(self) -> str | None:
        """The spec's field that holds the service's address (named when its host does not resolve)."""
        return getattr(self.module, "OUTAGE_FIELD", None)

    def forget_clients(self, cfg: Any) -> None:
        self.module.forget_clients(cfg)

    def read_table(self, cfg: Any, identifier: str) -> Any:
        """Another table of the handoff's catalog, whole, as Arrow (a transform's lookup)."""
        if not hasattr(self.module, "read_table"):
            raise SinkUnavailable(f"the {self.kind} sink has no lookups")
        return self.module.read_table(cfg, identifier)

    def table_version(self, cfg: Any, identifier: str) -> str | None:
        """What changes when that table's content does (Iceberg: its current snapshot id)."""
        return self.module.table_version(cfg, identifier)


def kinds() -> list[str]:
    return sorted(_MODULES)


def get(kind: str) -> SinkBackend:
    """The backend for `sink.kind`; a clear error when its module cannot be imported (missing client library)."""
    try:
        names = _MODULES[kind]
    except KeyError:
        raise SinkUnavailable(f"unknown sink kind {kind!r}; known: {', '.join(kinds())}") from None
    modules = []
    for name in names:
        try:
            modules.append(importlib.import_module(name))
        except ImportError as exc:
            raise SinkUnavailable(f"sink {kind!r} is not available ({name}: {exc})") from exc
    return SinkBackend(kind, *modules)
