"""Range readers' Kafka consumers, kept in the process for its next range instead of closed after each one (and
the consumer-group commits' consumer, `offsets.commit_group_offsets`, kept for the next batch's commit).

Why: a Spark Python worker reads one range per task, and a new consumer per range started new librdkafka threads,
each of which got a fresh glibc arena and grew it page by page while it fetched and decompressed (~8,000
`mprotect` calls and ~30,000 page faults per 167,000-record range). A consumer kept from the previous range
fetches into memory it already has: per range, 0.54 → 0.39 s of CPU, page faults 31,000 → 400 (measured,
docs/benchmarks.md "Throughput"). It also keeps its broker connection and the topics' metadata, so a task's
first fetch does not wait on either; `kafka.source.warm_reader` leaves the consumer it warmed here for the
next range its worker process reads.

Safety: a consumer is handed out to one reader at a time (readers in other threads take other ones); it goes
back only after a read that ended normally, unassigned (librdkafka drops what it had fetched for the old
assignment); a read that failed or was abandoned closes it. A forked child never uses, nor destroys, the
consumers its parent kept (their threads do not exist in the child)."""
from __future__ import annotations

import atexit
import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

#: Idle consumers kept per configuration. One is the norm (a worker runs one task at a time; the driver's bootstrap
#: batches read their ranges one after another); a few more cover a process reading in several threads.
MAX_IDLE_PER_CONF = 4

#: How long a reader waits for a topic's metadata before it assigns the topic's partitions anyway.
METADATA_TIMEOUT_S = 10.0

_lock = threading.Lock()
#: Per (factory, configuration): idle consumers, each with the topics whose metadata it has.
_idle: dict[tuple[Any, tuple[tuple[str, str], ...]], list[tuple[Any, set[str]]]] = {}
#: A parent's consumers a forked child inherited: referenced forever, so that the child never destroys them.
_inherited: list[Any] = []


def _key(conf: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, str(v)) for k, v in conf.items()))


@contextlib.contextmanager
def consumer(conf: Mapping[str, Any], topics: Iterable[str],
             factory: Callable[[dict[str, Any]], Any] | None = None) -> Iterator[Any]:
    """A consumer for `conf` made by `factory` (confluent-kafka's `Consumer` without one; an idle one if the process
    has one from the same factory) that has `topics`' metadata, unassigned; kept
    for the next reader when the block ends normally, closed when it raises (a failed read leaves the consumer in
    a state not worth trusting).

    The metadata first: a kept consumer assigned a partition of a topic it had not seen waited up to ~1 s for its
    leader (librdkafka's metadata query backoff), where asking for the topic first takes one round trip."""
    from confluent_kafka import Consumer, KafkaException

    make = factory or Consumer
    key = (make, _key(conf))
    with _lock:
        idle = _idle.get(key)
        c, known = idle.pop() if idle else (None, set())
    if c is None:
        c = make(dict(conf))
    try:
        for topic in set(topics) - known:
            try:
                c.list_topics(topic, timeout=METADATA_TIMEOUT_S)
                known.add(topic)
            except KafkaException:
                pass  # assigning still works; librdkafka keeps asking for the leader
        yield c
        c.unassign()
    except BaseException:
        c.close()
        raise
    with _lock:
        idle = _idle.setdefault(key, [])
        if len(idle) < MAX_IDLE_PER_CONF:
            idle.append((c, known))
            c = None
    if c is not None:
        c.close()


def idle_count(conf: Mapping[str, Any] | None = None) -> int:
    """Idle consumers kept for `conf`, of any factory (all of them without it)."""
    with _lock:
        return sum(len(v) for (_, k), v in _idle.items() if conf is None or k == _key(conf))


def close_idle() -> None:
    """Close every idle consumer (at exit, and where a test wants a clean process)."""
    with _lock:
        kept = [c for v in _idle.values() for c, _ in v]
        _idle.clear()
    for c in kept:
        c.close()


def _forget_after_fork() -> None:
    global _idle, _lock
    _inherited.append(_idle)
    _idle, _lock = {}, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
atexit.register(close_idle)
