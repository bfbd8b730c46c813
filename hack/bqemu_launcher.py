"""Runs the bqemulator CLI with its per-write table snapshot turned off.

Why: bqemulator 1.4.0 copies the whole table into `_bqemulator_snapshots` after EVERY write (AUTO
snapshots for `FOR SYSTEM_TIME AS OF`), so N appends cost O(N^2) time and space (7 GB after 400
Storage Write appends in a probe). Handoff never time-travels on BigQuery, so AUTO captures are
skipped; USER snapshots (`CREATE SNAPSHOT TABLE`) still work. `capture` may return None by contract
(the "table vanished" case), so callers cope.

Also: its Storage Write path builds the target table's Arrow schema from each column's name, type and
mode only (`write_servicer._table_arrow_schema`), dropping a RECORD's sub-fields, so every append to a
table with a RECORD column fails at commit with DuckDB's "Attempted to convert a STRUCT with no fields".
The REST path (`tabledata._build_arrow_schema`) already recurses into `fields`; the write path is given
the same nested field list here. Nothing else about the write path changes.

Also: the emulator shares ONE DuckDB connection between its REST worker threads and its gRPC (Storage Write)
threads, and deadlocked under concurrent use (seen with the replay drills: the operator's status reads, a test's
polling and a driver's appends at once): a thread holding the GIL waited for DuckDB's connection lock while the
thread holding that lock waited for the GIL to drop a registered Arrow table (`unregister` →
`PythonDependencyItem`'s destructor). Every call into the connection is made under one process-wide lock here
(`_SerializedConnection`): a thread blocked on a Python lock has released the GIL, so the holder can finish. Calls
were never safe to interleave on one connection anyway; they are now one at a time, and a statement holds the
connection from its execute until its result is fetched (`_Pending`): DuckDB keeps one pending result per
connection, and a SELECT fetched after another thread's INSERT got that INSERT's `Count` row (a replay drill's row
check; `test_testbed_bigquery.py` runs SELECTs beside DML and Storage Write appends).

Also: BigQuery has `requirePartitionFilter` on the table resource (the one in `timePartitioning` is deprecated), and
the Python client sets and reads it there; bqemulator 1.4.0 keeps it only inside `timePartitioning`, so a table made
with `Table.require_partition_filter = True` came back without it. The table-level field is read from insert,
patch and update bodies into the emulator's own place and written back on the table resource
(`_table_meta_with_table_level_filter`, `_table_rest_with_table_level_filter`). And `ALTER TABLE … SET OPTIONS
(require_partition_filter = …)`, which the emulator runs as a no-op, now changes it too (`_sync_altered_options`):
that statement is the fix Handoff's replay refusal names, and it must work where the tests run it.

Runs inside the emulator's own virtualenv (see hack/handoff_testbed/bigquery.py), never the repo's.
Usage: <emulator-venv>/bin/python hack/bqemu_launcher.py start --rest-port P1 --grpc-port P2 ...
"""
from __future__ import annotations

import re
import sys
import threading

from bqemulator.grpc_api import write_servicer
from bqemulator.storage import engine
from bqemulator.versioning import snapshots

_original_capture = snapshots.SnapshotManager.capture


def _capture_user_snapshots_only(self, project_id, dataset_id, table_id, *, kind="AUTO"):
    if kind == "AUTO":
        return None
    return _original_capture(self, project_id, dataset_id, table_id, kind=kind)


snapshots.SnapshotManager.capture = _capture_user_snapshots_only


def _fields_raw(fields):
    return [{"name": f.name, "type": f.type, "mode": f.mode, "fields": _fields_raw(f.fields)} for f in fields]


def _table_arrow_schema_with_nested_fields(table_meta):
    from bqemulator.api.routes.tabledata import _build_arrow_schema

    return _build_arrow_schema(_fields_raw(table_meta.schema_.fields))


write_servicer._table_arrow_schema = _table_arrow_schema_with_nested_fields

_DUCKDB_LOCK = threading.RLock()


class _SerializedConnection:
    """The engine's DuckDB connection, each attribute read and call made under `_DUCKDB_LOCK` (module docstring).
    A call that returns the connection itself (`execute` returns it as its own cursor) returns a `_Pending` that
    keeps the lock until its result is fetched: the statement's result lives on the shared connection, so another
    thread's statement in between would replace it (a SELECT answered with an INSERT's `Count` row, or nothing)."""

    def __init__(self, connection):
        self._connection = connection

    def __getattr__(self, name):
        with _DUCKDB_LOCK:
            attr = getattr(self._connection, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            _DUCKDB_LOCK.acquire()
            try:
                out = attr(*args, **kwargs)
            except BaseException:
                _DUCKDB_LOCK.release()
                raise
            if out is self._connection:
                return _Pending(self, out)  # the lock goes with it
            _DUCKDB_LOCK.release()
            return out

        return call


class _Pending:
    """A statement's result on the shared connection, with `_DUCKDB_LOCK` held for it (taken by the execute) until
    a fetch returns or the object is dropped (a DDL's or DML's result nobody reads goes with the statement's
    expression, at once in CPython). Every other attribute is the connection's, read under the same hold."""

    FETCHES = frozenset({"fetchall", "fetchone", "fetchmany", "fetchdf", "fetchnumpy", "fetch_df", "df", "pl",
                         "arrow", "to_arrow_table", "fetch_arrow_table", "fetch_record_batch"})

    def __init__(self, wrapper, connection):
        self._wrapper, self._connection, self._held = wrapper, connection, True

    def _release(self):
        if self._held:
            self._held = False
            try:
                _DUCKDB_LOCK.release()
            except RuntimeError:  # dropped by another thread than the one that executed: nothing of ours held
                pass

    def __getattr__(self, name):
        attr = getattr(self._connection, name)
        if not callable(attr):
            return attr
        if name in self.FETCHES:
            def fetch(*args, **kwargs):
                try:
                    return attr(*args, **kwargs)
                finally:
                    self._release()
            return fetch
        self._release()  # another call on the connection (a next statement): the pending result is done with
        return getattr(self._wrapper, name)

    def __del__(self):
        self._release()


def _serialized_connection(self):
    raw = _original_connection.fget(self)
    wrapped = getattr(self, "_handoff_serialized", None)
    if wrapped is None or wrapped._connection is not raw:
        wrapped = self._handoff_serialized = _SerializedConnection(raw)
    return wrapped


_original_connection = engine.DuckDBEngine.connection
engine.DuckDBEngine.connection = property(_serialized_connection)

from bqemulator.api.routes import tables as _table_routes

_original_rest_to_table_meta = _table_routes._rest_to_table_meta
_original_table_to_rest = _table_routes._table_to_rest


def _table_meta_with_table_level_filter(project_id, dataset_id, body, clock, existing=None):
    meta = _original_rest_to_table_meta(project_id, dataset_id, body, clock, existing)
    wanted = body.get("requirePartitionFilter")
    if wanted is None or meta.time_partitioning is None:
        return meta
    flag = wanted if isinstance(wanted, bool) else str(wanted).strip().lower() == "true"
    partitioning = meta.time_partitioning.model_copy(update={"require_partition_filter": flag})
    return meta.model_copy(update={"time_partitioning": partitioning})


def _table_rest_with_table_level_filter(table_meta):
    body = _original_table_to_rest(table_meta)
    if table_meta.time_partitioning is not None and table_meta.time_partitioning.require_partition_filter:
        body["requirePartitionFilter"] = True
    return body


_table_routes._rest_to_table_meta = _table_meta_with_table_level_filter
_table_routes._table_to_rest = _table_rest_with_table_level_filter

_ALTER_OPTIONS = re.compile(r"\s*ALTER\s+TABLE\s+(?P<table>[^\s(]+)\s+SET\s+OPTIONS\s*\((?P<options>[^)]*)\)\s*;?\s*\Z",
                            re.IGNORECASE)
_FILTER_OPTION = re.compile(r"require_partition_filter\s*=\s*(?P<value>true|false)", re.IGNORECASE)


def _sync_altered_options(bq_sql, project_id, ctx):
    """`ALTER TABLE t SET OPTIONS (require_partition_filter = true|false)` onto the table's catalog entry."""
    statement = _ALTER_OPTIONS.match(bq_sql)
    option = _FILTER_OPTION.search(statement.group("options")) if statement else None
    if option is None:
        return
    parts = [part for part in statement.group("table").replace("`", "").split(".") if part]
    if len(parts) == 2:
        parts = [project_id, *parts]
    if len(parts) != 3:
        return
    meta = ctx.catalog.get_table(*parts)
    if meta is None or meta.time_partitioning is None:
        return
    partitioning = meta.time_partitioning.model_copy(
        update={"require_partition_filter": option.group("value").lower() == "true"})
    ctx.catalog.update_table(meta.model_copy(update={"time_partitioning": partitioning,
                                                     "last_modified_time": ctx.clock.now()}))


from bqemulator.jobs import executor as _executor  # noqa: E402

_original_sync_created_table = _executor.sync_created_table


def _sync_created_table_and_altered_options(bq_sql, project_id, ctx):
    _original_sync_created_table(bq_sql, project_id, ctx)
    _sync_altered_options(bq_sql, project_id, ctx)


_executor.sync_created_table = _sync_created_table_and_altered_options

if __name__ == "__main__":
    from bqemulator.cli import main

    sys.exit(main())
