"""validation: specs the CRD allows but that cannot work → InvalidSpec naming the field and the fix."""
from __future__ import annotations

from handoff_operator.spec.validation import check, parse_spec

from operator_spec_support import SECRETS, spec


def _problems(spec_dict, secrets=SECRETS, name="orders"):
    parsed, problems = parse_spec(spec_dict)
    if parsed is None:
        return {p.field: p.message for p in problems}
    _, problems = check(name, parsed, secrets)
    return {p.field: p.message for p in problems}


def test_valid_spec_has_no_problems():
    assert _problems(spec()) == {}


def test_missing_secret_names_the_field_and_fix():
    problems = _problems(spec(), secrets={"lake-s3": SECRETS["lake-s3"]})
    assert "spec.source.propertiesFrom[0].secretKeyRef.name" in problems
    assert "'kafka-creds' not found" in problems["spec.source.propertiesFrom[0].secretKeyRef.name"]


def test_missing_secret_key():
    problems = _problems(spec(), secrets={**SECRETS, "kafka-creds": {"username": "u"}})
    msg = problems["spec.source.propertiesFrom[0].secretKeyRef.key"]
    assert "no key 'password'" in msg and "username" in msg


def test_missing_whole_secret_for_catalog():
    problems = _problems(spec(), secrets={"kafka-creds": SECRETS["kafka-creds"]})
    assert "spec.sink.iceberg.catalog.propertiesFrom[0].secretRef.name" in problems


def test_partition_by_undeclared_column():
    s = spec()
    s["sink"]["iceberg"]["partitionBy"] = ["day(created_at)", "region"]
    problems = _problems(s)
    assert list(problems) == ["spec.sink.iceberg.partitionBy[1]"]
    assert "'region'" in problems["spec.sink.iceberg.partitionBy[1]"]


def test_partition_by_kafka_metadata_column_is_fine():
    s = spec()
    s["sink"]["iceberg"]["partitionBy"] = ["hour(_kafka_timestamp)"]
    assert _problems(s) == {}


def test_commit_interval_below_one_second():
    problems = _problems(spec(commitInterval="500ms", freshness={"target": "1m"}))
    assert "shorter than 1s" in problems["spec.commitInterval"]


def test_dead_letter_without_topic():
    s = spec()
    s["schema"]["onIncompatible"] = "deadLetter"
    problems = _problems(s)
    assert any("deadLetter" in field or "deadLetter" in msg for field, msg in problems.items())


def test_event_time_column_missing():
    s = spec()
    s["schema"]["eventTimeColumn"] = "nope"
    problems = _problems(s)
    assert any("eventTimeColumn" in msg or "eventTimeColumn" in f for f, msg in problems.items())


def test_name_too_long_for_children():
    problems = _problems(spec(), name="x" * 60)
    assert "metadata.name" in problems


def test_checkpoint_scheme():
    problems = _problems(spec(checkpoint={"location": "ftp://host/x"}))
    assert "spec.checkpoint.location" in problems


def test_checkpoint_in_object_storage_is_refused_with_the_fix():
    problems = _problems(spec(checkpoint={"location": "s3a://bucket/ckpt"}))
    assert "not supported" in problems["spec.checkpoint.location"]
    assert "PersistentVolumeClaim" in problems["spec.checkpoint.location"]
    assert "spec.checkpoint.location" not in _problems(spec(checkpoint={"location": "file:///mnt/ckpt/orders"}))


def test_bigquery_cluster_by_undeclared():
    s = spec(sink={"bigquery": {"project": "p1", "dataset": "d", "table": "t", "clusterBy": ["nope"],
                                "partitionBy": "id"}})
    problems = _problems(s)
    assert "spec.sink.bigquery.clusterBy[0]" in problems
    assert "timestamp or date" in problems["spec.sink.bigquery.partitionBy"]
