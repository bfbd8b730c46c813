"""What every object-store checkpoint must do as a volume does, shared by the S3 and GCS tests
(tests/integration/spark/startup/test_checkpoint_files_on_*.py): each passes its location and a way to write an
object as Spark's connector would (another client than `handoff_spark.checkpoint`)."""
from __future__ import annotations

from typing import Callable

from handoff_spark import checkpoint as ckpt

Put = Callable[[str, str], None]  # (path relative to the checkpoint, text)


def offset_log_reads_as_on_a_volume(location: str, put: Put) -> None:
    """Spark's offset and commit logs, written by `put`, give the batch ranges and the resume point."""
    assert ckpt.resume_point(location).empty  # nothing there yet: no error, no position
    ckpt.write_initial_offsets(location, {"orders": {"0": 5, "1": 7}})
    put("metadata", '{"id":"q-1"}')
    put("offsets/0", 'v1\n{"batchWatermarkMs":0}\n{"orders":{"0":10,"1":12}}\n')
    put("offsets/1", 'v1\n{"batchWatermarkMs":0}\n{"orders":{"0":20,"1":22}}\n')
    put("commits/0", "v1\n{}\n")
    assert ckpt.batch_range(location, 0) == {("orders", 0): (5, 10), ("orders", 1): (7, 12)}
    assert ckpt.batch_range(location, 1) == {("orders", 0): (10, 20), ("orders", 1): (12, 22)}
    point = ckpt.resume_point(location)
    assert (point.query_id, point.pending_batch, point.next_start) == ("q-1", 1, {("orders", 0): 10, ("orders", 1): 12})
    assert ckpt.latest_planned_batch(location) == (1, 0)


def side_files_round_trip(location: str) -> None:
    """Handoff's own files beside Spark's: written, read back, the later gap winning, frame stats cleared."""
    ckpt.write_initial_offsets(location, {"orders": {"0": 0}})
    ckpt.write_kafka_identity(location, {"cluster": "c-1"})
    ckpt.write_last_commit(location, {"batch_id": 3, "rows": 9})
    ckpt.append_gap(location, {"topic": "orders", "partition": 0, "from": 4, "to": 6})
    ckpt.append_gap(location, {"topic": "orders", "partition": 0, "from": 8, "to": 9})
    assert ckpt.write_frame_stats(location, 3, "orders-0-0-10", {"rows": 10})
    assert ckpt.read_kafka_identity(location) == {"cluster": "c-1"}
    assert ckpt.read_commit(location, 3) == {"batch_id": 3, "rows": 9}
    assert ckpt.gaps_in(location, {("orders", 0): (0, 10)}) == {"orders": {"0": [8, 9]}}  # the later gap wins
    assert ckpt.read_frame_stats(location, 3) == [{"rows": 10}]
    ckpt.clear_frame_stats(location, up_to=3)
    assert ckpt.read_frame_stats(location, 3) == []
