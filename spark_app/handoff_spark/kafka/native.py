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
confluent-kafka's consumer. `native` where the extension cannot load is an error, not a silent fallback: the
package was installed without a working build of it.

The librdkafka guard. The extension is compiled against one librdkafka's headers (Debian's librdkafka-dev) and bound
at run time to another (the copy inside confluent-kafka's wheel), and it reads two of librdkafka's structs itself:
a mismatch would read wrong memory silently. So `module()` checks the binding before the first Reader is made
(`librdkafka_incompatibility`, a pure function of what it measured):
* the bound library's `rd_kafka_version()` has the headers' major version and is not older than the headers
  (librdkafka keeps its ABI backward compatible within a major version: a newer library serves code built against
  older headers, never the reverse; an older one may lack what the headers declare);
* it has every function the extension calls;
* the structs read back right: the bound library fills a partition list and a message with known values, and
  every field the extension reads is read through its compiled layout and compared (`_kafka_native.c`).
Checked: Debian's librdkafka-dev 2.0.2 headers against confluent-kafka 2.16.1's bundled librdkafka 2.16.0 and
Debian's own librdkafka 2.0.2 (tests/unit/spark/kafka/test_kafka_native_guard.py; docs/design/data-plane-contract.md).
On any mismatch the process reads with confluent-kafka's `Consumer`, the same results at more CPU, and logs one
warning line naming both versions and the fix. `HANDOFF_KAFKA_READER=native` does not override that: the
variable chooses between readers that work, and a mismatched native reader could only corrupt data; nor is it
an error, because the Python reader is correct, and a confluent-kafka upgrade must not stop a hand-off.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from handoff_spark import switches

log = logging.getLogger(__name__)

#: `HANDOFF_KAFKA_READER`: `native` (default) or `python`.
READER_ENV = switches.KAFKA_READER.name

_module: Any = None
_load_error: str | None = None
_mismatch: str | None = None


def version_text(version: int) -> str:
    """librdkafka's version integer (0xMMmmrrxx, xx 0xff for a release) as text: 0x020002ff -> 2.0.2."""
    text = f"{version >> 24 & 0xFF}.{version >> 16 & 0xFF}.{version >> 8 & 0xFF}"
    return text if version & 0xFF == 0xFF else f"{text}-pre{version & 0xFF}"


def version_incompatibility(header: int, bound: int) -> str | None:
    """Why a library of version `bound` cannot serve code compiled against headers of version `header` (None when
    it can): another major version, or older than the headers (the module's docstring says why)."""
    if bound >> 24 != header >> 24:
        return "another major version"
    if bound < header:
        return "older than the headers"
    return None


def librdkafka_incompatibility(header: int, bound: int, problems: Sequence[str]) -> str | None:
    """Whether the native reader may run: None, or why not. `header`: RD_KAFKA_VERSION of the headers the
    extension was compiled with; `bound`: `rd_kafka_version()` of the library it is bound to; `problems`:
    functions the bound library lacks and fields that did not read back (`_kafka_native.layout_problems()`)."""
    reason = version_incompatibility(header, bound)
    if reason is None and problems:
        reason = "; ".join(problems)
    return reason


def mismatch_warning(header: int, bound: int, reason: str) -> str:
    """The one line a process logs when it reads with the Python reader because of `reason`."""
    return (f"native Kafka reader off, reading with confluent-kafka's Consumer (same results, more CPU): "
            f"handoff_spark.kafka._kafka_native was compiled against librdkafka {version_text(header)} headers but "
            f"confluent-kafka's librdkafka is {version_text(bound)}: {reason}. To read natively, reinstall "
            f"handoff-operator with librdkafka {version_text(bound)}'s headers installed (the extension is "
            f"compiled from them); to choose the Python reader and not see this, set {READER_ENV}=python")


def _bind(native: Any, path: str) -> str | None:
    """Bind `native` to the librdkafka at `path` and check it; enables it and returns None, or returns why not."""
    bound, missing = native.load(path)
    problems = [f"it has no {name}()" for name in missing]
    if not problems and version_incompatibility(native.HEADER_VERSION, bound) is None:
        problems = list(native.layout_problems())  # calls into the library: only once its version passed
    reason = librdkafka_incompatibility(native.HEADER_VERSION, bound, problems)
    if reason is None:
        native.enable()
    else:
        log.warning(mismatch_warning(native.HEADER_VERSION, bound, reason))
    return reason


def module() -> Any:
    """`_kafka_native`, bound to confluent-kafka's librdkafka and checked; None when it cannot load (`load_error()`
    says why) or does not match that librdkafka (`mismatch()` says why; warned once)."""
    global _module, _load_error, _mismatch
    if _module is None and _load_error is None and _mismatch is None:
        try:
            from handoff_spark.kafka import _kafka_native

            from handoff_spark.kafka.confluent_kafka_private import librdkafka_path

            _mismatch = _bind(_kafka_native, librdkafka_path())
            if _mismatch is None:
                _module = _kafka_native
        except ImportError as e:
            _load_error = str(e)
    return _module


def load_error() -> str | None:
    """Why the extension cannot load at all (a broken installation), or None."""
    module()
    return _load_error


def mismatch() -> str | None:
    """Why the extension does not match confluent-kafka's librdkafka (the process reads with Python), or None."""
    module()
    return _mismatch


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
    if switches.KAFKA_READER() == "python":
        return False
    if native_conf(conf) is None:
        return False
    if module() is None:
        if _mismatch is not None:  # warned once when it was found; the Python reader is correct
            return False
        raise RuntimeError(f"{READER_ENV}=native but handoff_spark.kafka._kafka_native cannot load ({_load_error}); "
                           f"reinstall the package with a C compiler and librdkafka's headers, or set "
                           f"{READER_ENV}=python")
    return True


def consumer_factory(conf: Mapping[str, Any]) -> "type[NativeConsumer] | None":
    """What `kafka.readers.consumer` makes readers with for `conf`: `NativeConsumer`, or None for confluent-kafka's
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
    """The source's Arrow batch (kafka.source.ARROW_SCHEMA) over the buffers `_kafka_native.Reader.read` filled."""
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
