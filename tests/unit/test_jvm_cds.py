"""The CDS archive reaches the JVM options only when it exists, after the user's own options."""
from __future__ import annotations

from pathlib import Path

import pytest

from handoff_spark import jvm_cds


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
    assert jvm_cds.apply({"a": "b"}) == {"a": "b"}
