"""The ledger's shape and rules, the same for every backend: one `Commit` record per ledger entry, and the pure
decisions over entries (where a partition's ledger ends, whether a batch may commit there, which offsets a
Backfill would write twice, whether Kafka is still the cluster/topic the offsets belong to, and which incarnation
of a recreated topic the ledger follows since its `epoch`).

Why backend-neutral: Iceberg keeps its ledger in snapshot summaries (`iceberg.ledger`), BigQuery in the data
table plus an index table (`bigquery.ledger`); the exactly-once contract (docs/design/data-plane-contract.md)
is one, so its rules and the record the operator reads are one too. No pyiceberg/pyspark/google imports here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

BATCH, GAP, EPOCH = "batch", "gap", "epoch"

Offsets = dict[str, dict[int, int]]  # {topic: {partition: next offset}}
Ranges = dict[str, dict[int, tuple[int, int]]]  # {topic: {partition: (start, end)}}, end exclusive


@dataclass(frozen=True)
class Commit:
    """One ledger entry as recorded in the table: a micro-batch (`kind` batch) or a marker (gap/epoch).

    `offsets` ranges are [start, end) per topic partition. `snapshot_id` is the entry's key for time travel:
    the Iceberg snapshot id, or for BigQuery the commit time in µs (which BigQuery's time travel accepts).
    `timestamp_ms` is when the entry became durable in the table."""

    snapshot_id: int | None
    timestamp_ms: int
    handoff_id: str
    query: str
    batch_id: int
    offsets: Ranges
    rows: int
    dlq_rows: int
    max_event_time_ms: int | None
    parent_snapshot_id: int | None = None
    query_id: str | None = None
    kind: str = BATCH
    reason: str | None = None
    kafka_cluster_id: str | None = None
    topic_ids: dict[str, str] | None = None
    lost: Ranges | None = None  # offsets of the range retention deleted unread
    #: Schema Registry writer schemas of the entry's rows: {"<schema id>": ["<subject>:<version>", ...]}
    schemas: dict[str, list[str]] | None = None
    #: The DataFrame path's counts (None elsewhere): records at or below the watermark line, and records the
    #: transform filtered or the dedupe dropped (Iceberg: handoff.late-rows, handoff.dropped-rows).
    late_rows: int | None = None
    dropped_rows: int | None = None
    #: The table schema the entry was committed with: Iceberg's schema id; for BigQuery, which has no schema ids,
    #: the fingerprint of the table's columns after the commit (`bigquery.schema.fingerprint`). None: unknown
    #: (a BigQuery marker, or a row an older Handoff wrote).
    schema_id: int | str | None = None
    #: The table's columns {name: type} that `schema_id` names, where the entry itself carries them: BigQuery
    #: only, on the first row a driver process records and on each whose schema differs from the one that process
    #: recorded before (Iceberg keeps its schemas in the table metadata: None).
    columns: dict[str, str] | None = None

    @property
    def end_offsets(self) -> Offsets:
        return {t: {p: se[1] for p, se in parts.items()} for t, parts in self.offsets.items()}

    def covers(self, topic: str, partition: int, offset: int) -> bool:
        se = self.offsets.get(topic, {}).get(partition)
        return se is not None and se[0] <= offset < se[1]


def column_change(old: dict[str, str], new: dict[str, str], old_id: int | str, new_id: int | str) -> dict[str, Any]:
    """What changed between two versions of a table's top-level columns ({name: type}): the `schemaChange` of a
    ledger entry, which the timeline shows as a `schema` row (issue 35). One function for both backends, so an
    Iceberg and a BigQuery row say it the same way. Pure."""
    return {"from": old_id, "to": new_id,
            "added": [f"{n} {t}" for n, t in new.items() if n not in old],
            "dropped": [n for n in old if n not in new],
            "changed": [f"{n} {old[n]} → {t}" for n, t in new.items() if n in old and old[n] != t]}


def ledger_end(entries: Iterable[Commit], partitions: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """The ledger end of just `partitions` from `entries` newest first (markers included): the end of the
    newest entry naming each partition; partitions no entry names are absent. Stops reading `entries` once every
    partition is found (callers pass a lazy walk of the history). Pure."""
    found: dict[tuple[str, int], int] = {}
    for c in entries:
        for topic, parts in c.offsets.items():
            for p, (_start, end) in parts.items():
                if (topic, p) in partitions:
                    found.setdefault((topic, p), end)
        if len(found) == len(partitions):
            break
    return found


def contiguity_problems(ranges: dict[tuple[str, int], tuple[int, int]],
                        ledger: dict[tuple[str, int], int]) -> list[str]:
    """Why a batch must not commit: a partition whose non-empty range does not start at the ledger end (behind
    it: the records are already in the table, a duplicate; past it: records would be skipped). Partitions the
    ledger never saw may start anywhere (their start came from startingOffsets). Pure."""
    out = []
    for (topic, partition), (start, end) in sorted(ranges.items()):
        if end <= start or (topic, partition) not in ledger:
            continue
        have = ledger[(topic, partition)]
        if start < have:
            out.append(f"{topic}[{partition}] starts at {start} but the table already holds offsets up to {have} "
                       f"(re-reading {min(end, have) - start} records would duplicate them)")
        elif start > have:
            out.append(f"{topic}[{partition}] starts at {start} but the table's ledger ends at {have} "
                       f"(offsets {have}..{start - 1} would be skipped)")
    return out


def overlap_problems(held: Iterable[Commit], wanted: dict[tuple[str, int], tuple[int, int]]) -> list[str]:
    """Which of `wanted` (`[from, to)` per partition) the table already holds according to `held` (batch
    entries; markers hold no data). A Backfill must not re-write those records. Pure."""
    out = []
    for c in held:
        if c.kind != BATCH:
            continue
        for (topic, partition), (lo, hi) in sorted(wanted.items()):
            se = c.offsets.get(topic, {}).get(partition)
            if se is not None and se[0] < hi and lo < se[1] and se[0] < se[1]:
                out.append(f"{topic}[{partition}] offsets {max(lo, se[0])}..{min(hi, se[1]) - 1} are already in "
                           f"the table (snapshot {c.snapshot_id}, query {c.query} batch {c.batch_id})")
    return out


def newest_identity(entries: Iterable[Commit]) -> tuple[str | None, dict[str, str]]:
    """(Kafka cluster id, {topic: topic id}) as the newest entries that recorded them say, from `entries` newest
    first (markers included: an `epoch` marker's ids are the accepted ones). Stops reading once the cluster and
    every topic of an entry are known. Entries written before the ledger recorded identities add nothing. Pure."""
    cluster: str | None = None
    topics: dict[str, str] = {}
    for c in entries:
        if cluster is None and c.kafka_cluster_id:
            cluster = c.kafka_cluster_id
        for topic, tid in (c.topic_ids or {}).items():
            topics.setdefault(topic, tid)
        if cluster is not None and all(t in topics for t in c.offsets):
            break
    return cluster, topics


def incarnations(entries: Iterable[Commit]) -> dict[str, str]:
    """{topic: topic id} of each topic an `epoch` marker names, from the newest such marker (`entries` newest
    first): the incarnation the ledger follows since a recreated topic (or another cluster) was accepted. Entries
    and rows of other topic ids are of an earlier incarnation. Topics no epoch names are absent: every entry of
    theirs counts. Pure."""
    out: dict[str, str] = {}
    for c in entries:
        if c.kind != EPOCH:
            continue
        for topic in c.offsets:
            tid = (c.topic_ids or {}).get(topic)
            if tid:
                out.setdefault(topic, tid)
    return out


def of_incarnation(c: Commit, topic: str, current: dict[str, str]) -> bool:
    """Whether entry `c`'s offsets of `topic` belong to the incarnation `incarnations` found (always, for a
    topic no epoch names). Pure."""
    tid = current.get(topic)
    return tid is None or (c.topic_ids or {}).get(topic) == tid


def identity_problems(recorded_cluster: str | None, recorded_topics: dict[str, str], cluster: str | None,
                      topics: dict[str, str]) -> list[str]:
    """A Kafka cluster or topic that is not the one the ledger's offsets belong to (recreated under the same
    name, or the handoff now points at another cluster). Unknown ids on either side are not a mismatch. Pure."""
    out = []
    if recorded_cluster and cluster and recorded_cluster != cluster:
        out.append(f"the Kafka cluster id is {cluster}, the table's ledger was written from cluster {recorded_cluster}")
    for topic, tid in sorted(topics.items()):
        old = recorded_topics.get(topic)
        if old and tid and old != tid:
            out.append(f"topic {topic!r} has id {tid}, the ledger's offsets belong to topic id {old} "
                       f"(the topic was deleted and recreated)")
    return out
