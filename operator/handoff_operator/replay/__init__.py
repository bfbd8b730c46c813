"""The ReplayRequest controller: what a request will do (`plan`, pure), the table's steps (`table`), a Backfill
as a Kubernetes Job (`backfill`, pure), the kopf daemon that runs a request one idempotent step at a time
(`handlers`) and `handoff replay` for a handoff run locally (`local`).

Imports `models`, `spec`, `truth`, `upgrade`, `conditions`, `runtime` and the data plane's `config` and `ledger`;
imported by `cli` (`local`) and registered with kopf by `handoff_operator.register_handlers`. It never imports the
StreamTableHandoff controller (`handoff`): it asks for a handoff's reconcile through `runtime.controllers`.
"""
