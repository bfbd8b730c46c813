"""The Google BigQuery sink over the Storage Write API: clients and credentials (`client`), the table
schema and its evolution (`schema`, pure; `table`, the client calls that read and grow a table's columns),
pipelined Arrow appends with retries (`append`), the ledger kept in the data table and its index (`ledger`),
and the streaming writer and its commit (`sink`: Kafka records, or on the DataFrame path rows Spark made).

May import: `config`, `contract`, `errors`, `faults`, `switches`, `checkpoint` (the offset log, the last-commit side file), `decode`, `ledger`
(the record), `kafka.offsets` (the group's offsets after a durable commit) and `sink` (the contract; `sink.frames`' counts on the DataFrame path).
Nothing is imported here: `handoff_spark.sink.registry` imports `bigquery.sink` by name on first use, and
`handoff_spark.ledger` imports `client` and `ledger` when a BigQuery ledger is read.
"""
