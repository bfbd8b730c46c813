"""Lag and freshness from the table's ledger and Kafka's end offsets (pure; no I/O).

lag = Σ over partitions (Kafka end offset − committed next offset). A partition the ledger has never
seen counts from the earliest offset still in Kafka (everything there is waiting). Freshness is the age
of the newest committed event time (`handoff.max-event-time-ms`, which the sink takes from the
eventTimeColumn or the Kafka timestamp); when the ledger has none, the commit time stands in.
"""
from __future__ import annotations

from collections.abc import Mapping

from .conditions import ProgressFacts

Offsets = Mapping[str, Mapping[int, int]]


def lag_per_partition(committed: Offsets, end: Offsets, earliest: Offsets | None = None
                      ) -> dict[str, dict[int, int]]:
    out: dict[str, dict[int, int]] = {}
    for topic, parts in end.items():
        for partition, end_offset in parts.items():
            done = committed.get(topic, {}).get(partition)
            if done is None:
                done = (earliest or {}).get(topic, {}).get(partition, 0)
            out.setdefault(topic, {})[partition] = max(0, end_offset - done)
    return out


def progress_facts(commit: object | None, end: Offsets | None, earliest: Offsets | None,
                   now_ms: int, errors: list[str]) -> ProgressFacts:
    """`commit` is a handoff_spark.iceberg.ledger.Commit (or None: nothing committed yet)."""
    committed: dict[str, dict[int, int]] = {}
    snapshot = batch = at_ms = event_ms = None
    if commit is not None:
        committed = {t: dict(p) for t, p in commit.end_offsets.items()}  # type: ignore[attr-defined]
        snapshot = commit.snapshot_id  # type: ignore[attr-defined]
        batch = commit.batch_id  # type: ignore[attr-defined]
        at_ms = commit.timestamp_ms  # type: ignore[attr-defined]
        event_ms = commit.max_event_time_ms  # type: ignore[attr-defined]
    lag = None
    if end is not None:
        lag = sum(sum(p.values()) for p in lag_per_partition(committed, end, earliest).values())
    reference = event_ms if event_ms is not None else at_ms
    freshness = max(0.0, (now_ms - reference) / 1000.0) if reference is not None else None
    return ProgressFacts(
        committed_snapshot=snapshot, committed_batch=batch, committed_at_ms=at_ms,
        committed_offsets={t: {str(p): o for p, o in parts.items()} for t, parts in committed.items()},
        end_offsets=({t: {str(p): o for p, o in parts.items()} for t, parts in end.items()}
                     if end is not None else None),
        earliest_offsets=({t: {str(p): o for p, o in parts.items()} for t, parts in earliest.items()}
                          if earliest is not None else None),
        lag=lag, max_event_time_ms=event_ms, freshness_seconds=freshness, errors=tuple(errors))
