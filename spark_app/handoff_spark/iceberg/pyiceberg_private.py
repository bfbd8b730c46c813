"""Every PyIceberg private API Handoff uses, behind one name each, so a PyIceberg upgrade is checked here.

Why private APIs at all (each was measured or has no public equivalent; see the callers):
* `dataframe_to_data_files`: PyIceberg's Parquet writer with partitioning, without committing (executors write
  files, the driver commits them in one snapshot with the ledger properties). `iceberg.sink`, `iceberg.maintenance`.
* `apply_table_update`, `TableMetadataUpdateContext`, `update_table_metadata_log`: `update_table_metadata`
  without its final deep copy, whose cost grows with history. `iceberg.catalog.apply_updates`.
* `transaction_state`: a Transaction's base metadata and staged updates (`_table.metadata`, `_updates`), the
  key of the memoised `table_metadata`. `iceberg.sink._MemoTransaction`.
* `replace_file_format_model`: PyIceberg's file-format registry refuses a second model for a format, so Handoff's
  Parquet writer replaces the registered one in `FileFormatFactory._registry`. Its writer subclasses
  `ParquetFormatWriter` and sets `_parquet_writer_kwargs` before its first write (`_writer`). `iceberg.parquet_writer`.

Not re-exported (overrides in a subclass cannot be): `iceberg.catalog.HandoffSqlCatalog` overrides SqlCatalog's
`_convert_orm_to_iceberg` and `_update_and_stage_table` and calls `_parse_metadata_version` / `_load_file_io`.
`PRIVATE_APIS` lists every name above; tests/unit/spark/test_private_api_fences.py resolves each against the installed
PyIceberg (and the instance attributes on real objects), naming any an upgrade moved.
Pinned: requirements.lock; tests/unit/spark/iceberg/test_iceberg_catalog.py and the sink's integration tests exercise
them.
"""
from __future__ import annotations

from typing import Any

from pyiceberg.io.fileformat import FileFormatFactory
from pyiceberg.io.pyarrow import _dataframe_to_data_files as dataframe_to_data_files
from pyiceberg.table import Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import _apply_table_update as apply_table_update
from pyiceberg.table.update import _TableMetadataUpdateContext as TableMetadataUpdateContext
from pyiceberg.table.update import _update_table_metadata_log as update_table_metadata_log

#: Every PyIceberg private name Handoff uses, here or in a subclass (instance attributes: the test reads them off
#: real objects: `Transaction._table`, `Transaction._updates`, `ParquetFormatWriter._writer`,
#: `ParquetFormatWriter._parquet_writer_kwargs`).
PRIVATE_APIS = (
    "pyiceberg.io.pyarrow._dataframe_to_data_files",
    "pyiceberg.table.update._apply_table_update",
    "pyiceberg.table.update._TableMetadataUpdateContext",
    "pyiceberg.table.update._update_table_metadata_log",
    "pyiceberg.io.fileformat.FileFormatFactory._registry",
    "pyiceberg.catalog.sql.SqlCatalog._convert_orm_to_iceberg",
    "pyiceberg.catalog.sql.SqlCatalog._update_and_stage_table",
    "pyiceberg.catalog.sql.SqlCatalog._parse_metadata_version",
    "pyiceberg.catalog.sql.SqlCatalog._load_file_io",
)


def replace_file_format_model(model: Any) -> None:
    """Make `model` the writer of its file format for every later PyIceberg write in this process."""
    FileFormatFactory._registry[model.format] = model


def transaction_state(tx: Transaction) -> tuple[TableMetadata, tuple[Any, ...]]:
    """(the table metadata the transaction started from, the updates staged so far)."""
    return tx._table.metadata, tx._updates


__all__ = ["PRIVATE_APIS", "dataframe_to_data_files", "apply_table_update", "TableMetadataUpdateContext",
           "update_table_metadata_log", "transaction_state", "replace_file_format_model"]
