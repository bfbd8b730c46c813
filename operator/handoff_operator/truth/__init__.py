"""What the operator reads to know where a handoff stands: the table's ledger and Kafka's offsets (`reading`),
a BigQuery sink's ledger (`bigquery`), lag and freshness from them (`progress`, pure), the driver's published
progress record (`driver_report`) and what the watches saw (`watched`, kopf indexes).

Reads only, never changes anything.

May import: `conditions`, `models`, `runtime`, `spec.render` (names), `handoff_spark.config`,
`handoff_spark.ledger` (each backend's ledger, imported when read) and `handoff_spark.contract` (the progress
record's names).
Imported by the controllers (`handoff`, `retention`, `replay`), `runtime` (the record's key) and `kubectl_plugin`.
"""
