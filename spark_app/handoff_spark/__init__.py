"""Handoff's data plane: a PySpark Structured Streaming app from Kafka to Iceberg or BigQuery tables.

The Kafka source and the table sinks are PySpark Python data sources (no JVM connector jars). Exactly-once
rests on one rule: every table commit records the exact Kafka offsets it contains (the *ledger*), and a batch
already in the ledger is never applied again.
"""
__version__ = "0.1.0"
