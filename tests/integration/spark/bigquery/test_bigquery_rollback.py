"""A BigQuery table rolled back to a ledger entry, against the BigQuery emulator: batches committed by the sink's
own write/commit path, then the undo point (CREATE SNAPSHOT TABLE) and the one-transaction delete of the rows and
ledger rows past the entry (handoff_spark.bigquery.rollback)."""
from __future__ import annotations

import pytest

from handoff_spark.bigquery import client as bigquery_client, ledger as bigquery_ledger, rollback, sink

from bq_common import table_counts
from bq_support import bq_config
from sink_support import raw_batch, record, write_offsets

pytestmark = [pytest.mark.bigquery, pytest.mark.kafka]


def _rows(cfg) -> list[tuple[int, int]]:
    client = bigquery_client.rest_client(cfg.sink)
    sql = f"SELECT _kafka_partition AS p, _kafka_offset AS o FROM `{bigquery_client.table_ref(cfg.sink)}`"
    return sorted((int(r["p"]), int(r["o"])) for r in client.query(sql).result())


def test_rollback_deletes_exactly_the_rows_and_ledger_rows_past_the_target_once(bigquery, kafka, tmp_path):
    topic = "bq-rollback-1"
    kafka.create_topic(topic, partitions=2)
    cfg = bq_config(tmp_path, bigquery, kafka.bootstrap, topic)
    plan = sink.prepare(cfg)
    cp = tmp_path / "checkpoint"
    ends = {0: 0, 1: 0}
    for b in range(4):   # four batches: p0 +10 each, p1 +5 each
        write_offsets(cp, b, {topic: {"0": ends[0] + 10, "1": ends[1] + 5}},
                      initial={topic: {"0": 0, "1": 0}} if b == 0 else None)
        msgs = [sink.write_partition(cfg, plan, iter([raw_batch(topic, 0, ends[0], [record(i) for i in range(10)])]), b),
                sink.write_partition(cfg, plan, iter([raw_batch(topic, 1, ends[1], [record(i) for i in range(5)])]), b)]
        assert not sink.commit_batch(cfg, msgs, b).skipped
        ends = {0: ends[0] + 10, 1: ends[1] + 5}
    assert table_counts(cfg) == (60, 60)
    commits = [c for c in bigquery_ledger.list_commits(cfg.sink, cfg.handoff_id) if c.batch_id >= 0]
    assert [c.batch_id for c in commits] == [3, 2, 1, 0]
    target = commits[2]                       # batch 1: the table keeps p0 < 20, p1 < 10
    cut = {topic: {0: 20, 1: 10}}

    rows, size = rollback.rows_past(cfg.sink, cut)
    # each row: its Kafka coordinates and batch id (INT64s, a STRING topic) and the declared columns, sized as
    # BigQuery sizes values (the emulator's numBytes is 0, as BigQuery's is for rows in the streaming buffer)
    assert rows == 30 and size >= 30 * (4 * 8 + 2 + len(topic))
    name = rollback.undo_name(cfg.sink, "ns", "rewind-1")
    assert name == "events__handoff_undo_ns_rewind_1"
    assert rollback.create_undo_point(cfg.sink, name) is True
    assert rollback.create_undo_point(cfg.sink, name) is False       # there already: not made again
    assert rollback.undo_point_exists(cfg.sink, name)

    rollback.rollback(cfg.sink, cfg.handoff_id, cfg.query_name, cut, rollback.entry_key(target))
    assert _rows(cfg) == sorted([(0, o) for o in range(20)] + [(1, o) for o in range(10)])
    left = [c.batch_id for c in bigquery_ledger.list_commits(cfg.sink, cfg.handoff_id)]
    assert left == [1, 0]
    assert bigquery_ledger.resume_offsets(cfg.sink, cfg.handoff_id) == cut

    # Run again (an operator restarted before recording the step): nothing more goes.
    rollback.rollback(cfg.sink, cfg.handoff_id, cfg.query_name, cut, rollback.entry_key(target))
    assert table_counts(cfg) == (30, 30)
    assert [c.batch_id for c in bigquery_ledger.list_commits(cfg.sink, cfg.handoff_id)] == [1, 0]

    # The undo point still holds the table as it was before the rollback, ledger included.
    client = bigquery_client.rest_client(cfg.sink)
    undo = bigquery_client.table_ref(cfg.sink, name)
    assert int(list(client.query(f"SELECT COUNT(*) AS n FROM `{undo}`").result())[0]["n"]) == 60
    undo_ledger = bigquery_client.table_ref(cfg.sink, name + bigquery_ledger.LEDGER_SUFFIX)
    assert int(list(client.query(f"SELECT COUNT(*) AS n FROM `{undo_ledger}`").result())[0]["n"]) == 4


def test_dml_refusals_that_are_worth_waiting_for_are_told_apart() -> None:
    assert rollback.dml_refusal(RuntimeError("UPDATE or DELETE statement over table x would affect rows in the "
                                             "streaming buffer, which is not supported"))
    assert rollback.dml_refusal(RuntimeError("Could not serialize access to table x due to concurrent update"))
    assert rollback.dml_refusal(RuntimeError("Syntax error: Unexpected keyword")) is None
