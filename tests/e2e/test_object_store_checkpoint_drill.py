"""The object-store checkpoint drills: the real driver with its checkpoint on S3 (the test bed's moto server, through
Spark's S3A file system and hadoop-aws) and on Google Cloud Storage (the test bed's fake-gcs-server, through Google's
GCS connector), kill -9 mid-stream, the checkpoint's prefix deleted, a restart. Losing an object-store checkpoint must
behave exactly like losing a PVC (test_ledger_resume): the table's ledger decides where the new query starts, and
rows == distinct (partition, offset) == produced.

The bucket is listed after each run, so a drill fails if the checkpoint silently went somewhere else (a local
directory named like the URI, another bucket). The second drill runs the DataFrame path (transform, dedupe, event
time): Spark's dedupe state store is written into the store by the executors, the read tasks' counts by Python
workers."""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from handoff_operator.cli import local_checkpoint_env
from handoff_spark import checkpoint as ckpt
from handoff_spark import contract
from handoff_spark.iceberg import ledger
from handoff_spark.iceberg.sink import open_table
from handoff_testbed.jars import gcs_connector_jars, hadoop_aws_jars
from handoff_testbed.s3 import ACCESS_KEY, REGION, SECRET_KEY

from iceberg_drill_support import (assert_exactly_once, drill_config, end_offsets, produce, run_app,
                                   run_to_completion)
from operator_spec_support import spec
from transform_drill_support import COLUMNS, SQL, first_phase, order
from transform_drill_support import produce as produce_orders

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]


@dataclass
class Store:
    """One object store as the drills use it: the scheme, what the operator renders into the driver pod for its
    spec.checkpoint, and a client of its own (not the module under test) to list and delete."""

    scheme: str
    env: dict[str, str]
    create_bucket: Callable[[str], Any]
    keys: Callable[[str, str], list[str]]
    delete: Callable[[str, str], None]

    def lose(self, bucket: str, prefix: str) -> None:
        self.delete(bucket, prefix)
        assert self.keys(bucket, prefix) == []


def _s3_store(s3: Any) -> Store:
    """spec.checkpoint {location s3a://, endpoint, pathStyleAccess, region, credentialsSecret}; the jars the image
    has in pyspark/jars come from the test bed's copy here."""
    def keys(bucket: str, prefix: str) -> list[str]:
        pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(o["Key"][len(prefix):] for page in pages for o in page.get("Contents", []))

    def delete(bucket: str, prefix: str) -> None:
        s3.client().delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": prefix + k} for k in keys(bucket, prefix)]})

    env = {contract.ENV_CHECKPOINT_S3_ENDPOINT: s3.endpoint, contract.ENV_CHECKPOINT_S3_PATH_STYLE: "true",
           contract.ENV_CHECKPOINT_S3_REGION: REGION, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
           "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "HANDOFF_HADOOP_AWS_JARS": str(hadoop_aws_jars())}
    return Store("s3a", env, s3.create_bucket, keys, delete)


def _gcs_store(gcs: Any) -> Store:
    """spec.checkpoint {location gs://, endpoint, anonymous} through the operator's rendering, as `handoff run -f`
    takes it (cli.local_checkpoint_env); the connector's jar from the test bed's copy."""
    manifest = {"spec": spec(checkpoint={"location": "gs://any/checkpoint", "endpoint": gcs.endpoint,
                                         "anonymous": True})}
    env = {**local_checkpoint_env(manifest), "HANDOFF_HADOOP_GCS_JARS": str(gcs_connector_jars())}
    assert env[contract.ENV_CHECKPOINT_GCS_ANONYMOUS] == "true"
    return Store("gs", env, gcs.create_bucket, gcs.list_objects, gcs.delete_objects)


@pytest.fixture(params=["s3", "gcs"])
def store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Store:
    """Each drill on each store. Its environment is set in this process too: the test reads the checkpoint's side
    files (ckpt.initial_offsets), and run_to_completion's restarts inherit it."""
    made = (_s3_store if request.param == "s3" else _gcs_store)(request.getfixturevalue(request.param))
    for name, value in made.env.items():
        monkeypatch.setenv(name, value)
    return made


def test_checkpoint_lost_after_kill9_resumes_from_the_ledger(kafka, store: Store, tmp_path: Path) -> None:
    topic = f"{store.scheme}-ckpt-lost"
    kafka.create_topic(topic, partitions=3)
    bucket = f"ckpt-{uuid.uuid4().hex[:8]}"
    store.create_bucket(bucket)
    prefix = f"checkpoints/{topic}/"
    env = store.env
    cfg = drill_config(tmp_path, kafka.bootstrap, topic,
                       checkpointLocation=f"{store.scheme}://{bucket}/{prefix.rstrip('/')}")

    n = produce(kafka.bootstrap, topic, range(2400))
    first = run_app(tmp_path, env=env, kill_after_commits=2, cfg=cfg)
    assert first.returncode == -9, first.log.read_text()[-4000:]
    committed = ledger.resume_offsets(open_table(cfg, create=False), handoff_id=cfg.handoff_id)
    assert committed  # something landed before the kill
    keys = [k for k in store.keys(bucket, prefix) if not k.endswith("/")]  # files, not the GCS connector's markers
    # Spark's own log (through S3A or the GCS connector) and Handoff's side files (through pyarrow) are both there
    assert "metadata" in keys and "offsets/0" in keys and "sources/handoff-initial.json" in keys, keys
    assert any(k.startswith("commits/") for k in keys), keys
    assert not any(p.name.startswith(store.scheme) for p in tmp_path.iterdir())  # no local path named like the URI

    store.lose(bucket, prefix)  # the checkpoint is lost
    n += produce(kafka.bootstrap, topic, range(2400, 2700))
    run_to_completion(tmp_path, max_runs=1, env=env)

    table = open_table(cfg, create=False)
    commits = ledger.list_commits(table, cfg.handoff_id)
    restarted = [c for c in commits if c.query_id != commits[-1].query_id]  # a new query: a fresh checkpoint
    assert restarted and restarted[-1].batch_id == 0
    # the restarted driver's first batch started where the table's ledger ended, not at startingOffsets ...
    assert {t: {p: se[0] for p, se in parts.items()} for t, parts in restarted[-1].offsets.items()} == committed
    # ... as its new checkpoint, in the store again, records
    assert ckpt.initial_offsets(cfg.checkpoint_location) == {
        (t, p): off for t, parts in committed.items() for p, off in parts.items()}
    assert "offsets/0" in store.keys(bucket, prefix)
    assert_exactly_once(cfg, kafka.bootstrap, n, topic)


def test_checkpoint_on_the_dataframe_path_keeps_the_dedupe_exact(kafka, store: Store, tmp_path: Path) -> None:
    """Transform, dedupe and event time with the checkpoint on the store: kill -9, then the checkpoint (and the
    dedupe's state in it) lost; the table holds each passing order once, and its counts add up (the counts of every
    batch's read tasks reached the driver through the store)."""
    topic = f"{store.scheme}-ckpt-frames"
    kafka.create_topic(topic, partitions=2)
    kafka.create_topic(topic + "-dlq", partitions=1)
    bucket = f"ckpt-{uuid.uuid4().hex[:8]}"
    store.create_bucket(bucket)
    prefix = f"checkpoints/{topic}/"
    env = store.env
    cfg = drill_config(tmp_path, kafka.bootstrap, topic, columns=COLUMNS, max_records=300,
                       deadLetterTopic=topic + "-dlq", transform={"sql": SQL},
                       dedupe={"keys": ["id"], "withinSeconds": 3600},
                       eventTime={"column": "ts", "watermarkSeconds": 3600},
                       checkpointLocation=f"{store.scheme}://{bucket}/{prefix.rstrip('/')}")
    phase1 = first_phase(600)
    produce_orders(kafka.bootstrap, topic, phase1)
    runs = run_to_completion(tmp_path, kill_after_commits=2, cfg=cfg, env=env)
    assert runs[0].returncode == -9 and runs[-1].returncode == 0
    # (run_to_completion passes `env` to the first run only; the restarts inherit it from this process's, `store`)
    keys = [k for k in store.keys(bucket, prefix) if not k.endswith("/")]
    assert any(k.startswith("state/") for k in keys), keys  # the dedupe's state store, written by executors
    # ... in RocksDB (its changelog files, and its SST files once a snapshot is uploaded), not in the heap store's
    # delta files
    assert any(k.startswith("state/") and ("/SSTs/" in k or k.endswith(".changelog")) for k in keys), keys
    assert not any(k.startswith("state/") and k.endswith(".delta") for k in keys), keys
    store.lose(bucket, prefix)
    again = [order(i, 50 + i) for i in range(550, 600)]  # re-sent within the window: dropped
    fresh = [order(600 + i, 600 + i) for i in range(50)]
    produce_orders(kafka.bootstrap, topic, again + fresh)
    run_to_completion(tmp_path, max_runs=1, env=env)
    assert any(k.startswith("state/") and not k.endswith("/") for k in store.keys(bucket, prefix))

    table = open_table(cfg, create=False)
    data = table.scan().to_arrow()
    ids = data["id"].to_pylist()
    assert len(ids) == len(set(ids)), "a business-key duplicate reached the table"
    assert set(ids) == {i for i in range(650) if i % 20 >= 5}
    commits = ledger.list_commits(table)
    assert commits[0].end_offsets[topic] == end_offsets(kafka.bootstrap, topic)
    props = [table.snapshot_by_id(c.snapshot_id).summary.additional_properties for c in commits]
    counted = sum(int(p["handoff.rows"]) + int(p["handoff.dlq-rows"]) + int(p["handoff.dropped-rows"]) for p in props)
    assert counted == len(phase1) + len(again) + len(fresh)
