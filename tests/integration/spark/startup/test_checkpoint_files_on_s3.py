"""Handoff's own checkpoint files on S3 (`handoff_spark.checkpoint` over pyarrow's S3 file system), against the test
bed's moto server: what the driver reads from Spark's offset log and writes beside it must work on an `s3a://`
prefix exactly as on a volume. (Spark's side of the same checkpoint, through S3A, is the drill in
tests/e2e/test_object_store_checkpoint_drill.py.)"""
from __future__ import annotations

import uuid
from typing import Any

import pytest

from handoff_spark import checkpoint as ckpt
from handoff_spark import contract
from handoff_testbed.s3 import ACCESS_KEY, REGION, SECRET_KEY

from checkpoint_store_support import offset_log_reads_as_on_a_volume, side_files_round_trip


@pytest.fixture
def location(s3: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """An empty `s3a://` checkpoint with the environment the operator renders for it."""
    for name, value in {contract.ENV_CHECKPOINT_S3_ENDPOINT: s3.endpoint, contract.ENV_CHECKPOINT_S3_PATH_STYLE: "true",
                        contract.ENV_CHECKPOINT_S3_REGION: REGION, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                        "AWS_SECRET_ACCESS_KEY": SECRET_KEY}.items():
        monkeypatch.setenv(name, value)
    bucket = f"ckpt-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    return f"s3a://{bucket}/checkpoints/orders"


def _keys(s3: Any, location: str) -> list[str]:
    bucket, prefix = location.removeprefix("s3a://").split("/", 1)
    listed = s3.client().list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])
    return sorted(o["Key"][len(prefix) + 1:] for o in listed)


def _put(s3: Any, location: str, relative: str, text: str) -> None:
    """Write as Spark does (through S3A: another client than the module under test)."""
    bucket, prefix = location.removeprefix("s3a://").split("/", 1)
    s3.client().put_object(Bucket=bucket, Key=f"{prefix}/{relative}", Body=text.encode())


def test_spark_offset_log_on_s3_reads_as_on_a_volume(s3: Any, location: str) -> None:
    offset_log_reads_as_on_a_volume(location, lambda relative, text: _put(s3, location, relative, text))


def test_side_files_and_discard_on_s3(s3: Any, location: str) -> None:
    side_files_round_trip(location)
    _put(s3, location, "offsets/0", 'v1\n{}\n{"orders":{"0":10}}\n')
    _put(s3, location, "metadata", '{"id":"q-1"}')
    assert "sources/handoff-gaps.jsonl" in _keys(s3, location)
    removed = ckpt.discard(location)
    assert set(removed) == {"metadata", "offsets", "sources", "handoff"}
    # at most the prefix's own directory marker is left (pyarrow keeps the parent "directory"; S3A reads it as one)
    assert [k for k in _keys(s3, location) if k] == []
    assert ckpt.resume_point(location).empty


def test_a_backfill_checkpoint_sits_beside_the_streams_on_s3() -> None:
    assert ckpt.sibling("s3a://lake/checkpoints/orders", "bf-1-checkpoint") == "s3a://lake/checkpoints/bf-1-checkpoint"
    assert ckpt.sibling("file:///var/lib/handoff/checkpoint", "bf-checkpoint") == "/var/lib/handoff/bf-checkpoint"
