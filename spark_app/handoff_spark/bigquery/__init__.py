"""The Google BigQuery sink over the Storage Write API: clients and credentials (`client`), the table
schema and its evolution (`schema`, pure; `table`, the client calls that read and grow a table's columns),
pipelined Arrow appends with retries (`append`), the ledger kept in the data table and its index (`ledger`),
and the streaming writer and its commit (`sink`).

Nothing is imported here: `handoff_spark.sink.registry` imports `bigquery.sink` on first use.
"""
