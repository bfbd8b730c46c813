"""`handoff ledger ...`: read a handoff's ledger from its table, and record the markers a person decides on.

- `show`: the ledger, newest entry first (kind, snapshot, batch, rows, offset ranges, Kafka identity);
- `accept-kafka`: after a topic was deleted and recreated on purpose (or the cluster replaced), record an
  `epoch` marker with the new cluster/topic ids, whose partitions start at `startingOffsets` of the new topic.
  Until then the driver refuses to start (`resume.KafkaIdentityError`), so nothing is silently re-read or skipped.
`show` reads either sink's ledger (one `Commit` type); `accept-kafka` is Iceberg-only: BigQuery's ledger index
records no Kafka identity (docs/bigquery-exactly-once.md).
"""
from __future__ import annotations

import json
from typing import Any

from handoff_spark.iceberg import ledger
from handoff_spark.config import AppConfig, IcebergSink


def _table(cfg: AppConfig) -> Any:
    if not isinstance(cfg.sink, IcebergSink):
        raise SystemExit("handoff ledger accept-kafka: only Iceberg sinks record the Kafka cluster and topic ids "
                         "with their ledger; BigQuery's ledger index has none to accept")
    from handoff_spark.iceberg.sink import open_table

    return open_table(cfg, create=False)


def _commits(cfg: AppConfig) -> list[Any]:
    """The handoff's ledger entries (all queries), newest first: Iceberg snapshots or BigQuery's ledger index."""
    if isinstance(cfg.sink, IcebergSink):
        return ledger.list_commits(_table(cfg), handoff_id=cfg.handoff_id)
    from handoff_spark.bigquery import ledger as bigquery_ledger

    return bigquery_ledger.list_commits(cfg.sink, handoff_id=cfg.handoff_id)


def entries(cfg: AppConfig, limit: int | None = None) -> list[dict[str, Any]]:
    """The handoff's ledger entries (all queries), newest first, as plain dicts."""
    out = []
    for c in _commits(cfg)[:limit]:
        out.append({"kind": c.kind, "snapshot": c.snapshot_id, "query": c.query, "batch": c.batch_id,
                    "timestampMs": c.timestamp_ms, "rows": c.rows, "deadLetters": c.dlq_rows,
                    "offsets": {t: {str(p): list(se) for p, se in parts.items()} for t, parts in c.offsets.items()},
                    "kafkaCluster": c.kafka_cluster_id, "topicIds": c.topic_ids, "reason": c.reason})
    return out


def format_entries(rows: list[dict[str, Any]]) -> str:
    lines = []
    for r in rows:
        ranges = " ".join(f"{t}[{p}] {se[0]}→{se[1]}" for t, parts in sorted(r["offsets"].items())
                          for p, se in sorted(parts.items(), key=lambda kv: int(kv[0])))
        what = f"batch {r['batch']}" if r["kind"] == ledger.BATCH else r["kind"].upper()
        line = f"{r['snapshot']}  {r['query']:<10} {what:<10} rows {r['rows']:<8} {ranges}"
        if r.get("reason"):
            line += f"  ({r['reason']})"
        lines.append(line)
    return "\n".join(lines) if lines else "(no ledger entries yet)"


def accept_kafka(cfg: AppConfig) -> dict[str, Any]:
    """Record an epoch marker: the current Kafka identity, and for each topic whose id (or cluster) changed, its
    partitions starting at `startingOffsets`. Returns what was recorded; nothing when nothing changed."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    from handoff_spark.kafka.identity import admin_client, kafka_identity

    table = _table(cfg)
    admin = admin_client(cfg)
    cluster, topic_ids = kafka_identity(cfg, admin)
    old_cluster, old_topics = ledger.latest_identity(table, cfg.handoff_id, cfg.query_name)
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
    snapshot = ledger.record_marker(table, cfg.handoff_id, cfg.query_name, ranges, ledger.EPOCH, reason,
                                    {"cluster": cluster, "topics": topic_ids})
    return {"recorded": True, "snapshot": snapshot, "topics": changed, "offsets": ranges, "reason": reason}


def main_show(cfg: AppConfig, output: str, limit: int | None) -> str:
    rows = entries(cfg, limit)
    return json.dumps(rows, indent=2) if output == "json" else format_entries(rows)
