"""driver.resume.topics_problem against real Kafka and a real Iceberg ledger: what a running driver checks before it
switches its query to other topics (spec.source.topics changed in place, driver.query_config). A topic Kafka lacks
and one whose id is not the one the table's ledger recorded are refused in one line naming the fix; topics Kafka has
under the ledger's ids, or new to the ledger, pass. The change end to end: tests/e2e/test_operator_transform_change.py."""
from __future__ import annotations

from handoff_spark import checkpoint as ckpt
from handoff_spark.driver.resume import topics_problem
from handoff_spark.iceberg.sink import commit_batch, prepare
from handoff_spark.iceberg.stream import IcebergStreamWriter
from handoff_spark.kafka.identity import kafka_identity
from handoff_spark.sink import registry

from sink_support import app_config, raw_batch, record, write_offsets


def _with_topics(cfg, topics):
    return cfg.model_copy(update={"source": cfg.source.model_copy(update={"topics": topics})})


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

    assert topics_problem(_with_topics(cfg, [read, added]), backend) is None  # new to the ledger: passes
    assert topics_problem(_with_topics(cfg, [added]), backend) is None       # one removed: passes

    problem = topics_problem(_with_topics(cfg, [read, "topics-change-never-created"]), backend)
    assert problem == ("SourceInvalid: spec.source.topics: Kafka has no topic 'topics-change-never-created'; "
                       "create it, or remove it from spec.source.topics")
    assert "topics-change-never-created" not in kafka_identity(cfg)[1]  # asking did not create it

    kafka.recreate_topic(read, partitions=2)
    problem = topics_problem(_with_topics(cfg, [read, added]), backend)
    assert problem is not None and problem.startswith(
        f"SourceInvalid: spec.source.topics: topic '{read}' has id "), problem
    assert f"the ledger's offsets belong to topic id {ids[read]}" in problem
    assert problem.endswith("run `handoff ledger accept-kafka -f <manifest>`, which records its new id and starts "
                            "it at spec.source.startingOffsets"), problem
