"""driver.table_wait: a driver's start waits out the table's service (pure loop), and which errors each sink calls an
outage (real exceptions from real clients). The start end to end with a catalog that comes up late:
tests/e2e/test_iceberg_drills.py::test_a_catalog_down_at_the_drivers_start_is_waited_for."""
from __future__ import annotations

import socket
import sqlite3

import pytest
import sqlalchemy

from handoff_spark.driver import table_wait


class _Outage(ConnectionError):
    pass


def _run(failures: list[BaseException], stop_after: int | None = None):
    said: list[str] = []
    degraded: list[str | None] = []
    details: list[str | None] = []
    waits: list[float] = []
    forgotten: list[int] = []
    now = [0.0]

    def attempt() -> str:
        if failures:
            raise failures.pop(0)
        return "planned"

    def wait(seconds: float) -> bool:
        waits.append(seconds)
        now[0] += seconds
        return stop_after is not None and len(waits) >= stop_after

    result = table_wait.when_reachable(attempt, lambda e: isinstance(e, ConnectionError), reason="CatalogUnavailable",
                                       what="table db.t", wait=wait, say=said.append,
                                       degraded=lambda r, d: (degraded.append(r), details.append(d)),
                                       forget=lambda: forgotten.append(1), clock=lambda: now[0])
    assert all((r is None) == (d is None) for r, d in zip(degraded, details))  # the error with its reason
    return result, said, degraded, waits, forgotten


def test_an_outage_is_waited_for_with_growing_pauses_and_said_once_then_cleared():
    result, said, degraded, waits, forgotten = _run([_Outage("refused")] * 8)
    assert result == (True, "planned")
    assert waits == [1, 2, 4, 8, 16, 30, 30, 30]  # doubling up to the cap
    assert degraded == ["CatalogUnavailable"] * 8 + [None] and len(forgotten) == 8
    # the first failure, then once per capped pause (a line every 30 s while it lasts), and the recovery
    assert said[0].startswith("CatalogUnavailable: table db.t did not answer at the driver's start (_Outage: refused)")
    assert len(said) == 1 + 3 + 1 and said[-1] == "table db.t answered again after 121 s: the driver's start goes on"


def test_no_outage_no_wait_and_anything_else_fails_the_start_at_once():
    assert _run([]) == ((True, "planned"), [], [], [], [])
    with pytest.raises(ValueError, match="bad column"):
        _run([_Outage("refused"), ValueError("bad column")])


def test_a_stop_while_waiting_starts_nothing():
    (ready, planned), _said, degraded, waits, _f = _run([_Outage("refused")] * 5, stop_after=2)
    assert (ready, planned) == (False, None) and waits == [1, 2] and degraded == ["CatalogUnavailable"] * 2


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_iceberg_sink_waits_for_a_catalog_that_does_not_answer_but_not_for_a_bad_setting(tmp_path):
    from handoff_spark.iceberg.sink import is_outage

    def error(uri: str) -> BaseException:
        with pytest.raises(Exception) as caught:
            sqlalchemy.create_engine(uri).connect().close()
        return caught.value

    assert is_outage(error(f"postgresql+psycopg2://postgres@127.0.0.1:{_closed_port()}/x"))  # refused
    assert not is_outage(error(f"sqlite:///{tmp_path}/missing/dir/catalog.db"))  # a path that cannot be: a setting
    db = tmp_path / "catalog.db"
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        engine = sqlalchemy.create_engine(f"sqlite:///{db}", connect_args={"timeout": 0})
        with pytest.raises(Exception) as locked:
            with engine.begin() as conn:
                conn.execute(sqlalchemy.text("INSERT INTO t VALUES (1)"))
        assert is_outage(locked.value), locked.value  # "database is locked"
    finally:
        holder.execute("COMMIT")
        holder.close()
    assert is_outage(ConnectionRefusedError()) and not is_outage(ValueError("no such table"))


def test_the_bigquery_sink_waits_for_transient_errors_but_not_for_a_refusal():
    from google.api_core import exceptions

    from handoff_spark.bigquery.sink import is_outage
    assert is_outage(exceptions.ServiceUnavailable("down")) and is_outage(exceptions.InternalServerError("oops"))
    assert is_outage(ConnectionRefusedError())
    assert not is_outage(exceptions.NotFound("no table")) and not is_outage(exceptions.Forbidden("no access"))


#: A host name that cannot resolve, found so without a DNS query: glibc refuses a label over 63 characters before it
#: asks any server (tests talk to loopback only), and answers as for a name that does not exist.
UNRESOLVABLE_HOST = "a" * 64 + ".invalid"


def test_a_catalog_host_that_does_not_resolve_is_waited_for_and_its_line_names_the_field():
    """A wrong host in the spec and a Service not made yet look the same to the driver: it waits (a fixed spec rolls
    the pod; a Service that appears lets it go on), and its line, published as degradedDetail, names the field."""
    from handoff_spark.iceberg.sink import OUTAGE_FIELD, is_outage

    with pytest.raises(Exception) as caught:
        sqlalchemy.create_engine(f"postgresql+psycopg2://postgres@{UNRESOLVABLE_HOST}:5432/x").connect().close()
    assert "could not translate host name" in str(caught.value)
    assert is_outage(caught.value) and table_wait.unresolved_host(caught.value)
    detail = table_wait.outage_detail(caught.value, OUTAGE_FIELD)
    assert detail.startswith("OperationalError: (psycopg2.OperationalError) could not translate host name")
    assert detail.endswith("its host name does not resolve: check the host in spec.sink.iceberg.catalog.properties "
                           "(uri), or that its Service exists"), detail
    # the same through the wait: said once, published with the reason
    said, published = [], []
    failures = [caught.value]

    def attempt() -> str:
        if failures:
            raise failures.pop(0)
        return "planned"

    assert table_wait.when_reachable(attempt, is_outage, reason="CatalogUnavailable", what="table db.t",
                                     wait=lambda _s: False, say=said.append,
                                     degraded=lambda r, d: published.append((r, d)),
                                     field=OUTAGE_FIELD) == (True, "planned")
    assert published == [("CatalogUnavailable", detail), (None, None)]
    assert said[0] == (f"CatalogUnavailable: table db.t did not answer at the driver's start ({detail}); waiting for "
                       f"it, trying again in 1 s")
    # a refused connection is an outage too, without the hint: the host resolved
    with pytest.raises(Exception) as refused:
        sqlalchemy.create_engine(f"postgresql+psycopg2://postgres@127.0.0.1:{_closed_port()}/x").connect().close()
    assert "does not resolve" not in table_wait.outage_detail(refused.value, OUTAGE_FIELD)
    assert table_wait.unresolved_host(socket.gaierror(socket.EAI_NONAME, "Name or service not known"))
