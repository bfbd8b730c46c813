"""Executor scaling on lag: how many executors a handoff should run (`rule`, pure over plain data) and its
part of each reconcile's steps (`step`: `measure` gathers, `decide_step` decides (pure), `act` acts).

May import: `models`, `conditions`, `runtime`, `spec.render` (names), `handoff_spark.ledger` (lag) and
`handoff_spark.contract` (the annotation the driver polls).
Imported by `handoff`.
"""
