"""Pipelined, retrying appends to BigQuery Storage Write API streams (executor side).

Why not `google.cloud.bigquery_storage_v1.writer.AppendRowsStream`: its futures are `PollingFuture`s —
`result()` polls from 1 s, and every `add_done_callback` starts a polling thread per request. Here one
bidirectional `AppendRows` call per stream connection carries many requests at once (a window of
`max_inflight`); a reader thread resolves plain `concurrent.futures.Future`s in response order (the API
answers in request order on a connection) and their callbacks record latency and hand the outcome to the
writer. No request ever waits on its own blocking round trip.

Exactly-once within a stream: PENDING (and COMMITTED) streams get explicit row offsets, so a request resent
after a lost response is answered ALREADY_EXISTS instead of being applied twice; a request after a failed
one is answered OUT_OF_RANGE and is simply resent. The `_default` stream (atLeastOnce) takes no offsets.

Errors are classified by `classify()` (pure) into: retry with exponential backoff and full jitter
(RESOURCE_EXHAUSTED quota, UNAVAILABLE, INTERNAL, DEADLINE_EXCEEDED, ABORTED; bounded by
`RetryPolicy.max_attempts`), split the request (too large), move on to a fresh stream (the stream is full),
drop rejected rows to the dead letters (row errors: BigQuery applies none of the request, so the remaining
rows are resent at the same offset), or fail the task.
"""
from __future__ import annotations

import collections
import concurrent.futures
import enum
import queue
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import pyarrow as pa

from handoff_spark.bigquery.schema import Rejected

# gRPC status codes (numeric, as they appear in AppendRowsResponse.error.code).
OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED, NOT_FOUND, ALREADY_EXISTS = 0, 1, 2, 3, 4, 5, 6
PERMISSION_DENIED, RESOURCE_EXHAUSTED, FAILED_PRECONDITION, ABORTED, OUT_OF_RANGE = 7, 8, 9, 10, 11
UNIMPLEMENTED, INTERNAL, UNAVAILABLE = 12, 13, 14
CODE_NAMES = {0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
              5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
              9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL",
              14: "UNAVAILABLE", 16: "UNAUTHENTICATED"}

# BigQuery's AppendRows cap is 10 MB; stay clear of it (framing, schema on the first request).
DEFAULT_MAX_REQUEST_BYTES = 9 * 1024 * 1024


class Action(enum.Enum):
    DONE = "done"  # applied (OK, or ALREADY_EXISTS for a resent request on an offset stream)
    RETRY = "retry"  # transient: back off and resend
    SPLIT = "split"  # request too large: halve it
    ROTATE = "rotate"  # this stream takes no more rows: continue on a fresh one
    ROW_ERRORS = "row-errors"  # some rows rejected: dead-letter them, resend the rest
    RESEND = "resend"  # not applied because an earlier request failed (OUT_OF_RANGE on an offset stream)
    FAIL = "fail"


_TOO_LARGE = ("too large", "size cap", "exceeds the", "request size", "message larger than max")
_STREAM_FULL = ("per-stream cap", "stream buffer")


def classify(code: int, message: str, has_row_errors: bool, rows: int, offsets: bool) -> Action:
    """Decide what to do with an append response. Pure, so the policy is testable without a server."""
    text = message.lower()
    if has_row_errors:  # BigQuery applied none of the request, whatever `error` says (it says INVALID_ARGUMENT)
        return Action.ROW_ERRORS
    if code == OK:
        return Action.DONE
    if code == ALREADY_EXISTS and offsets:
        return Action.DONE
    if code == OUT_OF_RANGE and offsets:
        return Action.RESEND
    if code in (RESOURCE_EXHAUSTED, INVALID_ARGUMENT) and any(s in text for s in _TOO_LARGE):
        return Action.SPLIT if rows > 1 else Action.FAIL
    if code == RESOURCE_EXHAUSTED and any(s in text for s in _STREAM_FULL):
        return Action.ROTATE if offsets else Action.RETRY
    if code in (RESOURCE_EXHAUSTED, UNAVAILABLE, INTERNAL, DEADLINE_EXCEEDED, ABORTED, CANCELLED):
        return Action.RETRY
    return Action.FAIL


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff with full jitter (AWS-style): sleep U(0, min(cap, base·2^attempt))."""

    max_attempts: int = 8
    initial_seconds: float = 0.1
    max_seconds: float = 8.0
    multiplier: float = 2.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0, min(self.max_seconds, self.initial_seconds * self.multiplier ** attempt))


@dataclass
class AppendStats:
    """What one writer did; travels to the driver in the commit message and becomes metrics there."""

    requests: int = 0
    rows: int = 0
    bytes: int = 0
    retries: dict[str, int] = field(default_factory=dict)  # backoff retries, by gRPC code name
    errors: dict[str, int] = field(default_factory=dict)  # every refused request, by gRPC code name
    splits: int = 0
    rotations: int = 0
    reconnects: int = 0
    latencies_ms: list[float] = field(default_factory=list)  # per request, send → response

    def merge(self, other: "AppendStats") -> None:
        self.requests += other.requests
        self.rows += other.rows
        self.bytes += other.bytes
        for k, v in other.retries.items():
            self.retries[k] = self.retries.get(k, 0) + v
        for k, v in other.errors.items():
            self.errors[k] = self.errors.get(k, 0) + v
        self.splits += other.splits
        self.rotations += other.rotations
        self.reconnects += other.reconnects
        self.latencies_ms.extend(other.latencies_ms)


class AppendError(RuntimeError):
    """An append failed for good (not retryable, or retries exhausted)."""

    def __init__(self, message: str, code: int = UNKNOWN):
        super().__init__(message)
        self.code = code


# ---- serialization -------------------------------------------------------------------------------------------

class ArrowEncoder:
    """Arrow IPC payloads: schema once per connection, one record batch per request."""

    format = "arrow"

    def __init__(self, schema: pa.Schema):
        self.schema = schema
        self._schema_bytes = schema.serialize().to_pybytes()

    def payload(self, table: pa.Table) -> bytes:
        batch = table.combine_chunks().to_batches()
        rb = batch[0] if batch else pa.RecordBatch.from_pylist([], schema=self.schema)
        if len(batch) > 1:
            rb = pa.RecordBatch.from_struct_array(pa.concat_arrays([b.to_struct_array() for b in batch]))
        return rb.serialize().to_pybytes()

    def request(self, stream: str, payload: bytes, rows: int, offset: int | None, first: bool) -> Any:
        from google.cloud.bigquery_storage_v1 import types

        req = types.AppendRowsRequest(write_stream=stream)
        if offset is not None:
            req.offset = offset
        data = types.AppendRowsRequest.ArrowData(
            rows=types.ArrowRecordBatch(serialized_record_batch=payload, row_count=rows))
        if first:
            data.writer_schema = types.ArrowSchema(serialized_schema=self._schema_bytes)
        req.arrow_rows = data
        return req


class ProtoEncoder:
    """Protocol-buffer rows (the Write API's original format), built from the table's fields at run time.

    Kept for the benchmark and for BigQuery setups that cannot take Arrow; Arrow is the default because it
    skips the per-row encode (see docs/benchmarks.md)."""

    format = "proto"

    def __init__(self, schema: pa.Schema):
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

        self.schema = schema
        fdp = descriptor_pb2.FileDescriptorProto(name=f"handoff_row_{id(self)}.proto", package="handoff",
                                                 syntax="proto2")
        msg = fdp.message_type.add(name="Row")
        T = descriptor_pb2.FieldDescriptorProto
        self._kinds: list[tuple[str, str]] = []
        for i, f in enumerate(schema, start=1):
            t = f.type
            if pa.types.is_integer(t):
                ptype, kind = T.TYPE_INT64, "int"
            elif pa.types.is_floating(t):
                ptype, kind = T.TYPE_DOUBLE, "float"
            elif pa.types.is_boolean(t):
                ptype, kind = T.TYPE_BOOL, "bool"
            elif pa.types.is_binary(t):
                ptype, kind = T.TYPE_BYTES, "bytes"
            elif pa.types.is_timestamp(t):
                ptype, kind = T.TYPE_INT64, "ts"  # BigQuery: TIMESTAMP as int64 microseconds since the epoch
            elif pa.types.is_date(t):
                ptype, kind = T.TYPE_INT32, "date"  # days since the epoch
            else:
                ptype, kind = T.TYPE_STRING, "str"
            msg.field.add(name=f.name, number=i, type=ptype, label=T.LABEL_OPTIONAL)
            self._kinds.append((f.name, kind))
        pool = descriptor_pool.DescriptorPool()
        pool.Add(fdp)
        self._cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("handoff.Row"))
        self._descriptor = descriptor_pb2.DescriptorProto()
        msg_copy = descriptor_pb2.DescriptorProto()
        msg_copy.CopyFrom(msg)
        self._descriptor = msg_copy

    def payload(self, table: pa.Table) -> list[bytes]:  # type: ignore[override]
        cols = []
        for name, kind in self._kinds:
            col = table.column(name)
            if kind == "ts":
                col = col.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
            elif kind == "date":
                col = col.cast(pa.date32()).cast(pa.int32())
            cols.append((name, col.to_pylist()))
        out = []
        cls = self._cls
        for i in range(table.num_rows):
            m = cls()
            for name, values in cols:
                v = values[i]
                if v is not None:
                    setattr(m, name, v if not isinstance(v, (dict, list)) else str(v))
            out.append(m.SerializeToString())
        return out

    def request(self, stream: str, payload: list[bytes], rows: int, offset: int | None, first: bool) -> Any:
        from google.cloud.bigquery_storage_v1 import types

        req = types.AppendRowsRequest(write_stream=stream)
        if offset is not None:
            req.offset = offset
        data = types.AppendRowsRequest.ProtoData(rows=types.ProtoRows(serialized_rows=payload))
        if first:
            data.writer_schema = types.ProtoSchema(proto_descriptor=self._descriptor)
        req.proto_rows = data
        return req


def payload_size(payload: bytes | list[bytes]) -> int:
    return len(payload) if isinstance(payload, bytes) else sum(len(p) + 3 for p in payload)


# ---- one AppendRows connection -------------------------------------------------------------------------------

class _Connection:
    """One bidirectional AppendRows call: requests go in through a queue, responses resolve futures in order."""

    _CLOSE = object()

    def __init__(self, client: Any, stream: str):
        self._requests: queue.Queue[Any] = queue.Queue()
        self._pending: collections.deque[concurrent.futures.Future[Any]] = collections.deque()
        self._lock = threading.Lock()
        self.broken: BaseException | None = None
        # The writer schema rides on every request until the server has accepted one on this connection: a
        # first request refused before parsing (too large) would otherwise leave the connection schema-less.
        self.schema_acked = False
        # The transport's raw stream-stream callable: the GAPIC wrapper prefetches the first response while
        # opening the call, which deadlocks a request queue that is still empty.
        self._call = client.transport.append_rows(
            self._request_iter(), metadata=(("x-goog-request-params", f"write_stream={stream}"),))
        self._reader = threading.Thread(target=self._read, name="bq-append-reader", daemon=True)
        self._reader.start()

    def _request_iter(self) -> Iterator[Any]:
        while True:
            item = self._requests.get()
            if item is self._CLOSE:
                return
            yield item

    def send(self, request: Any) -> concurrent.futures.Future[Any]:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            if self.broken is not None:
                fut.set_exception(self.broken)
                return fut
            self._pending.append(fut)
        self._requests.put(request)
        return fut

    def _read(self) -> None:
        try:
            for response in self._call:
                with self._lock:
                    fut = self._pending.popleft() if self._pending else None
                if fut is not None:
                    if not response.error.code:
                        self.schema_acked = True
                    fut.set_result(response)
            error: BaseException = AppendError("AppendRows connection closed by the server", UNAVAILABLE)
        except BaseException as exc:  # noqa: BLE001 — every failure must reach the waiting futures
            error = exc
        with self._lock:
            self.broken = error
            pending, self._pending = list(self._pending), collections.deque()
        for fut in pending:
            if not fut.done():
                fut.set_exception(error)

    def close(self) -> None:
        self._requests.put(self._CLOSE)
        try:
            self._call.cancel()
        except Exception:  # noqa: BLE001
            pass
        self._reader.join(timeout=10)


def exception_code(exc: BaseException) -> tuple[int, str]:
    """gRPC code and message of a transport-level failure (api_core exception, grpc error or our own)."""
    if isinstance(exc, AppendError):
        return exc.code, str(exc)
    grpc_code = getattr(exc, "grpc_status_code", None)
    if grpc_code is not None:
        return int(grpc_code.value[0]), str(exc)
    code_fn = getattr(exc, "code", None)
    if callable(code_fn):
        try:
            return int(code_fn().value[0]), str(exc)
        except Exception:  # noqa: BLE001
            pass
    return UNAVAILABLE, f"{type(exc).__name__}: {exc}"


# ---- the writer ----------------------------------------------------------------------------------------------

@dataclass
class _Chunk:
    table: pa.Table
    payload: Any
    size: int
    index_base: list[int]  # original row numbers (in the writer's input order) of the chunk's rows
    attempts: int = 0


@dataclass
class StreamResult:
    name: str
    rows: int


class StreamWriter:
    """Appends Arrow tables to PENDING streams it creates (exactlyOnce) or to `_default` (atLeastOnce).

    `write(table)` splits into requests of at most `max_rows` rows and `max_bytes` bytes and keeps up to
    `max_inflight` of them outstanding; `close()` waits for all and returns the streams with their confirmed
    row counts (for the driver's finalize + batch commit) and the rows BigQuery rejected.
    """

    def __init__(self, client: Any, table_path: str, schema: pa.Schema, *, pending: bool = True,
                 fmt: str = "arrow", max_rows: int = 10_000, max_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 max_inflight: int = 16, retry: RetryPolicy = RetryPolicy(), rng: random.Random | None = None,
                 on_request: Callable[[], None] | None = None):
        self.client = client
        self.table_path = table_path
        self.pending = pending
        self.encoder = ArrowEncoder(schema) if fmt == "arrow" else ProtoEncoder(schema)
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.max_inflight = max_inflight
        self.retry = retry
        self.rng = rng or random.Random()
        self.on_request = on_request
        self.stats = AppendStats()
        self.rejected: list[tuple[int, str]] = []  # (input row number, BigQuery's message)
        self.streams: list[StreamResult] = []
        self._stream: str | None = None
        self._confirmed = 0  # rows acknowledged on the current stream
        self._next_offset = 0
        self._conn: _Connection | None = None
        self._todo: collections.deque[_Chunk] = collections.deque()
        self._inflight: collections.deque[tuple[_Chunk, int | None, concurrent.futures.Future[Any]]] = collections.deque()
        self._done: queue.Queue[tuple[_Chunk, int | None, Any, BaseException | None]] = queue.Queue()
        self._rows_in = 0

    # -- stream lifecycle --

    def _open_stream(self) -> None:
        if not self.pending:
            self._stream = f"{self.table_path}/streams/_default"
        else:
            from google.cloud.bigquery_storage_v1 import types

            ws = self._with_retry(lambda: self.client.create_write_stream(
                parent=self.table_path, write_stream=types.WriteStream(type_=types.WriteStream.Type.PENDING)))
            self._stream = ws.name
            self.streams.append(StreamResult(ws.name, 0))
        self._confirmed = 0
        self._next_offset = 0
        self._connect()

    def _connect(self) -> None:
        if self._conn is not None:
            self._conn.close()
        assert self._stream is not None
        self._conn = _Connection(self.client, self._stream)

    def _with_retry(self, fn: Callable[[], Any]) -> Any:
        attempt = 0
        while True:
            try:
                return fn()
            except Exception as exc:  # noqa: BLE001
                code, message = exception_code(exc)
                if classify(code, message, False, 0, False) is not Action.RETRY or attempt + 1 >= self.retry.max_attempts:
                    raise
                self._count_retry(code)
                time.sleep(self.retry.delay(attempt, self.rng))
                attempt += 1

    def _count_retry(self, code: int) -> None:
        name = CODE_NAMES.get(code, str(code))
        self.stats.retries[name] = self.stats.retries.get(name, 0) + 1

    # -- public --

    def write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        base = self._rows_in
        self._rows_in += table.num_rows
        for start in range(0, table.num_rows, self.max_rows):
            part = table.slice(start, self.max_rows)
            self._enqueue(part, list(range(base + start, base + start + part.num_rows)), front=False)
        self._pump(drain=False)

    def close(self) -> list[StreamResult]:
        self._pump(drain=True)
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        return [s for s in self.streams if s.rows > 0] if self.pending else []

    # -- internals --

    def _enqueue(self, table: pa.Table, rows: list[int], front: bool) -> None:
        payload = self.encoder.payload(table)
        size = payload_size(payload)
        if size > self.max_bytes and table.num_rows > 1:
            half = table.num_rows // 2
            self.stats.splits += 1
            first = (table.slice(0, half), rows[:half])
            second = (table.slice(half), rows[half:])
            if front:  # keep order: second goes in first so that first ends up in front
                self._enqueue(*second, front=True)
                self._enqueue(*first, front=True)
            else:
                self._enqueue(*first, front=False)
                self._enqueue(*second, front=False)
            return
        chunk = _Chunk(table, payload, size, rows)
        if front:
            self._todo.appendleft(chunk)
        else:
            self._todo.append(chunk)

    def _send(self, chunk: _Chunk) -> None:
        if self._stream is None:
            self._open_stream()
        assert self._conn is not None and self._stream is not None
        offset = self._next_offset if self.pending else None
        self._next_offset += chunk.table.num_rows
        request = self.encoder.request(self._stream, chunk.payload, chunk.table.num_rows, offset,
                                       first=not self._conn.schema_acked)
        sent = time.monotonic()
        if self.on_request is not None:
            self.on_request()
        fut = self._conn.send(request)
        self.stats.requests += 1
        self.stats.bytes += chunk.size

        def on_done(f: concurrent.futures.Future[Any], chunk: _Chunk = chunk, offset: int | None = offset) -> None:
            self.stats.latencies_ms.append((time.monotonic() - sent) * 1000.0)
            exc = f.exception()
            self._done.put((chunk, offset, None if exc else f.result(), exc))

        fut.add_done_callback(on_done)
        self._inflight.append((chunk, offset, fut))

    def _pump(self, drain: bool) -> None:
        """Send while the window has room; collect outcomes; on failures drain the window and recover.

        Without `drain`, returns once the backlog fits in the window (so `write` keeps the pipeline full
        without holding the whole partition in memory)."""
        while self._todo or self._inflight:
            while self._todo and len(self._inflight) < self.max_inflight:
                self._send(self._todo.popleft())
            if not drain and not self._todo and len(self._inflight) < self.max_inflight:
                return
            failures = self._collect(wait_all=False)
            if failures:
                failures += self._collect(wait_all=True)  # the rest of the window, then recover
                self._recover(failures)

    def _collect(self, wait_all: bool) -> list[tuple[_Chunk, int, str, Any]]:
        """Take outcomes off the done queue: at least one (or all in flight); returns failed ones in order."""
        failures: list[tuple[_Chunk, int, str, Any]] = []
        while self._inflight:
            chunk, offset, response, exc = self._done.get()
            head = self._inflight.popleft()
            assert head[0] is chunk, "responses arrive in request order"
            if exc is not None:
                code, message = exception_code(exc)
                failures.append((chunk, code, message, None))
            else:
                code = int(response.error.code) if response.error and response.error.code else OK
                row_errors = list(response.row_errors) if response.row_errors else []
                if row_errors and code == OK:
                    code = INVALID_ARGUMENT  # row errors are a refusal even without an error status
                action = classify(code, response.error.message if code else "", bool(row_errors),
                                  chunk.table.num_rows, self.pending)
                if action is Action.DONE:
                    self._confirmed += chunk.table.num_rows
                    self.stats.rows += chunk.table.num_rows
                    if self.pending:
                        self.streams[-1].rows = self._confirmed
                else:
                    failures.append((chunk, code, response.error.message, row_errors))
            if not wait_all and not failures:
                return failures
            if not wait_all and failures:
                return failures
        return failures

    def _recover(self, failures: list[tuple[_Chunk, int, str, Any]]) -> None:
        requeue: list[tuple[pa.Table, list[int], _Chunk]] = []
        backoff_attempt = -1
        reconnect = False
        rotate = False
        for chunk, code, message, row_errors in failures:
            action = classify(code, message, bool(row_errors), chunk.table.num_rows, self.pending)
            name = CODE_NAMES.get(code, str(code))
            self.stats.errors[name] = self.stats.errors.get(name, 0) + 1
            if row_errors is None and action is not Action.FAIL:
                reconnect = True  # transport failure: this connection is gone
            if action is Action.FAIL:
                raise AppendError(f"append to {self._stream} failed: {CODE_NAMES.get(code, code)}: {message}", code)
            if action is Action.ROW_ERRORS:
                kept, kept_rows, rejected = split_row_errors(chunk.table, chunk.index_base, row_errors)
                self.rejected.extend(rejected)
                if kept.num_rows:
                    requeue.append((kept, kept_rows, chunk))
                continue
            if action is Action.SPLIT:
                half = chunk.table.num_rows // 2
                self.stats.splits += 1
                requeue.append((chunk.table.slice(0, half), chunk.index_base[:half], chunk))
                requeue.append((chunk.table.slice(half), chunk.index_base[half:], chunk))
                continue
            if action is Action.ROTATE:
                rotate = True
            elif action is Action.RETRY:
                chunk.attempts += 1
                self._count_retry(code)
                if chunk.attempts >= self.retry.max_attempts:
                    raise AppendError(f"append to {self._stream}: {CODE_NAMES.get(code, code)} after "
                                      f"{chunk.attempts} attempts: {message}", code)
                backoff_attempt = max(backoff_attempt, chunk.attempts - 1)
            requeue.append((chunk.table, chunk.index_base, chunk))
        # Everything not confirmed is resent, in order, from the confirmed offset.
        self._next_offset = self._confirmed
        for table, rows, old in reversed(requeue):
            before = len(self._todo)
            self._enqueue(table, rows, front=True)
            for c in list(self._todo)[: len(self._todo) - before]:
                c.attempts = old.attempts
        if backoff_attempt >= 0:
            time.sleep(self.retry.delay(backoff_attempt, self.rng))
        if rotate:
            self.stats.rotations += 1
            self._open_stream()
        elif reconnect:
            self.stats.reconnects += 1
            try:
                self._connect()
            except Exception:  # noqa: BLE001 — the next send fails and is retried
                pass


def split_row_errors(table: pa.Table, rows: list[int], row_errors: Sequence[Any]
                     ) -> tuple[pa.Table, list[int], list[tuple[int, str]]]:
    """A request BigQuery refused for some of its rows (it applies none of them): the rows to resend, their
    input row numbers, and (input row number, BigQuery's message) for the dead letters."""
    bad = {int(e.index): str(e.message) for e in row_errors}
    rejected = [(rows[i], f"BigQuery row error: {msg}") for i, msg in sorted(bad.items()) if 0 <= i < len(rows)]
    keep = [i for i in range(table.num_rows) if i not in bad]
    return table.take(pa.array(keep, type=pa.int64())), [rows[i] for i in keep], rejected


def rejected_rows(writer: StreamWriter) -> list[Rejected]:
    return [Rejected(i, msg) for i, msg in writer.rejected]


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, int(round(q / 100.0 * (len(ordered) - 1)))))
    return ordered[k]
