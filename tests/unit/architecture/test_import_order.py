"""Every module imports on its own, whichever is imported first: no import circle (one made `app → progress →
sink_common → app` work only when `app` came first). Each module is imported first in a process of its own
(in-process re-imports would trip over the process-wide Prometheus registry and kopf's handler registry).

How: one interpreter imports the third-party libraries the packages use (none of this project's modules), then
forks a child per module, which imports that module first. A fork holds no module of `handoff_spark` or
`handoff_operator`, so what is checked is the same as in a fresh interpreter; the libraries' own import (most of a
fresh interpreter's ~0.35 s per module) is paid once."""
from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import handoff_operator
import handoff_spark

MODULES = sorted(
    info.name
    for pkg in (handoff_spark, handoff_operator)
    for info in pkgutil.walk_packages(pkg.__path__, prefix=f"{pkg.__name__}.", onerror=lambda _name: None)
    if not info.name.endswith("__main__"))

#: Imported once before the forks; a library missing here is simply imported by the child that needs it.
LIBRARIES = ("pyarrow", "pyspark.sql", "pyiceberg.catalog", "pyiceberg.table", "confluent_kafka",
             "confluent_kafka.admin", "kubernetes.client", "kubernetes.config", "kopf", "pydantic",
             "pydantic_settings", "google.cloud.bigquery", "prometheus_client", "sqlalchemy", "yaml", "fastavro",
             "jsonschema")

_RUNNER = """
import importlib, json, os, sys, traceback
names, libraries, at_once = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
for lib in libraries:
    try:
        importlib.import_module(lib)
    except Exception:
        pass
assert not [m for m in sys.modules if m.split(".")[0] in ("handoff_spark", "handoff_operator")]
failed, running = {}, {}

def reap():
    pid, status = os.waitpid(-1, 0)
    name, read = running.pop(pid)
    with os.fdopen(read, "rb") as pipe:
        err = pipe.read().decode(errors="replace")
    if status != 0:
        failed[name] = err or f"exit status {status}"

for name in names:
    while len(running) >= at_once:
        reap()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            importlib.import_module(name)
            code = 0
        except BaseException:
            os.write(write, traceback.format_exc()[-2000:].encode())
            code = 1
        os._exit(code)
    os.close(write)
    running[pid] = (name, read)
while running:
    reap()
print(json.dumps(failed))
"""


def test_every_module_imports_first():
    assert len(MODULES) > 30
    run = subprocess.run([sys.executable, "-c", _RUNNER, json.dumps(MODULES), json.dumps(LIBRARIES), "2"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    failed = json.loads(run.stdout.strip().splitlines()[-1])
    assert failed == {}
