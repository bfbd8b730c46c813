"""What a ReplayRequest will do, decided before anything changes (pure; no I/O).

The facts are plain data the I/O layer (the sink contract `replay.table`, `truth.kafka_offsets`) gathers: the
table's current ancestry with the ledger record of each snapshot (on BigQuery: each ledger entry, keyed by its
commit time in µs), the tags and every snapshot id the metadata still holds, and Kafka's earliest/latest offsets. `plan()` turns them and the request into a `Plan`, or
a `Failure` naming the reason and the fix. A plan that cannot succeed fails here, so a refused request
never stops a driver or touches a table.

Offsets maps are `{topic: {partition: offset}}`; ranges are `[start, end)`.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

Offsets = dict[str, dict[int, int]]
Ranges = dict[str, dict[int, tuple[int, int]]]
Mode = Literal["RollbackAndReplay", "Rollback", "Backfill"]


@dataclass(frozen=True)
class LedgerEntry:
    """The ledger record of one snapshot (`handoff_spark.ledger.Commit`, reduced to what planning needs).
    `gap`: a ledger marker (a gap recorded by a Rollback, or an epoch), which holds no data."""

    handoff_id: str
    query: str
    offsets: Ranges
    gap: bool = False


@dataclass(frozen=True)
class SnapshotInfo:
    snapshot_id: int
    timestamp_ms: int
    entry: LedgerEntry | None = None       # None: not written by Handoff (compaction, manual writes)


@dataclass(frozen=True)
class TableFacts:
    """The table as the planner needs it. `ancestry`: current snapshot first, back through parents."""

    ancestry: tuple[SnapshotInfo, ...]
    snapshot_ids: frozenset[int]            # every snapshot the metadata still holds (any branch)
    tags: Mapping[str, int] = field(default_factory=dict)

    @property
    def head(self) -> int | None:
        return self.ancestry[0].snapshot_id if self.ancestry else None


@dataclass(frozen=True)
class KafkaFacts:
    earliest: Offsets
    latest: Offsets


@dataclass(frozen=True)
class Request:
    """The parts of a ReplayRequest spec (plus the handoff's identity) that planning reads."""

    mode: Mode
    handoff_id: str                         # namespace/name, as recorded in every commit
    query: str                              # the stream's ledger query name (AppConfig.query_name)
    topics: tuple[str, ...]                 # the handoff's source topics
    sink: Literal["iceberg", "bigquery"] = "iceberg"
    starting_offsets: Literal["earliest", "latest"] = "earliest"   # source.startingOffsets of the stream
    snapshot_id: int | None = None
    timestamp_ms: int | None = None
    tag: str | None = None
    from_: Offsets | None = None
    to: Offsets | None = None


@dataclass(frozen=True)
class Failure:
    reason: str        # CamelCase, for the condition
    message: str       # what is wrong and how to fix it


@dataclass(frozen=True)
class Plan:
    mode: Mode
    head_snapshot: int | None = None        # the table's head when planned (the undo point)
    target_snapshot: int | None = None
    discarded_snapshots: int = 0
    resume_offsets: Offsets | None = None   # where the stream goes on from afterwards
    replay_from: Offsets | None = None      # re-read range (RollbackAndReplay, Backfill)
    replay_to: Offsets | None = None
    gap: Ranges | None = None               # ranges recorded as skipped (Rollback)
    records: int = 0                        # offsets to re-read
    summary: str = ""


def request_from_spec(spec: Any, handoff_id: str, query: str, topics: Sequence[str],
                      sink: Literal["iceberg", "bigquery"],
                      starting_offsets: Literal["earliest", "latest"] = "earliest") -> Request:
    """A `Request` from a validated `ReplayRequestSpec`."""
    target = spec.target
    ts: datetime | None = target.timestamp if target is not None else None
    return Request(
        mode=spec.mode, handoff_id=handoff_id, query=query, topics=tuple(topics), sink=sink,
        starting_offsets=starting_offsets,
        snapshot_id=int(target.snapshot_id) if target is not None and target.snapshot_id is not None else None,
        timestamp_ms=int(ts.timestamp() * 1000) if ts is not None else None,
        tag=target.tag if target is not None else None,
        from_=_int_keys(spec.from_) if spec.from_ is not None else None,
        to=_int_keys(spec.to) if spec.to is not None else None)


def _int_keys(offsets: Mapping[str, Mapping[Any, int]]) -> Offsets:
    return {t: {int(p): int(o) for p, o in parts.items()} for t, parts in offsets.items()}


def wire(offsets: Mapping[str, Mapping[int, int]] | None) -> dict[str, dict[str, int]] | None:
    """Offsets as the CRD stores them (partition keys are strings)."""
    if offsets is None:
        return None
    return {t: {str(p): o for p, o in sorted(parts.items())} for t, parts in sorted(offsets.items())}


def fmt_offsets(offsets: Mapping[str, Mapping[int, int]]) -> str:
    return ", ".join(f"{t}[{p}]@{o}" for t, parts in sorted(offsets.items()) for p, o in sorted(parts.items()))


def _records(start: Offsets, end: Offsets) -> int:
    return sum(max(0, end.get(t, {}).get(p, o) - o) for t, parts in start.items() for p, o in parts.items())


def _stream_ends(entries: Sequence[LedgerEntry]) -> Offsets:
    """Next offset per partition after `entries` (newest first): the newest entry naming a partition wins."""
    out: Offsets = {}
    for e in entries:
        for t, parts in e.offsets.items():
            for p, (_s, end) in parts.items():
                out.setdefault(t, {}).setdefault(p, end)
    return out


def _first_starts(entries: Sequence[LedgerEntry]) -> Offsets:
    """Start of the oldest range per partition among `entries` (newest first)."""
    out: Offsets = {}
    for e in entries:
        for t, parts in e.offsets.items():
            for p, (start, _e) in parts.items():
                out.setdefault(t, {})[p] = start
    return out


def _mine(entry: LedgerEntry | None, req: Request) -> bool:
    return entry is not None and entry.handoff_id == req.handoff_id and entry.query == req.query


def resolve_target(table: TableFacts, req: Request) -> int | Failure:
    """The snapshot id the request goes back to, which must be in the table's current ancestry."""
    in_ancestry = {s.snapshot_id for s in table.ancestry}
    if req.tag is not None:
        sid = table.tags.get(req.tag)
        if sid is None:
            return Failure("TagNotFound", f"spec.target.tag: the table has no tag {req.tag!r} (it has: "
                           f"{', '.join(sorted(table.tags)) or 'none'}); use an existing tag, or target.snapshotId")
        what = f"tag {req.tag!r} (snapshot {sid})"
    elif req.snapshot_id is not None:
        sid = req.snapshot_id
        if sid not in table.snapshot_ids:
            return Failure("SnapshotNotFound", f"spec.target.snapshotId: snapshot {sid} is not in the table (expired "
                           f"by the replay window, or never existed); pick a snapshot of the current history "
                           f"(status.committed.snapshot of the handoff, or the table's snapshots metadata table)")
        what = f"snapshot {sid}"
    else:
        assert req.timestamp_ms is not None
        older = [s for s in table.ancestry if s.timestamp_ms <= req.timestamp_ms]
        if not older:
            oldest = table.ancestry[-1].timestamp_ms if table.ancestry else None
            return Failure("TargetExpired", "spec.target.timestamp: the table keeps no snapshot at or before it"
                           + (f" (oldest kept: {_iso(oldest)})" if oldest is not None else "")
                           + "; snapshots older than spec.replay.window are expired: pick a later time")
        return older[0].snapshot_id
    if sid not in in_ancestry:
        return Failure("NotAnAncestor", f"{what} is not in the table's current history (it was rolled back "
                       f"or is on another branch); rolling back to it would not restore offsets the ledger can "
                       f"vouch for: pick a snapshot of the current history")
    return sid


def _iso(ms: int) -> str:
    return datetime.utcfromtimestamp(ms / 1000).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_kafka_holds(start: Offsets, end: Offsets, kafka: KafkaFacts, field_: str) -> Failure | None:
    """Kafka must still hold [start, end) of every partition that has records to re-read."""
    missing, deleted = [], []
    for t, parts in sorted(start.items()):
        for p, o in sorted(parts.items()):
            if end.get(t, {}).get(p, o) <= o:
                continue
            earliest = kafka.earliest.get(t, {}).get(p)
            if earliest is None:
                missing.append(f"{t}[{p}]")
            elif earliest > o:
                deleted.append(f"{t}[{p}] from {o} (earliest kept: {earliest})")
    if missing:
        return Failure("TopicNotFound", f"{field_}: Kafka has no {', '.join(missing)}; the records cannot be "
                       f"re-read (topic deleted or recreated)")
    if deleted:
        return Failure("OffsetsDeleted", f"{field_}: Kafka's retention already deleted offsets to re-read: "
                       f"{'; '.join(deleted)}; pick a later target, or use mode Rollback (no re-read), and "
                       f"raise the topic's retention.ms to cover spec.replay.window")
    return None


def plan(req: Request, table: TableFacts | None, kafka: KafkaFacts | None,
         active_replays: Sequence[str] = ()) -> Plan | Failure:
    """The plan for `req`, or why it cannot succeed. `active_replays`: other ReplayRequests of the same
    handoff that are running now (a table is rewound by one request at a time)."""
    if active_replays:
        return Failure("AnotherReplayRunning", f"ReplayRequest {', '.join(sorted(active_replays))} is running for "
                       f"this handoff; create this request again once it has finished")
    if table is None or table.head is None:
        return Failure("NothingCommitted", "the handoff's table does not exist or has no snapshot yet; there is "
                       "nothing to roll back or backfill into")
    if req.mode == "Backfill":
        return _plan_backfill(req, table, kafka)
    return _plan_rollback(req, table, kafka)


def _plan_rollback(req: Request, table: TableFacts, kafka: KafkaFacts | None) -> Plan | Failure:
    target = resolve_target(table, req)
    if isinstance(target, Failure):
        return target
    head = table.head
    if target == head:
        return Failure("NothingToRollBack", f"snapshot {target} is already the table's current snapshot; "
                       f"pick an older target")
    index = next(i for i, s in enumerate(table.ancestry) if s.snapshot_id == target)
    discarded, kept = table.ancestry[:index], table.ancestry[index:]
    others = sorted({f"{s.entry.handoff_id} (query {s.entry.query})" for s in discarded
                     if s.entry is not None and not _mine(s.entry, req)})
    if others:
        return Failure("OtherWritersInRange", f"the rollback would also discard commits of {', '.join(others)}, "
                       f"which this handoff's stream would not write again; pick a target after them")
    mine_discarded = [s.entry for s in discarded if s.entry is not None and _mine(s.entry, req)]
    mine_kept = [s.entry for s in kept if s.entry is not None and _mine(s.entry, req)]
    before = _stream_ends(mine_discarded + mine_kept)
    at_target = _stream_ends(mine_kept)
    starts = _first_starts(mine_discarded)
    replay_from: Offsets = {}
    for t, parts in before.items():
        for p, end in parts.items():
            start = at_target.get(t, {}).get(p, starts.get(t, {}).get(p, end))
            replay_from.setdefault(t, {})[p] = start
    records = _records(replay_from, before)
    n = len(discarded)
    if req.mode == "Rollback":
        gap: Ranges = {t: {p: (o, before[t][p]) for p, o in parts.items() if before[t][p] > o}
                       for t, parts in replay_from.items()}
        gap = {t: parts for t, parts in gap.items() if parts}
        return Plan("Rollback", head_snapshot=head, target_snapshot=target, discarded_snapshots=n,
                    resume_offsets=before, gap=gap, records=0,
                    summary=(f"roll the table back from snapshot {head} to {target} ({n} snapshots discarded, "
                             f"{records} records leave the table for good); the stream goes on from "
                             f"{fmt_offsets(before) or 'where it was'}, the skipped range recorded as a gap"))
    if kafka is None:
        return Failure("KafkaUnavailable", "Kafka's offsets could not be read; the request is planned again "
                       "when it can be")
    refused = check_kafka_holds(replay_from, before, kafka, "spec.target") or _check_new_partitions(
        req, replay_from, before, at_target, discarded, target, kafka)
    if refused is not None:
        return refused
    return Plan("RollbackAndReplay", head_snapshot=head, target_snapshot=target, discarded_snapshots=n,
                resume_offsets=replay_from, replay_from=replay_from, replay_to=before, records=records,
                summary=(f"roll the table back from snapshot {head} to {target} ({n} snapshots discarded) and "
                         f"re-read {records} records from Kafka: {fmt_offsets(replay_from)} up to {fmt_offsets(before)}"))


def _check_new_partitions(req: Request, replay_from: Offsets, before: Offsets, at_target: Offsets,
                          discarded: Sequence[SnapshotInfo], target: int, kafka: KafkaFacts) -> Failure | None:
    """A partition first committed after the target is absent from the ledger once the table is rolled back,
    so the restarted stream starts it at `source.startingOffsets`, not where its first commit started: with
    `latest` the records to re-read would be skipped (lost from the table for good), with `earliest` records
    before that first commit (never in the table) would be read too, unless Kafka's earliest offset is exactly
    where the first commit started. Refused unless it is; the fix is a target at or after that first commit
    (the ledger then names the partition), or mode Rollback (nothing is re-read)."""
    problems: list[str] = []
    newest_first = len(discarded)      # index in `discarded` (newest first) of the newest such first commit
    for t, parts in sorted(replay_from.items()):
        for p, start in sorted(parts.items()):
            if p in at_target.get(t, {}) or before[t][p] <= start:
                continue
            restart = (kafka.earliest if req.starting_offsets == "earliest" else kafka.latest).get(t, {}).get(p)
            if req.starting_offsets == "earliest" and restart == start:
                continue
            index = max(i for i, s in enumerate(discarded) if _mine(s.entry, req) and s.entry is not None
                        and p in s.entry.offsets.get(t, {}))
            newest_first = min(newest_first, index)
            first = discarded[index].snapshot_id
            effect = ("skipping the records to re-read" if req.starting_offsets == "latest" or
                      (restart is not None and restart > start) else "re-reading records the table never held")
            problems.append(f"{t}[{p}] (first committed in snapshot {first}, from offset {start}; it would restart "
                            f"at startingOffsets {req.starting_offsets}, offset {restart}: {effect})")
    if not problems:
        return None
    return Failure("PartitionNewerThanTarget", f"spec.target: partitions first committed after snapshot {target} "
                   f"are not in the ledger once the table is rolled back, so the stream would start them at "
                   f"source.startingOffsets instead of where they were first read: {'; '.join(problems)}; pick a "
                   f"target at or after snapshot {discarded[newest_first].snapshot_id} (the ledger then names them), or use mode "
                   f"Rollback (nothing is re-read)")


def _plan_backfill(req: Request, table: TableFacts, kafka: KafkaFacts | None) -> Plan | Failure:
    assert req.from_ is not None and req.to is not None
    unknown = sorted(set(req.from_) - set(req.topics))
    if unknown:
        return Failure("UnknownTopic", f"spec.from: {', '.join(unknown)} is not one of the handoff's "
                       f"source.topics ({', '.join(req.topics)}); backfill only the handoff's own topics")
    records = _records(req.from_, req.to)
    if records == 0:
        return Failure("NothingToBackfill", "spec.from equals spec.to for every partition; nothing to re-read")
    held: list[str] = []
    for snap in table.ancestry:
        e = snap.entry
        if e is None or e.gap or e.handoff_id != req.handoff_id:
            continue
        for t, parts in e.offsets.items():
            for p, (start, end) in parts.items():
                lo, hi = req.from_.get(t, {}).get(p), req.to.get(t, {}).get(p)
                if lo is not None and hi is not None and start < hi and lo < end and start < end:
                    held.append(f"{t}[{p}] {max(start, lo)}-{min(end, hi)} (snapshot {snap.snapshot_id}, "
                                f"query {e.query})")
    if held:
        shown = "; ".join(held[:5]) + (f"; and {len(held) - 5} more" if len(held) > 5 else "")
        return Failure("BackfillOverlap", f"spec.from/to: the table already holds part of the range: {shown}; "
                       f"backfill only offsets the table lacks (use mode RollbackAndReplay to re-read held ones)")
    if kafka is None:
        return Failure("KafkaUnavailable", "Kafka's offsets could not be read; the request is planned again "
                       "when it can be")
    refused = check_kafka_holds(req.from_, req.to, kafka, "spec.from")
    if refused is not None:
        return refused
    ahead = [f"{t}[{p}] to {o} (latest: {kafka.latest.get(t, {}).get(p)})" for t, parts in sorted(req.to.items())
             for p, o in sorted(parts.items()) if o > kafka.latest.get(t, {}).get(p, -1)]
    if ahead:
        return Failure("OffsetsNotWritten", f"spec.to: beyond what Kafka holds: {'; '.join(ahead)}; "
                       f"lower spec.to to offsets already written")
    return Plan("Backfill", head_snapshot=table.head, replay_from=req.from_, replay_to=req.to, records=records,
                summary=(f"re-read {records} records {fmt_offsets(req.from_)} up to {fmt_offsets(req.to)} into the table "
                         f"under their own ledger query; the stream's position is unchanged"))


def progress(start: Offsets, end: Offsets, now: Mapping[str, Mapping[int, int]]) -> tuple[int, bool]:
    """(records re-read so far, whether every partition reached `end`) from the ledger's offsets `now`."""
    done, finished = 0, True
    for t, parts in start.items():
        for p, o in parts.items():
            target = end.get(t, {}).get(p, o)
            at = now.get(t, {}).get(p, o)
            done += max(0, min(at, target) - o)
            finished = finished and at >= target
    return done, finished
