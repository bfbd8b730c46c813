"""Dead letters → the DLQ topic, before the task that found them reports success.

Why before success: the table commit (and the consumer-group commit after it) moves past these offsets;
if the dead letters were not durable by then they would be lost silently. A replayed batch produces them
again (at-least-once into the DLQ); the headers `handoff.source.topic/partition/offset` + `handoff.id` are
the dedup key. The original key, value and headers are kept so a fixed record can be re-produced as is.

Headers added (all UTF-8 strings): `handoff.reason` (null-value | unparseable | not-an-object |
missing-required | type-mismatch; Schema Registry formats also no-schema-id | unknown-schema | undecodable), `handoff.error` (human detail), `handoff.source.topic`,
`handoff.source.partition`, `handoff.source.offset`, `handoff.source.timestamp` (epoch ms, if any),
`handoff.id`.
"""
from __future__ import annotations

import threading
from typing import Any, Iterable, Mapping

import pyarrow as pa

from .config import AppConfig
from .decode import DeadLetter

FLUSH_TIMEOUT_S = 60.0

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
    return {**props, "bootstrap.servers": cfg.source.bootstrap_servers}


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


def send_dead_letters(cfg: AppConfig, raw: pa.Table | pa.RecordBatch, dead: Iterable[DeadLetter]) -> int:
    """Produce `dead` (rows of `raw`) to `cfg.dead_letter_topic`, flush, raise if any failed. Returns count."""
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
    producer = _producer(producer_conf(cfg))
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    for dl, key, value, hdrs, t_us in zip(dead, keys, values, orig_headers, ts):
        headers = [(h["key"], h["value"]) for h in (hdrs or [])]
        headers += dead_letter_headers(dl, cfg.handoff_id, None if t_us is None else t_us // 1000)
        while True:
            try:
                producer.produce(cfg.dead_letter_topic, value=value, key=key, headers=headers, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)
    remaining = producer.flush(FLUSH_TIMEOUT_S)
    if remaining or errors:
        raise DeadLetterDeliveryError(
            f"dead-letter topic {cfg.dead_letter_topic}: {remaining} undelivered after {FLUSH_TIMEOUT_S:.0f}s, "
            f"{len(errors)} failed (first error: {errors[0] if errors else 'timeout'})")
    return len(dead)
