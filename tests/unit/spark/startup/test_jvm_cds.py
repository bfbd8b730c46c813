"""The CDS archive reaches the JVM options only when it exists, after the user's own options: the one named by
HANDOFF_SPARK_CDS_ARCHIVE, else the machine's cache's; `off` turns it off."""
from __future__ import annotations

from pathlib import Path

import pytest

from handoff_spark.startup import jvm_cds


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(jvm_cds.ENV, raising=False)


def test_an_installed_archive_is_added_after_the_users_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    archive = tmp_path / "spark.jsa"
    archive.write_bytes(b"x")
    monkeypatch.setenv(jvm_cds.ENV, str(archive))
    conf = jvm_cds.apply({"spark.driver.extraJavaOptions": "-Dx=1"})
    assert conf["spark.driver.extraJavaOptions"] == f"-Dx=1 -XX:SharedArchiveFile={archive} -Xshare:auto"
    assert conf["spark.executor.extraJavaOptions"] == f"-XX:SharedArchiveFile={archive} -Xshare:auto"
    assert jvm_cds.apply(conf) == conf  # never twice


def test_a_missing_archive_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(jvm_cds.ENV, str(tmp_path / "absent.jsa"))
    assert jvm_cds.apply({"a": "b"}) == {"a": "b"}
    monkeypatch.delenv(jvm_cds.ENV)
    assert jvm_cds.apply({"a": "b"}) == {"a": "b"}  # and the cache has none yet


def test_the_machines_cached_archive_is_the_default_and_off_turns_it_off(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch):
    cached = jvm_cds.cache_path()
    assert cached.is_relative_to(tmp_path / "cache" / "handoff" / "spark-cds")
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"x")
    assert jvm_cds.apply({})["spark.driver.extraJavaOptions"] == f"-XX:SharedArchiveFile={cached} -Xshare:auto"
    monkeypatch.setenv(jvm_cds.ENV, "off")
    assert jvm_cds.apply({}) == {}


def test_the_cache_key_follows_the_spark_jars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "spark-core.jar").write_bytes(b"1")
    monkeypatch.setattr(jvm_cds, "spark_jars_dir", lambda: jars)
    before = jvm_cds.cache_key()
    assert jvm_cds.cache_key() == before
    (jars / "spark-core.jar").write_bytes(b"12")  # another Spark: another archive
    assert jvm_cds.cache_key() != before


def test_the_make_step_removes_other_installs_archives_but_the_recently_used(tmp_path: Path) -> None:
    """`python -m handoff_spark.startup.jvm_cds --if-missing` (make testbed-build) on a cache holding this install's
    archive and six others: the three most recently used others stay unless unused for 14 days, the rest go."""
    import os
    import subprocess
    import sys
    import time

    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "PYTHONPATH": str(Path(jvm_cds.__file__).parents[2])}
    current = Path(subprocess.run([sys.executable, "-c", "from handoff_spark.startup import jvm_cds; "
                                   "print(jvm_cds.cache_path())"], env=env, capture_output=True, text=True,
                                  check=True).stdout.strip())
    current.parent.mkdir(parents=True)
    current.write_bytes(b"this install's archive")  # --if-missing keeps it: no JVM runs here
    now = time.time()
    ages_days = {"a": 1, "b": 2, "c": 3, "d": 4, "old": 20, "older": 40}
    for name, days in ages_days.items():
        other = current.parent / f"{name}.jsa"
        other.write_bytes(b"x")
        os.utime(other, (now - days * 86400, now - days * 86400))
    out = subprocess.run([sys.executable, "-m", "handoff_spark.startup.jvm_cds", "--if-missing"], env=env,
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(current)
    assert sorted(p.name for p in current.parent.glob("*.jsa")) == sorted([current.name, "a.jsa", "b.jsa", "c.jsa"])
    assert current.read_bytes() == b"this install's archive"
    assert out.stderr.count("removed ") == 3, out.stderr


def test_pinned_jars_give_a_new_venv_at_the_same_path_the_same_archive(tmp_path: Path) -> None:
    """`make venv` runs `python -m handoff_spark.startup.jvm_cds --pin-jar-mtimes`: a venv made again at the same
    path (uv unpacks the jars anew, with new mtimes) keys the archive the last one built; a venv elsewhere does
    not (the JVM checks the jars' path too)."""
    import os
    import subprocess
    import sys

    def venv(where: Path, mtime: int) -> Path:
        jars = where / "jars"
        jars.mkdir(parents=True, exist_ok=True)
        for name in ("spark-core.jar", "scala-library.jar"):
            (jars / name).write_bytes(b"classes of " + name.encode())
            os.utime(jars / name, (mtime, mtime))
        (jars / "connect-repl").mkdir(exist_ok=True)  # pyspark's jars/ holds a folder too, not on the class path
        os.utime(jars / "connect-repl", (mtime, mtime))
        return where

    def key(spark_home: Path, *args: str) -> str:
        env = {**os.environ, "SPARK_HOME": str(spark_home), "PYTHONPATH": str(Path(jvm_cds.__file__).parents[2])}
        if args:
            subprocess.run([sys.executable, "-m", "handoff_spark.startup.jvm_cds", *args], env=env, check=True,
                           capture_output=True)
        return subprocess.run([sys.executable, "-c", "from handoff_spark.startup import jvm_cds; "
                               "print(jvm_cds.cache_key())"], env=env, capture_output=True, text=True,
                              check=True).stdout.strip()

    home = tmp_path / "clone" / "spark"
    first = key(venv(home, 1_800_000_000), "--pin-jar-mtimes")
    assert {int(j.stat().st_mtime) for j in (home / "jars").glob("*.jar")} == {jvm_cds.PINNED_JAR_MTIME}
    assert key(venv(home, 1_800_000_500)) != first          # unpacked anew: not the archive's jars
    assert key(home, "--pin-jar-mtimes") == first           # pinned again: the same archive
    elsewhere = tmp_path / "other-clone" / "spark"
    assert key(venv(elsewhere, 1_800_000_000), "--pin-jar-mtimes") != first
