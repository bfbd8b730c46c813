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


def test_after_abandon_py4j_says_nothing_about_the_jvm_it_lost_and_everything_else_is_still_logged(tmp_path):
    """A stop or a refusal kills the JVM being launched; a build command that was waiting for the JVM's answer then
    makes py4j log its lost connection at ERROR with a traceback, on the root logger (py4j 0.10.9.9,
    `GatewayClient.send_command`). After `abandon`, nothing of py4j's reaches the driver's log; the driver's own
    lines do. The record is made as py4j makes it: `logging.exception` from a file under a `py4j/` directory."""
    import logging

    py4j_dir = tmp_path / "site-packages" / "py4j"
    py4j_dir.mkdir(parents=True)
    (py4j_dir / "java_gateway.py").write_text(
        "import logging\n"
        "def send_command():\n"
        "    try:\n"
        "        raise ConnectionResetError(104, 'Connection reset by peer')\n"
        "    except ConnectionResetError:\n"
        "        logging.exception('Exception while sending command.')\n")
    namespace: dict[str, object] = {}
    source = py4j_dir / "java_gateway.py"
    exec(compile(source.read_text(), str(source), "exec"), namespace)  # noqa: S102 - the record's path is py4j's

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    root = logging.getLogger()
    handler = Keep()
    root.addHandler(handler)
    try:
        namespace["send_command"]()  # before abandon: logged (a real error of a running driver)
        assert seen == ["Exception while sending command."]
        EarlySession(lambda: None).start().abandon(wait=1.0)
        namespace["send_command"]()  # the JVM killed on purpose: not logged
        logging.getLogger("handoff.app").error("stopped")
        assert seen == ["Exception while sending command.", "stopped"]
    finally:
        root.removeHandler(handler)
        from handoff_spark.startup.early_session import not_from_py4j

        for other in root.handlers:  # pytest's own: this process goes on
            other.removeFilter(not_from_py4j)
