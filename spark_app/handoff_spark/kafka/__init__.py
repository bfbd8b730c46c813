"""Kafka, as the data plane reads it: the `handoff-kafka` streaming source and its range planning (`source`),
the range readers' consumers kept per process (`readers`), the native reader over librdkafka (`native`, C
`_kafka_native`), cluster and topic identity (`identity`), consumer-group offsets after a durable commit
(`offsets`), the librdkafka settings every client starts from (`client_defaults`) and the one fence around
confluent-kafka's private API (`confluent_kafka_private`).

May import: `checkpoint`, `contract`, `switches`, `private_api` (through `confluent_kafka_private`), `config` (for types only).
Imported by `sink` (the fused read), the sinks (group offsets), `driver` (the source, Kafka identity), `startup`
(the bootstrap's ranges, warm-ups), `ledger` (group offsets, for readers outside the driver) and `entry` (Kafka
identity, `handoff ledger accept-kafka`). The operator reads Kafka with its own clients, and the group's offsets
only through `handoff_spark.ledger`.
"""
