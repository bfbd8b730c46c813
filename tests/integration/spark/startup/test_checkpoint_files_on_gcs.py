"""Handoff's own checkpoint files on Google Cloud Storage (`handoff_spark.checkpoint` over pyarrow's GCS file system),
against the test bed's fake-gcs-server: what the driver reads from Spark's offset log and writes beside it must
work on a `gs://` prefix exactly as on a volume or S3. The offset log here is written by another client (the JSON
API's media upload, as Spark's GCS connector does), with and without the directory marker objects the connector
leaves (`offsets/`), which pyarrow's one-level listing depends on. (Spark's side of the same checkpoint is the
drill in tests/e2e/test_gcs_checkpoint_drill.py.)"""
from __future__ import annotations

import uuid
from typing import Any

import pytest

from handoff_spark import checkpoint as ckpt
from handoff_spark import contract

from checkpoint_store_support import offset_log_reads_as_on_a_volume, side_files_round_trip


@pytest.fixture
def location(gcs: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """An empty `gs://` checkpoint with the environment the operator renders for spec.checkpoint {endpoint,
    anonymous}."""
    monkeypatch.setenv(contract.ENV_CHECKPOINT_GCS_ENDPOINT, gcs.endpoint)
    monkeypatch.setenv(contract.ENV_CHECKPOINT_GCS_ANONYMOUS, "true")
    bucket = f"ckpt-{uuid.uuid4().hex[:8]}"
    gcs.create_bucket(bucket)
    return f"gs://{bucket}/checkpoints/orders"


def _split(location: str) -> tuple[str, str]:
    bucket, prefix = location.removeprefix("gs://").split("/", 1)
    return bucket, prefix + "/"


@pytest.mark.parametrize("markers", [False, True], ids=["no-markers", "connector-markers"])
def test_spark_offset_log_on_gcs_reads_as_on_a_volume(gcs: Any, location: str, markers: bool) -> None:
    bucket, prefix = _split(location)
    if markers:
        for marker in ("", "offsets/", "commits/", "sources/"):
            gcs.put_object(bucket, prefix + marker, "")
    offset_log_reads_as_on_a_volume(location, lambda relative, text: gcs.put_object(bucket, prefix + relative, text))

    removed = ckpt.discard(location)
    assert set(removed) == {"metadata", "offsets", "commits", "sources"}
    # at most the checkpoint's own directory marker stays (the directory itself is kept, as a volume's mount point)
    assert [k for k in gcs.list_objects(bucket, prefix) if k] == [], "discard left objects (or markers) behind"
    assert ckpt.resume_point(location).empty


def test_side_files_and_discard_on_gcs(gcs: Any, location: str) -> None:
    bucket, prefix = _split(location)
    side_files_round_trip(location)
    assert "sources/handoff-gaps.jsonl" in gcs.list_objects(bucket, prefix)
    gcs.put_object(bucket, prefix + "offsets/0", 'v1\n{}\n{"orders":{"0":10}}\n')
    gcs.put_object(bucket, prefix + "metadata", '{"id":"q-1"}')
    removed = ckpt.discard(location)
    assert set(removed) == {"metadata", "offsets", "sources", "handoff"}
    assert gcs.list_objects(bucket, prefix) == []
    assert ckpt.resume_point(location).empty


def test_a_backfill_checkpoint_sits_beside_the_streams_on_gcs() -> None:
    assert ckpt.sibling("gs://lake/checkpoints/orders", "bf-1-checkpoint") == "gs://lake/checkpoints/bf-1-checkpoint"


def test_a_gcs_location_without_a_bucket_is_refused_naming_the_form() -> None:
    with pytest.raises(ckpt.CheckpointLocationError, match=r"gs://<bucket>/<prefix>"):
        ckpt.files("gs:///orders")
