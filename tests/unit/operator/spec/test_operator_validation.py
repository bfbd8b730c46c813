"""validation: specs the CRD allows but that cannot work → InvalidSpec naming the field and the fix."""
from __future__ import annotations

import pytest

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


def test_checkpoint_on_s3a_is_accepted_with_its_settings():
    ok = spec(checkpoint={"location": "s3a://bucket/ckpt/orders", "credentialsSecret": "ckpt-s3",
                          "endpoint": "http://minio.storage:9000", "pathStyleAccess": True, "region": "eu-west-1"})
    assert _problems(ok) == {}
    assert _problems(spec(checkpoint={"location": "s3a://bucket/ckpt"})) == {}  # the pods' own AWS identity


def test_checkpoint_on_gcs_is_accepted_with_its_settings():
    assert _problems(spec(checkpoint={"location": "gs://bucket/ckpt/orders", "credentialsSecret": "ckpt-gcs",
                                      "endpoint": "https://storage.private.example"})) == {}
    assert _problems(spec(checkpoint={"location": "gs://bucket/ckpt", "endpoint": "http://fake-gcs:4443",
                                      "anonymous": True})) == {}
    assert _problems(spec(checkpoint={"location": "gs://bucket/ckpt"})) == {}  # the pods' own Google identity


@pytest.mark.parametrize("location", ["abfs://c@acct.dfs.core.windows.net/ckpt", "s3://bucket/ckpt", "hdfs://nn/ckpt"])
def test_object_stores_without_a_shipped_connector_are_refused_naming_s3a_and_gs(location):
    message = _problems(spec(checkpoint={"location": location}))["spec.checkpoint.location"]
    assert "not supported" in message and "\n" not in message
    assert "s3a://<bucket>/<prefix>" in message and "gs://<bucket>/<prefix>" in message
    assert "PersistentVolumeClaim" in message


@pytest.mark.parametrize("location", ["s3a://bucket", "s3a://bucket/", "s3a:///ckpt", "gs://bucket", "gs:///ckpt"])
def test_object_store_checkpoint_needs_a_bucket_and_a_prefix(location):
    scheme = location.split("://")[0]
    message = _problems(spec(checkpoint={"location": location}))["spec.checkpoint.location"]
    assert f"{scheme}://<bucket>/<prefix>" in message


@pytest.mark.parametrize("field,value", [("credentialsSecret", "ckpt-s3"), ("endpoint", "http://minio:9000"),
                                         ("pathStyleAccess", True), ("region", "eu-west-1"), ("anonymous", True)])
def test_store_settings_without_an_object_store_location_are_refused(field, value):
    for checkpoint in ({field: value}, {"location": "file:///mnt/ckpt/orders", field: value}):
        message = _problems(spec(checkpoint=checkpoint))[f"spec.checkpoint.{field}"]
        assert ("gs://" if field == "anonymous" else "s3a://") in message


@pytest.mark.parametrize("field,value,location", [("pathStyleAccess", True, "gs://b/c"), ("region", "eu", "gs://b/c"),
                                                  ("anonymous", True, "s3a://b/c")])
def test_a_setting_of_the_other_store_is_refused_naming_where_it_applies(field, value, location):
    message = _problems(spec(checkpoint={"location": location, field: value}))[f"spec.checkpoint.{field}"]
    assert "only applies to a " + ("gs://" if field == "anonymous" else "s3a://") in message


def test_anonymous_gcs_with_a_key_is_refused():
    message = _problems(spec(checkpoint={"location": "gs://b/c", "anonymous": True,
                                         "credentialsSecret": "k"}))["spec.checkpoint.anonymous"]
    assert "credentialsSecret" in message and "remove one" in message


def test_s3_endpoint_must_be_a_url():
    assert "spec.checkpoint.endpoint" in _problems(spec(checkpoint={"location": "s3a://b/c", "endpoint": "minio:9000"}))


def test_bigquery_cluster_by_undeclared():
    s = spec(sink={"bigquery": {"project": "p1", "dataset": "d", "table": "t", "clusterBy": ["nope"],
                                "partitionBy": "id"}})
    problems = _problems(s)
    assert "spec.sink.bigquery.clusterBy[0]" in problems
    assert "timestamp or date" in problems["spec.sink.bigquery.partitionBy"]


# ---- transform, dedupe, eventTime (issue 31): what the driver would refuse, refused before anything runs

DLQ = {"deadLetter": {"topic": "orders-dlq"}}


def _frame_spec(**fields):
    """The base spec (columns id: long, created_at: timestamp) with a dead-letter topic and no eventTimeColumn."""
    s = spec(**DLQ, **fields)
    s["schema"].pop("eventTimeColumn")
    return s


def test_transform_dedupe_and_event_time_on_declared_columns_have_no_problems():
    assert _problems(_frame_spec(transform={"sql": "SELECT * FROM source"},
                                 dedupe={"keys": ["id"], "within": "1h"},
                                 eventTime={"column": "created_at", "watermark": "30s"})) == {}


def test_dedupe_key_that_is_not_declared_names_the_key():
    problems = _problems(_frame_spec(dedupe={"keys": ["id", "order_id"], "within": "1h"}))
    assert list(problems) == ["spec.dedupe.keys[1]"]
    assert "'order_id' is not a declared column" in problems["spec.dedupe.keys[1]"]


def test_kafka_metadata_columns_are_known_without_a_transform():
    assert _problems(_frame_spec(dedupe={"keys": ["_kafka_offset"], "within": "1h"},
                                 eventTime={"column": "_kafka_timestamp"})) == {}


def test_event_time_column_that_is_not_declared():
    problems = _problems(_frame_spec(eventTime={"column": "ordered_at"}))
    assert list(problems) == ["spec.eventTime.column"]
    assert "'ordered_at' is not a declared column" in problems["spec.eventTime.column"]


def test_with_a_transform_undeclared_columns_are_left_to_the_driver():
    """The SQL's output is only known to Spark (it may derive the key): the driver checks it."""
    assert _problems(_frame_spec(transform={"sql": "SELECT *, id * 2 AS order_id FROM source"},
                                 dedupe={"keys": ["order_id"], "within": "1h"},
                                 eventTime={"column": "derived_ts"})) == {}


@pytest.mark.parametrize("with_transform", [False, True])
def test_event_time_column_declared_with_another_type(with_transform):
    fields = {"transform": {"sql": "SELECT * FROM source"}} if with_transform else {}
    problems = _problems(_frame_spec(eventTime={"column": "id"}, **fields))
    assert list(problems) == ["spec.eventTime.column"]
    assert "'id' is declared long" in problems["spec.eventTime.column"]
    assert "timestamp" in problems["spec.eventTime.column"]


def test_a_zero_dedupe_window_is_refused_before_the_app_config_is():
    problems = _problems(_frame_spec(dedupe={"keys": ["id"], "within": "0s"}))
    assert list(problems) == ["spec.dedupe.within"] and "positive duration" in problems["spec.dedupe.within"]


def test_frame_path_without_declared_columns():
    s = _frame_spec(dedupe={"keys": ["id"], "within": "1h"})
    s["schema"] = {}
    s["sink"]["iceberg"]["partitionBy"] = []
    problems = _problems(s)
    assert list(problems) == ["spec.schema.columns"] and "declare them" in problems["spec.schema.columns"]


def test_lookup_named_source_is_refused():
    problems = _problems(_frame_spec(transform={"sql": "SELECT * FROM source",
                                                "lookups": [{"name": "Source", "table": "crm.customers"}]}))
    assert list(problems) == ["spec.transform.lookups[0].name"]
    assert "the records' view" in problems["spec.transform.lookups[0].name"]


def test_lookup_names_are_unique():
    problems = _problems(_frame_spec(transform={"sql": "SELECT * FROM source", "lookups": [
        {"name": "customers", "table": "crm.customers"}, {"name": "Customers", "table": "crm.customers_v2"}]}))
    assert list(problems) == ["spec.transform.lookups[1].name"]
    assert "names two lookups" in problems["spec.transform.lookups[1].name"]


BIGQUERY_SINK = {"bigquery": {"project": "shop-analytics", "dataset": "shop", "table": "orders"}}


@pytest.mark.parametrize("fields, message", [
    ({"eventTime": {"column": "created_at", "lateRecords": "keep"}, "dedupe": {"keys": ["id"], "within": "1h"}},
     "eventTime.lateRecords=keep cannot be checked with a dedupe"),
    ({"eventTime": {"column": "created_at", "watermark": "2h"}, "dedupe": {"keys": ["id"], "within": "1h"}},
     "eventTime.watermark must be at most dedupe.within"),
    ({"transform": {"sql": "SELECT * FROM source", "lookups": [{"name": "c", "table": "crm.customers"}]},
      "sink": BIGQUERY_SINK}, "transform.lookups need sink.iceberg"),
    ({"eventTime": {"column": "created_at"}, "schema": {"columns": [{"name": "id", "type": "long"},
                                                                    {"name": "created_at", "type": "timestamp"}],
                                                        "eventTimeColumn": "created_at"}}, None),
])
def test_rules_between_the_fields_are_invalid_specs_naming_the_field(fields, message):
    problems = _problems(_frame_spec(**fields))
    if message is None:  # eventTime.column equal to schema.eventTimeColumn: both accepted
        assert problems == {}
    else:
        assert any(message in m for m in problems.values()), problems


@pytest.mark.parametrize("fields, message", [
    ({"eventTime": {"column": "created_at"}}, "eventTime.lateRecords=deadLetter needs deadLetter.topic"),
    ({"dedupe": {"keys": ["id"], "within": "1h"}}, "dedupe needs deadLetter.topic"),
])
def test_dead_letter_policies_need_the_dead_letter_topic(fields, message):
    s = spec(**fields)
    s["schema"].pop("eventTimeColumn")
    problems = _problems(s)
    assert any(message in m for m in problems.values()), problems
    s["deadLetter"] = {"topic": "orders-dlq"}
    assert _problems(s) == {}


def test_late_records_kept_need_no_dead_letter_topic():
    s = spec(eventTime={"column": "created_at", "lateRecords": "keep"})
    s["schema"].pop("eventTimeColumn")
    assert _problems(s) == {}


def test_a_data_plane_refusal_the_operator_does_not_mirror_is_a_problem_not_a_crash(monkeypatch):
    """render validates the AppConfig; a rule only the data plane has must end as InvalidSpec, not an exception."""
    import handoff_operator.spec.validation as validation
    from handoff_spark.config import AppConfig

    real = validation.app_config

    def stricter(*args, **kwargs):
        cfg = real(*args, **kwargs)
        AppConfig.model_validate({**cfg.model_dump(by_alias=True), "triggerIntervalSeconds": -1})
        return cfg

    monkeypatch.setattr(validation, "app_config", stricter)
    problems = _problems(spec())
    assert list(problems) == ["spec"] and problems["spec"].startswith("the Spark app would refuse its config: ")
