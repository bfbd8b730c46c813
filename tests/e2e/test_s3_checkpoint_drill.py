"""The object-store checkpoint drill: the real driver with its checkpoint on S3 (the test bed's moto server, through
Spark's S3A file system and hadoop-aws), kill -9 mid-stream, the checkpoint's prefix deleted, a restart. Losing an
S3 checkpoint must behave exactly like losing a PVC (test_ledger_resume): the table's ledger decides where the new
query starts, and rows == distinct (partition, offset) == produced.

The bucket is listed after each run, so the drill fails if the checkpoint silently went somewhere else (a local
directory named like the URI, another bucket)."""
from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from handoff_spark import checkpoint as ckpt
from handoff_spark import contract
from handoff_spark.iceberg import ledger
from handoff_spark.iceberg.sink import open_table
from handoff_testbed.jars import hadoop_aws_jars
from handoff_testbed.s3 import ACCESS_KEY, REGION, SECRET_KEY

from iceberg_drill_support import assert_exactly_once, drill_config, produce, run_app, run_to_completion

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]


def _keys(s3: Any, bucket: str, prefix: str) -> list[str]:
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"][len(prefix):] for page in pages for o in page.get("Contents", []))


def test_s3_checkpoint_lost_after_kill9_resumes_from_the_ledger(kafka, s3, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    topic = "s3-ckpt-lost"
    kafka.create_topic(topic, partitions=3)
    bucket = f"ckpt-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    prefix = f"checkpoints/{topic}/"
    # What the operator renders into the driver pod for spec.checkpoint {location, endpoint, pathStyleAccess,
    # credentialsSecret}; the jars the image has in pyspark/jars come from the test bed's copy here.
    env = {contract.ENV_CHECKPOINT_S3_ENDPOINT: s3.endpoint, contract.ENV_CHECKPOINT_S3_PATH_STYLE: "true",
           contract.ENV_CHECKPOINT_S3_REGION: REGION, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
           "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "HANDOFF_HADOOP_AWS_JARS": str(hadoop_aws_jars())}
    for name, value in env.items():  # this process reads the checkpoint's side files too (ckpt.initial_offsets)
        monkeypatch.setenv(name, value)
    cfg = drill_config(tmp_path, kafka.bootstrap, topic, checkpointLocation=f"s3a://{bucket}/{prefix.rstrip('/')}")

    n = produce(kafka.bootstrap, topic, range(2400))
    first = run_app(tmp_path, env=env, kill_after_commits=2, cfg=cfg)
    assert first.returncode == -9, first.log.read_text()[-4000:]
    committed = ledger.resume_offsets(open_table(cfg, create=False), handoff_id=cfg.handoff_id)
    assert committed  # something landed before the kill
    keys = _keys(s3, bucket, prefix)
    # Spark's own log (through S3A) and Handoff's side files (through pyarrow) are both in the bucket
    assert "metadata" in keys and "offsets/0" in keys and "sources/handoff-initial.json" in keys, keys
    assert any(k.startswith("commits/") for k in keys), keys
    assert not any(p.name.startswith("s3a") for p in tmp_path.iterdir())  # nothing took the URI for a local path

    s3.client().delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": prefix + k} for k in keys]})
    assert _keys(s3, bucket, prefix) == []  # the checkpoint is lost
    n += produce(kafka.bootstrap, topic, range(2400, 2700))
    run_to_completion(tmp_path, max_runs=1, env=env)

    table = open_table(cfg, create=False)
    boot = next(c for c in ledger.list_commits(table, cfg.handoff_id) if (c.query_id or "").startswith("bootstrap-"))
    # the restarted driver started where the table's ledger ended, not at startingOffsets ...
    assert {t: {p: se[0] for p, se in parts.items()} for t, parts in boot.offsets.items()} == committed
    # ... and its new checkpoint, in S3 again, where that bootstrap batch ended
    assert ckpt.initial_offsets(cfg.checkpoint_location) == {
        (t, p): se[1] for t, parts in boot.offsets.items() for p, se in parts.items()}
    assert "offsets/0" in _keys(s3, bucket, prefix)
    assert_exactly_once(cfg, kafka.bootstrap, n, topic)
