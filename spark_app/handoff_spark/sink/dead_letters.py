"""Dead letters → the DLQ topic, before the task that found them reports success.

Why before success: the table commit (and the consumer-group commit after it) moves past these offsets;
if the dead letters were not durable by then they would be lost silently. A replayed batch produces them
again (at-least-once into the DLQ); the headers `handoff.source.topic/partition/offset` + `handoff.id` are
the dedup key. The original key, value and headers are kept so a fixed record can be re-produced as is.

Headers added (all UTF-8 strings): `handoff.reason` (null-value | unparseable | not-an-object |
missing-required | type-mismatch | too-deep | too-large | unconvertible | record-error; Schema Registry formats
also no-schema-id | unknown-schema | undecodable), `handoff.error` (human detail), `handoff.source.topic`,
`handoff.source.partition`, `handoff.source.offset`, `handoff.source.timestamp` (epoch ms, if any),
`handoff.id`.

A dead letter too large for the dead-letter topic (a `too-large` record, or any over the producer's
`message.max.bytes` or the topic's `max.message.bytes`) is sent again with its key and value cut to their first
`TRUNCATED_BYTES` and the header `handoff.truncated` = `key=<bytes>,value=<bytes>` (their full lengths), and,
if even that is refused, cut to `LAST_RESORT_BYTES` and without its original headers (`handoff.headers.omitted`).
The full record stays where the source headers say until the source topic's retention deletes it.

Dead letters of rows (`send_row_dead_letters`): on the DataFrame path a row BigQuery rejects was made by Spark (the
transform), and its Kafka record is no longer beside it. Such a dead letter's value is the row as JSON (as the
transform made it), its key null, its timestamp the row's `_kafka_timestamp`, and it carries one more header,
`handoff.value` = `row-json`, so a person re-producing it knows the value is not the original record (that one is
in the source topic at `handoff.source.*` until retention deletes it). Other dead letters are unchanged.
"""
from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import threading
from dataclasses import replace
from typing import Any, Iterable, Mapping

import pyarrow as pa

from handoff_spark.config import AppConfig
from handoff_spark.decode.records import DeadLetter
from handoff_spark.kafka.client_defaults import with_defaults

FLUSH_TIMEOUT_S = 60.0
#: How much of an oversized dead letter's key and value is kept (well under Kafka's default 1 MB message limit).
TRUNCATED_BYTES = 64 * 1024
#: ... and of one the dead-letter topic still refuses (a topic whose max.message.bytes is set very low).
LAST_RESORT_BYTES = 1024

#: Kafka's MSG_SIZE_TOO_LARGE (librdkafka's own check against message.max.bytes, or the broker's against the
#: topic's max.message.bytes) and RECORD_LIST_TOO_LARGE: the dead letter itself is too big.
_TOO_LARGE = (10, 18)
#: The header a row dead letter adds (see the module docstring).
ROW_VALUE_HEADER = ("handoff.value", b"row-json")
_producers: dict[tuple[tuple[str, str], ...], Any] = {}
_lock = threading.Lock()


class DeadLetterDeliveryError(RuntimeError):
    """Some dead letters could not be written; the task fails so the batch is retried, never skipped."""


def _producer(conf: Mapping[str, str]) -> Any:
    """One idempotent producer per process and configuration (tasks on an executor reuse it)."""
    from confluent_kafka import Producer

    key = tuple(sorted(conf.items()))
    with _lock:
        producer = _producers.get(key)
        if producer is None:
            producer = Producer({**conf, "acks": "all", "enable.idempotence": True, "linger.ms": 5})
            _producers[key] = producer
        return producer


def producer_conf(cfg: AppConfig) -> dict[str, str]:
    props = {k: v for k, v in cfg.source.properties.items()
             if not k.startswith(("isolation.", "group.", "auto.offset", "enable.auto", "fetch.", "max.poll"))}
    return with_defaults({**props, "bootstrap.servers": cfg.source.bootstrap_servers})


def dead_letter_headers(dl: DeadLetter, handoff_id: str, timestamp_ms: int | None) -> list[tuple[str, bytes]]:
    headers = [
        ("handoff.reason", dl.reason.encode()),
        ("handoff.error", dl.detail.encode()[:4096]),
        ("handoff.source.topic", dl.topic.encode()),
        ("handoff.source.partition", str(dl.partition).encode()),
        ("handoff.source.offset", str(dl.offset).encode()),
        ("handoff.id", handoff_id.encode()),
    ]
    if timestamp_ms is not None:
        headers.append(("handoff.source.timestamp", str(timestamp_ms).encode()))
    return headers


def _shrunk(key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]], level: int
            ) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]:
    """A dead letter at shrink `level`: 0 as is; 1 key and value cut to `TRUNCATED_BYTES`, their full lengths in
    `handoff.truncated`; 2 cut to `LAST_RESORT_BYTES` and without the original record's headers (Handoff's own are
    kept)."""
    if level == 0:
        return key, value, headers
    lengths = f"key={0 if key is None else len(key)},value={0 if value is None else len(value)}"
    ours = [(k, v) for k, v in headers if k.startswith("handoff.")]
    kept = ours if level == 2 else headers
    extra = [("handoff.truncated", lengths.encode())]
    if level == 2:
        extra.append(("handoff.headers.omitted", str(len(headers) - len(ours)).encode()))
    cut = TRUNCATED_BYTES if level == 1 else LAST_RESORT_BYTES
    return None if key is None else key[:cut], None if value is None else value[:cut], kept + extra


def _json_value(value: Any) -> Any:
    """What `json` cannot write itself, as a row's columns hold it: timestamps and dates as ISO 8601, bytes as
    base64, decimals as their exact text."""
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    return str(value)


def row_values(rows: pa.Table, indices: list[int]) -> list[bytes]:
    """Rows `indices` of `rows` as compact JSON objects, columns in the table's order."""
    picked = rows.take(pa.array(indices, pa.int64())).to_pylist()
    return [json.dumps(r, default=_json_value, separators=(",", ":"), ensure_ascii=False).encode() for r in picked]


def split_missing_required(rows: pa.Table, required: list[str]) -> tuple[pa.Table, list[DeadLetter]]:
    """The DataFrame path's rows with a declared `required` column left null by the transform: (the other rows,
    those as dead letters by position, reason `missing-required`). Both sinks' rows writers take them out before
    writing, so one such row becomes a dead letter instead of failing its batch (on the fused path the decoder
    enforces `required`)."""
    import pyarrow.compute as pc

    from handoff_spark.contract import KAFKA_OFFSET, KAFKA_PARTITION, KAFKA_TOPIC

    present = [n for n in required if n in rows.column_names]
    if not present or not rows.num_rows:
        return rows, []
    missing = pc.is_null(rows.column(present[0]))
    for name in present[1:]:
        missing = pc.or_(missing, pc.is_null(rows.column(name)))
    if not pc.any(missing).as_py():
        return rows, []
    at = [i for i, hit in enumerate(missing.to_pylist()) if hit]
    take = pa.array(at, pa.int64())
    topics, parts, offs = (rows.column(n).take(take).to_pylist() for n in (KAFKA_TOPIC, KAFKA_PARTITION, KAFKA_OFFSET))
    dead = [DeadLetter(index=i, topic=t, partition=int(p), offset=int(o), reason="missing-required",
                       detail=f"missing required field {', '.join(n for n in present if rows.column(n)[i].as_py() is None)}"
                              f" (required in schema.columns; null after the transform)")
            for i, t, p, o in zip(at, topics, parts, offs)]
    return rows.filter(pc.invert(missing)), dead


def send_row_dead_letters(cfg: AppConfig, rows: pa.Table, dead: Iterable[DeadLetter]) -> int:
    """Produce `dead` (rows of `rows`, Spark rows with the `_kafka_*` columns, not Kafka records) as dead letters
    whose value is the row as JSON (see the module docstring), with the usual headers and `handoff.value`.
    Returns count."""
    from handoff_spark.contract import KAFKA_TIMESTAMP

    dead = list(dead)
    if not dead:
        return 0
    indices = [d.index for d in dead]
    n = len(indices)
    if KAFKA_TIMESTAMP in rows.column_names:
        ts = rows.column(KAFKA_TIMESTAMP).take(pa.array(indices, pa.int64())).cast(pa.timestamp("us", tz="UTC"))
    else:
        ts = pa.nulls(n, pa.timestamp("us", tz="UTC"))
    records = pa.table({"key": pa.nulls(n, pa.binary()), "value": pa.array(row_values(rows, indices), pa.binary()),
                        "headers": pa.nulls(n), "timestamp": ts})
    return send_dead_letters(cfg, records, [replace(d, index=i) for i, d in enumerate(dead)],
                             extra_headers=[ROW_VALUE_HEADER])


def send_dead_letters(cfg: AppConfig, raw: pa.Table | pa.RecordBatch, dead: Iterable[DeadLetter],
                      extra_headers: list[tuple[str, bytes]] | None = None) -> int:
    """Produce `dead` (rows of `raw`) to `cfg.dead_letter_topic`, flush, raise if any failed. Returns count.
    `extra_headers`: added after Handoff's usual ones (`send_row_dead_letters`' `handoff.value`)."""
    dead = list(dead)
    if not dead:
        return 0
    if not cfg.dead_letter_topic:
        raise DeadLetterDeliveryError(
            f"{len(dead)} record(s) need the dead-letter topic but handoff {cfg.handoff_id} has none configured "
            f"(first: {dead[0].topic}[{dead[0].partition}]@{dead[0].offset}: {dead[0].reason})")
    table = pa.Table.from_batches([raw]) if isinstance(raw, pa.RecordBatch) else raw
    rows = pa.array([d.index for d in dead], pa.int64())
    keys = table.column("key").take(rows).to_pylist()
    values = table.column("value").take(rows).to_pylist()
    orig_headers = table.column("headers").take(rows).to_pylist()
    ts = table.column("timestamp").take(rows).cast(pa.int64()).to_pylist()  # µs since epoch
    from confluent_kafka import KafkaException

    producer = _producer(producer_conf(cfg))
    pending = [(dl, key, value, [(h["key"], h["value"]) for h in (hdrs or [])]
                + dead_letter_headers(dl, cfg.handoff_id, None if t_us is None else t_us // 1000)
                + list(extra_headers or ()))
               for dl, key, value, hdrs, t_us in zip(dead, keys, values, orig_headers, ts)]
    for shrink in range(3):  # as is; key and value cut; original headers left out too
        too_large: list[int] = []
        errors: list[str] = []

        def on_delivery(index: int) -> Any:
            def done(err: Any, _msg: Any) -> None:
                if err is None:
                    return
                if err.code() in _TOO_LARGE and shrink < 2:
                    too_large.append(index)
                else:
                    errors.append(str(err))
            return done

        for index, (dl, key, value, headers) in enumerate(pending):
            key, value, headers = _shrunk(key, value, headers, shrink)
            while True:
                try:
                    producer.produce(cfg.dead_letter_topic, value=value, key=key, headers=headers,
                                     on_delivery=on_delivery(index))
                    break
                except BufferError:
                    producer.poll(0.1)
                except KafkaException as exc:
                    if exc.args[0].code() not in _TOO_LARGE or shrink == 2:
                        raise
                    too_large.append(index)
                    break
        remaining = producer.flush(FLUSH_TIMEOUT_S)
        if remaining or errors:
            raise DeadLetterDeliveryError(
                f"dead-letter topic {cfg.dead_letter_topic}: {remaining} undelivered after {FLUSH_TIMEOUT_S:.0f}s, "
                f"{len(errors)} failed (first error: {errors[0] if errors else 'timeout'})")
        if not too_large:
            break
        pending = [pending[i] for i in sorted(too_large)]
    return len(dead)
