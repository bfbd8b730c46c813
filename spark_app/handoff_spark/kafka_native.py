"""The range readers' native Kafka consumer: records fetched by librdkafka straight into an Arrow batch's buffers.

Why: confluent-kafka's `consume()` makes a Python `Message` per record, and building the batch's columns from them
took five method calls per record; for 1M records that was ~1.8 s more of the workers' CPU than this reader
takes, about what the whole raw consumer needs to read them (docs/benchmarks.md "Throughput"). `_kafka_native` (C, built with the package)
copies offsets, timestamps, keys and values into the buffers Arrow wraps without copying; no Python object per
record is made (headers, rare, still are). It drives confluent-kafka's own librdkafka (the copy already loaded in
the process), so both readers are the same client, with the same configuration keys and behaviour.

Which reader: `HANDOFF_KAFKA_READER=native` (the default; the package does not install without the extension) or
`python` (confluent-kafka's `Consumer`: for comparison, and a way out should the native reader misbehave). A configuration with a value that is not a
plain string, number or boolean (a callback, which only confluent-kafka's wrapper understands) always uses
confluent-kafka's consumer. `native` where the extension cannot load is an error, not a silent fallback.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

#: `HANDOFF_KAFKA_READER`: `native` (default) or `python`.
READER_ENV = "HANDOFF_KAFKA_READER"

_module: Any = None
_load_error: str | None = None


def module() -> Any:
    """`_kafka_native`, bound to confluent-kafka's librdkafka; None when it cannot load (`load_error()` says why)."""
    global _module, _load_error
    if _module is None and _load_error is None:
        try:
            from handoff_spark import _kafka_native

            from .confluent_kafka_private import librdkafka_path

            _kafka_native.load(librdkafka_path())
            _module = _kafka_native
        except ImportError as e:
            _load_error = str(e)
    return _module


def load_error() -> str | None:
    module()
    return _load_error


def native_conf(conf: Mapping[str, Any]) -> dict[str, str] | None:
    """`conf` as librdkafka's strings, or None if a value is one only confluent-kafka's wrapper takes."""
    out: dict[str, str] = {}
    for key, value in conf.items():
        if isinstance(value, bool):
            out[key] = "true" if value else "false"
        elif isinstance(value, (str, int, float)):
            out[key] = str(value)
        else:
            return None
    return out


def use_native(conf: Mapping[str, Any]) -> bool:
    """Whether a reader with `conf` reads natively (see the module's docstring)."""
    choice = os.environ.get(READER_ENV, "native").strip().lower() or "native"
    if choice == "python":
        return False
    if choice != "native":
        raise ValueError(f"{READER_ENV}={choice!r}: use native or python")
    if native_conf(conf) is None:
        return False
    if module() is None:
        raise RuntimeError(f"{READER_ENV}=native but handoff_spark._kafka_native cannot load ({_load_error}); "
                           f"reinstall the package with a C compiler and librdkafka's headers, or set "
                           f"{READER_ENV}=python")
    return True


def consumer_factory(conf: Mapping[str, Any]) -> "type[NativeConsumer] | None":
    """What `kafka_readers.consumer` makes readers with for `conf`: `NativeConsumer`, or None for confluent-kafka's
    `Consumer`."""
    return NativeConsumer if use_native(conf) else None


class NativeConsumer:
    """One assign-only librdkafka consumer, with the methods `kafka_readers` keeps consumers by."""

    def __init__(self, conf: Mapping[str, Any]) -> None:
        native = module()
        plain = native_conf(conf)
        if native is None or plain is None:
            raise RuntimeError("NativeConsumer: use_native(conf) is false")
        self._native = native
        try:
            self._reader = native.Reader(plain)
        except ValueError as e:
            from confluent_kafka import KafkaException

            raise KafkaException(f"kafka reader configuration: {e}") from None

    @contextlib.contextmanager
    def _kafka_errors(self) -> Iterator[None]:
        """`_kafka_native.KafkaError(code, reason)` as confluent-kafka's `KafkaException`, as its consumer raises."""
        try:
            yield
        except self._native.KafkaError as e:
            from confluent_kafka import KafkaError, KafkaException

            code, reason = e.args
            raise KafkaException(KafkaError(code, reason)) from None

    def list_topics(self, topic: str, timeout: float) -> None:
        with self._kafka_errors():
            self._reader.metadata(topic, int(timeout * 1000))

    def assign(self, topic: str, partition: int, offset: int) -> None:
        with self._kafka_errors():
            self._reader.assign(topic, partition, offset)

    def unassign(self) -> None:
        with self._kafka_errors():
            self._reader.assign()

    def assignment(self) -> list[tuple[str, int]]:
        with self._kafka_errors():
            return list(self._reader.assignment())

    def position(self, topic: str, partition: int) -> int:
        with self._kafka_errors():
            return int(self._reader.position(topic, partition))

    def fetch(self, n: int, timeout_s: float, end: int, topic: str, partition: int,
              schema: pa.Schema) -> "Fetched":
        """Up to `n` records (those at offsets < `end` in the batch) and every error event, as `Fetched`."""
        with self._kafka_errors():
            polled, rows, last, errors, cols = self._reader.read(n, int(timeout_s * 1000), end)
        batch = _batch(topic, partition, rows, cols, schema) if rows else None
        if errors:
            from confluent_kafka import KafkaError  # as confluent-kafka's `Message.error()` gives them

            errors = [(code, offset, KafkaError(code, reason)) for code, offset, reason in errors]
        return Fetched(batch=batch, last=last, errors=errors, short=0 <= polled < n)

    def close(self) -> None:
        self._reader.close()


@dataclass
class Fetched:
    """What one fetch gave a range reader."""
    batch: pa.RecordBatch | None  # its records at offsets < the range's end, in offset order
    last: int  # the highest offset of any record it gave (past the end too); -1 without records
    errors: list[tuple[int, int, Any]]  # (librdkafka error code, offset, confluent-kafka's KafkaError)
    short: bool  # it gave fewer than asked: the fetch waited out its timeout


def _buffer(data: bytes | None) -> pa.Buffer | None:
    return None if data is None else pa.py_buffer(data)


def _batch(topic: str, partition: int, n: int, cols: tuple, schema: pa.Schema) -> pa.RecordBatch:
    """The source's Arrow batch (kafka_source.ARROW_SCHEMA) over the buffers `_kafka_native.Reader.read` filled."""
    offsets, ts, ts_valid, koffs, kdata, k_valid, voffs, vdata, v_valid, headers = cols
    header_type = schema.field("headers").type
    return pa.RecordBatch.from_arrays([
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(offsets)]),
        pa.Array.from_buffers(schema.field("timestamp").type, n, [_buffer(ts_valid), pa.py_buffer(ts)]),
        pa.Array.from_buffers(pa.binary(), n, [_buffer(k_valid), pa.py_buffer(koffs), pa.py_buffer(kdata)]),
        pa.Array.from_buffers(pa.binary(), n, [_buffer(v_valid), pa.py_buffer(voffs), pa.py_buffer(vdata)]),
        pa.nulls(n, header_type) if headers is None else pa.array(headers, header_type),
    ], schema=schema)
