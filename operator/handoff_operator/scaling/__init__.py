"""Executor scaling on lag: how many executors a handoff should run (`rule`, pure over plain data) and the step
that gathers the facts, decides and acts in the status refresh (`step`).

May import: `models`, `conditions`, `runtime`, `spec.render` (names), `handoff_spark.ledger` (lag) and
`handoff_spark.contract` (the annotation the driver polls).
Imported by `handoff`.
"""
