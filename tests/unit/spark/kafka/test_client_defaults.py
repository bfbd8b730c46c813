"""Every Kafka client of the data plane starts from Handoff's librdkafka defaults (`kafka.client_defaults`), under
the client's own settings and the user's `spec.source.properties`."""
from __future__ import annotations

from handoff_spark.config import AppConfig
from handoff_spark.kafka.client_defaults import CLIENT_DEFAULTS, with_defaults
from handoff_spark.kafka.offsets import group_client_conf
from handoff_spark.kafka.source import SourceOptions, reader_conf, source_options
from handoff_spark.sink.dead_letters import producer_conf

KEY = "reconnect.backoff.ms"


def _cfg(properties: dict[str, str]) -> AppConfig:
    return AppConfig.model_validate({
        "handoffId": "ns/h", "source": {"bootstrapServers": "127.0.0.1:1", "topics": ["t"],
                                        "properties": properties},
        "sink": {"kind": "iceberg", "table": "db.t"}, "checkpointLocation": "/tmp/ck", "deadLetterTopic": "dlq"})


def test_the_defaults_lower_librdkafkas_reconnect_backoff_and_a_clients_own_setting_wins() -> None:
    assert CLIENT_DEFAULTS == {KEY: "10"}
    assert with_defaults({"bootstrap.servers": "b"}) == {KEY: "10", "bootstrap.servers": "b"}
    assert with_defaults({KEY: "250"})[KEY] == "250"


def test_range_readers_group_commits_and_dead_letter_producers_start_from_them() -> None:
    for properties, expected in (({}, "10"), ({KEY: "250"}, "250")):  # the user's property wins
        cfg = _cfg(properties)
        opts = SourceOptions.parse(source_options(cfg, None))
        assert reader_conf(opts)[KEY] == expected
        assert producer_conf(cfg)[KEY] == expected
        group = group_client_conf(cfg.source.bootstrap_servers, "g", dict(cfg.source.properties))
        assert group[KEY] == expected and group["group.id"] == "g" and group["enable.auto.commit"] is False
