"""The Apache Iceberg sink: catalog access (`catalog`), table creation and schema evolution (`table`), the
ledger kept in snapshot summaries (`ledger`), the streaming writer and its commit (`sink`), and the
bounded-history upkeep that keeps commit latency flat (`maintenance`).

Nothing is imported here: `handoff_spark.sink.registry` imports `iceberg.sink` on first use, so the operator can
read a ledger without pyspark.
"""
