"""Where a query starts: the table's ledger is the truth, the Spark checkpoint only a cache of it.

At start the driver compares where the checkpoint would resume with where the sink's ledger ends. A checkpoint
that agrees is used as is (the usual restart). One that disagrees — the table was rolled back, another writer
moved it, the checkpoint belongs to another table, or was restored from an old backup — is discarded, and the
query starts fresh from the ledger's offsets (`startOffsets` of the source). A lost checkpoint is the same case
without the discard. Partitions the ledger never saw start at `startingOffsets`.

The Kafka cluster id and topic ids recorded in the ledger are checked first: offsets of a deleted and recreated
topic (or of another cluster) mean nothing for the new one, so the driver refuses to start rather than re-read
or skip records silently, and says how to proceed.

A checkpoint whose Spark state is keyed by other `dedupe.keys` than the spec's (recorded at each start) is discarded
too: Spark refuses a changed state key schema, and the window is rebuilt for the new keys from the ledger. So is one
written by the other path (the fused path's query, or the DataFrame path's: a transform, dedupe or event time was
added or removed): its last batch was planned, and maybe half written, by a query that reads and writes otherwise, and
the ledger says where the new query starts just as well.

`checkpoint_problems`, `state_keys_problem` and `ledger.identity_problems` (handoff_spark.ledger.record) are the
pure decisions; `prepare_start` does the I/O.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from handoff_spark import checkpoint as ckpt
from handoff_spark.errors import HandoffConfigError
from handoff_spark.ledger.record import identity_problems

log = logging.getLogger("handoff.resume")

TopicPartition = tuple[str, int]


class KafkaIdentityError(HandoffConfigError):
    """The topic or cluster is not the one the ledger's offsets belong to."""


class BackfillOverlapError(HandoffConfigError):
    """A Backfill range the table already (partly) holds: re-reading it would duplicate records."""


def _candidate_problems(start: dict[TopicPartition, int], ledger: dict[TopicPartition, int],
                        baseline: dict[TopicPartition, int]) -> list[str]:
    out = []
    for tp, end in sorted(ledger.items()):
        have = start.get(tp)
        if have != end:
            where = "does not know the partition" if have is None else f"resumes at {have}"
            out.append(f"{tp[0]}[{tp[1]}]: the checkpoint {where}, the table's ledger ends at {end}")
    for tp, have in sorted(start.items()):
        if tp not in ledger and have > baseline.get(tp, have):
            out.append(f"{tp[0]}[{tp[1]}]: the checkpoint resumes at {have}, but the table holds none of "
                       f"offsets {baseline[tp]}..{have - 1}")
    return out


def checkpoint_problems(point: ckpt.ResumePoint, ledger: dict[TopicPartition, int],
                        baseline: dict[TopicPartition, int]) -> list[str]:
    """Why the checkpoint must not be trusted (empty: it agrees with the ledger). Pure.

    `point`: where Spark would resume. Its next batch starts at `next_start`; a batch Spark planned but did not
    mark done either already landed in the table (the ledger then ends at its end, and the sink will skip it) or
    did not (the ledger ends at its start) — both agree. `baseline`: per partition, the offset the checkpoint
    first saw it at (its initial offset, else Kafka's earliest now): a partition the ledger never saw must not be
    past it, or records the checkpoint counts as read are not in the table.
    """
    if point.empty:
        return []
    candidates = [c for c in (point.next_start, point.pending_end) if c is not None]
    if not candidates:
        candidates = [{}]
    problems = [_candidate_problems(c, ledger, baseline) for c in candidates]
    return [] if any(not p for p in problems) else problems[0]


@dataclass(frozen=True)
class StartPlan:
    """What the driver starts from: the ledger's offsets (handed to the source for a fresh checkpoint), and why
    the checkpoint was discarded, if it was."""

    ledger: dict[TopicPartition, int]
    discarded: str | None

    def start_offsets(self) -> dict[str, dict[int, int]]:
        out: dict[str, dict[int, int]] = {}
        for (topic, p), off in sorted(self.ledger.items()):
            out.setdefault(topic, {})[p] = off
        return out


def path_problem(recorded_rows: bool | None, rows: bool) -> str | None:
    """Why a checkpoint written by the other path's query is not resumed (None: same path, or not recorded). Pure."""
    if recorded_rows is None or recorded_rows == rows:
        return None
    def name(r: bool) -> str:
        return "the DataFrame path (a transform, dedupe or event time)" if r else "the fused path"
    return f"the query moved from {name(recorded_rows)} to {name(rows)}"


def state_keys_problem(recorded: list[str] | None, keys: list[str] | None,
                       recorded_types: dict[str, str] | None = None, types: dict[str, str] | None = None
                       ) -> str | None:
    """Why a checkpoint's Spark state no longer fits the spec's `dedupe.keys` (None: it fits). Spark keys the
    dedupe's state by them, and refuses a changed key schema (names, order, types), so the driver would fail at
    every start; the window is rebuilt from the ledger instead (`driver.seed`), for the new keys. Types are
    compared when both are known: a SQL that CASTs a key to another type keeps its name (or a declared key's
    type was widened)."""
    def shown(k: list[str] | None) -> str:
        return f"[{', '.join(k)}]" if k is not None else "none (no dedupe)"
    if recorded != keys:
        return f"dedupe.keys changed from {shown(recorded)} to {shown(keys)}"
    if not recorded_types or not types or recorded_types == types:
        return None
    changed = [f"{k} from {recorded_types.get(k, '?')} to {types.get(k, '?')}" for k in keys or []
               if recorded_types.get(k) != types.get(k)]
    return f"dedupe key types changed: {', '.join(changed)}" if changed else None


class SourceInvalid(ValueError):
    """Topics a running driver was handed in place (`driver.query_config`) that it cannot read: its one line
    starts with `contract.SOURCE_INVALID`."""


#: How long a running driver waits for other bootstrap servers to answer before it refuses them: the query runs on
#: meanwhile, but the loop that reports it waits too.
NEW_SERVERS_TIMEOUT_SECONDS = 10.0


def source_problem(cfg: Any, sink: Any, *, servers_changed: bool = False) -> str | None:
    """Why the driver cannot switch to `cfg`'s Kafka servers and topics (None: it can), checked before its query
    stops for them: a topic Kafka lacks, one recreated under its name, or another cluster than the one the ledger's
    offsets belong to (their ids against the ledger's); with `servers_changed`, servers where no broker answers too.
    At a driver's start these fail the start (the source names a missing topic; `prepare_start` a recreated one or
    another cluster); a running driver refuses them instead and runs on with the servers and topics before. One
    metadata request for every topic (asking for a topic by name may create it on a broker that auto-creates topics),
    whose cluster id the identity check takes too. Servers the driver already reads from that do not answer raise:
    an outage, checked again later, not a wrong spec."""
    from confluent_kafka import KafkaException

    from handoff_spark import contract
    from handoff_spark.kafka.identity import admin_client, kafka_identity

    field = "spec.source.bootstrapServers" if servers_changed else "spec.source.topics"
    admin = admin_client(cfg)
    try:
        metadata = admin.list_topics(timeout=NEW_SERVERS_TIMEOUT_SECONDS if servers_changed else 30)
    except KafkaException as exc:
        if not servers_changed:
            raise
        return (f"{contract.SOURCE_INVALID}: {field}: no Kafka broker answered at {cfg.source.bootstrap_servers} "
                f"({_kafka_error(exc)}); correct it, or put back the servers before")
    found = metadata.topics
    missing = [t for t in cfg.source.topics
               if t not in found or found[t].error is not None or not found[t].partitions]
    if missing:
        where = f" at {cfg.source.bootstrap_servers}" if servers_changed else ""
        return (f"{contract.SOURCE_INVALID}: {field}: Kafka{where} has no topic {', '.join(map(repr, missing))}; "
                f"create it, or remove it from spec.source.topics")
    found_ids = kafka_identity(cfg, admin, cluster_id=metadata.cluster_id)
    problems = identity_problems(*sink.ledger_identity(cfg), *found_ids)
    if problems:
        if servers_changed:
            return (f"{contract.SOURCE_INVALID}: {field}: {'; '.join(problems)}. Fix: if these are the wrong "
                    f"servers, put back the ones before; if the cluster or topic was replaced on purpose, run `handoff "
                    f"ledger accept-kafka -f <manifest>`, which records the new ids and starts them at "
                    f"spec.source.startingOffsets")
        return (f"{contract.SOURCE_INVALID}: {field}: {'; '.join(problems)}. Fix: if the topic was "
                f"recreated on purpose, run `handoff ledger accept-kafka -f <manifest>`, which records its new id "
                f"and starts it at spec.source.startingOffsets")
    return None


def _kafka_error(exc: Exception) -> str:
    """A KafkaException's own text (its KafkaError's), without the class name."""
    error = exc.args[0] if exc.args else None
    return error.str() if hasattr(error, "str") else str(exc)


def prepare_start(cfg: Any, sink: Any, echo: Callable[[str], None] = print,
                  key_types: dict[str, str] | None = None) -> StartPlan:
    """Driver, before the query starts (after the sink prepared its table): check Kafka's identity against the
    ledger, then trust or discard the checkpoint. `sink` is the sink's backend (`sink.registry.SinkBackend`).
    `key_types`: the dedupe keys' Spark types from `transform.check`, when it has run (None before: a driver's
    first start plans while its session starts, and `settle_key_types` compares them once the check has)."""
    from handoff_spark.kafka.identity import kafka_identity, list_earliest

    topics = set(cfg.source.topics)
    ledger = {tp: off for tp, off in sink.ledger_end(cfg).items() if tp[0] in topics}
    if cfg.backfill is not None:
        overlap = sink.backfill_overlap(cfg)
        if overlap:
            raise BackfillOverlapError(
                f"backfill {cfg.query_name} of handoff {cfg.handoff_id}: " + "; ".join(overlap[:5])
                + ". Nothing was written. Fix: backfill only ranges the table does not hold (see `handoff ledger "
                  "show`), e.g. a gap a Rollback left.")
        # the backfill's own ledger (a resumed run) wins; partitions it has not committed start at `from`
        ledger = {**{(t, p): off for t, parts in cfg.backfill.from_.items() for p, off in parts.items()}, **ledger}
    cluster, topic_ids = kafka_identity(cfg)
    recorded_cluster, recorded_topics = sink.ledger_identity(cfg)
    problems = identity_problems(recorded_cluster, recorded_topics, cluster, topic_ids)
    if problems:
        raise KafkaIdentityError(
            f"handoff {cfg.handoff_id}: " + "; ".join(problems) + ". Its offsets in the table's ledger do not "
            "apply to what Kafka holds now, so nothing is read (no silent re-read or skip). Fix: if the handoff "
            "points at the wrong cluster, correct spec.source.bootstrapServers; if the topic was recreated on "
            "purpose, run `handoff ledger accept-kafka -f <manifest>`, which records the new ids in the ledger and "
            "starts the new topic's partitions at spec.source.startingOffsets.")
    point = ckpt.resume_point(cfg.checkpoint_location)
    discarded = None
    if not point.empty:
        initial = ckpt.initial_offsets(cfg.checkpoint_location) or {}
        starts = {tp for c in (point.next_start, point.pending_end) if c for tp in c}
        unknown = sorted(tp for tp in starts if tp not in ledger and tp not in initial)
        baseline = {**list_earliest(cfg, unknown), **initial}
        found = checkpoint_problems(point, ledger, baseline)
        if found:
            discarded = "; ".join(found[:5]) + (f" (+{len(found) - 5} more)" if len(found) > 5 else "")
            _discard(cfg, discarded, echo, "disagrees with the table's ledger")
    keys, rows = _wanted_state(cfg)
    state = ckpt.read_state_keys(cfg.checkpoint_location)
    if not point.empty and discarded is None:
        moved = path_problem(state.rows, rows)
        if moved:
            discarded = moved
            _discard(cfg, moved, echo, "was written by the other path's query")
    if not point.empty and discarded is None:
        changed = state_keys_problem(state.keys, keys, state.types, key_types) if state.recorded else None
        if changed:
            discarded = changed
            _discard_state(cfg, changed, echo)
    if key_types is None and discarded is None and state.recorded and state.keys == keys:
        key_types = state.types  # not known yet: the recorded ones stay until the check compares them
    ckpt.write_state_keys(cfg.checkpoint_location, keys, key_types, rows)
    ckpt.write_kafka_identity(cfg.checkpoint_location, {"cluster": cluster, "topics": topic_ids})
    return StartPlan(ledger=ledger, discarded=discarded)


def _wanted_state(cfg: Any) -> tuple[list[str] | None, bool]:
    """The dedupe keys `cfg`'s query keys Spark's state by (None: no dedupe), and whether it runs the DataFrame path:
    what `checkpoint.STATE_KEYS_FILE` records."""
    keys = list(cfg.dedupe.keys) if getattr(cfg, "dedupe", None) is not None else None
    return keys, bool(getattr(cfg, "frame_path", False))


def _discard_state(cfg: Any, why: str, echo: Callable[[str], None]) -> None:
    _discard(cfg, why, echo, "holds Spark's dedupe state for other keys")


def _discard(cfg: Any, why: str, echo: Callable[[str], None], what: str) -> None:
    removed = ckpt.discard(cfg.checkpoint_location)
    echo(f"checkpoint {cfg.checkpoint_location} {what} and is discarded ({', '.join(removed)}): {why}. Resuming "
         f"from the ledger.")
    log.warning("checkpoint discarded: %s", why)


def settle_key_types(cfg: Any, start: StartPlan, key_types: dict[str, str] | None,
                     echo: Callable[[str], None] = print) -> StartPlan:
    """Driver, once `transform.check` has planned the pipeline (after `prepare_start`, before the query): the
    dedupe keys' types against those the checkpoint's state was made with. A change (the SQL CASTs a key to another
    type under the same name, or a declared key was widened) discards the checkpoint as a change of the keys does,
    rather than failing every start on Spark's state; then records the types."""
    keys, rows = _wanted_state(cfg)
    state = ckpt.read_state_keys(cfg.checkpoint_location)
    changed = state_keys_problem(state.keys, keys, state.types, key_types) if state.recorded else None
    if changed and not ckpt.resume_point(cfg.checkpoint_location).empty:
        _discard_state(cfg, changed, echo)
        start = StartPlan(ledger=start.ledger, discarded=changed)
    ckpt.write_state_keys(cfg.checkpoint_location, keys, key_types, rows)
    return start
