"""progress: lag = Kafka end − committed per partition; freshness from the newest committed event time."""
from __future__ import annotations

from types import SimpleNamespace

from handoff_operator.truth.progress import lag_per_partition, progress_facts


def test_lag_per_partition_counts_unseen_partitions_from_earliest():
    lag = lag_per_partition({"t": {0: 10, 1: 5}}, {"t": {0: 15, 1: 5, 2: 7}}, {"t": {2: 3}})
    assert lag == {"t": {0: 5, 1: 0, 2: 4}}


def test_progress_facts_from_a_commit():
    commit = SimpleNamespace(end_offsets={"t": {0: 10}}, snapshot_id=99, batch_id=3, timestamp_ms=1_000_000,
                             max_event_time_ms=990_000)
    facts = progress_facts(commit, {"t": {0: 25}}, {"t": {0: 0}}, now_ms=1_010_000, errors=[])
    assert facts.lag == 15 and facts.committed_snapshot == 99
    assert facts.freshness_seconds == 20.0
    assert facts.committed_offsets == {"t": {"0": 10}}


def test_nothing_committed_all_is_lag():
    facts = progress_facts(None, {"t": {0: 8}}, {"t": {0: 2}}, now_ms=0, errors=["x"])
    assert facts.lag == 6 and facts.freshness_seconds is None and facts.errors == ("x",)
