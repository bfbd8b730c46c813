"""Topic retention that covers the replay window plus an outage: the rule (`rule`, pure), Kafka's retention read
and raised (`kafka`), Strimzi-managed topics (`strimzi`), the check as the status refresh runs it (`step`) and
the report into conditions, status and Events (`report`, pure).

May import: `models`, `conditions`, `runtime`, `truth` (the per-cluster Kafka client and offsets) and
`handoff_spark.config`.
Imported by `handoff`.
"""
