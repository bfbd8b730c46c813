"""The driver's and executors' JVMs get C1-only compilation (`app.jit_options`) after the user's own options,
unless the user chose a compilation mode or `HANDOFF_JVM_C1_ONLY=0`."""
from __future__ import annotations

import pytest

from handoff_spark.driver.app import C1_ONLY_OPTION, jit_options


@pytest.fixture(autouse=True)
def default_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HANDOFF_JVM_C1_ONLY", raising=False)


def test_c1_only_is_appended_to_the_driver_and_executor_options():
    conf = jit_options({"spark.driver.extraJavaOptions": "-Dx=1", "spark.master": "local[2]"})
    assert conf["spark.driver.extraJavaOptions"] == f"-Dx=1 {C1_ONLY_OPTION}"
    assert conf["spark.executor.extraJavaOptions"] == C1_ONLY_OPTION
    assert conf["spark.master"] == "local[2]"
    assert jit_options(conf) == conf  # never twice


def test_the_users_own_compilation_mode_wins():
    conf = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=4",
            "spark.executor.extraJavaOptions": "-XX:-TieredCompilation"}
    assert jit_options(conf) == conf


def test_the_environment_turns_it_off(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HANDOFF_JVM_C1_ONLY", "0")
    assert jit_options({"a": "b"}) == {"a": "b"}
