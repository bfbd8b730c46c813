"""Spark's data-source lookup in a driver's session start is a fork of the driver's fork server too.

Spark runs the lookup once per JVM, at the session's first data-source call (`app.register_data_sources`, inside
`build_session`), with the JVM's own Python (`PythonUtils.defaultPythonExec`: `PYSPARK_DRIVER_PYTHON` first), not
pyspark's `sc.pythonExec`. Left at the interpreter, it was the one process of a restart's chain that started fresh
and imported pyspark (docs/benchmarks.md, "Cold start", session 49). Its daemon stays alive under the
JVM, so what Spark ran for it can be read after the session is up."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

#: In a fresh interpreter (pyspark keeps one JVM per process, and the lookup runs once per JVM): a driver's session,
#: then the command lines of the JVM's child processes, and the fork server's launcher.
_PROBE = """
import json, sys
from handoff_spark.config import AppConfig
from handoff_spark.driver import app
cfg = AppConfig.model_validate_json(sys.argv[1])
spark = app.build_session(cfg)
jvm = spark.sparkContext._gateway.proc.pid
children = []
for task in __import__("os").listdir(f"/proc/{jvm}/task"):
    try:
        with open(f"/proc/{jvm}/task/{task}/children") as fh:
            children += fh.read().split()
    except FileNotFoundError:  # a JVM thread that ended meanwhile
        pass
argvs = []
for pid in children:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argvs.append([a.decode() for a in fh.read().split(b"\\0") if a])
    except FileNotFoundError:
        pass
launcher = app._fork_server.launcher if app._fork_server is not None else None
print(json.dumps({"argvs": argvs, "launcher": launcher}))
spark.stop()
"""


#: How Spark starts the lookup's daemon: `<python> -m pyspark.daemon <worker module>`.
LOOKUP = ["-m", "pyspark.daemon", "pyspark.sql.worker.lookup_data_sources"]


def _lookup_daemons(tmp_path: Path, env: dict[str, str]) -> tuple[list[list[str]], str | None]:
    cfg = {"handoffId": "test/lookup", "source": {"bootstrapServers": "127.0.0.1:1", "topics": ["t"]},
           "sink": {"kind": "iceberg", "table": "t.t"}, "schema": {"onIncompatible": "halt"},
           "checkpointLocation": str(tmp_path / "ck"), "sparkConf": {"spark.master": "local[1]"}}
    done = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(cfg)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    daemons = [a for a in out["argvs"] if "pyspark.sql.worker.lookup_data_sources" in a]
    return daemons, out["launcher"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON",
                                                            "HANDOFF_FORK_SERVER", "HANDOFF_FORK_SOCKET")}
    return {**env, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable, **extra}


def test_the_lookup_runs_as_the_fork_servers_launcher_and_as_the_interpreter_without_the_server(
        tmp_path: Path) -> None:
    daemons, launcher = _lookup_daemons(tmp_path / "a", _env())
    assert launcher is not None
    # the launcher script (`python -IS <launcher> -m …`, its shebang's line), which has the server fork the daemon
    assert [d[d.index(launcher):] if launcher in d else d for d in daemons] == [[launcher, *LOOKUP]], daemons
    # The switch off: Spark's own way, the interpreter itself (so the probe above can tell the two apart).
    daemons, launcher = _lookup_daemons(tmp_path / "b", _env(HANDOFF_FORK_SERVER="0"))
    assert launcher is None
    assert daemons == [[sys.executable, *LOOKUP]], daemons
