"""Spark's Python workers fork from Handoff's daemon, with the sink's heavy modules already imported.

Why it matters: a worker that imports pyarrow/PyIceberg/SQLAlchemy itself spends 1–2 s of CPU before
its first record, on every restart and every added executor (see handoff_spark.startup.worker_daemon).
"""
from __future__ import annotations

import importlib
import os
import sys
import zipfile
from pathlib import Path
from typing import Any, Iterator

import pytest

from handoff_spark.startup import worker_daemon
from handoff_spark.driver import app
from handoff_spark.config import AppConfig


def test_preload_imports_the_write_path_modules() -> None:
    loaded = worker_daemon.preload()
    assert set(loaded) == set(worker_daemon.PRELOAD)
    assert all(name in sys.modules for name in worker_daemon.PRELOAD)


def test_preload_skips_a_module_that_cannot_be_imported() -> None:
    assert worker_daemon.preload(("json", "handoff_no_such_module")) == ["json"]


#: Run in a fresh interpreter (malloc's settings are per process): did `keep_freed_memory` set them, and is a
#: 16 MiB block then served from malloc's heap (kept for reuse when freed) rather than mapped on its own (unmapped
#: when freed, faulted in again next time)? glibc marks a chunk it mapped on its own with the IS_MMAPPED bit (0x2)
#: of the size word just before the block (a look at /proc/self/maps could not tell such a mapping from one the
#: kernel merged with its neighbour).
_BIG_BLOCK = """
import ctypes
from handoff_spark.startup import worker_daemon
kept = worker_daemon.keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
addr = libc.malloc(16 << 20)
print(kept, not ctypes.c_size_t.from_address(addr - ctypes.sizeof(ctypes.c_size_t)).value & 2)
"""


def _big_block_from_heap(env: dict[str, str]) -> str:
    import subprocess

    return subprocess.run([sys.executable, "-c", _BIG_BLOCK], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_daemon_keeps_freed_memory_for_the_next_task_unless_the_user_set_malloc() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES" and not k.startswith("MALLOC_")}
    assert _big_block_from_heap(env) == "True True"
    # glibc's default: a block this big is mapped on its own; a user's own malloc settings are left alone
    assert _big_block_from_heap({**env, "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}) == "False False"


def test_archives_without_python_leave_the_path_and_the_finder_cache(tmp_path: Any, monkeypatch: Any) -> None:
    jar, modules, broken = tmp_path / "core.jar", tmp_path / "mods.zip", tmp_path / "broken.zip"
    with zipfile.ZipFile(jar, "w") as z:
        z.writestr("org/apache/spark/SparkContext.class", b"\xca\xfe")
    with zipfile.ZipFile(modules, "w") as z:
        z.writestr("some_zipped_module_x.py", "X = 1\n")
    broken.write_bytes(b"not a zip")
    monkeypatch.setattr(sys, "path", [str(jar), str(modules), str(jar), str(broken), *sys.path])
    monkeypatch.setattr(sys, "path_importer_cache", dict(sys.path_importer_cache))
    with pytest.raises(ImportError):
        importlib.import_module("no_such_module_anywhere")  # every path entry gets its finder
    assert str(jar) in sys.path_importer_cache
    assert worker_daemon.drop_archives_without_python() == [str(jar)]
    assert str(jar) not in sys.path and str(jar) not in sys.path_importer_cache
    assert str(modules) in sys.path and str(broken) in sys.path
    assert importlib.import_module("some_zipped_module_x").X == 1  # what can be imported from an archive still is


def test_preload_follows_the_sink() -> None:
    assert "pyiceberg.table" in worker_daemon.preload_for("iceberg")
    bigquery = worker_daemon.preload_for("bigquery")
    assert "handoff_spark.bigquery.sink" in bigquery and not any(
        m.startswith(("pyiceberg", "sqlalchemy")) for m in bigquery)
    assert worker_daemon.preload_for(None) == worker_daemon.preload_for("elsewhere") == worker_daemon.PRELOAD


SINKS = {"iceberg": {"kind": "iceberg", "table": "t.t"},
         "bigquery": {"kind": "bigquery", "project": "p", "dataset": "d", "table": "t"}}


@pytest.mark.parametrize("sink", sorted(SINKS))
def test_spark_workers_fork_from_the_preloading_daemon(tmp_path: Any, sink: str) -> None:
    """The workers have the write path of the handoff's own sink already imported, and only that sink's: a
    BigQuery worker never uses PyIceberg or SQLAlchemy."""
    from handoff_spark.driver.app import C1_ONLY_OPTION, build_session

    cfg = AppConfig.model_validate({
        "handoffId": "test/daemon", "source": {"bootstrapServers": "127.0.0.1:1", "topics": ["t"]},
        "sink": SINKS[sink], "schema": {"onIncompatible": "halt"},
        "checkpointLocation": str(tmp_path), "sparkConf": {"spark.master": "local[1]"}})
    def modules_in_worker(_: Iterator[Any]) -> Iterator[tuple[str, bool]]:
        # Runs in a Spark Python worker (pickled by value); it imports nothing heavy itself, so what it
        # sees there came from the daemon it was forked from.
        import sys as worker_sys

        for name in ("sqlalchemy", "pyiceberg.catalog.sql", "confluent_kafka", "handoff_spark.bigquery.sink"):
            yield name, name in worker_sys.modules
        import pyarrow

        yield "arrow pool", pyarrow.default_memory_pool().backend_name
        # the daemon (this worker's `__main__`, forked) set malloc's thresholds before it forked
        yield "freed memory kept", getattr(worker_sys.modules["__main__"], "freed_memory_kept", None)
        # Spark's spark-core jar (no Python inside) is neither on the path nor re-read by each task's
        # importlib.invalidate_caches() (worker_daemon.drop_archives_without_python)
        yield "jars", [p for p in [*worker_sys.path, *worker_sys.path_importer_cache] if p.endswith(".jar")]
        # py4j from its installed, compiled package, not Spark's source zip (removed by `make` and the Dockerfile)
        import py4j

        yield "py4j zipped", ".zip" in py4j.__file__
        # the daemon itself was forked from the driver's fork server (startup.fork_server), not a fresh interpreter
        import os as worker_os

        with open(f"/proc/{worker_os.getppid()}/stat") as daemon_stat:
            yield "daemon's parent", int(daemon_stat.read().rsplit(")", 1)[1].split()[1])

    from pyspark import SparkContext

    # pyspark keeps one JVM per Python process: after an earlier test's session (test_kafka_source's), this
    # session's options reach the conf but not that JVM's command line.
    fresh_jvm = SparkContext._gateway is None
    spark = build_session(cfg)
    try:
        assert spark.conf.get("spark.python.daemon.module") == "handoff_spark.startup.worker_daemon"
        # and its JVMs compile with C1 only (app.jit_options)
        for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
            assert C1_ONLY_OPTION in spark.conf.get(key).split(), (key, spark.conf.get(key))
        assert "-Djava.io.tmpdir=" in spark.conf.get("spark.driver.extraJavaOptions")
        if fresh_jvm:
            # the running JVM's own arguments, not only the conf (an option set after the JVM started would be in
            # the conf and have no effect): once from the conf, besides the test bed's JAVA_TOOL_OPTIONS copy
            jvm_args = list(spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
                            .getInputArguments())
            from_tool_options = C1_ONLY_OPTION in os.environ.get("JAVA_TOOL_OPTIONS", "").split()
            assert jvm_args.count(C1_ONLY_OPTION) == 1 + from_tool_options, jvm_args
            # a local driver's JVM unpacks native libraries into a directory of its own (app.local_jvm_tmp_dir)
            jvm_tmp = Path(spark.sparkContext._jvm.java.lang.System.getProperty("java.io.tmpdir"))
            assert jvm_tmp.name.startswith(f"{app.JVM_TMP_PREFIX}{os.getpid()}-") and jvm_tmp.is_dir(), jvm_tmp
        rows = spark.sparkContext.parallelize([0], 1).mapPartitions(modules_in_worker).collect()
        fork_server = app._fork_server
        assert fork_server is not None and spark.sparkContext.pythonExec == fork_server.launcher
    finally:
        spark.stop()
    # ... and allocate Arrow memory from the system allocator, not mimalloc's huge-page arena (worker_daemon)
    # ... and inherit the daemon's malloc settings (worker_daemon.keep_freed_memory)
    iceberg = sink == "iceberg"
    assert dict(rows) == {"sqlalchemy": iceberg, "pyiceberg.catalog.sql": iceberg, "confluent_kafka": True,
                          "handoff_spark.bigquery.sink": not iceberg, "arrow pool": worker_daemon.ARROW_POOL,
                          "freed memory kept": True, "jars": [], "py4j zipped": False,
                          "daemon's parent": fork_server.process.pid}
