"""The driver's and executors' JVMs start processes with vfork (`app.launch_options`) after the user's own options,
only on Java 17–24, unless the user chose a launch mechanism or `HANDOFF_JVM_VFORK=0`."""
from __future__ import annotations

from pathlib import Path

import pytest

from handoff_spark.app import VFORK_OPTION, java_feature_version, launch_options


@pytest.fixture(autouse=True)
def default_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HANDOFF_JVM_VFORK", raising=False)


def test_vfork_is_appended_to_the_driver_and_executor_options():
    conf = launch_options({"spark.driver.extraJavaOptions": "-Dx=1", "spark.master": "local[2]"}, java_version=17)
    assert conf["spark.driver.extraJavaOptions"] == f"-Dx=1 {VFORK_OPTION}"
    assert conf["spark.executor.extraJavaOptions"] == VFORK_OPTION
    assert conf["spark.master"] == "local[2]"
    assert launch_options(conf, java_version=17) == conf  # never twice


def test_the_users_own_launch_mechanism_wins():
    conf = {"spark.driver.extraJavaOptions": "-Djdk.lang.Process.launchMechanism=FORK",
            "spark.executor.extraJavaOptions": "-Djdk.lang.Process.launchMechanism=POSIX_SPAWN"}
    assert launch_options(conf, java_version=17) == conf


def test_the_environment_turns_it_off(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HANDOFF_JVM_VFORK", "0")
    assert launch_options({"a": "b"}, java_version=17) == {"a": "b"}


@pytest.mark.parametrize("version", [None, 11, 25, 26])
def test_only_on_java_versions_that_have_it(version: int | None):
    # Java 25 deprecates VFORK (a warning on stderr), later versions removed it; an unknown java gets nothing.
    assert launch_options({"a": "b"}, java_version=version if version else -1) == {"a": "b"}


@pytest.mark.parametrize("text, version", [('JAVA_VERSION="17.0.15"\n', 17), ('JAVA_VERSION="1.8.0_402"\n', 8),
                                           ('IMPLEMENTOR="x"\nJAVA_VERSION="25"\n', 25), ("nothing\n", None)])
def test_java_feature_version_reads_the_release_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str,
                                                     version: int | None):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "java").write_text("")
    (tmp_path / "release").write_text(text)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    assert java_feature_version() == version


def test_java_feature_version_of_a_java_home_without_a_release_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    assert java_feature_version() is None
