"""The sink contract of a ReplayRequest's table steps: what the controller (`handlers`) and `handoff replay`
(`local`) ask of a table, whatever the sink. Each sink answers it in its own module (`iceberg_table`,
`bigquery_table`); `table.open_table` picks it by the config's sink kind, so no step branches on the sink.

What a table must do:
- `facts()`: its ledger as the planner reads it (`plan.TableFacts`): entries newest first, each with its key
  (Iceberg: the snapshot id; BigQuery: the ledger key, the batch's commit time in µs) and time;
- `refusal(plan)`: what this sink cannot do for a plan the generic rules allowed, with the fix (None: nothing);
- `undo_point_name` / `ensure_undo_point(name, head)`: the undo point before anything changes (Iceberg: a tag on
  the head; BigQuery: a snapshot table), named in `status.undoTag`;
- `current()`: the key of its newest entry now (the step that rolls back compares it with the plan's head and
  target);
- `rollback(step)`: go back to the target (idempotent: done again after it is done, nothing changes);
- `stream_offsets(handoff_id, query)`: where a ledger query stands now, which is where the driver resumes from;
- `record_gap(...)`: offsets skipped on purpose (mode Rollback);
- `cost(plan)`: what the rows to discard and to re-read weigh, for the dry run (`cost.TableCost`).

Every step is idempotent on its own, checked against the table rather than remembered, so an operator restarted
between a step and the status write that records it repeats nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from handoff_operator.replay.cost import TableCost
from handoff_operator.replay.plan import Failure, Offsets, Plan, Ranges, TableFacts


class UndoPointTaken(RuntimeError):
    """The undo point's name is already used for another state of the table."""


class RollbackRefused(RuntimeError):
    """The table refused the rollback for now (BigQuery: rows still in the write-optimised buffer, a concurrent
    mutation, a DML quota): the step is tried again later; the message says why."""


@dataclass(frozen=True)
class RollbackStep:
    """What the rollback step needs from the recorded plan: the table's head and target keys, and the first offset
    per partition that leaves the table (the cut: the target's ledger end, or where a partition first committed
    after it started)."""

    handoff_id: str
    query: str
    head: int
    target: int
    cut: Offsets


class ReplayTable(Protocol):
    kind: str

    def facts(self) -> TableFacts: ...

    def refusal(self, plan: Plan) -> Failure | None: ...

    def undo_point_name(self, namespace: str, request: str) -> str: ...

    def ensure_undo_point(self, name: str, head: int) -> bool: ...

    def current(self) -> int | None: ...

    def rollback(self, step: RollbackStep) -> None: ...

    def stream_offsets(self, handoff_id: str, query: str) -> Offsets: ...

    def record_gap(self, handoff_id: str, query: str, gap: Ranges, reason: str) -> str: ...

    def cost(self, plan: Plan) -> TableCost: ...


def cut_of(plan_status: dict[str, Any]) -> Offsets:
    """The cut of a recorded plan (`status.plan`): where the re-read starts (RollbackAndReplay), or where the gap
    starts (Rollback)."""
    wire = plan_status.get("replayFrom") or plan_status.get("gapFrom") or {}
    return {t: {int(p): int(o) for p, o in parts.items()} for t, parts in wire.items()}
