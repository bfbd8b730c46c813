"""What the operator's `handoff` command runs of the data plane in its own process, the public entry points beside
`python -m handoff_spark` (`__main__`, which `handoff run` execs into):

- `own_temp_dir`: `handoff run`'s directory for the rendered app config, named by its pid like the driver's own
  (`driver.temp_dirs`), so the next run removes those a killed one left;
- `ledger_show` and `accept_kafka`: `handoff ledger show / accept-kafka`. `show` reads either sink's ledger (one
  `Commit` type); `accept-kafka` records, after a topic was deleted and recreated on purpose (or the cluster
  replaced), an `epoch` marker with the new cluster/topic ids, whose partitions start at `startingOffsets` of the
  new topic: an Iceberg snapshot without data, or a BigQuery ledger-index row (the sink's `record_epoch`). Until
  then the driver refuses to start (`resume.KafkaIdentityError`), so nothing is silently re-read or skipped.

Why here and not in `ledger/`: `ledger/` is the shared record and the reading face; recording a marker after
asking Kafka for its identity is a command that needs the sink's ledger writer (`sink.registry`) and the Kafka
clients.
"""
from __future__ import annotations

import json
from typing import Any

from handoff_spark.config import AppConfig
from handoff_spark.driver.temp_dirs import own_temp_dir
from handoff_spark.ledger import entries, format_entries

__all__ = ["own_temp_dir", "ledger_show", "accept_kafka"]


def ledger_show(cfg: AppConfig, output: str, limit: int | None) -> str:
    """`handoff ledger show`: the handoff's ledger entries, newest first, as JSON (`output` "json") or text."""
    rows = entries(cfg, limit)
    return json.dumps(rows, indent=2) if output == "json" else format_entries(rows)


def accept_kafka(cfg: AppConfig) -> dict[str, Any]:
    """Record an epoch marker: the current Kafka identity, and for each topic whose id (or cluster) changed, its
    partitions starting at `startingOffsets`. Returns what was recorded (`entry`: the snapshot or ledger row);
    nothing when nothing changed."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    from handoff_spark.kafka.identity import admin_client, kafka_identity
    from handoff_spark.sink import registry

    backend = registry.get(cfg.sink.kind)
    admin = admin_client(cfg)
    cluster, topic_ids = kafka_identity(cfg, admin)
    old_cluster, old_topics = backend.ledger_identity(cfg)
    changed = [t for t in cfg.source.topics
               if (old_cluster and cluster and old_cluster != cluster)
               or (old_topics.get(t) and topic_ids.get(t) and old_topics[t] != topic_ids[t])]
    if not changed:
        return {"recorded": False, "topics": []}
    metadata = admin.list_topics(timeout=30)
    spec = OffsetSpec.earliest() if cfg.source.starting_offsets == "earliest" else OffsetSpec.latest()
    tps = [TopicPartition(t, p) for t in changed for p in sorted(metadata.topics[t].partitions)]
    futures = admin.list_offsets({tp: spec for tp in tps}, isolation_level=IsolationLevel.READ_COMMITTED,
                                 request_timeout=30)
    ranges: dict[str, dict[str, list[int]]] = {}
    for tp, fut in futures.items():
        off = fut.result().offset
        ranges.setdefault(tp.topic, {})[str(tp.partition)] = [off, off]
    reason = (f"Kafka identity accepted: cluster {old_cluster} → {cluster}, topics "
              + ", ".join(f"{t} {old_topics.get(t)} → {topic_ids.get(t)}" for t in changed)
              + f"; new partitions start at startingOffsets={cfg.source.starting_offsets}")
    entry = backend.record_epoch(cfg, ranges, reason, {"cluster": cluster, "topics": topic_ids})
    return {"recorded": True, "entry": entry, "topics": changed, "offsets": ranges, "reason": reason}
