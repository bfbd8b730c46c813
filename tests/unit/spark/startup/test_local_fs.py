"""Hadoop's `file:` system without a `chmod` process per file (`startup.local_fs`): the jar builds from
spark_app/jvm/ (once per set of sources, byte for byte the same), a driver names its class when Spark's jars hold it,
and a driver session's checkpoint files and directories get their permissions without the JVM running `chmod`, where
Hadoop's own local file system runs one for each (a `chmod` on the JVM's PATH that records its calls tells)."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from handoff_spark.startup import jvm_cds, local_fs

REPO = Path(__file__).resolve().parents[4]


def test_the_jar_builds_from_the_sources_once_and_the_same_every_time(tmp_path: Path):
    jars = tmp_path / "jars"
    jars.mkdir()
    for jar in jvm_cds.class_path_jars(jvm_cds.spark_jars_dir()):
        if jar.name.startswith("hadoop-client-api"):
            (jars / jar.name).symlink_to(jar)
    built = local_fs.build(jars)
    assert built == jars / local_fs.JAR_NAME
    with zipfile.ZipFile(built) as z:
        assert {"io/handoff/fs/NioLocalFileSystem.class", "io/handoff/fs/NioRawLocalFileSystem.class"} <= set(
            z.namelist())
    first, mtime = built.read_bytes(), built.stat().st_mtime_ns
    assert local_fs.build(jars).stat().st_mtime_ns == mtime  # the same sources: not built again
    built.unlink()
    assert local_fs.build(jars).read_bytes() == first  # rebuilt: the same bytes (the class-data archive's check)


def test_without_javac_the_build_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    done = subprocess.run([sys.executable, "-m", "handoff_spark.startup.local_fs", "build", str(tmp_path)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO / "spark_app")})
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "handoff local_fs: javac not found: install a JDK 17 or newer (Debian: default-jdk-headless), or set "
        "JAVA_HOME to one"]


def test_a_driver_names_the_class_only_when_its_jar_is_there_and_the_users_choice_wins(tmp_path: Path):
    assert local_fs.conf({"a": "b"}, tmp_path) == {"a": "b"}
    (tmp_path / local_fs.JAR_NAME).write_bytes(b"")
    assert local_fs.conf({}, tmp_path) == {local_fs.FS_IMPL_KEY: local_fs.FS_CLASS}
    mine = {local_fs.FS_IMPL_KEY: "org.apache.hadoop.fs.RawLocalFileSystem"}
    assert local_fs.conf(mine, tmp_path) == mine
    assert local_fs.conf({}, None) == {}


def test_the_venvs_spark_has_the_jar():
    """`make venv` built it into pyspark's jars, so every driver this machine starts uses it."""
    assert (jvm_cds.spark_jars_dir() / local_fs.JAR_NAME).is_file()


DRIVER = textwrap.dedent("""
    import json, sys
    from handoff_spark.config import AppConfig
    from handoff_spark.driver.app import build_session

    ckpt = sys.argv[1]
    cfg = AppConfig.model_validate({
        "handoffId": "ns/h", "source": {"bootstrapServers": "127.0.0.1:1", "topics": ["t"]},
        "sink": {"kind": "iceberg", "table": "db.t"}, "checkpointLocation": ckpt, "deadLetterTopic": "dlq",
        "sparkConf": {"spark.master": "local[1]", **json.loads(sys.argv[2])}})
    spark = build_session(cfg)
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), conf)
    root = jvm.org.apache.hadoop.fs.Path(ckpt + "/offsets")
    fs.mkdirs(root)
    out = fs.create(jvm.org.apache.hadoop.fs.Path(ckpt + "/offsets/0"), True)
    out.write(bytearray(b"v1"))
    out.close()
    print(fs.getRawFileSystem().getClass().getName())
    spark.stop()
""")


def run_driver(tmp_path: Path, name: str, conf: dict[str, str]) -> tuple[str, list[str], Path]:
    """A driver's session (`build_session`) writing a checkpoint directory and file, with a `chmod` first on the
    PATH its JVM inherits that records each call and then does it. The raw file system's class, the calls, the
    checkpoint."""
    import json

    bin_dir, calls, ckpt = tmp_path / f"{name}-bin", tmp_path / f"{name}-chmod-calls", tmp_path / f"{name}-ckpt"
    bin_dir.mkdir()
    chmod = bin_dir / "chmod"
    chmod.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec /bin/chmod "$@"\n')
    chmod.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join([str(REPO / "spark_app"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", DRIVER, str(ckpt), json.dumps(conf)], capture_output=True,
                          text=True, env=env, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    recorded = calls.read_text().splitlines() if calls.exists() else []
    return done.stdout.strip().splitlines()[-1], recorded, ckpt


def test_a_drivers_checkpoint_files_get_their_permissions_without_a_chmod_process(tmp_path: Path):
    raw, calls, ckpt = run_driver(tmp_path, "handoff", {})
    assert raw == "io.handoff.fs.NioRawLocalFileSystem"
    assert calls == []
    assert stat.S_IMODE((ckpt / "offsets").stat().st_mode) == 0o755
    assert stat.S_IMODE((ckpt / "offsets" / "0").stat().st_mode) == 0o644
    assert (ckpt / "offsets" / "0").read_bytes() == b"v1"
    # Hadoop's own local file system, for contrast: the same writes run chmod, once per file and directory.
    raw, calls, ckpt = run_driver(tmp_path, "hadoop", {local_fs.FS_IMPL_KEY: "org.apache.hadoop.fs.LocalFileSystem"})
    assert raw == "org.apache.hadoop.fs.RawLocalFileSystem"
    assert any(c.startswith("0755 ") and c.endswith("/offsets") for c in calls), calls
    assert any(c.startswith("0644 ") and c.endswith("/offsets/0") for c in calls), calls
