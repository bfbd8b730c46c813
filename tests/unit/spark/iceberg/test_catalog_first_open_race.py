"""Two processes opening a new SQLite catalog at once (the demo's driver and its checks did, in CI): PyIceberg's
SqlCatalog probes for its tables and creates them when the probe finds none, so the slower CREATE TABLE fails
with "already exists". `load_catalog_cached` opens it again then. Real processes on a real SQLite file race here
(a barrier lines them up), and a fault injected at PyIceberg's table creation makes the lost race certain."""
from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
import sqlalchemy.exc
from pyiceberg.catalog.sql import SqlCatalog

from handoff_spark.iceberg import table as iceberg_table


def _open(uri: str, warehouse: str, barrier: multiprocessing.synchronize.Barrier, out: multiprocessing.Queue) -> None:
    barrier.wait()
    try:
        iceberg_table.load_catalog_cached("race", {"type": "sql", "uri": uri, "warehouse": warehouse})
        out.put("ok")
    except Exception as exc:  # noqa: BLE001 - reported to the test
        out.put(f"{type(exc).__name__}: {exc}"[:300])


def test_processes_opening_a_new_catalog_at_once_all_succeed(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    results = []
    for round_ in range(4):
        uri = f"sqlite:///{tmp_path}/c{round_}.db"
        barrier, out = ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=_open, args=(uri, f"file://{tmp_path}/wh", barrier, out)) for _ in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        results += [out.get(timeout=10) for _ in procs]
    assert results == ["ok"] * 16


def test_a_lost_creation_race_opens_the_catalog_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = SqlCatalog.create_tables
    raced = []

    def create_after_another_process(self: SqlCatalog) -> None:
        real(self)  # the other process's CREATE TABLE got there first ...
        if not raced:
            raced.append(1)
            real_error = sqlalchemy.exc.OperationalError(
                "CREATE TABLE iceberg_tables", {}, Exception("table iceberg_tables already exists"))
            raise real_error  # ... so this one's fails as SQLite says

    monkeypatch.setattr(SqlCatalog, "create_tables", create_after_another_process)
    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": f"file://{tmp_path}/wh"}
    catalog = iceberg_table.load_catalog_cached("lost-race", props)
    assert raced == [1] and catalog.list_namespaces() == []


def test_other_catalog_errors_are_not_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def broken(self: SqlCatalog) -> None:
        calls.append(1)
        raise sqlalchemy.exc.OperationalError("CREATE TABLE iceberg_tables", {}, Exception("disk I/O error"))

    monkeypatch.setattr(SqlCatalog, "create_tables", broken)
    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/d.db", "warehouse": f"file://{tmp_path}/wh"}
    with pytest.raises(sqlalchemy.exc.OperationalError, match="disk I/O error"):
        iceberg_table.load_catalog_cached("broken", props)
    assert calls == [1]
