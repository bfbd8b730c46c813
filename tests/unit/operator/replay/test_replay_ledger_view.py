"""The replay controller's view of a BigQuery table (pure halves of `replay.ledger_view`): the ledger index's
entries as the planner's ancestry, and where one ledger query stands."""
from __future__ import annotations

from handoff_spark.ledger import BATCH, EPOCH, GAP, Commit

from handoff_operator.replay.ledger_view import bigquery_facts, query_offsets
from handoff_operator.replay.plan import KafkaFacts, Plan, Request, plan

HID, T = "shop/orders", "orders"


def commit(at_ms: int, start: int, end: int, query: str = "handoff", kind: str = BATCH, topic_id: str | None = "A",
           commit_us: int | None = None, hid: str = HID) -> Commit:
    return Commit(snapshot_id=commit_us if commit_us is not None else (at_ms * 1000 if kind == BATCH else None),
                  timestamp_ms=at_ms, handoff_id=hid, query=query, batch_id=-1 if kind != BATCH else at_ms,
                  offsets={T: {0: (start, end)}}, rows=end - start if kind == BATCH else 0, dlq_rows=0,
                  max_event_time_ms=None, kind=kind, topic_ids={T: topic_id} if topic_id else None)


def test_index_entries_become_the_ancestry_newest_first_markers_as_gaps() -> None:
    commits = [commit(3000, 20, 30), commit(2000, 10, 20, kind=GAP), commit(1000, 0, 10)]
    facts = bigquery_facts(commits)
    assert facts is not None and facts.head == 3_000_000
    assert [s.snapshot_id for s in facts.ancestry] == [3_000_000, 2_000_000, 1_000_000]  # a marker: recorded time
    assert [s.entry.gap for s in facts.ancestry if s.entry] == [False, True, False]
    assert bigquery_facts([]) is None  # nothing committed: the plan says NothingCommitted


def test_a_backfill_into_a_gap_plans_and_over_a_batch_is_refused() -> None:
    facts = bigquery_facts([commit(3000, 20, 30), commit(2000, 10, 20, kind=GAP), commit(1000, 0, 10)])
    kafka = KafkaFacts({T: {0: 0}}, {T: {0: 30}})
    ok = plan(Request("Backfill", HID, "handoff", (T,), sink="bigquery", from_={T: {0: 10}}, to={T: {0: 20}}),
              facts, kafka)
    assert isinstance(ok, Plan) and ok.records == 10
    refused = plan(Request("Backfill", HID, "handoff", (T,), sink="bigquery", from_={T: {0: 5}}, to={T: {0: 20}}),
                   facts, kafka)
    assert not isinstance(refused, Plan) and refused.reason == "BackfillOverlap"


def test_entries_of_a_topic_before_its_epoch_hold_nothing_of_the_new_topic() -> None:
    """Offsets 0..50 of the old topic are not the recreated topic's: a backfill of the new one's 0..50 plans."""
    commits = [commit(3000, 0, 0, kind=EPOCH, topic_id="B"), commit(1000, 0, 50, topic_id="A")]
    facts = bigquery_facts(commits)
    assert facts is not None
    p = plan(Request("Backfill", HID, "handoff", (T,), sink="bigquery", from_={T: {0: 0}}, to={T: {0: 50}}),
             facts, KafkaFacts({T: {0: 0}}, {T: {0: 80}}))
    assert isinstance(p, Plan) and p.records == 50


def test_query_offsets_follow_one_query_of_one_handoff() -> None:
    commits = [commit(4000, 30, 40, query="backfill-x"), commit(3000, 90, 95), commit(2000, 20, 30, query="backfill-x"),
               commit(1000, 20, 99, query="backfill-x", hid="other/handoff")]
    assert query_offsets(commits, HID, "backfill-x") == {T: {0: 40}}
    assert query_offsets(commits, HID, "handoff") == {T: {0: 95}}
    assert query_offsets(commits, HID, "backfill-y") == {}
