"""Lag and freshness from the table's ledger and Kafka's end offsets (pure; no I/O).

lag = Σ over partitions (Kafka end offset − committed next offset). A partition the ledger has never
seen counts from the earliest offset still in Kafka (everything there is waiting). Freshness is the age
of the newest committed event time (`handoff.max-event-time-ms`, which the sink takes from the
eventTimeColumn or the Kafka timestamp); when the ledger has none, the commit time stands in.
"""
from __future__ import annotations

from collections.abc import Mapping

from handoff_spark import ledger

from handoff_operator.conditions import ProgressFacts

Offsets = Mapping[str, Mapping[int, int]]


def lag_per_partition(committed: Offsets, end: Offsets, earliest: Offsets | None = None
                      ) -> dict[str, dict[int, int]]:
    """`handoff_spark.ledger.lag_per_partition` over the status's `{topic: {partition: offset}}` shape."""
    return ledger.nested(ledger.lag_per_partition(ledger.flat(committed), ledger.flat(end), ledger.flat(earliest)))


def progress_facts(commit: object | None, end: Offsets | None, earliest: Offsets | None,
                   now_ms: int, errors: list[str], end_read_at_ms: int | None = None) -> ProgressFacts:
    """`commit` is a handoff_spark.ledger.Commit (either backend; or None: nothing committed yet);
    `end_read_at_ms`: when `end` was read (the refresh's time when not given)."""
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
        end_read_at_ms=(end_read_at_ms if end_read_at_ms is not None else now_ms) if end is not None else None,
        earliest_offsets=({t: {str(p): o for p, o in parts.items()} for t, parts in earliest.items()}
                          if earliest is not None else None),
        lag=lag, max_event_time_ms=event_ms, freshness_seconds=freshness, errors=tuple(errors))
