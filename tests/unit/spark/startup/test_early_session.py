"""The driver's session is launched in a thread while the driver prepares (`startup.early_session`): the build
runs beside the caller, its error reaches the caller, and a refusing driver kills what the build started."""
from __future__ import annotations

import subprocess
import threading
import time

import pytest

from handoff_spark.startup.early_session import EarlySession, child_pids


def test_the_build_runs_beside_the_caller_and_its_result_is_handed_over(monkeypatch):
    monkeypatch.setattr("handoff_spark.pyspark_private.set_active_session", lambda _s: None)
    release, seen = threading.Event(), []

    def build() -> str:
        seen.append(threading.current_thread().name)
        release.wait(10)
        return "session"

    early = EarlySession(build).start()
    time.sleep(0.05)
    assert seen == ["handoff-session-start"]  # started before the caller asked for it
    release.set()
    assert early.result() == "session" and early.seconds is not None and early.seconds >= 0.05


def test_a_failed_build_raises_in_the_caller():
    def build() -> None:
        raise RuntimeError("JAVA_HOME is not set")

    with pytest.raises(RuntimeError, match="JAVA_HOME"):
        EarlySession(build).start().result()


def test_abandon_kills_the_process_the_build_started_and_no_other():
    older = subprocess.Popen(["sleep", "60"])  # a child from before the build: not the build's to kill
    started = threading.Event()
    procs: list[subprocess.Popen[bytes]] = []

    def build() -> None:
        procs.append(subprocess.Popen(["sleep", "60"]))
        started.set()
        procs[0].wait()

    early = EarlySession(build).start()
    assert started.wait(10)
    assert procs[0].pid in child_pids()
    early.abandon()
    assert procs[0].wait(10) == -9
    assert older.poll() is None
    older.kill()
    older.wait()


def test_abandon_also_kills_what_the_build_starts_after_it_was_called():
    """A refusal found soon after the build started (an operator's query config refused at once) can come before
    it has launched its JVM: what it launches then is killed too, before `abandon` returns, so nothing talks after
    the refusal."""
    procs: list[subprocess.Popen[bytes]] = []

    def build() -> None:
        time.sleep(0.3)  # the fork server and the JVM's launch come a moment after the thread starts
        procs.append(subprocess.Popen(["sleep", "60"]))
        procs[0].wait()

    early = EarlySession(build).start()
    early.abandon()
    assert early.seconds is not None  # the build has ended (its time is set when it does)
    assert procs and procs[0].poll() == -9
