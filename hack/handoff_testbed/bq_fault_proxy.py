"""A fault-injecting gRPC proxy in front of the BigQuery emulator's Storage Write API (test only).

Why: BigQuery refuses rows it cannot take with `AppendRowsResponse.row_errors` — the whole request is
refused (nothing appended), the error says INVALID_ARGUMENT, and each bad row is listed by its index in the
request. The emulator never answers that way, so the sink's handling (bad rows to the dead-letter topic with
BigQuery's message, the rest resent at the same offset) could otherwise only be unit-tested. This proxy
implements the `google.cloud.bigquery.storage.v1.BigQueryWrite` service, forwards every RPC to the
emulator's gRPC endpoint unchanged, and answers an AppendRows request itself — with row errors for exactly
the rows whose string column value starts with the marker (default "REJECT"), and without forwarding it —
the way BigQuery does. Later requests of the same connection are forwarded as sent, so their explicit
offsets now lie past the stream's end and the emulator answers OUT_OF_RANGE, as BigQuery would.

Both row formats are inspected: Arrow record batches (the sink's default) and proto rows (decoded with the
request's own descriptor). The messages travel as bytes: the service is served with grpc's generic handlers
(the client library ships types, not server stubs) and only AppendRows requests are parsed.
"""
from __future__ import annotations

import collections
import concurrent.futures
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator

SERVICE = "google.cloud.bigquery.storage.v1.BigQueryWrite"
UNARY_METHODS = ("CreateWriteStream", "GetWriteStream", "FinalizeWriteStream", "BatchCommitWriteStreams",
                 "FlushRows")
# What BigQuery says in `error` when it lists row errors (the rows' own messages are in row_errors).
ROW_ERRORS_MESSAGE = ("Errors found while processing rows. Please refer to the row_errors field for details. "
                      "The list may not be complete because of the size limitations. Entity: {stream}")
_OPTIONS = [("grpc.max_send_message_length", 32 * 1024 * 1024),
            ("grpc.max_receive_message_length", 32 * 1024 * 1024)]
_END = object()


def row_error_message(column: str, value: str) -> str:
    """The text the proxy gives a refused row (tests look for it in the dead letters' headers)."""
    return f"Field {column}: value {value!r} refused by BigQuery (fault proxy marker)"


@dataclass
class ProxyStats:
    forwarded_appends: int = 0
    refused_appends: int = 0
    refused_rows: int = 0
    refused_values: list[str] = field(default_factory=list)


class BigQueryWriteFaultProxy:
    """`BigQueryWriteFaultProxy(emulator.grpc_endpoint).start()`; point the sink's grpcEndpoint at
    `.endpoint`; `.stop()`. `.stats` counts what was refused."""

    def __init__(self, upstream: str, marker: str = "REJECT") -> None:
        self.upstream = upstream
        self.marker = marker
        self.stats = ProxyStats()
        self._lock = threading.Lock()
        self._server: Any = None
        self._channel: Any = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "BigQueryWriteFaultProxy":
        import grpc

        self._channel = grpc.insecure_channel(self.upstream, options=_OPTIONS)
        handlers = {m: grpc.unary_unary_rpc_method_handler(self._unary(m)) for m in UNARY_METHODS}
        handlers["AppendRows"] = grpc.stream_stream_rpc_method_handler(self._append_rows)
        # One server thread per open AppendRows call (the sync server): room for a Spark app's tasks.
        self._server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=64), options=_OPTIONS)
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=1).wait()
            self._server = None
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    # ---- forwarding -------------------------------------------------------------------------------

    @staticmethod
    def _metadata(context: Any) -> list[tuple[str, str]]:
        """The routing header the client sends (x-goog-request-params); transport headers are grpc's own."""
        return [(k, v) for k, v in context.invocation_metadata() if k.startswith("x-goog-")]

    def _unary(self, method: str) -> Any:
        import grpc

        call = self._channel.unary_unary(f"/{SERVICE}/{method}")

        def handle(request: bytes, context: Any) -> bytes:
            try:
                return call(request, metadata=self._metadata(context), timeout=context.time_remaining())
            except grpc.RpcError as exc:
                context.abort(exc.code(), exc.details() or "")
                raise  # unreachable: abort raises

        return handle

    def _append_rows(self, requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
        """Answers in request order: forwarded requests by the emulator's responses, refused ones by the
        proxy's own, each response waiting for the ones before it (the API's order on a connection)."""
        import grpc
        from google.cloud.bigquery_storage_v1 import types

        request_pb = types.AppendRowsRequest.pb()
        slots: queue.Queue[Any] = queue.Queue()
        to_upstream: queue.Queue[Any] = queue.Queue()
        waiting: collections.deque[concurrent.futures.Future[bytes]] = collections.deque()
        lock = threading.Lock()
        broken: list[BaseException] = []

        upstream = self._channel.stream_stream(f"/{SERVICE}/AppendRows")(
            iter(to_upstream.get, _END), metadata=self._metadata(context))
        context.add_callback(upstream.cancel)

        def read_upstream() -> None:
            error: BaseException
            try:
                for response in upstream:
                    with lock:
                        fut = waiting.popleft() if waiting else None
                    if fut is not None:
                        fut.set_result(response)
                error = ConnectionError("the emulator closed the AppendRows call")
            except grpc.RpcError as exc:
                error = exc
            with lock:
                broken.append(error)
                pending = list(waiting)
                waiting.clear()
            for fut in pending:
                fut.set_exception(error)

        def pump() -> None:
            writer_schema: Any = None  # the connection's last writer schema (ArrowSchema or ProtoSchema)
            decoder: Any = None
            schema_sent = False
            try:
                for raw in requests:
                    req = request_pb.FromString(raw)
                    fut: concurrent.futures.Future[bytes] = concurrent.futures.Future()
                    kind = req.WhichOneof("rows")
                    data = getattr(req, kind) if kind else None
                    has_schema = data is not None and data.HasField("writer_schema")
                    if has_schema:
                        writer_schema = type(data.writer_schema)()
                        writer_schema.CopyFrom(data.writer_schema)
                        decoder = _decoder(kind, writer_schema)
                    refused = self._refuse(req, decoder(data)) if data is not None and decoder is not None else None
                    if refused is not None:
                        fut.set_result(refused)
                        slots.put(fut)
                        continue
                    if data is not None and not has_schema and not schema_sent and writer_schema is not None:
                        # The refused request carried the connection's schema; the emulator must get it too.
                        data.writer_schema.CopyFrom(writer_schema)
                        raw = req.SerializeToString()
                        has_schema = True
                    schema_sent = schema_sent or has_schema
                    with lock:
                        if broken:
                            fut.set_exception(broken[0])
                        else:
                            waiting.append(fut)
                    slots.put(fut)
                    with self._lock:
                        self.stats.forwarded_appends += 1
                    to_upstream.put(raw)
            except Exception:  # noqa: BLE001 — the client went away (cancel): end both directions
                pass
            finally:
                to_upstream.put(_END)
                slots.put(_END)

        threading.Thread(target=read_upstream, name="bq-proxy-upstream", daemon=True).start()
        threading.Thread(target=pump, name="bq-proxy-pump", daemon=True).start()
        for fut in iter(slots.get, _END):
            try:
                yield fut.result()
            except grpc.RpcError as exc:
                context.abort(exc.code(), exc.details() or "")
            except ConnectionError as exc:
                context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))

    def _refuse(self, req: Any, rows: list[dict[str, str]]) -> bytes | None:
        """The proxy's own response for a request holding marked rows (None: forward it). `rows`: each
        row's string columns."""
        from google.cloud.bigquery_storage_v1 import types

        bad: dict[int, str] = {}
        for i, values in enumerate(rows):
            for name, value in values.items():
                if value.startswith(self.marker):
                    bad[i] = row_error_message(name, value)
                    break
        if not bad:
            return None
        with self._lock:
            self.stats.refused_appends += 1
            self.stats.refused_rows += len(bad)
            self.stats.refused_values += [bad[i] for i in sorted(bad)]
        response = types.AppendRowsResponse.pb()(write_stream=req.write_stream)
        response.error.code = 3  # INVALID_ARGUMENT, as BigQuery
        response.error.message = ROW_ERRORS_MESSAGE.format(stream=req.write_stream)
        for i in sorted(bad):
            response.row_errors.add(index=i, code=types.RowError.RowErrorCode.FIELDS_ERROR, message=bad[i])
        return response.SerializeToString()


def _decoder(kind: str, writer_schema: Any) -> Any:
    """rows data → [{string column: value} per row], for Arrow record batches or proto rows."""
    if kind == "arrow_rows":
        import pyarrow as pa

        schema = pa.ipc.read_schema(pa.py_buffer(writer_schema.serialized_schema))
        names = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]

        def arrow_rows(data: Any) -> list[dict[str, str]]:
            batch = pa.ipc.read_record_batch(pa.py_buffer(data.rows.serialized_record_batch), schema)
            columns = {n: batch.column(n).to_pylist() for n in names}
            return [{n: v[i] for n, v in columns.items() if v[i] is not None} for i in range(batch.num_rows)]

        return arrow_rows
    if kind == "proto_rows":
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

        fdp = descriptor_pb2.FileDescriptorProto(name="fault_proxy_rows.proto", syntax="proto2")
        fdp.message_type.add().CopyFrom(writer_schema.proto_descriptor)
        pool = descriptor_pool.DescriptorPool()
        pool.Add(fdp)
        cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(writer_schema.proto_descriptor.name))
        names = [f.name for f in cls.DESCRIPTOR.fields if f.type == f.TYPE_STRING]

        def proto_rows(data: Any) -> list[dict[str, str]]:
            out = []
            for raw in data.rows.serialized_rows:
                m = cls.FromString(raw)
                out.append({n: getattr(m, n) for n in names if m.HasField(n)})
            return out

        return proto_rows
    return None


__all__ = ["BigQueryWriteFaultProxy", "ProxyStats", "row_error_message", "ROW_ERRORS_MESSAGE"]
