"""A class-data-sharing (AppCDS) archive of Spark's classes, so a (re)started driver's JVM loads them mapped from
one file instead of parsing and verifying thousands of classes from Spark's jars again.

Why: a driver start is mostly class loading (Spark, Scala, Hadoop, Jackson …): measured on this project's 2-core
machine under load ~20, a local session start plus one tiny query took 31.6 s of JVM CPU without the archive and
16.7 s with it (docs/benchmarks.md, "Cold start"). Every restart (crash, upgrade, replay, rollback) pays it.

`python -m handoff_spark.jvm_cds PATH` writes the archive (Java 17's dynamic archive, `-XX:ArchiveClassesAtExit`,
from a local session that runs one query). It is only valid for the same JDK and the same Spark jars, so it is
made where it is used (an image build, or a machine's cache). `HANDOFF_SPARK_CDS_ARCHIVE=PATH` makes
`app.build_session` start the driver's and executors' JVMs with it; `-Xshare:auto` makes a stale or missing
archive a silent fallback to ordinary class loading, never a failed start.
"""
from __future__ import annotations

import os
import sys

ENV = "HANDOFF_SPARK_CDS_ARCHIVE"


def java_options(existing: str | None, archive: str) -> str:
    """`existing` JVM options with the archive's appended (the user's own options kept first)."""
    return " ".join(x for x in (existing, f"-XX:SharedArchiveFile={archive}", "-Xshare:auto") if x)


def apply(conf: dict[str, str]) -> dict[str, str]:
    """`conf` with the archive named by HANDOFF_SPARK_CDS_ARCHIVE (when that file exists) in the driver's and
    executors' JVM options; unchanged otherwise."""
    archive = os.environ.get(ENV)
    if not archive or not os.path.isfile(archive):
        return conf
    out = dict(conf)
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        if "SharedArchiveFile" not in out.get(key, ""):
            out[key] = java_options(out.get(key), archive)
    return out


def create(path: str) -> None:
    """Run a local session and one query with `-XX:ArchiveClassesAtExit=path`; the JVM writes the archive
    when it exits (at the end of this process)."""
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[1]").appName("handoff-cds")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.driver.extraJavaOptions", f"-XX:ArchiveClassesAtExit={path}").getOrCreate())
    spark.range(1000).selectExpr("sum(id)").collect()
    spark.stop()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m handoff_spark.jvm_cds ARCHIVE_PATH")
    create(sys.argv[1])
