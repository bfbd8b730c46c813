"""Lag: how many records Kafka holds that the table does not, per partition. One rule for the driver's metrics,
the operator's status and its autoscaler (each keeps its own key shape; `flat`/`nested` convert).

Why its own module: the driver (pyspark side) and the operator (no pyspark) both need it, and a second copy
would drift on the edge cases (a partition nothing was committed from yet, an end behind the position).
"""
from __future__ import annotations

from collections.abc import Mapping

TopicPartition = tuple[str, int]


def lag_per_partition(done: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int],
                      start: Mapping[TopicPartition, int] | None = None) -> dict[TopicPartition, int]:
    """`end − done` for every partition of `end` (never negative). A partition with nothing done counts from
    `start` (e.g. the earliest offset retention keeps), else from 0. Pure."""
    start = start or {}
    return {tp: max(0, e - done.get(tp, start.get(tp, 0))) for tp, e in end.items()}


def flat(offsets: Mapping[str, Mapping[int | str, int]] | None) -> dict[TopicPartition, int]:
    """`{topic: {partition: offset}}` (partition keys int or str, as JSON gives them) → `{(topic, partition): offset}`."""
    return {(t, int(p)): int(o) for t, parts in (offsets or {}).items() for p, o in (parts or {}).items()}


def nested(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[int, int]]:
    out: dict[str, dict[int, int]] = {}
    for (t, p), o in offsets.items():
        out.setdefault(t, {})[p] = o
    return out
