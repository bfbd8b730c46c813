"""Does Kafka keep a handoff's records long enough? The retention rule, over plain data (pure; no I/O).

Kafka deletes whole log segments once their newest record is older than `retention.ms`, or once a
partition holds more than `retention.bytes`. When that passes the handoff's position (an outage, a
stuck driver) or the range a ReplayRequest needs, records are gone without anyone being told. So, per
topic:

    need = replay.window + replay.maxOutage + lag age + margin

- `replay.window`: a ReplayRequest may re-consume from any snapshot in the window, so the offsets
  recorded with those snapshots must still be in Kafka;
- `replay.maxOutage`: the handoff must survive an outage that long without losing records;
- lag age: the oldest record not yet committed (on any partition) is already that old, so it has that
  much less time left (a partition the ledger has not committed on yet counts 0: a new handoff starting
  from `earliest` would otherwise always need more than the topic keeps);
- margin: MARGIN_FRACTION of the rest (clock skew, segment roll granularity, the check interval).

`have` is the shorter of `retention.ms` and how long the partition's `retention.bytes` lasts at the
current write rate (estimated per partition: records/s × average record size; the busiest partition
decides, since the limit is per partition). -1 (unlimited) counts as forever.

`cleanup.policy=compact` deletes nothing by age or size: compaction keeps the newest record per key
(tombstones for `delete.retention.ms`), so a replay reads the newest value of each key, not the
history; retention settings do not apply and enforcement has nothing to raise. `compact,delete`
compacts *and* deletes by age/size: the rule above holds for deletion.

Data loss is a fact, not a forecast: a partition whose ledger position (the next offset the table
expects) is below Kafka's earliest offset has lost the records in between.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from handoff_operator.models import format_duration

MARGIN_FRACTION = 0.1
HOUR_MS = 3_600_000
RETENTION_SUFFICIENT, DATA_LOSS = "RetentionSufficient", "DataLoss"


@dataclass(frozen=True)
class PartitionFacts:
    """What Kafka says about one partition, plus the ledger's position on it."""

    earliest: int
    latest: int
    next_offset: int | None = None            # the ledger's next offset (None: nothing committed there)
    oldest_unconsumed_ms: int | None = None   # timestamp of the record at next_offset, if it is waiting
    records_per_second: float | None = None   # recent write rate (None: unknown)
    average_record_bytes: float | None = None


@dataclass(frozen=True)
class TopicFacts:
    """A topic's retention configs (describe_configs) and partitions. None / -1 = unlimited."""

    topic: str
    retention_ms: int | None
    retention_bytes: int | None
    cleanup_policy: tuple[str, ...] = ("delete",)
    partitions: Mapping[int, PartitionFacts] = field(default_factory=dict)


@dataclass(frozen=True)
class Requirement:
    """What a handoff's spec asks of every topic it reads."""

    window_seconds: float
    max_outage_seconds: float
    enforce: bool = False


@dataclass(frozen=True)
class TopicVerdict:
    topic: str
    sufficient: bool
    need_seconds: float
    have_seconds: float | None            # None = unlimited
    headroom_seconds: float | None        # have - need; None = unlimited
    limited_by: str | None                # "retention.ms" / "retention.bytes" / None (unlimited)
    lag_age_seconds: float
    compacted: bool                       # cleanup.policy has compact
    deletes: bool                         # cleanup.policy has delete
    target_retention_ms: int | None       # what enforce would set retention.ms to (None: nothing to raise)
    need_bytes: int | None                # per partition, when retention.bytes limits
    message: str
    fix: str


@dataclass(frozen=True)
class LostRange:
    topic: str
    partition: int
    start: int      # first lost offset (the ledger's next offset)
    end: int        # Kafka's earliest offset now (exclusive)

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}] offsets {self.start}..{self.end - 1} ({self.end - self.start} records)"


def _unlimited(value: int | None) -> bool:
    return value is None or value < 0


def lag_age_seconds(topic: TopicFacts, now_ms: int) -> float:
    """Age of the oldest record not yet committed to the table, over the topic's partitions (0: none waiting)."""
    ages = [max(0.0, (now_ms - p.oldest_unconsumed_ms) / 1000.0) for p in topic.partitions.values()
            if p.oldest_unconsumed_ms is not None and p.next_offset is not None and p.next_offset < p.latest]
    return max(ages, default=0.0)


def bytes_per_second(partition: PartitionFacts) -> float | None:
    if partition.records_per_second is None or partition.average_record_bytes is None:
        return None
    return partition.records_per_second * partition.average_record_bytes


def bytes_budget_seconds(topic: TopicFacts) -> float | None:
    """How long the busiest partition's `retention.bytes` lasts at its write rate (None: unlimited or no rate)."""
    if _unlimited(topic.retention_bytes):
        return None
    rates = [r for r in (bytes_per_second(p) for p in topic.partitions.values()) if r]
    if not rates:
        return None  # nothing is written: the byte budget never runs out
    return float(topic.retention_bytes) / max(rates)  # type: ignore[arg-type]


def _d(seconds: float | None) -> str:
    return "unlimited" if seconds is None else format_duration(seconds)


def verdict(topic: TopicFacts, requirement: Requirement, now_ms: int) -> TopicVerdict:
    """Is the topic's retention enough for the requirement? With the numbers and the fix."""
    deletes = "delete" in topic.cleanup_policy
    compacted = "compact" in topic.cleanup_policy
    lag_age = lag_age_seconds(topic, now_ms)
    base = requirement.window_seconds + requirement.max_outage_seconds + lag_age
    need = round(base * (1 + MARGIN_FRACTION) * 1000) / 1000  # whole ms, like retention.ms: 3h18m is 3h18m
    terms = (f"replay.window {_d(requirement.window_seconds)} + replay.maxOutage "
             f"{_d(requirement.max_outage_seconds)} + lag age {_d(lag_age)} + {MARGIN_FRACTION:.0%} margin")
    if not deletes:
        return TopicVerdict(
            topic.topic, True, need, None, None, None, lag_age, compacted, deletes, None, None,
            f"topic {topic.topic} is compacted (cleanup.policy=compact): no record is deleted by age or size; "
            f"compaction keeps the newest record per key, so a replay re-reads the newest value of each key, "
            f"not the full history", "")
    time_have = None if _unlimited(topic.retention_ms) else topic.retention_ms / 1000.0  # type: ignore[operator]
    bytes_have = bytes_budget_seconds(topic)
    candidates = [(v, k) for v, k in ((time_have, "retention.ms"), (bytes_have, "retention.bytes")) if v is not None]
    have, limited_by = min(candidates) if candidates else (None, None)
    headroom = None if have is None else have - need
    sufficient = have is None or have >= need
    compact_note = (" (also compacted: only the newest record per key survives compaction)" if compacted else "")
    target_ms = None
    need_bytes = None
    fixes: list[str] = []
    if time_have is not None and time_have < need:
        # Whole hours: readable in kafka-configs, and a lag age growing by minutes does not raise it every check.
        target_ms = math.ceil(need * 1000 / HOUR_MS) * HOUR_MS
        fixes.append(f"raise retention.ms of topic {topic.topic} to at least {target_ms} ({_d(target_ms / 1000)})")
    if bytes_have is not None and bytes_have < need:
        rates = [r for r in (bytes_per_second(p) for p in topic.partitions.values()) if r]
        need_bytes = int(math.ceil(need * max(rates)))
        fixes.append(f"raise retention.bytes of topic {topic.topic} to at least {need_bytes} per partition or -1 "
                     f"(at ~{max(rates):.0f} B/s on its busiest partition, {topic.retention_bytes} bytes last "
                     f"~{_d(bytes_have)})")
    if sufficient:
        message = (f"topic {topic.topic} keeps records {_d(have)} (limited by {limited_by or 'nothing'}); "
                   f"need {_d(need)} = {terms}; headroom {_d(headroom)}{compact_note}")
        fix = ""
    else:
        message = (f"topic {topic.topic} keeps records only {_d(have)} (limited by {limited_by}); need {_d(need)} "
                   f"= {terms}{compact_note}")
        fix = "; ".join(fixes)
        if target_ms is not None and not requirement.enforce:
            fix += " (or set spec.retention.mode=enforce to let the operator raise retention.ms)"
        fix += ", or lower spec.replay.window / spec.replay.maxOutage"
    return TopicVerdict(topic.topic, sufficient, need, have, headroom, limited_by, lag_age, compacted, deletes,
                        target_ms, need_bytes, message, fix)


def lost_ranges(topics: Sequence[TopicFacts]) -> list[LostRange]:
    """Partitions whose ledger position was deleted by Kafka before the handoff read it."""
    out = []
    for topic in topics:
        for partition, facts in sorted(topic.partitions.items()):
            if facts.next_offset is not None and facts.next_offset < facts.earliest:
                out.append(LostRange(topic.topic, partition, facts.next_offset, facts.earliest))
    return out


def lost_from_offsets(committed: Mapping[str, Mapping[str, int]] | None,
                      earliest: Mapping[str, Mapping[str, int]] | None) -> list[LostRange]:
    """The same from a status's committed offsets and Kafka's earliest ({topic: {"partition": offset}})."""
    if not committed or not earliest:
        return []
    out = []
    for topic, parts in sorted(committed.items()):
        for partition, next_offset in sorted(parts.items(), key=lambda kv: int(kv[0])):
            low = (earliest.get(topic) or {}).get(str(partition))
            if low is not None and next_offset < low:
                out.append(LostRange(topic, int(partition), int(next_offset), int(low)))
    return out


def may_raise(current_ms: int | None, target_ms: int | None) -> bool:
    """Enforce only ever raises: never touch unlimited retention, never lower a longer one."""
    return target_ms is not None and not _unlimited(current_ms) and target_ms > current_ms  # type: ignore[operator]
