"""The sink contract: the registry of table sinks and what the driver needs of each (`registry`), what both
sinks share (`common`: fused read, event time, the commit record), PySpark's data source base classes
(`datasource_api`) and dead letters sent to the DLQ topic before a task reports success (`dead_letters`).

May import: `config`, `contract`, `errors`, `checkpoint` (the last-commit side file), `decode` (dead letters), `kafka` (the
fused read). The registry imports each sink's modules by name (importlib), on first use.
Imported by `iceberg`, `bigquery`, `driver`, `startup` (the warm-ups' data sources) and `entry` (`handoff ledger
accept-kafka`'s marker, through the registry); never by the operator.
"""
