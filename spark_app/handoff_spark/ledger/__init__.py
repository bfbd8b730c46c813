"""The ledger's record and rules, the same for every backend (`record`: `Commit`, ledger end, contiguity,
overlap, Kafka identity), lag per partition (`lag`) and `handoff ledger show / accept-kafka` (`cli`).

Pure apart from `cli`; imports only `config` and `errors`. Imported by every other folder, and by the operator,
which reads ledgers through this folder and the backends' `iceberg.ledger` / `bigquery.ledger`.
"""
