"""The Apache Iceberg sink: catalog access (`catalog`), table creation and schema evolution (`table`), the
ledger kept in snapshot summaries (`ledger`), the streaming writer and its commit (`sink`, `stream`), and the
bounded-history upkeep that keeps commit latency flat (`maintenance`).

May import: `config`, `contract`, `faults`, `switches`, `checkpoint` (the last-commit side file), `decode`, `ledger` (the
record), `kafka.offsets` (the group's offsets after a durable commit) and `sink` (the contract).
Nothing is imported here: `handoff_spark.sink.registry` imports the writer by name on first use, and
`handoff_spark.ledger` imports `ledger` and `table` when an Iceberg ledger is read, so a reader of the ledger needs
no pyspark. Also imported by `entry` (`handoff ledger accept-kafka`) and `startup` (the warm-ups).
"""
