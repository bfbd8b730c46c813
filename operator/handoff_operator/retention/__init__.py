"""Topic retention that covers the replay window plus an outage: the rule (`rule`, pure), Kafka's retention read
and raised (`kafka`), Strimzi-managed topics (`strimzi`), the check in a status refresh's steps
(`step`: `gather` reads, `decide` and `checked` are pure, `act` raises) and
the report into conditions, status and Events (`report`, pure).

May import: `models`, `conditions`, `runtime`, `truth` (the per-cluster Kafka client and offsets) and
`handoff_spark.config`.
Imported by `handoff`.
"""
