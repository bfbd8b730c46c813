"""What a ReplayRequest reads of the handoff's table, whatever the sink: the planner's facts and where one ledger
query stands now (a Backfill's progress). The one place the replay controller tells the sinks apart for reading.

Why per sink: Iceberg's ledger is its snapshot history (`replay.table`), so the planner's ancestry is the table's;
BigQuery has no snapshots, and its ledger index (`<table>__handoff_ledger`, one row per committed micro-batch or
marker, `handoff_spark.bigquery.ledger`) stands in for them, newest first. That is enough for a Backfill: its plan
only asks which ranges the handoff's entries hold, and the driver checks the data table itself (the truth: every
row carries its Kafka coordinates) before it writes anything (`bigquery.sink.backfill_overlap`).

`bigquery_facts` and `query_offsets` are pure; `table_facts` and `query_offsets_now` do the I/O.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from handoff_spark.config import AppConfig, BigQuerySink, IcebergSink
from handoff_spark.ledger import BATCH, Commit, incarnations, list_commits, of_incarnation

from handoff_operator.replay import table as replay_table
from handoff_operator.replay.plan import LedgerEntry, Offsets, SnapshotInfo, TableFacts


def _key(commit: Commit) -> int:
    """A BigQuery entry's stand-in snapshot id: its commit time in µs (what BigQuery's time travel takes), or for
    a marker, which commits no data, when it was recorded."""
    return commit.snapshot_id if commit.snapshot_id is not None else commit.timestamp_ms * 1000


def bigquery_facts(commits: Sequence[Commit]) -> TableFacts | None:
    """The ledger index's entries (newest first) as the planner's ancestry; None when it has none. Entries of a
    topic's incarnation before an `epoch` (a recreated topic) are left out: their offsets name another topic."""
    if not commits:
        return None
    current = incarnations(commits)
    snaps = []
    for c in commits:
        offsets = {t: parts for t, parts in c.offsets.items() if of_incarnation(c, t, current)}
        snaps.append(SnapshotInfo(_key(c), c.timestamp_ms,
                                  LedgerEntry(c.handoff_id, c.query, offsets, gap=c.kind != BATCH)))
    return TableFacts(tuple(snaps), frozenset(s.snapshot_id for s in snaps))


def query_offsets(commits: Sequence[Commit], handoff_id: str, query: str) -> Offsets:
    """Where `query` of `handoff_id` stands: the highest end per partition of its entries, current incarnation
    only (the rule of `bigquery.ledger.ends`)."""
    current = incarnations(commits)
    out: Offsets = {}
    for c in commits:
        if c.handoff_id != handoff_id or c.query != query:
            continue
        for topic, parts in c.end_offsets.items():
            if of_incarnation(c, topic, current):
                for p, end in parts.items():
                    out.setdefault(topic, {})[p] = max(out.get(topic, {}).get(p, 0), end)
    return out


class _View(Protocol):
    def facts(self, config: AppConfig) -> TableFacts | None: ...

    def offsets(self, config: AppConfig, query: str) -> Offsets | None: ...


class _Iceberg:
    def facts(self, config: AppConfig) -> TableFacts | None:
        table = replay_table.load(config)
        return replay_table.table_facts(table) if table is not None else None

    def offsets(self, config: AppConfig, query: str) -> Offsets | None:
        table = replay_table.load(config)
        return replay_table.stream_offsets(table, config.handoff_id, query) if table is not None else None


class _BigQuery:
    def facts(self, config: AppConfig) -> TableFacts | None:
        return bigquery_facts(list_commits(config))

    def offsets(self, config: AppConfig, query: str) -> Offsets | None:
        return query_offsets(list_commits(config), config.handoff_id, query)


_VIEWS: dict[type, _View] = {IcebergSink: _Iceberg(), BigQuerySink: _BigQuery()}


def _view(config: AppConfig) -> Any:
    return _VIEWS[type(config.sink)]


def table_facts(config: AppConfig) -> TableFacts | None:
    """The planner's view of the handoff's table now (None: no table, or nothing committed)."""
    return _view(config).facts(config)


def query_offsets_now(config: AppConfig, query: str) -> Offsets | None:
    """Where ledger query `query` of the handoff stands now (None: the table is gone)."""
    return _view(config).offsets(config, query)
