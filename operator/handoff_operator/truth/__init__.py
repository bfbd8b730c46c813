"""What the operator reads to know where a handoff stands: the table's ledger and Kafka's offsets (`reading`),
a BigQuery sink's ledger (`bigquery`), lag and freshness from them (`progress`, pure), the driver's published
progress record (`driver_report`) and what the watches saw (`watched`, kopf indexes).

Reads only, never changes anything. Imports `models`, `runtime` and the data plane's `config` and `ledger`;
imported by the controllers (`handoff`, `scaling`, `retention`, `upgrade`, `replay`).
"""
