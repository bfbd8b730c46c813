"""Kafka records → rows of the declared schema, plus dead letters: JSON and raw (`records`, with the C tier
`_json_arrow`), Schema Registry formats (`registry`, `registry_schema`), the column-type grammar
(`column_types`) and the one entry point both sinks call for a raw batch (`batch`).

May import: `config`, `errors`, `ledger`, `switches`. Imported by `sink`, the sinks and `startup` (pre-imports); the
operator imports only `column_types` (the CRD's column grammar must be the decoder's).
"""
