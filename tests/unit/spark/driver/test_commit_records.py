"""The driver's progress reporter finds each batch's commit record, even when the next batch committed before it
polled (seen in the full suite: an AvailableNow run's batch 1 took 0.4 s after a 14 s batch 0, and batch 0's
console line and progress record came out without its snapshot)."""
from __future__ import annotations

from pathlib import Path

from handoff_spark import checkpoint as ckpt


def test_a_batchs_record_is_found_after_later_batches_committed(tmp_path: Path) -> None:
    location = str(tmp_path / "ck")
    for batch in range(3):
        ckpt.write_last_commit(location, {"batch_id": batch, "snapshot_id": 100 + batch})
    assert ckpt.read_last_commit(location) == {"batch_id": 2, "snapshot_id": 102}
    assert ckpt.read_commit(location, 0) == {"batch_id": 0, "snapshot_id": 100}
    assert ckpt.read_commit(location, 2) == {"batch_id": 2, "snapshot_id": 102}
    assert ckpt.read_commit(location, 7) is None


def test_the_recent_records_are_bounded_and_a_replayed_batch_keeps_one(tmp_path: Path) -> None:
    location = str(tmp_path / "ck")
    for batch in range(ckpt.RECENT_COMMITS + 10):
        ckpt.write_last_commit(location, {"batch_id": batch, "snapshot_id": batch})
    ckpt.write_last_commit(location, {"batch_id": ckpt.RECENT_COMMITS + 9, "snapshot_id": -1, "skipped": True})
    recent = ckpt.read_json(location, ckpt.RECENT_COMMITS_FILE)
    assert len(recent) == ckpt.RECENT_COMMITS
    assert [r["batch_id"] for r in recent].count(ckpt.RECENT_COMMITS + 9) == 1
    assert ckpt.read_commit(location, 5) is None  # fell out of the window
    assert ckpt.read_commit(location, ckpt.RECENT_COMMITS + 9)["skipped"] is True
