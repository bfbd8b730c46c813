"""The driver's Spark session, launched in a thread at the driver's start (I/O: it starts the JVM).

Why: every committed batch is Spark's, so a (re)started driver commits nothing until its session is up and its
query has run a batch. The JVM's launch and Spark's context (3-5 s on a 2-core node) need nothing from the table
or Kafka, while the driver's own preparation (the table made or checked, the ledger's end and Kafka's identity
read, the checkpoint trusted or discarded: 1-2 s of catalog and broker round trips) needs nothing from Spark. Done
one after the other they added up; here the session is built while the main thread prepares, and the query
starts as soon as both are done (docs/benchmarks.md, "Cold start").

A preparation that fails (a bad table, another Kafka cluster, missing credentials) still fails the driver at once
with its one-line message, without waiting for the JVM: `abandon` kills the JVM being launched (so nothing it prints
follows the refusal) and the thread is a daemon; the launch directory is removed by the next driver, as after a
kill (`driver.temp_dirs`).
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any


#: How long `abandon` kills what the build starts, at most, and how often it looks.
ABANDON_WAIT_SECONDS = 10.0
ABANDON_POLL_SECONDS = 0.05


class EarlySession:
    """`build()` run in a daemon thread from `start()`; `result()` waits for it and returns the session (or raises
    what the build raised)."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self._build = build
        self._session: Any = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        self.seconds: float | None = None  # the build's wall time, for the driver's log
        self._children_before: set[int] = set()
        self._thread = threading.Thread(target=self._run, name="handoff-session-start", daemon=True)

    def start(self) -> "EarlySession":
        self._children_before = set(child_pids())
        self._thread.start()
        return self

    def _run(self) -> None:
        started = time.monotonic()
        try:
            self._session = self._build()
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread by result()
            self._error = exc
        finally:
            self.seconds = time.monotonic() - started
            self._done.set()

    def abandon(self, wait: float = ABANDON_WAIT_SECONDS) -> None:
        """The driver refuses to start: kill the processes started since `start` (the JVM's launch, the fork
        server), so none of them outlives or talks after the refusal. Until the build has ended (at most `wait`
        seconds): a refusal can come while the build is still about to start one (an operator's query config
        refused right after the hold's first answer), and a build whose JVM is killed ends at once ("exited
        before sending its port")."""
        # The JVM is killed on purpose: py4j's report of the connection it loses would follow the refusal or the stop
        # (at ERROR, with a traceback, when a command of the build's was waiting for its answer: not retried).
        for handler in logging.getLogger().handlers:
            handler.addFilter(not_from_py4j)
        deadline = time.monotonic() + wait
        while True:
            self._kill_started()
            if self._done.is_set() or time.monotonic() >= deadline:
                break
            self._done.wait(ABANDON_POLL_SECONDS)
        self._kill_started()  # what the build started in the last poll

    def _kill_started(self) -> None:
        for pid in set(child_pids()) - self._children_before:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def result(self) -> Any:
        """The session, made the calling thread's active one in the JVM too: Spark looks Python data sources up
        in the active session, which is per thread (the build's thread has it, the caller would not)."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        from handoff_spark import pyspark_private

        pyspark_private.set_active_session(self._session)
        return self._session


def from_py4j(record: logging.LogRecord) -> bool:
    """Whether py4j logged `record`: on its own loggers, or on the root logger (py4j 0.10.9.9 logs a lost
    connection's traceback there, `logging.exception` in `java_gateway.GatewayClient.send_command`)."""
    return record.name.startswith("py4j") or "/py4j/" in record.pathname.replace(os.sep, "/")


def not_from_py4j(record: logging.LogRecord) -> bool:
    return not from_py4j(record)


def child_pids(pid: int | None = None) -> list[int]:
    """The direct children of process `pid` (this one by default), from /proc (every thread's children)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid or os.getpid()}/task").glob("*"):
        try:
            found += [int(x) for x in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return found
