"""The ReplayRequest controller: what a request will do (`plan`, pure), the table's steps (`table`), a Backfill
as a Kubernetes Job (`backfill`, pure), what a request reads of each sink's table (`ledger_view`: Iceberg's
snapshots, BigQuery's ledger index), the kopf daemon that runs a request one idempotent step at a time
(`handlers`) and `handoff replay` for a handoff run locally (`local`).

May import: `models`, `spec`, `truth`, `upgrade`, `conditions`, `runtime`, `handoff_spark.config`,
`handoff_spark.ledger`, `handoff_spark.contract` and `handoff_spark.switches` (the data plane's public face: the
table's ledger, what the Backfill Job's driver is given). It never imports the StreamTableHandoff controller (`handoff`): it asks for a
handoff's reconcile through `runtime.controllers`.
Imported by `cli` (`local`) and registered with kopf by `handoff_operator.register_handlers`.
"""
