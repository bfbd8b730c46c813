"""Client construction for BigQuery (REST, for tables and queries) and the Storage Write API (gRPC).

Credentials, in order: the service-account key file the operator mounts from `credentialsFrom` (a Secret);
anonymous when the endpoints point at an emulator; otherwise application default credentials, which on GKE
are Workload Identity. Endpoint overrides exist for the emulator (tests, the demo): a `host:port` gRPC
endpoint is used as a plaintext channel, because the client's `api_endpoint` option alone always dials TLS.

Clients are cached per process (per executor Python worker, per driver): creating a gRPC channel per task
or per batch costs a TLS handshake and, on real BigQuery, counts against connection limits.
"""
from __future__ import annotations

import threading
from typing import Any

from ..config import BigQuerySink

_lock = threading.Lock()
_rest: dict[tuple[Any, ...], Any] = {}
_write: dict[tuple[Any, ...], Any] = {}

# gRPC messages up to 20 MB both ways: AppendRows requests are kept under 10 MB, and responses to large
# requests (row errors) can be big too; the default 4 MB receive cap would turn them into transport errors.
_GRPC_OPTIONS = [("grpc.max_send_message_length", 20 * 1024 * 1024),
                 ("grpc.max_receive_message_length", 20 * 1024 * 1024)]


def _key(sink: BigQuerySink) -> tuple[Any, ...]:
    return (sink.project, sink.credentials_file, sink.rest_endpoint, sink.grpc_endpoint)


def credentials(sink: BigQuerySink) -> Any:
    if sink.credentials_file:
        from google.oauth2 import service_account

        return service_account.Credentials.from_service_account_file(
            sink.credentials_file, scopes=["https://www.googleapis.com/auth/bigquery"])
    if sink.rest_endpoint or sink.grpc_endpoint:
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        creds, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/bigquery"])
    except DefaultCredentialsError:
        from ..errors import HandoffConfigError

        raise HandoffConfigError(
            f"BigQuery sink {sink.project}.{sink.dataset}.{sink.table}: no credentials. Fix: set "
            "spec.sink.bigquery.credentialsFrom to a Secret key holding a service-account JSON key, give the "
            "driver's ServiceAccount Workload Identity, or (emulators only) set spec.sink.bigquery.restEndpoint "
            "and grpcEndpoint") from None
    return creds


def rest_client(sink: BigQuerySink) -> Any:
    """`google.cloud.bigquery.Client` for the sink's project (cached)."""
    key = _key(sink)
    with _lock:
        client = _rest.get(key)
        if client is None:
            from google.api_core.client_options import ClientOptions
            from google.cloud import bigquery

            options = ClientOptions(api_endpoint=sink.rest_endpoint) if sink.rest_endpoint else None
            client = bigquery.Client(project=sink.project, credentials=credentials(sink), client_options=options)
            _rest[key] = client
        return client


def write_client(sink: BigQuerySink) -> Any:
    """`BigQueryWriteClient` (cached); a plaintext channel for an emulator endpoint."""
    key = _key(sink)
    with _lock:
        client = _write.get(key)
        if client is None:
            from google.cloud.bigquery_storage_v1 import BigQueryWriteClient
            from google.cloud.bigquery_storage_v1.services.big_query_write.transports import (
                BigQueryWriteGrpcTransport,
            )

            if sink.grpc_endpoint:
                import grpc

                target = sink.grpc_endpoint.removeprefix("http://")
                channel = grpc.insecure_channel(target, options=_GRPC_OPTIONS)
                client = BigQueryWriteClient(transport=BigQueryWriteGrpcTransport(channel=channel))
            else:
                transport = BigQueryWriteGrpcTransport(
                    credentials=credentials(sink),
                    channel=BigQueryWriteGrpcTransport.create_channel(
                        "bigquerystorage.googleapis.com:443", credentials=credentials(sink),
                        options=_GRPC_OPTIONS),
                )
                client = BigQueryWriteClient(transport=transport)
            _write[key] = client
        return client


def reset() -> None:
    """Forget cached clients (after an endpoint restart in tests, or a credentials rotation)."""
    with _lock:
        _rest.clear()
        _write.clear()


def table_path(sink: BigQuerySink, table: str | None = None) -> str:
    return f"projects/{sink.project}/datasets/{sink.dataset}/tables/{table or sink.table}"


def table_ref(sink: BigQuerySink, table: str | None = None) -> str:
    return f"{sink.project}.{sink.dataset}.{table or sink.table}"
