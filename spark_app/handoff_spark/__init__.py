"""Handoff's data plane: a PySpark Structured Streaming app from Kafka to Iceberg or BigQuery tables.

The Kafka source and the table sinks are PySpark Python data sources (no JVM connector jars). Exactly-once
rests on one rule: every table commit records the exact Kafka offsets it contains (the *ledger*), and a batch
already in the ledger is never applied again.

Folders by concern (each `__init__` says what lives there and who may import it): `kafka`, `decode`, `sink`
(the sink contract), `iceberg`, `bigquery`, `ledger`, `driver`, `startup`. Top-level modules every folder may
import: `config` (the app config), `contract` (the operator ↔ driver names and shapes), `switches` (every
`HANDOFF_*` environment switch), `checkpoint` (the checkpoint's layout), `errors`, `faults` (test hooks) and the
fences around private APIs (`private_api`, `pyspark_private`).
"""
__version__ = "0.1.0"
