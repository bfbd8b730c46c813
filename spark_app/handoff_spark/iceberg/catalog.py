"""The SQL catalog Handoff uses, with commit costs that do not grow with the snapshots a table retains.

Why: a streaming sink commits every few seconds to a table that keeps the replay window's snapshots (their
summaries carry the ledger offsets, ~50-80 of them). Profiled on PyIceberg 0.12 at 77 retained snapshots, one
commit spent ~20 ms in work proportional to that history, not in the append itself:
  * the metadata JSON was parsed twice (the driver's `load_table`, then again inside `commit_table`, which
    reloads the table to validate the requirements) — ~2-4 ms each;
  * `update_table_metadata` deep-copies the whole metadata (every snapshot and its summary) each time it
    applies updates — three times per append (twice in the Transaction, once when staging) — ~4 ms each.

What changes, and why it is safe:
  * Parsed metadata is cached *by metadata location*. The catalog row (the pointer) is still read on every
    `load_table`, so a load always sees the catalog's current state; only the parse of the file the pointer
    names is skipped when that file was parsed (or written, by this catalog's own commit) before. A metadata
    file is written once under a fresh name (`<version>-<uuid>.metadata.json`) and never rewritten, so its
    location identifies its content. A commit by another writer moves the pointer to a location not in the
    cache, which is then read from storage. The commit itself still swaps the pointer with
    `UPDATE … WHERE metadata_location = <the one we based on>`, so a concurrent commit fails it.
  * Updates are applied without the final defensive deep copy (`apply_updates`). PyIceberg's update
    functions never mutate a metadata object in place (each returns `model_copy(update=…)` with new lists),
    and neither does Handoff, so the new metadata may share unchanged snapshots with the old one.
    `tests/unit/spark/iceberg/test_iceberg_catalog.py` pins the result to PyIceberg's own `update_table_metadata`.
Only `SqlCatalog` (SQLite, PostgreSQL) is wrapped; other catalog types are used as PyIceberg ships them.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from datetime import datetime

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.io import FileIO
from pyiceberg.table import CommitTableResponse, StagedTable, Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import TableRequirement, TableUpdate
from pyiceberg.typedef import Identifier
from pyiceberg.utils.datetime import datetime_to_millis

from handoff_spark.iceberg.pyiceberg_private import TableMetadataUpdateContext, apply_table_update, update_table_metadata_log

#: Parsed metadata versions kept per catalog (a driver needs one or two per table; the operator reads a few
#: tables). An entry shares unchanged snapshots with its neighbours, so it costs little beyond the first.
CACHE_ENTRIES = 16


def apply_updates(base: TableMetadata, updates: tuple[TableUpdate, ...],
                  metadata_location: str | None = None) -> TableMetadata:
    """PyIceberg's `update_table_metadata(base, updates, enforce_validation=False, metadata_location)` without
    its final `model_copy(deep=True)`, the one step whose cost grows with the snapshots retained. With no
    updates the base itself is the answer."""
    if not updates:
        return base
    context = TableMetadataUpdateContext()
    new = base
    for update in updates:
        new = apply_table_update(update, new, context)
    if context.has_changes():
        if metadata_location:
            new = update_table_metadata_log(new, metadata_location, base.last_updated_ms)
        if base.last_updated_ms == new.last_updated_ms:
            new = new.model_copy(update={"last_updated_ms": datetime_to_millis(datetime.now().astimezone())})
    new.spec().check_compatible(new.schema())
    new.sort_order().check_compatible(new.schema())
    return new


class HandoffSqlCatalog(SqlCatalog):
    """`SqlCatalog` with parsed metadata cached by location and updates staged without a deep copy."""

    def __init__(self, name: str, **properties: str) -> None:
        super().__init__(name, **properties)
        self._metadata_cache: OrderedDict[str, tuple[TableMetadata, FileIO]] = OrderedDict()
        self._metadata_lock = threading.Lock()
        self.metadata_parses = 0  # metadata files read from storage (tests and benchmarks look at it)

    def _remember(self, location: str, metadata: TableMetadata, io: FileIO) -> None:
        with self._metadata_lock:
            self._metadata_cache[location] = (metadata, io)
            self._metadata_cache.move_to_end(location)
            while len(self._metadata_cache) > CACHE_ENTRIES:
                self._metadata_cache.popitem(last=False)

    def _cached(self, location: str) -> tuple[TableMetadata, FileIO] | None:
        with self._metadata_lock:
            hit = self._metadata_cache.get(location)
            if hit is not None:
                self._metadata_cache.move_to_end(location)
            return hit

    def forget_metadata(self) -> None:
        with self._metadata_lock:
            self._metadata_cache.clear()

    def _convert_orm_to_iceberg(self, orm_table: IcebergTables) -> Table:
        # Called by load_table with the catalog row it has just read: the pointer is current.
        location = orm_table.metadata_location
        hit = self._cached(location) if location else None
        if hit is None or not orm_table.table_namespace or not orm_table.table_name:
            table = super()._convert_orm_to_iceberg(orm_table)
            self.metadata_parses += 1
            self._remember(table.metadata_location, table.metadata, table.io)
            return table
        metadata, io = hit
        return Table(identifier=Catalog.identifier_to_tuple(orm_table.table_namespace) + (orm_table.table_name,),
                     metadata=metadata, metadata_location=location, io=io, catalog=self)

    def _update_and_stage_table(self, current_table: Table | None, table_identifier: Identifier,
                                requirements: tuple[TableRequirement, ...],
                                updates: tuple[TableUpdate, ...]) -> StagedTable:
        if current_table is None:  # table creation: PyIceberg's path, with its full validation
            return super()._update_and_stage_table(current_table, table_identifier, requirements, updates)
        for requirement in requirements:
            requirement.validate(current_table.metadata)
        metadata = apply_updates(current_table.metadata, updates, current_table.metadata_location)
        version = self._parse_metadata_version(current_table.metadata_location) + 1
        location = load_location_provider(metadata.location, metadata.properties).new_table_metadata_file_location(
            version)
        return StagedTable(identifier=table_identifier, metadata=metadata, metadata_location=location,
                           io=self._load_file_io(properties=metadata.properties, location=location), catalog=self)

    def commit_table(self, table: Table, requirements: tuple[TableRequirement, ...],
                     updates: tuple[TableUpdate, ...]) -> CommitTableResponse:
        response = super().commit_table(table, requirements, updates)
        # The pointer now names the file this commit wrote from `response.metadata`: no need to read it back.
        self._remember(response.metadata_location, response.metadata,
                       self._load_file_io(response.metadata.properties, response.metadata_location))
        return response


def wrap_sql_catalog(catalog: Catalog) -> Catalog:
    """The same catalog as a `HandoffSqlCatalog` when it is a plain `SqlCatalog`, else unchanged."""
    if type(catalog) is not SqlCatalog:
        return catalog
    wrapped = HandoffSqlCatalog(catalog.name, **catalog.properties)
    catalog.engine.dispose()
    return wrapped


__all__ = ["HandoffSqlCatalog", "apply_updates", "wrap_sql_catalog", "CACHE_ENTRIES"]
