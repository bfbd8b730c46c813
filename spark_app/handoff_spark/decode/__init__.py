"""Kafka records → rows of the declared schema, plus dead letters: JSON and raw (`records`, with the C tier
`_json_arrow`), Schema Registry formats (`registry`, `registry_schema`), the column-type grammar
(`column_types`), the one entry point both sinks call for a raw batch (`batch`), and decoded batches shaped as
a Spark DataFrame's (`frame`, for issue 31's DataFrame path; only its benchmark uses it so far).

May import: `config`, `contract` (the Kafka columns).
Imported by `config` (`column_types`), `sink` (dead letters), the sinks, `driver` (the registry's start-up check)
and `startup.worker_daemon` (pre-imports, by name); the operator reaches `column_types` only through `config`
(the CRD's column grammar must be the decoder's).
"""
