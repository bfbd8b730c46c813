"""driver.resume.source_problem against real Kafka and a real Iceberg ledger: what a running driver checks before it
switches its query to other topics or servers (spec.source.topics or bootstrapServers changed in place,
driver.query_config). A topic Kafka lacks, one whose id is not the one the table's ledger recorded, servers where no
broker answers and another cluster than the ledger's are refused in one line naming the field and the fix; topics
Kafka has under the ledger's ids, or new to the ledger, and another address of the same cluster pass. The change end
to end: tests/e2e/test_operator_transform_change.py."""
from __future__ import annotations

import socket

from handoff_spark import checkpoint as ckpt
from handoff_spark.driver.resume import source_problem
from handoff_spark.iceberg.sink import commit_batch, prepare
from handoff_spark.iceberg.stream import IcebergStreamWriter
from handoff_spark.kafka.identity import kafka_identity
from handoff_spark.sink import registry

from sink_support import app_config, raw_batch, record, write_offsets


def _with_topics(cfg, topics):
    return cfg.model_copy(update={"source": cfg.source.model_copy(update={"topics": topics})})


def _with_servers(cfg, servers):
    return cfg.model_copy(update={"source": cfg.source.model_copy(update={"bootstrap_servers": servers})})


def _ledger_from(cfg, tmp_path, topic, cluster, ids):
    """The table's ledger holds one batch of `topic`, recorded as read from Kafka cluster `cluster` (topic ids
    `ids`)."""
    prepare(cfg)
    cp = tmp_path / "checkpoint"
    write_offsets(cp, 0, {topic: {"0": 3}}, initial={topic: {"0": 0}})
    ckpt.write_kafka_identity(str(cp), {"cluster": cluster, "topics": ids})
    commit_batch(cfg, [IcebergStreamWriter(cfg.to_json()).write(iter([raw_batch(topic, 0, 0, [record(i)
                                                                                           for i in range(3)])]))], 0)


def test_a_missing_or_recreated_topic_is_refused_and_known_or_new_ones_pass(kafka, tmp_path):
    read, added = "topics-change-read", "topics-change-added"
    kafka.create_topic(read, partitions=2)
    kafka.create_topic(added, partitions=1)
    cfg = app_config(tmp_path, kafka.bootstrap, read)
    prepare(cfg)
    backend = registry.get("iceberg")
    cluster, ids = kafka_identity(cfg)
    cp = tmp_path / "checkpoint"
    write_offsets(cp, 0, {read: {"0": 3, "1": 0}}, initial={read: {"0": 0, "1": 0}})
    ckpt.write_kafka_identity(str(cp), {"cluster": cluster, "topics": ids})
    commit_batch(cfg, [IcebergStreamWriter(cfg.to_json()).write(iter([raw_batch(read, 0, 0, [record(i)
                                                                                           for i in range(3)])]))], 0)
    assert backend.ledger_identity(cfg) == (cluster, ids)

    assert source_problem(_with_topics(cfg, [read, added]), backend) is None  # new to the ledger: passes
    assert source_problem(_with_topics(cfg, [added]), backend) is None       # one removed: passes

    problem = source_problem(_with_topics(cfg, [read, "topics-change-never-created"]), backend)
    assert problem == ("SourceInvalid: spec.source.topics: Kafka has no topic 'topics-change-never-created'; "
                       "create it, or remove it from spec.source.topics")
    assert "topics-change-never-created" not in kafka_identity(cfg)[1]  # asking did not create it

    kafka.recreate_topic(read, partitions=2)
    problem = source_problem(_with_topics(cfg, [read, added]), backend)
    assert problem is not None and problem.startswith(
        f"SourceInvalid: spec.source.topics: topic '{read}' has id "), problem
    assert f"the ledger's offsets belong to topic id {ids[read]}" in problem
    assert problem.endswith("run `handoff ledger accept-kafka -f <manifest>`, which records its new id and starts "
                            "it at spec.source.startingOffsets"), problem


def test_other_servers_pass_when_they_are_the_ledgers_cluster_and_are_refused_when_silent_or_another(kafka, tmp_path):
    topic = "servers-change"
    kafka.create_topic(topic, partitions=1)
    cfg = app_config(tmp_path, kafka.bootstrap, topic)
    cluster, ids = kafka_identity(cfg)
    _ledger_from(cfg, tmp_path, topic, cluster, ids)
    backend = registry.get("iceberg")
    assert backend.ledger_identity(cfg) == (cluster, ids)

    host, port = kafka.bootstrap.rsplit(":", 1)
    other_address = f"{'localhost' if host == '127.0.0.1' else '127.0.0.1'}:{port}"  # the same broker
    assert source_problem(_with_servers(cfg, other_address), backend, servers_changed=True) is None

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        silent = f"127.0.0.1:{s.getsockname()[1]}"
    problem = source_problem(_with_servers(cfg, silent), backend, servers_changed=True)
    assert problem is not None and problem.startswith(
        f"SourceInvalid: spec.source.bootstrapServers: no Kafka broker answered at {silent} ("), problem
    assert problem.endswith("); correct it, or put back the servers before"), problem


def test_servers_of_another_cluster_than_the_ledgers_are_refused(kafka, tmp_path):
    """The ledger recorded another cluster id (as a table written from another Kafka cluster has): the servers the
    spec now names are refused, naming both ids and the fix."""
    topic = "servers-other-cluster"
    kafka.create_topic(topic, partitions=1)
    cfg = app_config(tmp_path, kafka.bootstrap, topic)
    cluster, ids = kafka_identity(cfg)
    _ledger_from(cfg, tmp_path, topic, "another-cluster-id", ids)
    problem = source_problem(cfg, registry.get("iceberg"), servers_changed=True)
    assert problem == (f"SourceInvalid: spec.source.bootstrapServers: the Kafka cluster id is {cluster}, the table's "
                       "ledger was written from cluster another-cluster-id. Fix: if these are the wrong servers, put "
                       "back the ones before; if the cluster or topic was replaced on purpose, run `handoff ledger "
                       "accept-kafka -f <manifest>`, which records the new ids and starts them at "
                       "spec.source.startingOffsets"), problem
