"""Hadoop's local file system without a `chmod` process for every file: Spark's checkpoint on a local path.

Why: Hadoop's `RawLocalFileSystem` sets the permission of every file it creates and every directory it makes, and
without Hadoop's native library (pyspark ships none) it does so by running `chmod` (`Shell.execCommand`): a process
forked from the JVM for each file of a checkpoint on a `file:` path, which is a driver pod's default (its
PersistentVolumeClaim), `make demo`'s and a local run's. Per batch that is the offset and commit logs and each
state store's changelog; per query start, the checkpoint's directories and metadata too. Measured: 46 `chmod`
processes (each after ~10 failed `execve`s along the PATH) for a 50,000-record dedupe bench's warm-up and one pass,
and a 300,000-record dedupe pass 10-13 % faster without them (docs/benchmarks.md, "Checkpoint files without a chmod
process").

`io.handoff.fs.NioLocalFileSystem` (spark_app/jvm/) is Hadoop's `LocalFileSystem` over a `RawLocalFileSystem` whose
`setPermission` is java.nio's `Files.setPosixFilePermissions`: the same chmod(2), made by the JVM itself. The driver
names it as `fs.file.impl` (`conf`) when its jar is in Spark's jars directory, so that every JVM Spark starts (the
driver's, an executor pod's) loads it with Spark's own classes, on the class path in the order the class-data archive
recorded (`startup.jvm_cds`): `make venv` builds it into the venv's pyspark, the Dockerfile into the image's.

    python -m handoff_spark.startup.local_fs build [JARS_DIR]   # javac (a JDK 17+), idempotent

Runs as a plain script too (`python .../startup/local_fs.py build DIR`): the image builds the jar before its
class-data archive, in a layer that depends only on the JDK, the Spark jars and the Java sources.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path

#: The jar, in Spark's jars directory.
JAR_NAME = "handoff-localfs.jar"
#: Hadoop's key for the class behind `file:` URIs, as a Spark setting.
FS_IMPL_KEY = "spark.hadoop.fs.file.impl"
FS_CLASS = "io.handoff.fs.NioLocalFileSystem"
#: The Java sources (the repository's spark_app/jvm/).
SOURCES = Path(__file__).resolve().parents[2] / "jvm"


def sources(root: Path = SOURCES) -> list[Path]:
    return sorted(root.rglob("*.java"))


def source_digest(files: list[Path], root: Path = SOURCES) -> str:
    """What the jar was built from (its zip comment), so a build with the same sources is skipped."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.relative_to(root)}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def built_from(jar: Path) -> str | None:
    try:
        with zipfile.ZipFile(jar) as z:
            return z.comment.decode() or None
    except (OSError, zipfile.BadZipFile):
        return None


def build(jars_dir: Path, root: Path = SOURCES) -> Path:
    """Compile the sources against Spark's jars in `jars_dir` and write `JAR_NAME` there (unless a jar of the same
    sources is there already). Raises RuntimeError naming the missing tool or the compiler's error."""
    files = sources(root)
    if not files:
        raise RuntimeError(f"no Java sources under {root}")
    jar = jars_dir / JAR_NAME
    digest = source_digest(files, root)
    if built_from(jar) == digest:
        return jar
    javac = shutil.which("javac", path=_java_path())
    if javac is None:
        raise RuntimeError("javac not found: install a JDK 17 or newer (Debian: default-jdk-headless), or set "
                           "JAVA_HOME to one")
    with tempfile.TemporaryDirectory(prefix="handoff-localfs-") as tmp:
        done = subprocess.run([javac, "--release", "17", "-nowarn", "-cp", str(jars_dir / "*"), "-d", tmp,
                               *map(str, files)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"javac failed: {(done.stderr or done.stdout).strip()}")
        partial = jar.with_name(f".{JAR_NAME}.{os.getpid()}")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
            manifest = zipfile.ZipInfo("META-INF/MANIFEST.MF", date_time=(2020, 1, 1, 0, 0, 0))
            z.writestr(manifest, "Manifest-Version: 1.0\r\nCreated-By: handoff local_fs\r\n\r\n")
            for cls in sorted(Path(tmp).rglob("*.class")):  # fixed times: the same sources, the same bytes
                info = zipfile.ZipInfo(cls.relative_to(tmp).as_posix(), date_time=(2020, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, cls.read_bytes())
            z.comment = digest.encode()
        partial.chmod(0o644)
        os.replace(partial, jar)
    return jar


def _java_path() -> str:
    """PATH with JAVA_HOME's bin first, when it is set."""
    home = os.environ.get("JAVA_HOME")
    path = os.environ.get("PATH", os.defpath)
    return os.pathsep.join([str(Path(home) / "bin"), path]) if home else path


def conf(conf: Mapping[str, str], jars_dir: Path | None) -> dict[str, str]:
    """`conf` with `FS_IMPL_KEY` naming `FS_CLASS` when its jar is in `jars_dir` (Spark's jars directory; None: not
    known), unless the user named a `file:` implementation. Without the jar (a pyspark the project did not install),
    Hadoop's own, with its `chmod` processes."""
    out = dict(conf)
    if FS_IMPL_KEY not in out and jars_dir is not None and (jars_dir / JAR_NAME).is_file():
        out[FS_IMPL_KEY] = FS_CLASS
    return out


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "build" or len(argv) > 2:
        print("usage: python -m handoff_spark.startup.local_fs build [JARS_DIR]", file=sys.stderr)
        return 2
    if len(argv) == 2:
        jars_dir = Path(argv[1])
    else:  # the jars the driver looks in (`conf`): spark-submit's, SPARK_HOME's when set
        from handoff_spark.startup.jvm_cds import spark_jars_dir

        jars_dir = spark_jars_dir()
    try:
        print(build(jars_dir))
    except RuntimeError as exc:
        print(f"handoff local_fs: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
