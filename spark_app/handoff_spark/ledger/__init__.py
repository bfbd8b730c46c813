"""The ledger, the same for every backend, and the data plane's public face for reading it.

`record`: one `Commit` per ledger entry and the pure rules over entries (ledger end, contiguity, overlap, Kafka
identity); `lag`: lag per partition, one rule for the driver's metrics, the operator's status and its autoscaler;
`backends`: a handoff's ledger where each backend keeps it (Iceberg snapshots, BigQuery's ledger index), the
consumer group's offsets, and the entries as `handoff ledger show` and `kubectl handoff ledger` print them, each
backend imported only when called (so readers never import pyspark or a backend they do not use).

Everything the operator and the kubectl plugin need of the ledger is re-exported here, and they import it from
here only; the data plane's own modules import `record` and `lag` directly.

May import: `config`, `iceberg`, `bigquery` and `kafka.offsets` (the last three in `backends` only, inside the
functions that read them). `record` and `lag` import nothing of the package.
Imported by the sinks, `driver`, `entry`, and the operator (its public face for the ledger).
"""
from typing import TYPE_CHECKING

from handoff_spark.ledger.backends import (bigquery_credential_choice, bigquery_credentials, bigquery_latest_commit,
                                           bigquery_ledger_ref, bigquery_list_commits, bigquery_query_ends,
                                           bigquery_record_gap, bigquery_resume_offsets, bigquery_rollback_steps, committed_group_offsets, entries,
                                           forget_iceberg_catalog, format_entries, iceberg_ancestry, iceberg_catalog,
                                           iceberg_latest_commit, iceberg_record_gap, iceberg_resume_offsets,
                                           iceberg_table, list_commits)
from handoff_spark.ledger.lag import flat, lag_per_partition, nested
from handoff_spark.ledger.record import (BATCH, EPOCH, GAP, Commit, Offsets, Ranges, contiguity_problems,
                                         identity_problems, incarnations, ledger_end, newest_identity,
                                         of_incarnation, overlap_problems)

if TYPE_CHECKING:  # a Literal for annotations; importing it at run time would import the config (pydantic)
    from handoff_spark.bigquery.client import CredentialChoice

__all__ = [
    "BATCH", "EPOCH", "GAP", "Commit", "Offsets", "Ranges", "contiguity_problems", "identity_problems",
    "incarnations", "ledger_end", "newest_identity", "of_incarnation", "overlap_problems", "flat", "lag_per_partition", "nested", "bigquery_credential_choice", "bigquery_credentials",
    "bigquery_latest_commit", "bigquery_ledger_ref", "bigquery_list_commits", "bigquery_query_ends",
    "bigquery_record_gap", "bigquery_resume_offsets", "bigquery_rollback_steps", "committed_group_offsets", "entries", "forget_iceberg_catalog",
    "format_entries", "iceberg_ancestry", "iceberg_catalog", "iceberg_latest_commit", "iceberg_record_gap",
    "iceberg_resume_offsets", "iceberg_table", "list_commits",
]
