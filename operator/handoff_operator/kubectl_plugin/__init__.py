"""`kubectl handoff`: a kubectl plugin (the `kubectl-handoff` console script) that reads a StreamTableHandoff the
way its users think of it: `status` (conditions, lag per partition, freshness against the target, executors),
`ledger` (the snapshot ↔ offsets timeline, read from the table itself) and `replay` (writes a ReplayRequest and
follows it to its end). It runs on a person's machine with their kubeconfig; it decides nothing the operator
decides, it only reads and writes the resources the operator works from.

Modules: `status` and `replay` hold the pure parts (summaries, manifests, what a status change means), `ledger`
and `cli` the I/O.

May import: `models`, `runtime.kube`, `spec` (the app config the operator would render), `truth.driver_report`,
`yaml_text` (what `-o yaml` prints) and `handoff_spark.ledger` (the data plane's public face; the backend is
imported when the ledger is read).
Imported by nothing: it is an entry point.
"""
