"""The dedupe's window after a lost checkpoint: rebuilt from Kafka, as the table's ledger says, before new data.

Why: Spark keeps the dedupe's keys in its checkpoint (the state store). The table's ledger is the truth and the
checkpoint only a cache, so a lost checkpoint must not empty the window: a key re-sent within `dedupe.within` of
its first copy would be written twice. So when a driver with a dedupe starts on an empty checkpoint and the
ledger has batches, the query starts *earlier* than the ledger's end: at the first ledger batch whose newest
event time is within the window of the ledger's newest (older batches' keys have left the window), clamped to
what Kafka still holds. The records between that start and the ledger's end (the *seed*) go through the same
SQL and dedupe, so their keys enter Spark's state, and none of them is written again:
- the frame source ends the first batches at the ledger's end (the *seed line*), so new records never share a
  batch with seed records (within one batch Spark keeps whichever copy of a key it meets first);
- seed records send no dead letters and are not counted (the earlier driver did both);
- the rows writer drops rows below the line, and the commit's ranges start at the line, so the ledger stays
  contiguous (a seed batch commits nothing).
The line is kept in the checkpoint (`checkpoint.SEED_FILE`) so a driver that dies mid-seed replays the same.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from handoff_spark import checkpoint as ckpt

if TYPE_CHECKING:
    from handoff_spark.config import AppConfig

log = logging.getLogger("handoff.seed")

TopicPartition = tuple[str, int]


def seed_start(cfg: AppConfig, ledger_end: dict[TopicPartition, int], commits: list[Any],
               earliest: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
    """Where the seed starts per partition (pure): see the module docstring. `commits`: the ledger's entries, newest
    first (`handoff_spark.ledger.Commit`). Partitions whose seed would be empty are left out."""
    assert cfg.dedupe is not None
    batches = [c for c in commits if c.kind == "batch" and c.query == cfg.query_name]
    times = [c.max_event_time_ms for c in batches if c.max_event_time_ms is not None]
    if not times:
        return {}
    threshold = max(times) - int(cfg.dedupe.within_seconds * 1000)
    start = dict(ledger_end)
    for c in batches:  # newest first: stop at the first batch wholly before the window
        if c.max_event_time_ms is not None and c.max_event_time_ms < threshold:
            break
        for topic, parts in c.offsets.items():
            for partition, (s, e) in parts.items():
                tp = (topic, int(partition))
                if tp in start and e > s:
                    start[tp] = min(start[tp], s)
    return {tp: max(off, earliest.get(tp, 0)) for tp, off in start.items()
            if max(off, earliest.get(tp, 0)) < ledger_end[tp]}


def plan(cfg: AppConfig, ledger_end: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
    """Driver, before a query on an empty checkpoint: the seed's start offsets (empty: no seed), and the line
    written to the checkpoint."""
    if cfg.dedupe is None or not ledger_end or cfg.backfill is not None:
        return {}
    if not ckpt.resume_point(cfg.checkpoint_location).empty:
        return {}
    from handoff_spark.kafka.identity import list_earliest
    from handoff_spark.ledger import list_commits

    start = seed_start(cfg, ledger_end, list_commits(cfg), list_earliest(cfg, sorted(ledger_end)))
    if start:
        ckpt.write_seed_line(cfg.checkpoint_location, {tp: ledger_end[tp] for tp in start})
        log.info("dedupe window rebuilt from Kafka before new data: %s",
                 {f"{t}[{p}]": f"{s}→{ledger_end[(t, p)]}" for (t, p), s in sorted(start.items())})
    return start
