"""The BigQuery sink's pure decisions: error classification, backoff bounds, the checks BigQuery makes on rows
(REQUIRED, unknown fields, types), schema planning. No server: these are the rules the emulator does not
enforce, so they must hold on their own."""
from __future__ import annotations

import random

import pyarrow as pa
import pytest

from handoff_spark.bigquery.append import (ALREADY_EXISTS, DEADLINE_EXCEEDED, INTERNAL, INVALID_ARGUMENT, NOT_FOUND,
                                           OUT_OF_RANGE, RESOURCE_EXHAUSTED, UNAVAILABLE, Action, AppendStats,
                                           RetryPolicy, classify, percentile)
from handoff_spark.bigquery.schema import (Field, UnknownColumns, arrow_schema, bq_type, conform, declared_fields,
                                           plan_schema)
from handoff_spark.bigquery.sink import degraded_reason
from handoff_spark.config import Column


@pytest.mark.parametrize("code,message,row_errors,rows,offsets,expected", [
    (0, "", False, 10, True, Action.DONE),
    (INVALID_ARGUMENT, "row errors", True, 10, True, Action.ROW_ERRORS),
    (0, "", True, 10, True, Action.ROW_ERRORS),  # row errors mean nothing was applied, even without a status
    (ALREADY_EXISTS, "Offset 0 already buffered", False, 10, True, Action.DONE),  # resent after a lost response
    (OUT_OF_RANGE, "Offset 20 beyond next expected 10", False, 10, True, Action.RESEND),
    (RESOURCE_EXHAUSTED, "AppendRowsRequest exceeds the 16384-byte size cap", False, 10, True, Action.SPLIT),
    (INVALID_ARGUMENT, "AppendRows request too large: 11000000 limit 10485760", False, 10, True, Action.SPLIT),
    (RESOURCE_EXHAUSTED, "AppendRowsRequest exceeds the 1024-byte size cap", False, 1, True, Action.FAIL),
    (RESOURCE_EXHAUSTED, "PENDING stream buffer would exceed the per-stream cap", False, 10, True, Action.ROTATE),
    (RESOURCE_EXHAUSTED, "Exceeds 'AppendRows throughput' quota", False, 10, True, Action.RETRY),
    (UNAVAILABLE, "connection reset", False, 10, True, Action.RETRY),
    (INTERNAL, "internal error", False, 10, False, Action.RETRY),
    (DEADLINE_EXCEEDED, "deadline", False, 10, True, Action.RETRY),
    (NOT_FOUND, "Stream not found", False, 10, True, Action.FAIL),
    (INVALID_ARGUMENT, "bad schema", False, 10, True, Action.FAIL),
])
def test_classify(code, message, row_errors, rows, offsets, expected):
    assert classify(code, message, row_errors, rows, offsets) is expected


def test_backoff_is_bounded_exponential_with_full_jitter():
    policy = RetryPolicy(max_attempts=8, initial_seconds=0.1, max_seconds=2.0)
    rng = random.Random(7)
    for attempt in range(10):
        cap = min(2.0, 0.1 * 2 ** attempt)
        samples = [policy.delay(attempt, rng) for _ in range(200)]
        assert all(0 <= s <= cap for s in samples)
        assert max(samples) > cap * 0.8  # jitter spans the window, not a constant
    assert len({policy.delay(3, rng) for _ in range(20)}) > 1


FIELDS = [Field("id", "INT64", "REQUIRED"), Field("name", "STRING"), Field("ts", "TIMESTAMP"),
          Field("_kafka_topic", "STRING", "REQUIRED"), Field("_kafka_partition", "INT64", "REQUIRED"),
          Field("_kafka_offset", "INT64", "REQUIRED")]


def _batch(**cols):
    base = {"_kafka_topic": ["t"] * 4, "_kafka_partition": pa.array([0] * 4, pa.int32()),
            "_kafka_offset": [0, 1, 2, 3]}
    return pa.table({**cols, **base})


def test_conform_rejects_null_in_required_column_and_keeps_the_rest():
    shaped, rejected = conform(_batch(id=pa.array([1, None, 3, None], pa.int32()), name=["a", "b", None, "d"]), FIELDS)
    assert [r.index for r in rejected] == [1, 3]
    assert "missing required field id" in rejected[0].reason
    assert shaped.column("id").to_pylist() == [1, 3]
    assert shaped.schema == arrow_schema(FIELDS)  # table's column order and types (int32 → INT64 etc.)
    assert shaped.column("ts").null_count == 2  # absent column → NULL


def test_conform_refuses_unknown_columns():
    with pytest.raises(UnknownColumns) as err:
        conform(_batch(id=[1, 2, 3, 4], coupon=["x"] * 4), FIELDS)
    assert err.value.names == ["coupon"]


def test_conform_rejects_values_that_do_not_fit_and_dropped_conflicting_columns():
    shaped, rejected = conform(_batch(id=["1", "2", "x", "4"]), FIELDS)
    assert [r.index for r in rejected] == [2] and "does not fit" in rejected[0].reason
    assert shaped.column("id").to_pylist() == [1, 2, 4]
    shaped, rejected = conform(_batch(id=[1, 2, 3, 4], name=["a", None, None, "d"]), FIELDS, dropped=["name"])
    assert [r.index for r in rejected] == [0, 3]  # a value that cannot be written is never dropped silently


def test_declared_fields_and_types():
    fields = declared_fields([Column(name="id", type="long", required=True), Column(name="p", type="decimal(10,2)"),
                              Column(name="big", type="decimal(60,20)")])
    assert fields[0] == Field("id", "INT64", "NULLABLE")  # required is decode's job; BigQuery cannot add REQUIRED later
    assert [f.type for f in fields[:3]] == ["INT64", "NUMERIC", "BIGNUMERIC"]
    assert [f.name for f in fields[3:]] == ["_kafka_topic", "_kafka_partition", "_kafka_offset", "_kafka_timestamp",
                                            "_handoff_batch_id"]
    assert bq_type("timestamp") == "TIMESTAMP" and bq_type("binary") == "BYTES"


def test_plan_schema_adds_missing_as_nullable_and_reports_conflicts():
    table = [Field("id", "INTEGER", "REQUIRED"), Field("amount", "FLOAT"), Field("region", "STRING")]
    wanted = [Field("id", "INT64"), Field("amount", "INT64"), Field("region", "INT64"), Field("new", "STRING")]
    plan = plan_schema(table, wanted)
    assert plan.add == (Field("new", "STRING", "NULLABLE"),)
    assert plan.conflicts == (("region", "INT64", "STRING"),)  # INT64 into FLOAT64 is a write-time widening


def test_percentile_and_degraded_reason():
    assert percentile([], 50) is None
    assert percentile(list(range(1, 101)), 50) in (50, 51) and percentile(list(range(1, 101)), 99) == 99
    assert degraded_reason(AppendStats()) is None
    assert degraded_reason(AppendStats(errors={"RESOURCE_EXHAUSTED": 2})) == "BigQueryResourceExhausted"
    assert degraded_reason(AppendStats(retries={"UNAVAILABLE": 1})) == "BigQueryUnavailable"


def test_progress_record_and_metrics_carry_the_sinks_request_trouble():
    """The BigQuery sink's commit record → the same progress record and metrics as the Iceberg sink, plus the
    Degraded reason and refused/retried requests by code."""
    from handoff_spark.driver.progress import Metrics, report_from_progress

    progress = {"batchId": 3, "numInputRows": 10, "durationMs": {"triggerExecution": 100},
                "sources": [{"startOffset": '{"t": {"0": 0}}', "endOffset": '{"t": {"0": 10}}'}]}
    commit = {"batch_id": 3, "snapshot_id": 1795318656243373, "skipped": False, "rows": 10, "dlq_rows": 0,
              "commit_latency_ms": 12.0, "append_errors": {"RESOURCE_EXHAUSTED": 4},
              "append_retries": {"UNAVAILABLE": 2}, "append_latency_p50_ms": 20.0, "append_latency_p99_ms": 80.0,
              "degraded_reason": "BigQueryResourceExhausted"}
    report = report_from_progress(progress, commit, None)
    record = report.record("ns/h")
    assert record["degradedReason"] == "BigQueryResourceExhausted" and record["committedSnapshot"] == 1795318656243373
    m = Metrics("ns/h")
    m.observe(report)
    get = m.registry.get_sample_value
    assert get("handoff_sink_request_errors_total", {"handoff": "ns/h", "code": "RESOURCE_EXHAUSTED"}) == 4
    assert get("handoff_sink_retries_total", {"handoff": "ns/h", "code": "UNAVAILABLE"}) == 2
    assert get("handoff_sink_append_latency_seconds", {"handoff": "ns/h", "quantile": "0.99"}) == 0.08


def test_row_errors_split_the_request_into_resend_and_dead_letters():
    """BigQuery applies none of a request with row errors: the listed rows become dead letters with BigQuery's
    message, the others are resent (same order, their original row numbers kept for the DLQ mapping)."""
    from google.cloud.bigquery_storage_v1 import types

    from handoff_spark.bigquery.append import split_row_errors

    table = pa.table({"id": [10, 11, 12, 13, 14]})
    errors = [types.RowError(index=1, code=types.RowError.RowErrorCode.FIELDS_ERROR, message="id: out of range"),
              types.RowError(index=4, code=types.RowError.RowErrorCode.FIELDS_ERROR, message="bad value")]
    kept, rows, rejected = split_row_errors(table, [100, 101, 102, 103, 104], errors)
    assert kept.column("id").to_pylist() == [10, 12, 13] and rows == [100, 102, 103]
    assert rejected == [(101, "BigQuery row error: id: out of range"), (104, "BigQuery row error: bad value")]
    assert classify(INVALID_ARGUMENT, "Rows failed", True, 5, True) is Action.ROW_ERRORS


def test_credentials_key_file_else_anonymous_for_an_emulator(tmp_path):
    """credentialsFrom (mounted as credentialsFile) wins; an emulator endpoint without it is anonymous; real
    BigQuery without it falls through to application default credentials (Workload Identity on GKE)."""
    import json

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from google.auth.credentials import AnonymousCredentials
    from google.oauth2 import service_account

    from handoff_spark.bigquery import client as bigquery_client
    from handoff_spark.config import BigQuerySink

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    path = tmp_path / "credentials.json"
    path.write_text(json.dumps({"type": "service_account", "project_id": "p", "private_key_id": "k1",
                                "private_key": pem, "client_email": "handoff@p.iam.gserviceaccount.com",
                                "client_id": "1", "token_uri": "https://oauth2.googleapis.com/token"}))
    creds = bigquery_client.credentials(BigQuerySink(project="p", dataset="d", table="t",
                                                     credentials_file=str(path)))
    assert isinstance(creds, service_account.Credentials)
    assert creds.service_account_email == "handoff@p.iam.gserviceaccount.com"
    emulator = BigQuerySink(project="p", dataset="d", table="t", rest_endpoint="http://127.0.0.1:1")
    assert isinstance(bigquery_client.credentials(emulator), AnonymousCredentials)
