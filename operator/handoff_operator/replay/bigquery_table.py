"""The BigQuery side of the replay sink contract (`table.ReplayTable`); the SQL is the data plane's
(`handoff_spark.bigquery.rollback`, reached through `handoff_spark.ledger`), docs/bigquery-exactly-once.md
("Rollback") says what a crash at each step leaves.

A BigQuery table has no snapshots, so its ledger index stands in for the history: each ledger row is an entry
whose key (`rollback.entry_key`: the batch's commit time in µs, which `handoff ledger show` prints in the snapshot
column) is what `target.snapshotId` names, and whose time `target.timestamp` is compared with. Rolling back to
an entry deletes the rows at or past the plan's cut and the ledger rows after the entry, in one transaction.

BigQuery's limits, each handled or refused:
- rows still in the streaming (write-optimised) buffer, a concurrent mutation, a DML quota: the rollback is
  refused for now (`RollbackRefused`); the controller waits and runs it again (one DML transaction per rollback,
  whatever the number of batches discarded, so quotas are met by waiting, not by splitting);
- `require_partition_filter`: refused in the plan (`refusal`), with the fix;
- the time-travel window: not needed. The target is found in the ledger and the rollback deletes by offsets, so a
  target older than the window works; the undo point is a snapshot table, kept until dropped.
"""
from __future__ import annotations

import os
from typing import Any

from handoff_spark.config import AppConfig, BigQuerySink
from handoff_spark.ledger import (BATCH, bigquery_credential_choice, bigquery_list_commits, bigquery_query_ends,
                                  bigquery_record_gap, bigquery_resume_offsets, bigquery_rollback_steps)

from handoff_operator.replay.cost import TableCost
from handoff_operator.replay.plan import Failure, LedgerEntry, Offsets, Plan, Ranges, SnapshotInfo, TableFacts
from handoff_operator.replay.contract import RollbackRefused, RollbackStep, UndoPointTaken


def _client(sink: BigQuerySink, key_json: str | None) -> Any:
    """A client with the sink's credentials: the operator's from `credentialsFrom` (`key_json`), else the driver's
    path (credentials file, application default, anonymous for an emulator endpoint)."""
    if not key_json:
        return None   # the data plane's own cached client
    from handoff_operator.truth.bigquery import rest_client

    exists = bool(sink.credentials_file) and os.path.exists(sink.credentials_file or "")
    return rest_client(sink, bigquery_credential_choice(sink, key_json, exists), key_json)


def _cut(plan: Plan) -> Offsets:
    if plan.replay_from:
        return plan.replay_from
    return {t: {p: r[0] for p, r in parts.items()} for t, parts in (plan.gap or {}).items()}


class BigQueryReplayTable:
    """One BigQuery table and its ledger index (`open` again for a fresh view)."""

    kind = "bigquery"

    def __init__(self, config: AppConfig, client: Any) -> None:
        assert isinstance(config.sink, BigQuerySink)
        self.config, self.sink, self.client = config, config.sink, client
        self.steps = bigquery_rollback_steps()

    @classmethod
    def open(cls, config: AppConfig, key_json: str | None = None) -> "BigQueryReplayTable | None":
        assert isinstance(config.sink, BigQuerySink)
        client = _client(config.sink, key_json)
        table = cls(config, client)
        return table if table.steps.table_info(config.sink, client).exists else None

    def _entries(self) -> list[Any]:
        return bigquery_list_commits(self.sink, None, self.client)

    def facts(self) -> TableFacts:
        ancestry = tuple(SnapshotInfo(self.steps.entry_key(c), c.timestamp_ms,
                                      LedgerEntry(c.handoff_id, c.query, c.offsets, gap=c.kind != BATCH))
                         for c in self._entries())
        return TableFacts(ancestry, frozenset(s.snapshot_id for s in ancestry), {})

    def refusal(self, plan: Plan) -> Failure | None:
        info = self.steps.table_info(self.sink, self.client)
        if info.require_partition_filter and plan.mode != "Backfill":
            ref = f"{self.sink.project}.{self.sink.dataset}.{self.sink.table}"
            return Failure("PartitionFilterRequired", f"the BigQuery table {ref} requires a partition filter "
                           f"(require_partition_filter), and the rollback deletes rows by their Kafka offsets, not by "
                           f"partition ({info.partition_field or '_PARTITIONTIME'}): run ALTER TABLE `{ref}` SET "
                           f"OPTIONS (require_partition_filter = false), create the ReplayRequest again, and set the "
                           f"option back once it has Succeeded")
        return None

    def undo_point_name(self, namespace: str, request: str) -> str:
        return self.steps.undo_name(self.sink, namespace, request)

    def ensure_undo_point(self, name: str, head: int) -> bool:
        """Snapshot tables of the table and its ledger as they are now, unless they exist. One that exists while
        the ledger has moved on from `head` is not ours: refused."""
        if self.steps.undo_point_exists(self.sink, name, self.client) and self.current() != head:
            raise UndoPointTaken(f"snapshot table {name} already exists, and the table is no longer at ledger "
                                 f"entry {head}")
        return bool(self.steps.create_undo_point(self.sink, name, self.client))

    def current(self) -> int | None:
        entries = self._entries()
        return self.steps.entry_key(entries[0]) if entries else None

    def rollback(self, step: RollbackStep) -> None:
        try:
            self.steps.rollback(self.sink, step.handoff_id, step.query, step.cut, step.target, self.client)
        except Exception as exc:
            why = self.steps.dml_refusal(exc)
            if why is not None:
                raise RollbackRefused(f"BigQuery refused the rollback's DELETE for now ({why}); it is run again "
                                      f"shortly (rows stay in the streaming buffer up to ~30 min after their write)"
                                      ) from exc
            raise

    def stream_offsets(self, handoff_id: str, query: str) -> Offsets:
        """The stream's query: where its driver resumes (past every row and ledger entry); another query (a
        Backfill's): its ledger end."""
        if query == self.config.query_name:
            return bigquery_resume_offsets(self.sink, handoff_id, self.client)
        return bigquery_query_ends(self.sink, handoff_id, query, self.client)

    def record_gap(self, handoff_id: str, query: str, gap: Ranges, reason: str) -> str:
        ranges = {t: {str(p): [s, e] for p, (s, e) in parts.items()} for t, parts in gap.items()}
        cfg = self.config.model_copy(update={"handoff_id": handoff_id, "query_name": query})
        if not bigquery_record_gap(cfg, ranges, reason):
            raise RuntimeError("the gap marker could not be written to the ledger; it is tried again")
        return "a gap row in the ledger"

    def cost(self, plan: Plan) -> TableCost:
        rows, size = self.steps.rows_past(self.sink, _cut(plan), self.client)
        if not rows:   # nothing to delete (a Backfill): the table's average row, from its metadata
            info = self.steps.table_info(self.sink, self.client)
            return TableCost(rows_to_delete=0, bytes_to_delete=0, sample_rows=info.num_rows,
                             sample_bytes=info.num_bytes, billed_writes=True)
        return TableCost(rows_to_delete=rows, bytes_to_delete=size, sample_rows=rows, sample_bytes=size,
                         billed_writes=True)
