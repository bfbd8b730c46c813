"""PySpark's Python worker daemon with Handoff's heavy imports done once, before it forks workers.

Why: PySpark starts every Python worker by forking its daemon (`pyspark.daemon`), which has imported
nothing but pyspark. A fresh worker then spends 1–2 s of CPU importing pyarrow's JSON/Parquet modules,
PyIceberg with SQLAlchemy, confluent-kafka and the sink before it touches its first record (measured:
1.7 s of a 4 s task on this project's 2-core test machine). Fresh workers are not rare: the first batch
after every (re)start, every executor the autoscaler adds, every worker Spark replaces after an idle
timeout or a failure — exactly the moments when freshness matters. Importing in the daemon makes those
modules shared, copy-on-write pages of every forked worker.

Spark runs `python -m <spark.python.daemon.module>`; `app.build_session` sets it to this module. Only
imports happen here, no threads or sockets are created before the fork. A module that fails to import
is skipped (the worker imports it itself later and reports the real error there); `HANDOFF_WORKER_PRELOAD=0`
turns the preloading off.

The workers' Arrow memory pool defaults to the system allocator (`ARROW_DEFAULT_MEMORY_POOL=system`, unless
the environment already names one). pyarrow's default, mimalloc, reserves its arena with `MADV_HUGEPAGE`: on
a kernel whose transparent huge pages are `madvise`, a worker's first large batch then faults in 2 MiB pages the
kernel must find, compact and zero (~1 s more kernel time over a 1M-record batch's workers), and its resident
memory kept growing batch after batch (4 workers: 1.4 → 2.9 GB over 12 batches, against 1.3 → 1.7 GB with the
system pool; docs/benchmarks.md "Throughput").

The workers' glibc malloc keeps freed memory for the next task (`keep_freed_memory`): with glibc's defaults,
allocations above a threshold that adapts upwards (the Arrow buffers of a task: fetched values, decoded columns,
Parquet pages) are mapped fresh and unmapped when freed, and the heap's top is given back above twice that
threshold, so every task faulted much of its working set in again. Fixed thresholds (map above 32 MiB, give back
above 128 MiB), measured (docs/benchmarks.md, "Throughput"): a write-task loop in one process, per three 167,000-
record tasks, 35,000–71,000 page faults → under 6,000 and 0.14–0.28 → 0.02–0.08 s of kernel time, peak resident
memory the same (515 MB) and 64 MB more kept between tasks; Spark's four workers per 1M-record pass, 100,000–
150,000 faults → 1,000–33,000 and ~20 % less CPU, 1.5–1.7 GB resident either way. A user's own glibc settings
(`GLIBC_TUNABLES`, `MALLOC_*_` variables) win.
"""
from __future__ import annotations

import ctypes
import importlib
import os
import sys

from handoff_spark import switches

#: What every Handoff write task imports, heaviest first. gRPC-based clients (BigQuery's) are left out on
#: purpose: gRPC's runtime is not fork-safe once initialised, so BigQuery workers import it after the fork.
PRELOAD_COMMON = (
    "pyarrow",
    "pyarrow.compute",
    "pyarrow.json",
    "pyarrow.parquet",
    "confluent_kafka",
    "pydantic",
    "handoff_spark.config",
    "handoff_spark.decode.records",
    "handoff_spark.kafka.source",
)
#: What each sink's write task imports besides (`SINK_ENV` names the handoff's sink). A BigQuery worker never
#: imports PyIceberg or SQLAlchemy (~1.1 s of CPU per daemon; docs/test-suite.md, "Who used the CPU").
PRELOAD_BY_SINK = {
    "iceberg": ("sqlalchemy", "pyiceberg.catalog.sql", "pyiceberg.io.pyarrow", "pyiceberg.table",
                "handoff_spark.iceberg.sink"),
    "bigquery": ("handoff_spark.bigquery.sink",),
}
#: The daemon's environment variable naming the handoff's sink (`switches.WORKER_SINK`): `driver.app.build_session`
#: sets it through `spark.executorEnv.*`, which PySpark hands to the daemon in local mode and Kubernetes puts in the
#: executors.
SINK_ENV = switches.WORKER_SINK.name
#: Everything, for a daemon that does not know its sink (a Spark started by someone else).
PRELOAD = PRELOAD_COMMON + tuple(m for mods in PRELOAD_BY_SINK.values() for m in mods)


def preload_for(sink: str | None) -> tuple[str, ...]:
    """The modules to import for a handoff whose sink is `sink` (None or an unknown one: every sink's)."""
    return PRELOAD_COMMON + PRELOAD_BY_SINK[sink] if sink in PRELOAD_BY_SINK else PRELOAD


#: pyarrow's pool for the workers (see the module docstring); a user's own `ARROW_DEFAULT_MEMORY_POOL` wins.
ARROW_POOL = "system"


#: glibc `mallopt` parameters and the workers' values (see the module docstring).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
TRIM_THRESHOLD, MMAP_THRESHOLD = 128 << 20, 32 << 20


#: Whether this daemon set them (`main`); a worker forked from it sees it as `sys.modules["__main__"]`'s.
freed_memory_kept = False


def keep_freed_memory() -> bool:
    """Fixed malloc thresholds for this process and the workers it forks; False where glibc's are not ours to set
    (another C library, or the user's own settings in the environment)."""
    if "GLIBC_TUNABLES" in os.environ or any(k.startswith("MALLOC_") and k.endswith("_") for k in os.environ):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def drop_archives_without_python() -> list[str]:
    """Take off `sys.path` (and out of the import system's finder cache) every zip archive on it that holds no
    Python module (`python_path`); returns them. Workers forked from this daemon inherit the shorter path, so a
    fresh worker's `importlib.invalidate_caches()` on its first task no longer reads Spark's core jar again (60-150
    ms of CPU here, in every worker a (re)started driver or a new executor forks)."""
    from handoff_spark.startup.python_path import without_python

    dropped = without_python(sys.path)
    for entry in dropped:
        while entry in sys.path:
            sys.path.remove(entry)
        sys.path_importer_cache.pop(entry, None)
    return dropped


def preload(modules: tuple[str, ...] = PRELOAD) -> list[str]:
    """Import `modules`; returns the ones that loaded."""
    loaded = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - never break the daemon: the worker will import (and fail) itself
            continue
        loaded.append(name)
    return loaded


def main() -> None:
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", ARROW_POOL)  # before pyarrow is imported
    global freed_memory_kept
    freed_memory_kept = keep_freed_memory()  # before the imports allocate: every worker forked from here inherits it
    drop_archives_without_python()  # before the imports probe them
    if switches.WORKER_PRELOAD():
        preload(preload_for(switches.WORKER_SINK()))
    import gc

    from handoff_spark.pyspark_private import daemon_manager

    manager = daemon_manager()

    # Objects imported above live as long as the daemon: move them out of the collector's view so the
    # `gc.collect()` PySpark runs after each task does not touch (and un-share) their pages in every worker.
    gc.freeze()
    manager()


if __name__ == "__main__":
    main()
