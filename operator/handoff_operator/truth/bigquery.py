"""A BigQuery sink's committed progress for the status: its `__handoff_ledger` table, read cheaply and with
the sink's own credentials.

Why a cache in front of the ledger SELECT: the status refreshes every 15 s per handoff, and on real BigQuery
every query is billed (10 MB minimum each), while `tables.get` is free. So each refresh first asks the
ledger table's metadata (last modified time, row count, streaming-buffer estimate, etag) and runs the SELECT
only when that signature differs from the one the cached answer was read under. The Storage Write API's
rows sit in the streaming buffer, which `numRows`/`lastModifiedTime` do not cover and whose row count is
only an estimate, so the cached answer is also re-read after `LEDGER_RECHECK_SECONDS` whatever the metadata
says: a missed signal delays the status by at most that, it never freezes it.

Why the operator builds its own client: `credentialsFrom` is mounted into the driver pod, not into the
operator's; without the key the operator could not read the ledger and fell back to the consumer group's
offsets. The handlers read that Secret anyway (to validate and render), so they pass the service-account
JSON here and the client is built from it (google.oauth2.service_account); without one the client is
anonymous for an emulator endpoint, else application default credentials (Workload Identity).

The decisions (`needs_query`, `service_account_key`; `bigquery_credential_choice` is the data plane's) are pure functions over plain data;
the rest is I/O and two bounded per-process caches (clients, ledger answers).
"""
from __future__ import annotations

import collections
import hashlib
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generic, TypeVar

from handoff_spark.config import AppConfig, BigQuerySink
# One credentials path for the driver and the operator (google imports there are deferred).
from handoff_spark.ledger import (Commit, bigquery_credential_choice, bigquery_credentials, bigquery_latest_commit,
                                  bigquery_ledger_ref)

if TYPE_CHECKING:
    from handoff_spark.ledger import CredentialChoice

LEDGER_RECHECK_SECONDS = 300.0
CACHE_SIZE = 1024


# ------------------------------------------------------------------------------------------ decisions

def service_account_key(spec: Any, secrets: Mapping[str, Mapping[str, str] | None]) -> str | None:
    """The service-account JSON `spec.sink.bigquery.credentialsFrom` points at, from the Secrets the handlers
    read (None: no credentialsFrom, or the Secret/key is missing — validation reports that)."""
    bq = getattr(getattr(spec, "sink", None), "bigquery", None)
    ref = getattr(bq, "credentials_from", None)
    if ref is None:
        return None
    data = secrets.get(ref.name)
    return None if data is None else data.get(ref.key)


@dataclass(frozen=True)
class TableSignature:
    """What `tables.get` says about the ledger table; a different one means new ledger rows may exist."""

    modified_ms: int | None
    num_rows: int | None
    buffer_rows: int | None
    buffer_oldest_ms: int | None
    etag: str | None


@dataclass(frozen=True)
class CachedLedger:
    signature: TableSignature
    commit: Commit | None
    read_at: float  # monotonic seconds


def needs_query(cached: CachedLedger | None, signature: TableSignature, now: float,
                recheck_seconds: float = LEDGER_RECHECK_SECONDS) -> bool:
    """Run the ledger SELECT? Only when nothing is cached, the table's signature changed since the cached
    answer, or the answer is older than `recheck_seconds` (streaming-buffer statistics are estimates)."""
    return cached is None or cached.signature != signature or now - cached.read_at >= recheck_seconds


K = TypeVar("K")
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    """A small thread-safe LRU map: the operator serves many handoffs from worker threads, and entries of
    deleted handoffs must not pile up forever."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size = size
        self._data: collections.OrderedDict[K, V] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)

    def pop(self, key: K) -> None:
        with self._lock:
            self._data.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)


LEDGER_CACHE: BoundedCache[tuple[str, ...], CachedLedger] = BoundedCache()
_CLIENTS: BoundedCache[tuple[str, ...], Any] = BoundedCache(64)


# ------------------------------------------------------------------------------------------ I/O

def rest_client(sink: BigQuerySink, choice: CredentialChoice, key_json: str | None) -> Any:
    """`google.cloud.bigquery.Client` per (project, endpoint, credentials), cached: a client per refresh
    would fetch a fresh OAuth token every 15 s."""
    key_hash = hashlib.sha256((key_json or "").encode()).hexdigest()
    cache_key = (sink.project, sink.rest_endpoint or "", choice, sink.credentials_file or "", key_hash)
    client = _CLIENTS.get(cache_key)
    if client is None:
        from google.api_core.client_options import ClientOptions
        from google.cloud import bigquery

        options = ClientOptions(api_endpoint=sink.rest_endpoint) if sink.rest_endpoint else None
        client = bigquery.Client(project=sink.project, credentials=bigquery_credentials(sink, key_json, choice),
                                 client_options=options)
        _CLIENTS.put(cache_key, client)
    return client


def signature(table: Any) -> TableSignature:
    """The signature of a `tables.get` answer (`google.cloud.bigquery.Table`)."""
    def ms(moment: Any) -> int | None:
        return None if moment is None else int(moment.timestamp() * 1000)

    buffer = table.streaming_buffer
    return TableSignature(ms(table.modified), table.num_rows,
                          None if buffer is None else buffer.estimated_rows,
                          None if buffer is None else ms(buffer.oldest_entry_time), table.etag)


def ledger_commit(config: AppConfig, key_json: str | None = None,
                  cache: BoundedCache[tuple[str, ...], CachedLedger] = LEDGER_CACHE,
                  clock: Callable[[], float] = time.monotonic) -> Any:
    """The newest ledger row of this handoff (None: no ledger table or row yet, or no way to authenticate).
    Raises on other BigQuery errors (the status reports them)."""
    from google.api_core.exceptions import NotFound

    sink = config.sink
    if not isinstance(sink, BigQuerySink):
        return None
    choice = bigquery_credential_choice(sink, key_json, bool(sink.credentials_file) and os.path.exists(sink.credentials_file or ""))
    if choice == "unavailable":
        return None
    client = rest_client(sink, choice, key_json)
    ref = bigquery_ledger_ref(sink)
    key = (config.handoff_id, sink.project, sink.rest_endpoint or "", ref)
    try:
        table = client.get_table(ref, retry=None)
    except NotFound:
        cache.pop(key)
        return None
    sig = signature(table)
    cached = cache.get(key)
    now = clock()
    if not needs_query(cached, sig, now):
        assert cached is not None
        return cached.commit
    # The signature is taken before the SELECT: a row landing in between makes the next refresh query
    # again, never hides behind an older answer.
    from handoff_operator.runtime import metrics

    metrics.CATALOG_READS.labels(kind="bigquery_ledger_query").inc()
    commit = bigquery_latest_commit(sink, config.handoff_id, client=client)
    cache.put(key, CachedLedger(sig, commit, now))
    return commit


__all__ = ["LEDGER_RECHECK_SECONDS", "TableSignature", "CachedLedger", "BoundedCache", "LEDGER_CACHE",
           "service_account_key", "needs_query", "signature", "ledger_commit",
           "rest_client"]
