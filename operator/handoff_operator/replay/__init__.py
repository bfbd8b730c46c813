"""The ReplayRequest controller: what a request will do (`plan`, pure), the table's steps (`table`), a Backfill
as a Kubernetes Job (`backfill`, pure), the kopf daemon that runs a request one idempotent step at a time
(`handlers`) and `handoff replay` for a handoff run locally (`local`).

Imports `models`, `spec`, `truth`, `runtime` and the data plane's `config` and `ledger`; imported by `cli` (and
registered with kopf by the operator's entry point).
"""
