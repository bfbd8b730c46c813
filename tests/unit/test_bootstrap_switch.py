"""When the driver runs its bootstrap batch (handoff_spark.bootstrap.off_reason): pure, no Kafka needed."""
from __future__ import annotations

import pytest

from handoff_spark import bootstrap
from handoff_spark.config import AppConfig


def _cfg(**overrides):
    doc = {"handoffId": "ns/h", "source": {"bootstrapServers": "localhost:9092", "topics": ["t"]},
           "sink": {"kind": "iceberg", "table": "ns.t"}, "checkpointLocation": "/tmp/x",
           "schema": {"onIncompatible": "halt"}, **overrides}
    return AppConfig.model_validate(doc)


def test_on_by_default_for_the_iceberg_sink(monkeypatch):
    monkeypatch.delenv(bootstrap.ENV, raising=False)
    assert bootstrap.off_reason(_cfg(), None) is None


@pytest.mark.parametrize("value", ["0", "off", "false", "NO"])
def test_the_environment_turns_it_off(monkeypatch, value):
    monkeypatch.setenv(bootstrap.ENV, value)
    assert bootstrap.off_reason(_cfg(), None) == f"{bootstrap.ENV}={value}"


def test_the_app_config_turns_it_off_and_other_paths_never_use_it(monkeypatch):
    monkeypatch.delenv(bootstrap.ENV, raising=False)
    assert bootstrap.off_reason(_cfg(bootstrapBatch=False), None) == "bootstrapBatch is false"
    assert bootstrap.off_reason(_cfg(), "noop") == "the sink is overridden (noop)"
    bq = _cfg(sink={"kind": "bigquery", "project": "p", "dataset": "d", "table": "t"})
    assert bootstrap.off_reason(bq, None) == "the bigquery sink commits through Spark only"
