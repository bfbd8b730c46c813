"""bigquery_truth's decisions: when the ledger SELECT runs (metadata signature, recheck age), which
credentials the operator uses for a BigQuery sink (credentialsFrom key, key file, anonymous emulator,
default), the key taken from the Secrets the handlers read, and the bounded caches."""
from __future__ import annotations

import json

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from handoff_spark.bigquery.client import credential_choice
from handoff_operator.truth.bigquery import (BoundedCache, CachedLedger, TableSignature,
                                             needs_query, rest_client, service_account_key)
from handoff_operator.spec.validation import parse_spec
from handoff_spark.config import BigQuerySink

from operator_spec_support import spec

SIG = TableSignature(modified_ms=1_000, num_rows=3, buffer_rows=None, buffer_oldest_ms=None, etag='"e1"')


def _sink(**kw) -> BigQuerySink:
    return BigQuerySink.model_validate({"kind": "bigquery", "project": "p1", "dataset": "d", "table": "t", **kw})


def service_account_json(email: str = "handoff-reader@p1.iam.gserviceaccount.com",
                         token_uri: str = "https://oauth2.googleapis.com/token") -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    return json.dumps({"type": "service_account", "project_id": "p1", "private_key_id": "k1", "private_key": pem,
                       "client_email": email, "client_id": "1", "token_uri": token_uri})


def test_query_only_when_the_ledger_table_changed_or_the_answer_is_old():
    cached = CachedLedger(SIG, commit="batch 3", read_at=100.0)
    assert needs_query(None, SIG, 100.0)  # nothing cached yet
    assert not needs_query(cached, SIG, 115.0)  # the next refresh, table unchanged: no billed query
    assert needs_query(cached, TableSignature(1_000, 4, None, None, '"e1"'), 115.0)  # a row was added
    assert needs_query(cached, TableSignature(2_000, 3, None, None, '"e1"'), 115.0)  # modified
    assert needs_query(cached, TableSignature(1_000, 3, 1, 99, '"e1"'), 115.0)  # rows in the streaming buffer
    assert needs_query(cached, TableSignature(1_000, 3, None, None, '"e2"'), 115.0)  # metadata changed
    # streaming-buffer counts are estimates: an unchanged signature is re-read after the recheck age anyway
    assert not needs_query(cached, SIG, 399.0, recheck_seconds=300)
    assert needs_query(cached, SIG, 400.0, recheck_seconds=300)


def test_credential_choice_follows_the_data_plane_order():
    key = service_account_json()
    emulator = _sink(restEndpoint="http://127.0.0.1:9050", grpcEndpoint="127.0.0.1:9060")
    mounted = _sink(credentialsFile="/var/run/secrets/handoff/bigquery/credentials.json")
    assert credential_choice(_sink(), key, False) == "service-account"
    assert credential_choice(mounted, key, False) == "service-account"  # the Secret itself, not the driver's path
    assert credential_choice(mounted, None, True) == "key-file"  # e.g. the operator run where the file exists
    assert credential_choice(mounted, None, False) == "unavailable"  # → the consumer group's offsets
    assert credential_choice(emulator, None, False) == "anonymous"
    assert credential_choice(emulator, key, False) == "service-account"
    assert credential_choice(_sink(), None, False) == "default"  # Workload Identity / ADC


def test_service_account_key_from_the_secrets_the_handlers_read():
    s = spec(sink={"bigquery": {"project": "p1", "dataset": "d", "table": "t",
                                "credentialsFrom": {"name": "bq-sa", "key": "sa.json"}}})
    parsed, problems = parse_spec(s)
    assert parsed is not None, problems
    key = service_account_json()
    assert service_account_key(parsed, {"bq-sa": {"sa.json": key}}) == key
    assert service_account_key(parsed, {"bq-sa": None}) is None  # missing Secret: validation reports it
    assert service_account_key(parsed, {"bq-sa": {"other": "x"}}) is None
    no_creds, _ = parse_spec(spec(sink={"bigquery": {"project": "p1", "dataset": "d", "table": "t"}}))
    assert service_account_key(no_creds, {}) is None
    iceberg, _ = parse_spec(spec())
    assert service_account_key(iceberg, {}) is None


def test_client_is_built_from_the_service_account_key_and_cached_per_key():
    from google.auth.credentials import AnonymousCredentials
    from google.oauth2 import service_account

    key = service_account_json("reader@p1.iam.gserviceaccount.com")
    sink = _sink(credentialsFile="/nonexistent/credentials.json")
    client = rest_client(sink, "service-account", key)
    assert isinstance(client._credentials, service_account.Credentials)
    assert client._credentials.service_account_email == "reader@p1.iam.gserviceaccount.com"
    assert "https://www.googleapis.com/auth/bigquery" in client._credentials.scopes
    assert rest_client(sink, "service-account", key) is client  # no new client (and token) per refresh
    rotated = rest_client(sink, "service-account", service_account_json("rotated@p1.iam.gserviceaccount.com"))
    assert rotated is not client and rotated._credentials.service_account_email.startswith("rotated@")
    emulator = _sink(restEndpoint="http://127.0.0.1:9050")
    assert isinstance(rest_client(emulator, "anonymous", None)._credentials, AnonymousCredentials)


def test_bounded_cache_forgets_the_least_recently_used():
    cache: BoundedCache[str, int] = BoundedCache(size=2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # a is now the most recent
    cache.put("c", 3)
    assert cache.get("b") is None and cache.get("a") == 1 and cache.get("c") == 3 and len(cache) == 2
    cache.pop("a")
    assert cache.get("a") is None


def test_signature_from_a_tables_get_answer():
    """The fields BigQuery sends (strings of ms / counts), including the streaming buffer Write API rows sit in."""
    from google.cloud import bigquery

    from handoff_operator.truth.bigquery import signature

    ref = {"projectId": "p1", "datasetId": "d", "tableId": "t__handoff_ledger"}
    table = bigquery.Table.from_api_repr({
        "tableReference": ref, "lastModifiedTime": "1795328064021", "numRows": "3", "etag": "abc",
        "streamingBuffer": {"estimatedRows": "5", "oldestEntryTime": "1795328064000"}})
    assert signature(table) == TableSignature(1795328064021, 3, 5, 1795328064000, "abc")
    assert signature(bigquery.Table.from_api_repr({"tableReference": ref})) == TableSignature(None, None, None, None, None)
