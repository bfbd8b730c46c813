"""The driver's bootstrap batches: a restarted driver commits the stream itself, in its own process, while Spark's
session starts and warms up, then hands it to Spark's query (issue 15, docs/benchmarks.md "Cold start").

Why: Spark's first micro-batch after any (re)start starts seven fresh Python interpreters one after another
(planner daemons, the source runner, the executors' worker daemon, the sink's commit runner) and took 13 s on
top of a 5.5 s session start; the driver process has, by then, prepared the table, read the ledger and loaded
PyIceberg, pyarrow and confluent-kafka. So it reads the next batches itself and commits them — through the *same*
functions Spark's write task and commit run (`iceberg.sink.write_task` over `handoff-kafka-ranges` rows,
`iceberg.sink.commit_ranges`), so the ledger check (`check_contiguous`), the dead-letter topic, the schema
policy, the Kafka identity recorded in the ledger and the zombie-driver guard hold by construction.

How it fits the ledger and the checkpoint:
- the batch's ranges start at the table's ledger end (`resume.prepare_start` read it; partitions the ledger
  lacks start at `startingOffsets`, as the source's `initialOffset` does) and end at Kafka's last stable
  offsets, bounded by `maxRecordsPerBatch` and `MAX_RECORDS` (`kafka.source.admit`, the source's own rule);
- they are batches 0, 1, … of a query of their own (query id `bootstrap-<uuid>` in the ledger), so the sink's
  replay skip (`ledger.find_batch`, keyed on Spark's query id) never takes a Spark batch for one or one for it;
  each starts where the previous one ended, through the same ledger check;
- a running stream (not AvailableNow) keeps them coming at the trigger interval while the main thread starts
  the session and runs its warm-up query (`session_warmup`: Spark's first batch otherwise pays ~6 s of fresh
  interpreters), so the table never waits on Spark's start; `Bootstrap.hand_over` stops them at a batch
  boundary just before Spark's query starts;
- once the first one committed, Spark's checkpoint is behind the ledger; it is reset (`reset_checkpoint`) and
  Spark's query starts fresh from the ledger's new end (the source's `startOffsets`). A driver killed between
  the commit and the reset finds a checkpoint that disagrees with the ledger at its next start, which
  `resume.prepare_start` discards (the existing rule) — nothing is read twice or skipped either way.
- a failed attempt's data files are left to the orphan sweep (unreferenced; a commit that landed despite an
  error keeps its files).

Off (Spark's path only): `bootstrapBatch: false` in the app config (`spec.spark.driver.bootstrapBatch`), or the
environment `HANDOFF_BOOTSTRAP_BATCH=0`; never for a backfill, a built-in sink override, or the BigQuery sink
(its write and commit keep Spark's path).
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from handoff_spark import checkpoint as ckpt
from handoff_spark import faults, switches
from handoff_spark.config import AppConfig

log = logging.getLogger("handoff.bootstrap")

ENV = switches.BOOTSTRAP_BATCH.name
#: The most offsets the bootstrap reads (a tighter `maxRecordsPerBatch` wins): it runs in the driver's one
#: process while the JVM starts, so it is sized to about the session's start time (~100k records/s in-process).
MAX_RECORDS = 100_000
#: The bootstrap's fault hooks' prefix (its batches are 0, 1, … of its own query in the ledger).
FAULT_PREFIX = "bootstrap-"
#: The shortest wait between two bootstrap batches when Kafka had no more than one batch's worth.
MIN_PAUSE_SECONDS = 0.2

TopicPartition = tuple[str, int]


def off_reason(cfg: AppConfig, sink_format: str | None) -> str | None:
    """Why this driver runs no bootstrap batch (None: it runs one)."""
    if sink_format is not None:
        return f"the sink is overridden ({sink_format})"
    if cfg.backfill is not None:
        return "a backfill reads a bounded range through Spark"
    if not switches.BOOTSTRAP_BATCH():
        return switches.BOOTSTRAP_BATCH.as_set()
    if not cfg.bootstrap_batch:
        return "bootstrapBatch is false"
    if cfg.sink.kind != "iceberg":
        return f"the {cfg.sink.kind} sink commits through Spark only"
    if cfg.frame_path:
        return "transform, dedupe and eventTime run in Spark: every batch is Spark's"
    return None


@dataclass(frozen=True)
class Plan:
    """The bootstrap batch's ranges `{(topic, partition): (start, end)}` (every partition, empty ones too, as a
    Spark batch records them), Kafka's last stable offsets when planned (for lag), and its ledger query id."""

    ranges: dict[TopicPartition, tuple[int, int]]
    latest: dict[TopicPartition, int]
    query_id: str
    capped: bool = False  # the batch stops short of Kafka's end (its cap): the next one follows at once

    @property
    def offsets(self) -> int:
        return sum(end - start for start, end in self.ranges.values())


@dataclass(frozen=True)
class Outcome:
    """A committed bootstrap batch: its plan, the sink's commit result and its wall time (plan → commit)."""

    plan: Plan
    commit: Any  # iceberg.sink.CommitResult
    duration_ms: int

    def commit_record(self) -> dict[str, Any]:
        return dataclasses.asdict(self.commit)


def open_source(cfg: AppConfig) -> tuple[Any, Any]:
    """The source's options for `cfg` and one AdminClient for them (`kafka.source.Broker`), kept for every batch
    a Bootstrap plans: one client and its connections, not one per batch."""
    from handoff_spark.kafka.source import Broker, SourceOptions, source_options

    opts = SourceOptions.parse(source_options(cfg, None))
    return opts, Broker(opts)


def plan(opts: Any, broker: Any, ledger: dict[TopicPartition, int], query_id: str) -> tuple[Plan | None, str]:
    """The batch to bootstrap from the ledger's end `ledger` (`opts`, `broker`: `open_source`), or (None, why
    not). Declines — leaving the range to Spark's source, which applies `onOffsetOutOfRange` and records gaps —
    when a start was deleted by retention."""
    from handoff_spark.kafka.source import admit, plan_ranges

    tps = broker.partitions()
    known = {tp: off for tp, off in ledger.items() if tp in set(tps)}
    rest = [tp for tp in tps if tp not in known]
    start = {**broker.list_offsets(rest, opts.starting_offsets), **known}
    latest = broker.list_offsets(tps, "latest")
    cap = min(MAX_RECORDS, opts.max_records_per_batch or MAX_RECORDS)
    end = admit(start, latest, cap)
    moving = plan_ranges(start, end)
    if not moving:
        return None, "no backlog"
    earliest = broker.list_offsets([(r.topic, r.partition) for r in moving], "earliest")
    deleted = [f"{r.topic}[{r.partition}] {r.start} < {earliest[(r.topic, r.partition)]}" for r in moving
               if r.start < earliest[(r.topic, r.partition)]]
    if deleted:
        return None, "offsets deleted by retention (" + ", ".join(deleted) + "); Spark's source handles them"
    ranges = {tp: (start[tp], end[tp]) for tp in sorted(start)}
    return Plan(ranges=ranges, latest=latest, query_id=query_id,
                capped=any(end[tp] < latest.get(tp, end[tp]) for tp in end)), ""


def run_batch(cfg: AppConfig, p: Plan, batch_id: int) -> Any:
    """Read, decode and write the plan's records with the Spark write task's own function, then commit them with
    the Spark commit's own function (ledger check included). Returns the sink's CommitResult."""
    from handoff_spark.iceberg.sink import commit_ranges, write_task
    from handoff_spark.kafka.source import plan_ranges, range_batch

    starts = {tp: se[0] for tp, se in p.ranges.items()}
    ends = {tp: se[1] for tp, se in p.ranges.items()}
    rows = [range_batch(r) for r in plan_ranges(starts, ends)]
    msg = write_task(cfg, iter(rows), in_spark=False)
    return commit_ranges(cfg, [msg], batch_id, p.ranges, p.query_id, FAULT_PREFIX)


def reset_checkpoint(cfg: AppConfig) -> list[str]:
    """After a bootstrap commit Spark's checkpoint is behind the table's ledger (a cache that is now stale): clear
    it so Spark's query starts fresh from the ledger's end. The Kafka identity side file (written by
    `prepare_start`, recorded in every commit) is kept. Returns what was removed."""
    identity = ckpt.read_kafka_identity(cfg.checkpoint_location)
    removed = ckpt.discard(cfg.checkpoint_location)
    if identity is not None:
        ckpt.write_kafka_identity(cfg.checkpoint_location, identity)
    return removed


class Bootstrap:
    """The bootstrap batches in a thread of the driver, so they overlap the Spark session's start (and its
    warm-up, `session_warmup`) on the main thread (the session itself must be built on the main thread: built
    in another one, the sink registered on it was not found at `writeStream.start`, docs/benchmarks.md).

    `keep_going=False` (AvailableNow): one batch. Otherwise batches of one query follow each other, paced like
    Spark's processing-time trigger (`triggerIntervalSeconds`, back to back while a backlog exceeds a batch),
    until `hand_over()`: the running batch finishes, no new one starts, and Spark's query takes the stream from
    the ledger's end. `result()` joins the thread: the ledger's end after the last committed batch, or the
    thread's exception re-raised."""

    def __init__(self, cfg: AppConfig, ledger: dict[TopicPartition, int], echo: Callable[[str], None] = print,
                 on_commit: Callable[[Outcome], None] | None = None, keep_going: bool = False) -> None:
        self.cfg, self.ledger, self.echo, self.on_commit = cfg, dict(ledger), echo, on_commit
        self.keep_going = keep_going
        self.outcomes: list[Outcome] = []
        self._error: BaseException | None = None
        self._handed_over = threading.Event()
        self._query_id = f"bootstrap-{uuid.uuid4()}"
        self._thread = threading.Thread(target=self._run, name="handoff-bootstrap", daemon=True)

    def start(self) -> "Bootstrap":
        self._thread.start()
        return self

    def failed(self) -> bool:
        """The thread ended on an error (`result()` re-raises it)."""
        return self._error is not None

    def hand_over(self) -> None:
        """Start no further batch (the running one still commits)."""
        self._handed_over.set()

    def _run(self) -> None:
        try:
            opts, broker = open_source(self.cfg)
            while True:
                began = time.monotonic()
                batch_id = len(self.outcomes)
                p, why_not = plan(opts, broker, self.ledger, self._query_id)
                if p is None:
                    if not self.outcomes:
                        self.echo(f"bootstrap batch: none yet ({why_not})" if self.keep_going
                                  else f"bootstrap batch: none ({why_not})")
                else:
                    self._commit(p, batch_id, began)
                if not self.keep_going:
                    return
                # like Spark's processing-time trigger: the next batch at the interval, at once while capped
                pause = 0.0 if p is not None and p.capped else max(
                    MIN_PAUSE_SECONDS, began + self.cfg.trigger_interval_seconds - time.monotonic())
                if self._handed_over.wait(pause):
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread by result()
            self._error = exc

    def _commit(self, p: Plan, batch_id: int, began: float) -> None:
        log.info("bootstrap batch %d: %d offsets, query %s", batch_id, p.offsets, p.query_id)
        faults.maybe_pause(FAULT_PREFIX + "pause", batch_id)
        commit = run_batch(self.cfg, p, batch_id)
        outcome = Outcome(p, commit, int((time.monotonic() - began) * 1000))
        self.outcomes.append(outcome)
        self.ledger.update({tp: se[1] for tp, se in p.ranges.items()})
        if batch_id == 0:
            faults.maybe_crash(FAULT_PREFIX + "crash-before-checkpoint-reset", batch_id)
            # Here, not after the session start: the main thread does not touch the checkpoint until the query
            # starts, and the batch is reported (freshness, the operator's record) as soon as it is durable.
            # Once is enough: nothing writes Spark's checkpoint before the query starts.
            reset_checkpoint(self.cfg)
        if self.on_commit is not None:
            try:
                self.on_commit(outcome)
            except Exception:  # noqa: BLE001 - a reporting bug must not fail the driver
                log.exception("reporting the bootstrap batch failed")
        if batch_id == 0:
            self.echo(f"bootstrap batch committed (snapshot {commit.snapshot_id}); Spark's checkpoint reset, its "
                      f"query resumes from the table's ledger")

    def result(self) -> dict[TopicPartition, int]:
        self.hand_over()
        self._thread.join()
        if self._error is not None:
            raise self._error
        return dict(self.ledger)
