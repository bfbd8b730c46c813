"""The BigQuery sink's DataFrame path, the parts that need neither BigQuery nor Kafka: which source row a rejected
row's dead letter is made of (records by Kafka coordinates, Spark rows by position), a BigQuery row error mapped
back through rows the sink itself rejected, a row dead letter's JSON value, and the start's view of a pending batch
whose last records left no row (`_with_landed_pending_batch`)."""
from __future__ import annotations

import datetime as dt
import decimal
import json
from pathlib import Path

import pyarrow as pa
import pytest

from handoff_spark.bigquery import sink
from handoff_spark.config import AppConfig
from handoff_spark.sink.dead_letters import row_values

TOPIC = "orders"


def _rows(offsets: list[int], partition: int = 0) -> pa.Table:
    n = len(offsets)
    return pa.table({"id": pa.array([o * 10 for o in offsets], pa.int64()),
                     "_kafka_topic": pa.array([TOPIC] * n), "_kafka_partition": pa.array([partition] * n, pa.int32()),
                     "_kafka_offset": pa.array(offsets, pa.int64())})


def _raw(offsets: list[int]) -> pa.Table:
    return pa.table({"topic": pa.array([TOPIC] * len(offsets)), "partition": pa.array([0] * len(offsets), pa.int32()),
                     "offset": pa.array(offsets, pa.int64())})


def test_nth_kept_skips_the_rows_the_sink_rejected():
    assert [sink._nth_kept(n, []) for n in range(3)] == [0, 1, 2]
    # positions 1 and 2 rejected: the kept rows are 0, 3, 4, 5 ...
    assert [sink._nth_kept(n, [1, 2]) for n in range(4)] == [0, 3, 4, 5]
    assert [sink._nth_kept(n, [0, 4]) for n in range(4)] == [1, 2, 3, 5]


def test_a_records_dead_letter_points_at_its_raw_record_by_kafka_coordinates():
    raw = _raw([10, 11, 12, 13])  # record 11 did not decode: the decoded rows skip it
    chunk = sink._Chunk(raw, _rows([10, 12, 13]))
    (dead,) = chunk.dead([(1, "column 'id': not an integer")], "type-mismatch")
    assert (dead.index, dead.offset, dead.reason) == (2, 12, "type-mismatch")


def test_a_rows_dead_letter_points_at_its_row_by_position_even_when_a_transform_repeats_a_record():
    rows = _rows([10, 10, 11])  # a join made two rows of record 10
    chunk = sink._Chunk(rows, rows, by_position=True)
    dead = chunk.dead([(1, "BigQuery row error: x"), (2, "y")], "rejected-by-bigquery")
    assert [(d.index, d.offset, d.partition, d.topic) for d in dead] == [(1, 10, 0, TOPIC), (2, 11, 0, TOPIC)]
    assert [d.detail for d in dead] == ["BigQuery row error: x", "y"]


def test_a_row_dead_letters_value_is_the_row_as_json():
    rows = pa.table({"id": pa.array([1, 2], pa.int64()),
                     "ts": pa.array([dt.datetime(2026, 3, 1, 12, tzinfo=dt.timezone.utc), None],
                                    pa.timestamp("us", tz="UTC")),
                     "blob": pa.array([b"\x00\x01", None], pa.binary()),
                     "price": pa.array([decimal.Decimal("1.10"), None], pa.decimal128(6, 2)),
                     "day": pa.array([dt.date(2026, 3, 1), None], pa.date32())})
    first, second = (json.loads(v) for v in row_values(rows, [0, 1]))
    assert first == {"id": 1, "ts": "2026-03-01T12:00:00+00:00", "blob": "AAE=", "price": "1.10", "day": "2026-03-01"}
    assert second == {"id": 2, "ts": None, "blob": None, "price": None, "day": None}
    assert list(first) == ["id", "ts", "blob", "price", "day"]  # the table's column order


# ------------------------------------------------------------------ the start and a pending batch's filtered tail

def _cfg(tmp_path: Path) -> AppConfig:
    return AppConfig.model_validate({
        "handoffId": "ns/rows", "source": {"bootstrapServers": "127.0.0.1:1", "topics": [TOPIC]},
        "sink": {"kind": "bigquery", "project": "p", "dataset": "d", "table": "t"},
        "schema": {"columns": [{"name": "id", "type": "long"}], "onIncompatible": "halt"},
        "checkpointLocation": str(tmp_path / "checkpoint")})


def _offsets(cp: Path, batch_id: int, end: dict[str, int], initial: dict[str, int] | None = None) -> None:
    (cp / "offsets").mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}}
    (cp / "offsets" / str(batch_id)).write_text(f"v1\n{json.dumps(meta)}\n{json.dumps({TOPIC: end})}")
    if initial is not None:
        (cp / "sources").mkdir(parents=True, exist_ok=True)
        (cp / "sources" / "handoff-initial.json").write_text(json.dumps({TOPIC: initial}))


def _commit(cp: Path, batch_id: int) -> None:
    (cp / "commits").mkdir(parents=True, exist_ok=True)
    (cp / "commits" / str(batch_id)).write_text('v1\n{"nextBatchWatermarkMs":0}')


class ReplayCheck:
    """The replay check's query (`rows_in_range`), answered with `present`; `calls`: the ranges it was asked."""

    def __init__(self) -> None:
        self.present = 0
        self.calls: list[dict] = []

    def rows_in_range(self, client, ref, ranges, topic_ids=None) -> int:
        self.calls.append(dict(ranges))
        return self.present


@pytest.fixture()
def asked(monkeypatch: pytest.MonkeyPatch) -> ReplayCheck:
    check = ReplayCheck()
    monkeypatch.setattr(sink.bigquery_client, "rest_client", lambda s: object())
    monkeypatch.setattr(sink, "current_topic_ids", lambda cfg: {})
    monkeypatch.setattr(sink, "rows_in_range", check.rows_in_range)
    return check


def test_a_pending_batch_in_the_table_without_its_index_row_moves_the_end_to_the_batch_end(tmp_path, asked):
    cfg = _cfg(tmp_path)
    cp = tmp_path / "checkpoint"
    _offsets(cp, 0, {"0": 100, "1": 50}, initial={"0": 0, "1": 0})
    _commit(cp, 0)
    _offsets(cp, 1, {"0": 200, "1": 80})  # batch 1 = [100, 200) and [50, 80), planned, not marked done
    asked.present = 70
    # the data table ends at 180 on partition 0 (records 180..199 filtered) and 50 on partition 1 (all filtered)
    end = {(TOPIC, 0): 180, (TOPIC, 1): 50}
    assert sink._with_landed_pending_batch(cfg, end) == {(TOPIC, 0): 200, (TOPIC, 1): 80}
    assert asked.calls == [{(TOPIC, 0): (100, 200), (TOPIC, 1): (50, 80)}]


def test_a_pending_batch_not_in_the_table_leaves_the_end(tmp_path, asked):
    cfg = _cfg(tmp_path)
    cp = tmp_path / "checkpoint"
    _offsets(cp, 0, {"0": 100}, initial={"0": 0})
    _commit(cp, 0)
    _offsets(cp, 1, {"0": 200})
    end = {(TOPIC, 0): 150}
    asked.present = 0
    assert sink._with_landed_pending_batch(cfg, end) == end and len(asked.calls) == 1


@pytest.mark.parametrize("end", [{(TOPIC, 0): 100}, {(TOPIC, 0): 200}, {(TOPIC, 0): 250}, {}],
                         ids=["at-the-start", "at-the-end", "past-the-end", "unknown"])
def test_no_question_when_the_table_does_not_end_inside_the_pending_batch(tmp_path, asked, end):
    cfg = _cfg(tmp_path)
    cp = tmp_path / "checkpoint"
    _offsets(cp, 0, {"0": 100}, initial={"0": 0})
    _commit(cp, 0)
    _offsets(cp, 1, {"0": 200})
    asked.present = 5
    assert sink._with_landed_pending_batch(cfg, end) == end and not asked.calls


def test_no_question_without_a_pending_batch(tmp_path, asked):
    cfg = _cfg(tmp_path)
    cp = tmp_path / "checkpoint"
    _offsets(cp, 0, {"0": 100}, initial={"0": 0})
    _commit(cp, 0)
    assert sink._with_landed_pending_batch(cfg, {(TOPIC, 0): 90}) == {(TOPIC, 0): 90} and not asked.calls
    assert sink._with_landed_pending_batch(_cfg(tmp_path / "none"), {}) == {}


# ------------------------------------------------------------------ the driver's check at start

def test_the_driver_takes_a_transform_on_bigquery_but_refuses_its_lookups(tmp_path):
    from handoff_spark.driver import transform

    assert "bigquery" in transform.ROWS_SINKS
    doc = json.loads(_cfg(tmp_path).to_json())
    doc.update({"deadLetterTopic": "dlq", "transform": {"sql": "SELECT * FROM source",
                                                         "lookups": [{"name": "c", "table": "crm.customers"}]}})
    with pytest.raises(transform.TransformInvalid) as refused:
        transform.check(None, AppConfig.model_validate(doc))  # refused before Spark is asked anything
    assert str(refused.value).startswith("TransformInvalid: spec.transform.lookups:")
    assert "BigQuery lookups are not built" in str(refused.value)
