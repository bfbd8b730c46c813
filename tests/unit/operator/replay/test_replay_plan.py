"""ReplayRequest planning (pure): targets, ranges, and every reason a plan is refused before anything changes."""
from __future__ import annotations

from handoff_operator.replay.plan import (Failure, KafkaFacts, LedgerEntry, Plan, Request, SnapshotInfo,
                                          TableFacts, plan, progress, wire)

HID, Q, T = "shop/orders", "handoff", "orders"


def entry(p0: tuple[int, int], p1: tuple[int, int] | None = None, hid: str = HID, query: str = Q,
          gap: bool = False) -> LedgerEntry:
    parts = {0: p0} if p1 is None else {0: p0, 1: p1}
    return LedgerEntry(hid, query, {T: parts}, gap=gap)


def history(*entries: LedgerEntry | None, extra_ids: tuple[int, ...] = (), tags: dict[str, int] | None = None
            ) -> TableFacts:
    """Snapshots 1..n, committed at 1000·i ms, oldest first in the arguments; ancestry is newest first."""
    snaps = tuple(SnapshotInfo(i + 1, 1000 * (i + 1), e) for i, e in enumerate(entries))[::-1]
    return TableFacts(snaps, frozenset({s.snapshot_id for s in snaps} | set(extra_ids)), tags or {})


# Five commits of two partitions: p0 0-10-20-30-40-50, p1 0-5-10-15-20-25.
TABLE = history(*(entry((10 * i, 10 * i + 10), (5 * i, 5 * i + 5)) for i in range(5)))
KAFKA = KafkaFacts(earliest={T: {0: 0, 1: 0}}, latest={T: {0: 60, 1: 30}})


def req(mode: str = "RollbackAndReplay", **kw) -> Request:
    return Request(mode=mode, handoff_id=HID, query=Q, topics=(T,), **kw)  # type: ignore[arg-type]


def test_rollback_and_replay_of_the_last_three_snapshots() -> None:
    p = plan(req(snapshot_id=2), TABLE, KAFKA)
    assert isinstance(p, Plan)
    assert (p.head_snapshot, p.target_snapshot, p.discarded_snapshots) == (5, 2, 3)
    assert p.replay_from == p.resume_offsets == {T: {0: 20, 1: 10}}
    assert p.replay_to == {T: {0: 50, 1: 25}}
    assert p.records == 30 + 15
    assert "45 records" in p.summary and wire(p.replay_from) == {T: {"0": 20, "1": 10}}


def test_target_by_time_is_the_newest_snapshot_at_or_before_it() -> None:
    p = plan(req(timestamp_ms=3500), TABLE, KAFKA)
    assert isinstance(p, Plan) and p.target_snapshot == 3 and p.discarded_snapshots == 2


def test_target_by_tag() -> None:
    table = history(*(s.entry for s in TABLE.ancestry[::-1]), tags={"before-deploy": 4})
    p = plan(req(tag="before-deploy"), table, KAFKA)
    assert isinstance(p, Plan) and p.target_snapshot == 4 and p.records == 10 + 5


def test_rollback_records_the_discarded_range_as_a_gap_and_keeps_the_position() -> None:
    p = plan(req("Rollback", snapshot_id=3), TABLE, None)  # Kafka is not needed: nothing is re-read
    assert isinstance(p, Plan)
    assert p.gap == {T: {0: (30, 50), 1: (15, 25)}}
    assert p.resume_offsets == {T: {0: 50, 1: 25}}
    assert p.records == 0 and p.replay_from is None


def test_a_partition_first_committed_after_the_target_is_re_read_from_its_first_range() -> None:
    # Allowed when the restarted stream starts it exactly there: startingOffsets earliest, and Kafka's
    # earliest offset is where its first commit started.
    table = history(entry((0, 10)), entry((10, 20), (7, 9)), entry((20, 30), (9, 12)))
    p = plan(req(snapshot_id=1), table, KafkaFacts({T: {0: 0, 1: 7}}, {T: {0: 30, 1: 12}}))
    assert isinstance(p, Plan) and p.replay_from == {T: {0: 10, 1: 7}} and p.replay_to == {T: {0: 30, 1: 12}}


def test_non_ledger_snapshots_compaction_are_walked_through() -> None:
    table = history(entry((0, 10)), None, entry((10, 20)))
    p = plan(req(snapshot_id=2), table, KafkaFacts({T: {0: 0}}, {T: {0: 20}}))
    assert isinstance(p, Plan) and p.replay_from == {T: {0: 10}} and p.discarded_snapshots == 1


def reason(result: Plan | Failure) -> str:
    assert isinstance(result, Failure), result
    assert result.message
    return result.reason


def test_offsets_deleted_by_retention() -> None:
    f = plan(req(snapshot_id=2), TABLE, KafkaFacts({T: {0: 25, 1: 0}}, KAFKA.latest))
    assert reason(f) == "OffsetsDeleted"
    assert "orders[0] from 20 (earliest kept: 25)" in f.message and "retention.ms" in f.message  # type: ignore[union-attr]
    # Rollback re-reads nothing: retention does not matter.
    assert isinstance(plan(req("Rollback", snapshot_id=2), TABLE, KafkaFacts({T: {0: 25, 1: 0}}, {})), Plan)


def test_topic_gone_from_kafka() -> None:
    assert reason(plan(req(snapshot_id=2), TABLE, KafkaFacts({}, {}))) == "TopicNotFound"


def test_snapshot_expired_or_unknown() -> None:
    assert reason(plan(req(snapshot_id=99), TABLE, KAFKA)) == "SnapshotNotFound"


def test_snapshot_not_in_the_current_ancestry() -> None:
    table = history(*(s.entry for s in TABLE.ancestry[::-1]), extra_ids=(77,), tags={"old-branch": 77})
    assert reason(plan(req(snapshot_id=77), table, KAFKA)) == "NotAnAncestor"
    assert reason(plan(req(tag="old-branch"), table, KAFKA)) == "NotAnAncestor"


def test_timestamp_before_the_oldest_snapshot_kept() -> None:
    f = plan(req(timestamp_ms=500), TABLE, KAFKA)
    assert reason(f) == "TargetExpired" and "replay.window" in f.message  # type: ignore[union-attr]


def test_unknown_tag() -> None:
    assert reason(plan(req(tag="nope"), TABLE, KAFKA)) == "TagNotFound"


def test_target_is_the_head() -> None:
    assert reason(plan(req(snapshot_id=5), TABLE, KAFKA)) == "NothingToRollBack"
    assert reason(plan(req(timestamp_ms=10_000), TABLE, KAFKA)) == "NothingToRollBack"


def test_another_replay_running_for_the_same_handoff() -> None:
    f = plan(req(snapshot_id=2), TABLE, KAFKA, active_replays=["first"])
    assert reason(f) == "AnotherReplayRunning" and "first" in f.message  # type: ignore[union-attr]


def test_commits_of_another_writer_would_be_discarded() -> None:
    table = history(entry((0, 10)), entry((0, 5), hid="shop/other"), entry((10, 20)))
    assert reason(plan(req(snapshot_id=1), table, KAFKA)) == "OtherWritersInRange"
    backfilled = history(entry((0, 10)), entry((40, 50), query="backfill-x"), entry((10, 20)))
    assert reason(plan(req(snapshot_id=1), backfilled, KAFKA)) == "OtherWritersInRange"


def test_bigquery_plans_rollbacks_over_its_ledger_entries_as_iceberg_over_snapshots() -> None:
    """A BigQuery table's facts are its ledger entries (keyed by commit time in µs): the same plan."""
    bq = TableFacts(tuple(SnapshotInfo(1_000_000 * s.snapshot_id, s.timestamp_ms, s.entry) for s in TABLE.ancestry),
                    frozenset(1_000_000 * i for i in TABLE.snapshot_ids))
    p = plan(Request("RollbackAndReplay", HID, Q, (T,), sink="bigquery", snapshot_id=2_000_000), bq, KAFKA)
    assert isinstance(p, Plan) and (p.head_snapshot, p.target_snapshot) == (5_000_000, 2_000_000)
    assert p.replay_from == {T: {0: 20, 1: 10}} and p.records == 45
    gap = plan(Request("Rollback", HID, Q, (T,), sink="bigquery", timestamp_ms=3500), bq, None)
    assert isinstance(gap, Plan) and gap.gap == {T: {0: (30, 50), 1: (15, 25)}}


def test_empty_tables_are_refused() -> None:
    assert reason(plan(req(snapshot_id=1), None, KAFKA)) == "NothingCommitted"
    assert reason(plan(req(snapshot_id=1), TableFacts((), frozenset()), KAFKA)) == "NothingCommitted"


def test_kafka_unreadable_is_reported() -> None:
    assert reason(plan(req(snapshot_id=2), TABLE, None)) == "KafkaUnavailable"


# ------------------------------------------------------------------------------------------ Backfill

def test_backfill_of_a_range_the_table_lacks() -> None:
    table = history(entry((100, 110), (50, 60)), entry((110, 120), (60, 70)))
    p = plan(req("Backfill", from_={T: {0: 20, 1: 0}}, to={T: {0: 100, 1: 50}}), table,
             KafkaFacts({T: {0: 0, 1: 0}}, {T: {0: 120, 1: 70}}))
    assert isinstance(p, Plan) and p.records == 80 + 50 and p.replay_from == {T: {0: 20, 1: 0}}
    assert p.resume_offsets is None and p.target_snapshot is None


def test_backfill_overlapping_what_the_table_holds() -> None:
    f = plan(req("Backfill", from_={T: {0: 5, 1: 0}}, to={T: {0: 15, 1: 0}}), TABLE, KAFKA)
    assert reason(f) == "BackfillOverlap" and "orders[0] 5-10" in f.message  # type: ignore[union-attr]


def test_backfill_into_a_recorded_gap_is_not_an_overlap() -> None:
    table = history(entry((0, 10)), entry((10, 30), gap=True), entry((30, 40)))
    p = plan(req("Backfill", from_={T: {0: 10}}, to={T: {0: 30}}), table, KafkaFacts({T: {0: 0}}, {T: {0: 40}}))
    assert isinstance(p, Plan) and p.records == 20


def test_backfill_refusals() -> None:
    table = history(entry((100, 110)))
    kafka = KafkaFacts({T: {0: 10}}, {T: {0: 110}})
    assert reason(plan(req("Backfill", from_={T: {0: 0}}, to={T: {0: 50}}), table, kafka)) == "OffsetsDeleted"
    assert reason(plan(req("Backfill", from_={T: {0: 20}}, to={T: {0: 20}}), table, kafka)) == "NothingToBackfill"
    assert reason(plan(req("Backfill", from_={"x": {0: 0}}, to={"x": {0: 5}}), table, kafka)) == "UnknownTopic"
    ahead = KafkaFacts({T: {0: 0}}, {T: {0: 40}})
    assert reason(plan(req("Backfill", from_={T: {0: 20}}, to={T: {0: 60}}), history(entry((0, 10))), ahead)) \
        == "OffsetsNotWritten"


def test_backfill_is_planned_for_bigquery_too_and_its_overlap_refused() -> None:
    """BigQuery's facts are its ledger index's entries (`replay.bigquery_table`): the same rules as Iceberg's."""
    table = history(entry((100, 110)), entry((110, 120)))
    kafka = KafkaFacts({T: {0: 0}}, {T: {0: 120}})
    p = plan(req("Backfill", sink="bigquery", from_={T: {0: 0}}, to={T: {0: 100}}), table, kafka)
    assert isinstance(p, Plan) and p.records == 100 and p.replay_to == {T: {0: 100}}
    f = plan(req("Backfill", sink="bigquery", from_={T: {0: 90}}, to={T: {0: 105}}), table, kafka)
    assert reason(f) == "BackfillOverlap" and "orders[0] 100-105" in f.message  # type: ignore[union-attr]


def test_progress_counts_records_re_read_until_every_partition_passes_the_end() -> None:
    start, end = {T: {0: 20, 1: 10}}, {T: {0: 50, 1: 25}}
    assert progress(start, end, {T: {0: 20, 1: 10}}) == (0, False)
    assert progress(start, end, {T: {0: 35}}) == (15, False)
    assert progress(start, end, {T: {0: 50, 1: 24}}) == (44, False)
    assert progress(start, end, {T: {0: 61, 1: 30}}) == (45, True)


def test_a_partition_first_committed_after_the_target_restarting_elsewhere_is_refused() -> None:
    # p1 first committed in snapshot 2 from offset 7; the rollback to 1 leaves it out of the ledger, so the
    # restarted stream would start it at startingOffsets, not at 7.
    table = history(entry((0, 10)), entry((10, 20), (7, 9)), entry((20, 30), (9, 12)))
    for starting, kafka, effect in (
            ("latest", KafkaFacts({T: {0: 0, 1: 0}}, {T: {0: 30, 1: 12}}), "skipping the records to re-read"),
            ("earliest", KafkaFacts({T: {0: 0, 1: 3}}, {T: {0: 30, 1: 12}}), "records the table never held")):
        f = plan(req(snapshot_id=1, starting_offsets=starting), table, kafka)
        assert isinstance(f, Failure) and f.reason == "PartitionNewerThanTarget", f
        assert f"{T}[1] (first committed in snapshot 2, from offset 7" in f.message and effect in f.message
        assert "at or after snapshot 2" in f.message and "mode Rollback" in f.message
        # The fix the message names works: a target that keeps p1's first commit.
        assert isinstance(plan(req(snapshot_id=2, starting_offsets=starting), table, kafka), Plan)
        # Rollback re-reads nothing: the gap it records names p1, so the stream goes on from 12.
        assert isinstance(plan(req("Rollback", snapshot_id=1, starting_offsets=starting), table, kafka), Plan)


def test_the_newest_first_commit_is_the_target_named_when_several_partitions_are_new() -> None:
    def three(p0: tuple[int, int], p1: tuple[int, int] | None = None, p2: tuple[int, int] | None = None):
        parts = {0: p0, **({1: p1} if p1 else {}), **({2: p2} if p2 else {})}
        return LedgerEntry(HID, Q, {T: parts})
    table = history(three((0, 10)), three((10, 20), (4, 9)), three((20, 30), (9, 12), (5, 6)))
    f = plan(req(snapshot_id=1, starting_offsets="latest"), table,
             KafkaFacts({T: {0: 0, 1: 0, 2: 0}}, {T: {0: 30, 1: 12, 2: 6}}))
    assert isinstance(f, Failure) and "at or after snapshot 3" in f.message and f"{T}[2]" in f.message
