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
"""
from __future__ import annotations

import importlib
import os

#: What a Handoff write task imports, heaviest first. gRPC-based clients (BigQuery) are left out on
#: purpose: gRPC's runtime is not fork-safe once initialised, so BigQuery workers import it after the fork.
PRELOAD = (
    "pyarrow",
    "pyarrow.compute",
    "pyarrow.json",
    "pyarrow.parquet",
    "sqlalchemy",
    "pyiceberg.catalog.sql",
    "pyiceberg.io.pyarrow",
    "pyiceberg.table",
    "confluent_kafka",
    "pydantic",
    "handoff_spark.config",
    "handoff_spark.decode",
    "handoff_spark.kafka_source",
    "handoff_spark.iceberg.sink",
)

#: pyarrow's pool for the workers (see the module docstring); a user's own `ARROW_DEFAULT_MEMORY_POOL` wins.
ARROW_POOL = "system"


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
    if os.environ.get("HANDOFF_WORKER_PRELOAD", "1") != "0":
        preload()
    import gc

    from pyspark.daemon import manager

    # Objects imported above live as long as the daemon: move them out of the collector's view so the
    # `gc.collect()` PySpark runs after each task does not touch (and un-share) their pages in every worker.
    gc.freeze()
    manager()


if __name__ == "__main__":
    main()
