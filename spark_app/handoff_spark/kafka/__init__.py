"""Kafka, as the data plane reads it: the `handoff-kafka` streaming source and its range planning (`source`),
the range readers' consumers kept per process (`readers`), the native reader over librdkafka (`native`, C
`_kafka_native`), cluster and topic identity (`identity`), consumer-group offsets after a durable commit
(`offsets`) and the one fence around confluent-kafka's private API (`confluent_kafka_private`).

May import: `config`, `errors`, `faults`, `ledger`, `switches`. Imported by `driver`, `sink`, the sinks and `startup`;
the operator reads Kafka with its own clients and reaches this folder only through `handoff_spark.ledger`.
"""
