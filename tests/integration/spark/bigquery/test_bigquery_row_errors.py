"""BigQuery's row errors over the real protocol: the emulator never sends them, so the Storage Write API is
reached through the test bed's fault proxy (hack/handoff_testbed/bq_fault_proxy.py), which forwards every RPC
to the emulator and refuses an AppendRows request holding a marked row ("REJECT…") the way BigQuery does —
INVALID_ARGUMENT with `row_errors` naming the rows, nothing appended. The sink's writer must drop exactly those
rows (with BigQuery's message) and resend the rest at the same offset, also with many requests in flight
(the ones behind a refused request come back OUT_OF_RANGE and are resent)."""
from __future__ import annotations

import uuid
from typing import Iterator

import grpc
import pyarrow as pa
import pytest
from google.cloud import bigquery as bq
from google.cloud.bigquery_storage_v1 import BigQueryWriteClient, types
from google.cloud.bigquery_storage_v1.services.big_query_write.transports import BigQueryWriteGrpcTransport

from handoff_spark.bigquery.append import RetryPolicy, StreamWriter
from handoff_testbed.bq_fault_proxy import BigQueryWriteFaultProxy, row_error_message

pytestmark = pytest.mark.bigquery

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("region", pa.string())])


@pytest.fixture()
def proxy(bigquery) -> Iterator[BigQueryWriteFaultProxy]:
    p = BigQueryWriteFaultProxy(bigquery.grpc_endpoint).start()
    yield p
    p.stop()


def _table(emulator) -> tuple[str, str]:
    dataset = f"rowerr_{uuid.uuid4().hex[:8]}"
    client = emulator.bq_client()
    client.create_dataset(f"{emulator.project}.{dataset}")
    client.create_table(bq.Table(f"{emulator.project}.{dataset}.t", schema=[
        bq.SchemaField("id", "INT64"), bq.SchemaField("region", "STRING")]))
    return f"{emulator.project}.{dataset}.t", emulator.table_path(dataset, "t")


def _client(endpoint: str) -> BigQueryWriteClient:
    return BigQueryWriteClient(transport=BigQueryWriteGrpcTransport(channel=grpc.insecure_channel(endpoint)))


def _rows(n: int, marked: set[int]) -> pa.Table:
    return pa.table({"id": pa.array(range(n), pa.int64()),
                     "region": pa.array([f"REJECT-{i}" if i in marked else f"eu-{i % 3}" for i in range(n)])},
                    schema=SCHEMA)


@pytest.mark.parametrize("pending,fmt", [(True, "arrow"), (False, "arrow"), (True, "proto")],
                         ids=["pending-stream", "default-stream", "pending-stream-proto-rows"])
def test_row_errors_drop_exactly_the_refused_rows_and_resend_the_rest(bigquery, proxy, pending, fmt):
    ref, path = _table(bigquery)
    n = 400
    marked = {3, 77, 78, 150, 399}
    writer = StreamWriter(_client(proxy.endpoint), path, SCHEMA, pending=pending, fmt=fmt, max_rows=25, max_inflight=8,
                          retry=RetryPolicy(max_attempts=4, max_seconds=0.5))
    writer.write(_rows(200, marked).slice(0, 200))
    writer.write(_rows(n, marked).slice(200))
    streams = writer.close()

    # the refused rows, by input row number, with BigQuery's (here: the proxy's) message
    assert sorted(i for i, _ in writer.rejected) == sorted(marked)
    assert all(row_error_message("region", f"REJECT-{i}") in msg for i, msg in writer.rejected)
    assert proxy.stats.refused_rows == len(marked)
    assert writer.stats.errors.get("INVALID_ARGUMENT") == proxy.stats.refused_appends == 4  # 77 and 78 share one
    if pending:
        # pipelined requests behind a refused one were not applied either (offsets past the stream's end)
        assert writer.stats.errors.get("OUT_OF_RANGE", 0) > 0
        assert sum(s.rows for s in streams) == n - len(marked)
        wc = _client(proxy.endpoint)
        for s in streams:
            assert wc.finalize_write_stream(name=s.name).row_count == s.rows
        resp = wc.batch_commit_write_streams(types.BatchCommitWriteStreamsRequest(
            parent=path, write_streams=[s.name for s in streams]))
        assert not resp.stream_errors
    got = [r["id"] for r in bigquery.bq_client().query(f"SELECT id FROM `{ref}` ORDER BY id").result()]
    assert got == [i for i in range(n) if i not in marked]
