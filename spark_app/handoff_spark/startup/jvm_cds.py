"""A class-data-sharing (AppCDS) archive of Spark's classes, so a (re)started driver's JVM loads them mapped from
one file instead of parsing and verifying thousands of classes from Spark's jars again.

Why: a driver start is mostly class loading (Spark, Scala, Hadoop, Jackson …): measured on this project's 2-core
machine under load ~20, a local session start plus one tiny query took 31.6 s of JVM CPU without the archive and
16.7 s with it (docs/benchmarks.md, "Cold start"). Every restart (crash, upgrade, replay, rollback) pays it.

An archive is only valid for the JDK and the Spark jars it was made from, so it is made where it is used:
- an image builds one at build time and names it with `HANDOFF_SPARK_CDS_ARCHIVE=PATH` (the project's Dockerfile
  does: `/opt/handoff/spark-cds.jsa`, used by the driver pods and, through `<archive>.classpath`, the executor pods);
- a machine without that variable uses its own cache's archive, `${XDG_CACHE_HOME:-~/.cache}/handoff/spark-cds/
  <key>.jsa` (key: the JDK and the Spark jars), once `python -m handoff_spark.startup.jvm_cds` has built it there;
- `HANDOFF_SPARK_CDS_ARCHIVE=off` (or empty) turns it off.
`python -m handoff_spark.startup.jvm_cds [PATH]` writes an archive (Java 17's dynamic archive, `-XX:ArchiveClassesAtExit`)
from a local session that runs a batch query and a one-batch streaming query through a Python data source and a
Python sink, i.e. the classes a Handoff driver loads. `app.build_session` starts the driver's and executors'
JVMs with the archive; `-Xshare:auto` makes a stale, foreign or missing archive a silent fallback to ordinary
class loading, never a failed start.

This file runs as a plain script too (`python jvm_cds.py PATH`), so an image build can make its archive before
the package is installed, in a layer that depends only on the JDK, the Spark jars and this file with the three
beside it that it imports (the package's `__init__.py`, `pyspark_private.py`, the fence of the PySpark private
APIs it uses, and `private_api.py`; `switches` only when a driver asks for its archive): as a script it imports its
package from the directory above it.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from pathlib import Path

if not __package__:  # a plain script (`python .../handoff_spark/startup/jvm_cds.py`): spark_app/ goes on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def __getattr__(name: str) -> str:
    """`ENV`, the switch's variable name, read from `switches` only when asked: the image build runs this file as a
    script with only the modules `create` needs beside it (Dockerfile), so its layer is rebuilt only when they change."""
    if name == "ENV":
        from handoff_spark import switches

        return switches.SPARK_CDS_ARCHIVE.name
    raise AttributeError(name)


def java_options(existing: str | None, archive: str) -> str:
    """`existing` JVM options with the archive's appended (the user's own options kept first)."""
    return " ".join(x for x in (existing, f"-XX:SharedArchiveFile={archive}", "-Xshare:auto") if x)


def spark_jars_dir() -> Path:
    """The jars spark-submit puts on the JVM's class path (pyspark's own Spark, or SPARK_HOME's)."""
    from handoff_spark.pyspark_private import spark_home

    return Path(spark_home()) / "jars"


def class_path_jars(jars: Path) -> list[Path]:
    """The jar files of `jars`, as the class path's `jars/*` names them (pyspark's folder also holds a folder)."""
    return sorted(jars.glob("*.jar")) if jars.is_dir() else []


#: The mtime `make venv` gives Spark's jars (`pin_jar_mtimes`). Any constant would do.
PINNED_JAR_MTIME = 1_700_000_000


def pin_jar_mtimes(jars: Path | None = None) -> int:
    """Give the Spark jars one fixed mtime; returns how many changed.

    Why: the JVM uses an archive only with the jars it was made from, checked by path, size and mtime. Every
    fresh venv (uv unpacks pyspark anew) gave the jars new mtimes, so a new clone at the same path (a CI
    checkout) could not use the archive the last one made and built its own (~30 s of `make test`)."""
    jars = jars or spark_jars_dir()
    changed = 0
    for jar in class_path_jars(jars):
        if int(jar.stat().st_mtime) != PINNED_JAR_MTIME:
            os.utime(jar, (PINNED_JAR_MTIME, PINNED_JAR_MTIME))
            changed += 1
    return changed


def cache_key() -> str:
    """What an archive is made from: the java spark-submit runs and the Spark jars (their folder, names, sizes,
    mtimes: what the JVM checks before it uses an archive)."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java") or "java"
    h = hashlib.sha256(os.path.realpath(java).encode())
    jars = spark_jars_dir()
    h.update(f"{os.path.realpath(jars)};".encode())
    for jar in class_path_jars(jars):
        st = jar.stat()
        h.update(f"{jar.name}:{st.st_size}:{int(st.st_mtime)};".encode())
    return h.hexdigest()[:16]


def cache_path() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "handoff" / "spark-cds" / f"{cache_key()}.jsa"


def archive() -> str | None:
    """The archive a driver uses: HANDOFF_SPARK_CDS_ARCHIVE's when set (none when it is off or the file is
    missing), else this machine's cache's when it has been built."""
    from handoff_spark import switches

    named = switches.SPARK_CDS_ARCHIVE()
    if named is not None:
        return named if named and os.path.isfile(named) else None
    try:
        path = cache_path()
    except Exception:  # noqa: BLE001 - no pyspark, no home directory (an arbitrary uid): no archive, never a failed start
        return None
    return str(path) if path.is_file() else None


def apply(conf: dict[str, str]) -> dict[str, str]:
    """`conf` with the archive (see `archive`) in the driver's and executors' JVM options; unchanged without one."""
    found = archive()
    if found is None:
        return conf
    out = dict(conf)
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        if "SharedArchiveFile" not in out.get(key, ""):
            out[key] = java_options(out.get(key), found)
    return out


def create(path: str) -> None:
    """Run a local session under `-XX:ArchiveClassesAtExit=path`: one batch query and one AvailableNow streaming
    query from a Python streaming source into a Python streaming sink (the driver's code paths). The JVM writes
    the archive as it exits; this returns once it has."""
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import (DataSource, DataSourceStreamReader, DataSourceStreamWriter, InputPartition,
                                        WriterCommitMessage)

    from handoff_spark.pyspark_private import gateway_process, jvm

    class Reader(DataSourceStreamReader):
        def initialOffset(self) -> dict:
            return {"o": 0}

        def latestOffset(self) -> dict:
            return {"o": 1}

        def partitions(self, start: dict, end: dict) -> list:
            return [InputPartition(0)] if end["o"] > start["o"] else []

        def read(self, partition: InputPartition):  # type: ignore[no-untyped-def]
            yield (1,)

    class Writer(DataSourceStreamWriter):
        def write(self, iterator):  # type: ignore[no-untyped-def]
            for _ in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages: list, batchId: int) -> None:  # noqa: N803
            pass

    class Training(DataSource):
        @classmethod
        def name(cls) -> str:
            return "handoff-cds-training"

        def schema(self) -> str:
            return "id long"

        def streamReader(self, schema):  # type: ignore[no-untyped-def]  # noqa: N802
            return Reader()

        def streamWriter(self, schema, overwrite):  # type: ignore[no-untyped-def]  # noqa: N802
            return Writer()

    import tempfile

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the workers need this interpreter's pyspark
    spark = (SparkSession.builder.master("local[1]").appName("handoff-cds")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.driver.extraJavaOptions", f"-XX:ArchiveClassesAtExit={path}").getOrCreate())
    spark.range(1000).selectExpr("sum(id)").collect()
    spark.dataSource.register(Training)
    with tempfile.TemporaryDirectory(prefix="handoff-cds-") as ck:
        query = (spark.readStream.format("handoff-cds-training").load().writeStream.format("handoff-cds-training")
                 .option("checkpointLocation", ck).trigger(availableNow=True).start())
        query.awaitTermination(300)
    class_path = jvm(spark.sparkContext).java.lang.System.getProperty("java.class.path")
    classpath_file(Path(path)).write_text(class_path)
    process = gateway_process(spark.sparkContext)  # the JVM writes the archive as it exits: wait for that
    spark.stop()
    process.stdin.close()  # PySpark's JVM exits when its stdin closes
    process.wait(600)


def classpath_file(archive: Path) -> Path:
    """Where `create` records the class path the archive was made with (`<archive>.classpath`).

    Why: the JVM uses an archive only when its class path starts with that one, entry by entry. spark-submit's
    order (slf4j's jar first, then `jars/*` in directory order) is spark-submit's own; the image's executor
    entry point (docker/entrypoint.sh), which starts its JVM without spark-submit, reads this file to start
    its class path the same way."""
    return archive.with_name(archive.name + ".classpath")


def build(path: Path) -> None:
    """Write an archive at `path` atomically (made beside it, then renamed): a driver starting meanwhile sees the
    whole archive or none. The training run is a child process, because the JVM writes the archive at its exit."""
    import subprocess

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        subprocess.run([sys.executable, os.path.abspath(__file__), "--create", str(tmp)], check=True)
        if not tmp.is_file():
            raise SystemExit(f"the JVM wrote no archive at {tmp}")
        os.replace(classpath_file(tmp), classpath_file(path))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
        classpath_file(tmp).unlink(missing_ok=True)


#: Archives the cache keeps besides the current one, and how long an unused one stays (see `prune`).
KEEP_OTHERS = 3
KEEP_UNUSED_DAYS = 14


def prune(current: Path, keep_others: int = KEEP_OTHERS, unused_days: float = KEEP_UNUSED_DAYS) -> list[Path]:
    """Delete the cache's archives that belong to other JDKs or Spark installs, but the `keep_others` most
    recently used ones unless unused for `unused_days`. Returns what it deleted.

    Why: a CDS archive is valid only for the class path it was made from, so every venv at another path makes its
    own ~170 MB archive; a developer's cache grew to 3.7 GB. An archive deleted while a JVM has it mapped stays
    readable to that JVM; a driver started after finds none and loads classes as without the archive (`archive`),
    never a failed start."""
    used = []
    for other in current.parent.glob("*.jsa"):
        if other == current:
            continue
        try:
            st = other.stat()
        except FileNotFoundError:
            continue
        used.append((max(st.st_atime, st.st_mtime), other))
    used.sort(reverse=True)
    cutoff = time.time() - unused_days * 86400
    deleted = []
    for i, (when, other) in enumerate(used):
        if i >= keep_others or when < cutoff:
            other.unlink(missing_ok=True)
            classpath_file(other).unlink(missing_ok=True)
            deleted.append(other)
    return deleted


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--create":
        create(argv[1])
        return 0
    if argv == ["--pin-jar-mtimes"]:
        print(f"{pin_jar_mtimes()} Spark jars given the mtime {PINNED_JAR_MTIME}", file=sys.stderr)
        return 0
    if_missing = argv[:1] == ["--if-missing"]
    argv = argv[1:] if if_missing else argv
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        print("usage: python -m handoff_spark.startup.jvm_cds [--if-missing] [ARCHIVE_PATH]  (default: this machine's cache; "
              "--if-missing: keep an archive already there) | --pin-jar-mtimes", file=sys.stderr)
        return 2
    path = Path(argv[0]) if argv else cache_path()
    if not (if_missing and path.is_file()):
        build(path)
    if not argv:  # the machine's cache: the archives of other venvs go (`prune`); a named path's folder is the caller's
        for gone in prune(path):
            print(f"removed {gone} (another JDK or Spark install's archive, not among the {KEEP_OTHERS} most "
                  f"recently used or unused for {KEEP_UNUSED_DAYS} days)", file=sys.stderr)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
