"""A BigQuery Backfill's commit and start checks against the emulator and real Kafka, without Spark (the sink's
own write and commit, as the driver calls them): what `tests/e2e/test_bigquery_backfill.py` cannot reach from the
command line.

- a backfill's ledger-index row is not best effort: when it cannot be written the batch fails (the stream's goes
  on, its row kept in the checkpoint and written by its next commit), and the batch's replay skips the data commit
  and writes the row; the backfill then resumes after it;
- the start check refuses a range the data table holds even when no index row says so (a crash between a data
  commit and its index row), naming the rows.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from google.cloud import bigquery as bq

from handoff_spark import checkpoint as ckpt
from handoff_spark.__main__ import backfill_config
from handoff_spark.bigquery import client as bigquery_client, ledger as bigquery_ledger

from bq_common import table_counts
from bq_support import bq_config
from sink_support import raw_batch, record, write_offsets

pytestmark = [pytest.mark.kafka, pytest.mark.bigquery]


def _commit(cfg, plan, batch_id: int, topic: str, start: int, end: int):
    from handoff_spark.bigquery import sink

    write_offsets(Path(cfg.checkpoint_location), batch_id, {topic: {"0": end}},
                  initial={topic: {"0": start}} if batch_id == 0 else None)
    batch = [raw_batch(topic, 0, start, [record(i) for i in range(start, end)])]
    return sink.commit_batch(cfg, [sink.write_partition(cfg, plan, iter(batch), batch_id)], batch_id)


def test_a_backfill_batch_without_its_index_row_fails_and_its_replay_writes_it(bigquery, kafka, tmp_path):
    from handoff_spark.bigquery import sink

    topic = "bq-backfill-index"
    kafka.create_topic(topic, partitions=1)
    stream = bq_config(tmp_path / "stream", bigquery, kafka.bootstrap, topic, handoffId="ns/fill")
    plan = sink.prepare(stream)
    assert _commit(stream, plan, 0, topic, 100, 130).rows == 30  # the stream started at 100
    fill = backfill_config(stream, "backfill-x", {topic: {"0": 0}}, {topic: {"0": 100}}, str(tmp_path / "fill-cp"))
    assert sink.backfill_overlap(fill) == []

    # the ledger index cannot take a row now: its `offsets` column is replaced by one of another type
    client = bigquery_client.rest_client(stream.sink)
    ref = bigquery_client.table_ref(stream.sink, bigquery_ledger.ledger_table(stream.sink))
    kept = client.get_table(ref)
    client.delete_table(ref)
    client.create_table(bq.Table(ref, schema=[f if f.name != "offsets" else bq.SchemaField("offsets", "INT64")
                                             for f in kept.schema]))
    with pytest.raises(sink.BatchCommitError, match="ledger-index row could not be written"):
        _commit(fill, plan, 0, topic, 0, 50)
    assert table_counts(stream) == (80, 80)  # the data commit stands
    # (the stream's own batch would go on without it: the index is best effort there)
    assert _commit(stream, plan, 1, topic, 130, 140).rows == 10

    client.delete_table(ref)  # the index takes rows again; Spark replays the failed batch
    sink._known_committed.clear()
    replayed = _commit(fill, plan, 0, topic, 0, 50)
    assert replayed.skipped and table_counts(stream) == (90, 90)
    entries = bigquery_ledger.list_commits(stream.sink, stream.handoff_id)
    assert bigquery_ledger.ends(entries, {}, "backfill-x") == {topic: {0: 50}}
    assert sink.ledger_end(fill) == {(topic, 0): 50} and sink.backfill_overlap(fill) == []  # resumes after it
    assert not _commit(fill, plan, 1, topic, 50, 100).skipped
    assert table_counts(stream) == (140, 140)

    # The stream's batch 1 went on without its index row, which was kept in its checkpoint; the stream's next commit
    # writes it, so the index has no hole where BigQuery was briefly unavailable.
    assert [r["batch_id"] for r in ckpt.read_unindexed(stream.checkpoint_location)] == [1]
    _commit(stream, plan, 2, topic, 140, 150)
    indexed = {c.batch_id: c.offsets[topic][0] for c in bigquery_ledger.list_commits(stream.sink, stream.handoff_id)
               if c.query == stream.query_name}
    assert indexed == {1: (130, 140), 2: (140, 150)}  # batch 0's row went with the replaced table
    assert ckpt.read_unindexed(stream.checkpoint_location) == []


def test_the_start_check_names_rows_no_index_row_covers(bigquery, kafka, tmp_path):
    from handoff_spark.bigquery import sink

    topic = "bq-backfill-rows"
    kafka.create_topic(topic, partitions=1)
    stream = bq_config(tmp_path / "stream", bigquery, kafka.bootstrap, topic, handoffId="ns/rows")
    plan = sink.prepare(stream)
    assert _commit(stream, plan, 0, topic, 20, 30).rows == 10
    # a crash between the data commit and its index row: the rows are there, no entry says so
    client = bigquery_client.rest_client(stream.sink)
    client.delete_table(bigquery_client.table_ref(stream.sink, bigquery_ledger.ledger_table(stream.sink)))
    fill = backfill_config(stream, "backfill-y", {topic: {"0": 0}}, {topic: {"0": 25}}, str(tmp_path / "fill-cp"))
    assert sink.backfill_overlap(fill) == [f"{topic}[0] has 5 rows in the data table at offsets 20..24"]
    below = backfill_config(stream, "backfill-z", {topic: {"0": 0}}, {topic: {"0": 20}}, str(tmp_path / "z-cp"))
    assert sink.backfill_overlap(below) == []
