"""The seed's start after a lost checkpoint (pure): the ledger batches within the dedupe's window, clamped to Kafka."""
from __future__ import annotations

from handoff_spark import checkpoint as ckpt
from handoff_spark.config import AppConfig
from handoff_spark.driver.seed import seed_start
from handoff_spark.ledger import Commit


def cfg(tmp_path):
    return AppConfig.model_validate({
        "handoffId": "ns/h", "source": {"bootstrapServers": "127.0.0.1:1", "topics": ["t"]},
        "sink": {"kind": "iceberg", "table": "db.t"}, "checkpointLocation": str(tmp_path / "ck"),
        "deadLetterTopic": "dlq", "dedupe": {"keys": ["id"], "withinSeconds": 60},
        "schema": {"columns": [{"name": "id", "type": "long"}]}})


def commit(batch: int, ranges: dict[int, tuple[int, int]], newest_ms: int | None, query: str = "handoff") -> Commit:
    return Commit(snapshot_id=batch, timestamp_ms=0, handoff_id="ns/h", query=query, batch_id=batch,
                  offsets={"t": ranges}, rows=1, dlq_rows=0, max_event_time_ms=newest_ms)


def test_the_seed_starts_at_the_first_batch_within_the_window(tmp_path):
    commits = [commit(3, {0: (300, 400), 1: (30, 40)}, 200_000), commit(2, {0: (200, 300), 1: (20, 30)}, 150_000),
               commit(1, {0: (100, 200), 1: (10, 20)}, 130_000), commit(0, {0: (0, 100), 1: (0, 10)}, 60_000)]
    end = {("t", 0): 400, ("t", 1): 40}
    # the window: 200 s - 60 s = 140 s; batch 1 (newest 130 s) is wholly before it
    assert seed_start(cfg(tmp_path), end, commits, {}) == {("t", 0): 200, ("t", 1): 20}
    # what Kafka no longer holds is not asked for; a partition whose seed would be empty is left out
    assert seed_start(cfg(tmp_path), end, commits, {("t", 0): 250, ("t", 1): 40}) == {("t", 0): 250}


def test_no_event_times_or_another_querys_batches_mean_no_seed(tmp_path):
    end = {("t", 0): 100}
    assert seed_start(cfg(tmp_path), end, [commit(0, {0: (0, 100)}, None)], {}) == {}
    assert seed_start(cfg(tmp_path), end, [commit(0, {0: (0, 100)}, 5, query="backfill-1")], {}) == {}


def test_the_seed_line_round_trips_through_the_checkpoint(tmp_path):
    (tmp_path / "ck" / "sources").mkdir(parents=True)
    line = {("t", 0): 400, ("u", 3): 7}
    ckpt.write_seed_line(str(tmp_path / "ck"), line)
    assert ckpt.read_seed_line(str(tmp_path / "ck")) == line
    assert ckpt.parse_seed_line(ckpt.seed_line_json(line)) == line
