"""The replay sink contract's registry: the table of a handoff, by its sink kind (`contract.ReplayTable`).

One place maps a sink kind to its table steps, so the controller and `handoff replay` never branch on the sink.
"""
from __future__ import annotations

from collections.abc import Callable

from handoff_spark.config import AppConfig

from handoff_operator.replay.bigquery_table import BigQueryReplayTable
from handoff_operator.replay.contract import (ReplayTable, RollbackRefused, RollbackStep, UndoPointTaken,
                                              cut_of)
from handoff_operator.replay.iceberg_table import IcebergReplayTable

#: The sinks a ReplayRequest can act on, by `config.sink.kind`.
OPENERS: dict[str, Callable[[AppConfig, str | None], ReplayTable | None]] = {
    "iceberg": lambda config, _key: IcebergReplayTable.open(config),
    "bigquery": BigQueryReplayTable.open}


def open_table(config: AppConfig, key_json: str | None = None) -> ReplayTable | None:
    """The handoff's table, freshly read (None: it does not exist yet). `key_json`: a BigQuery sink's
    service-account key from `credentialsFrom` (the operator has no file the driver's config could name)."""
    return OPENERS[config.sink.kind](config, key_json)


__all__ = ["OPENERS", "ReplayTable", "RollbackRefused", "RollbackStep", "UndoPointTaken", "cut_of", "open_table"]
