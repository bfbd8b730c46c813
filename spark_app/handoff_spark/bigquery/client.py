"""Client construction for BigQuery (REST, for tables and queries) and the Storage Write API (gRPC).

Credentials, in order: the service-account key file the operator mounts from `credentialsFrom` (a Secret);
anonymous when the endpoints point at an emulator; otherwise application default credentials, which on GKE
are Workload Identity. Endpoint overrides exist for the emulator (tests, the demo): a `host:port` gRPC
endpoint is used as a plaintext channel, because the client's `api_endpoint` option alone always dials TLS.

Clients are cached per process (per executor Python worker, per driver): creating a gRPC channel per task
or per batch costs a TLS handshake and, on real BigQuery, counts against connection limits.
"""
from __future__ import annotations

import json
import os
import threading
from typing import Any, Callable, Literal

from handoff_spark.config import BigQuerySink

_lock = threading.Lock()
_rest: dict[tuple[Any, ...], Any] = {}
_write: dict[tuple[Any, ...], Any] = {}

# gRPC messages up to 20 MB both ways: AppendRows requests are kept under 10 MB, and responses to large
# requests (row errors) can be big too; the default 4 MB receive cap would turn them into transport errors.
_GRPC_OPTIONS = [("grpc.max_send_message_length", 20 * 1024 * 1024),
                 ("grpc.max_receive_message_length", 20 * 1024 * 1024)]


def _key(sink: BigQuerySink) -> tuple[Any, ...]:
    return (sink.project, sink.credentials_file, sink.rest_endpoint, sink.grpc_endpoint)


SCOPES = ("https://www.googleapis.com/auth/bigquery",)

CredentialChoice = Literal["service-account", "key-file", "anonymous", "default", "unavailable"]


def credential_choice(sink: BigQuerySink, key_json: str | None, file_exists: bool) -> CredentialChoice:
    """How to authenticate to the sink's BigQuery, the same order for the driver and the operator: the
    `credentialsFrom` key passed as JSON (the operator reads the Secret; its pod does not mount it); the key
    file (the driver's mount of that Secret); anonymous for an emulator endpoint; application default
    credentials (Workload Identity on GKE). "unavailable": the sink names a key file this process does not
    have and no key was passed. Pure."""
    if key_json:
        return "service-account"
    if sink.credentials_file:
        return "key-file" if file_exists else "unavailable"
    if sink.rest_endpoint or sink.grpc_endpoint:
        return "anonymous"
    return "default"


def credentials(sink: BigQuerySink, key_json: str | None = None, choice: CredentialChoice | None = None) -> Any:
    """Credentials for the sink (the one path: driver, executors and operator). A missing credential is a
    `HandoffConfigError` naming the field or Secret that provides it, not a traceback."""
    from handoff_spark.errors import HandoffConfigError

    where = f"BigQuery sink {sink.project}.{sink.dataset}.{sink.table}"
    if choice is None:
        choice = credential_choice(sink, key_json, bool(sink.credentials_file) and
                                   os.path.exists(sink.credentials_file or ""))
    if choice == "service-account":
        from google.oauth2 import service_account

        return service_account.Credentials.from_service_account_info(json.loads(key_json or "{}"),
                                                                     scopes=list(SCOPES))
    if choice == "key-file":
        from google.oauth2 import service_account

        return service_account.Credentials.from_service_account_file(sink.credentials_file, scopes=list(SCOPES))
    if choice == "unavailable":
        raise HandoffConfigError(
            f"{where}: credentials file {sink.credentials_file} does not exist. Fix: check that the Secret "
            f"named by spec.sink.bigquery.credentialsFrom exists and holds the key")
    if choice == "anonymous":
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        creds, _ = google.auth.default(scopes=list(SCOPES))
    except DefaultCredentialsError:
        raise HandoffConfigError(
            f"{where}: no credentials. Fix: set "
            "spec.sink.bigquery.credentialsFrom to a Secret key holding a service-account JSON key, give the "
            "driver's ServiceAccount Workload Identity, or (emulators only) set spec.sink.bigquery.restEndpoint "
            "and grpcEndpoint") from None
    return creds


def _cached(cache: dict[tuple[Any, ...], Any], sink: BigQuerySink, make: Callable[[BigQuerySink], Any]) -> Any:
    """The client of `cache` for the sink's endpoint and project, made on first use; under the lock, so two
    tasks of one executor starting together build one channel, not two."""
    key = _key(sink)
    with _lock:
        client = cache.get(key)
        if client is None:
            client = cache[key] = make(sink)
        return client


def rest_client(sink: BigQuerySink) -> Any:
    """`google.cloud.bigquery.Client` for the sink's project (cached)."""
    return _cached(_rest, sink, _new_rest_client)


def _new_rest_client(sink: BigQuerySink) -> Any:
    from google.api_core.client_options import ClientOptions
    from google.cloud import bigquery

    options = ClientOptions(api_endpoint=sink.rest_endpoint) if sink.rest_endpoint else None
    return bigquery.Client(project=sink.project, credentials=credentials(sink), client_options=options)


def write_client(sink: BigQuerySink) -> Any:
    """`BigQueryWriteClient` (cached); a plaintext channel for an emulator endpoint."""
    return _cached(_write, sink, _new_write_client)


def _new_write_client(sink: BigQuerySink) -> Any:
    from google.cloud.bigquery_storage_v1 import BigQueryWriteClient
    from google.cloud.bigquery_storage_v1.services.big_query_write.transports import BigQueryWriteGrpcTransport

    if sink.grpc_endpoint:
        import grpc

        target = sink.grpc_endpoint.removeprefix("http://")
        channel = grpc.insecure_channel(target, options=_GRPC_OPTIONS)
        return BigQueryWriteClient(transport=BigQueryWriteGrpcTransport(channel=channel))
    transport = BigQueryWriteGrpcTransport(
        credentials=credentials(sink),
        channel=BigQueryWriteGrpcTransport.create_channel(
            "bigquerystorage.googleapis.com:443", credentials=credentials(sink), options=_GRPC_OPTIONS),
    )
    return BigQueryWriteClient(transport=transport)


def reset() -> None:
    """Forget cached clients (after an endpoint restart in tests, or a credentials rotation)."""
    with _lock:
        _rest.clear()
        _write.clear()


def table_path(sink: BigQuerySink, table: str | None = None) -> str:
    return f"projects/{sink.project}/datasets/{sink.dataset}/tables/{table or sink.table}"


def table_ref(sink: BigQuerySink, table: str | None = None) -> str:
    return f"{sink.project}.{sink.dataset}.{table or sink.table}"
