"""How many executors a handoff should run, from its Kafka backlog (pure; no I/O).

The rule (after Flink's autoscaler, restart-free here, and what its users complained about):

- **Capacity** is measured, not guessed: records per second one executor processes, from the driver's busy
  micro-batches (rows / batch wall time / executors that ran it; the caller passes the best of the last
  minutes, scaling.step.RATE_WINDOW_MS, since fixed per-batch costs make small batches understate it).
- **Required rate** = input rate (records arriving per second) + lag / targetCatchUp: keep up with the input
  and clear today's backlog within targetCatchUp.
- **Scale up at once** when the executors we have cannot deliver the required rate (and the last batch does
  not show them keeping up, below): to
  ceil(required / (capacity × TARGET_UTILIZATION)), headroom included so the next spike does not scale again.
  No cooldown and no stabilization window on the way up (a spike must not wait).
- **Scale down slowly**: only after `cooldown` since the last change, only to the highest recommendation seen
  over the last `cooldown` (the stabilization window: one quiet refresh among noisy ones does not shrink the
  job), by at most half the executors per step, never below what the input rate alone needs, and never while
  the backlog could not be cleared within targetCatchUp by the smaller count.
- **Cap** at what the topic can feed: a batch is split into at most one task per MIN_SPLIT_OFFSETS offsets of
  each partition's share (kafka.source.split_ranges, through `minPartitions`), at least one per partition;
  executors beyond tasks / cores would sit idle.
- **Keeping up beats the estimate** (Flink's busy time, in Spark's terms): a batch that finished within the
  commit interval and was not cut by maxRecordsPerBatch took everything there was, and the executors then sat
  idle until the next trigger, so they keep up whatever the capacity estimate says; no scale-up then. Why:
  a small steady batch rates an executor far below what it does under load (per-task fixed costs: measured on
  the test bed, 6,000-row batches rated a 200m executor under the ~3,600/s the base load seemed to need, while
  it kept up with 12,000/s), and the rule scaled up at base load. A batch that overruns the interval or is cut at the cap is the evidence that
  more executors are needed, and it also rates them better (a large batch). Input that has grown past 1.5x
  the last batch's load since (a spike) makes that batch no evidence, and the estimate decides at once.
- Bounds (minExecutors/maxExecutors) are applied last and at once, so a bounds change applies live.
- Unknown capacity (no busy batch yet) or unknown input rate: hold (clamped to the bounds), never guess.

The hysteresis between the two thresholds (scale up when utilization would pass 100 %, aim at 70 %, scale
down only when the smaller count still stays under 70 %) is what keeps a steady load from flapping.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from handoff_spark.contract import MIN_SPLIT_OFFSETS  # the source never cuts a range finer than this

#: Aim at this share of measured capacity after scaling (Flink's job.autoscaler.target.utilization default).
TARGET_UTILIZATION = 0.7
#: At most this share of the executors goes in one scale-down step (at least one executor).
MAX_DOWN_FRACTION = 0.5


@dataclass(frozen=True)
class ScalingInput:
    """Plain facts of one status refresh."""

    now_ms: int
    current: int                                 # executors we last asked for (status.executors.desired)
    min_executors: int
    max_executors: int
    target_catch_up_seconds: float
    cooldown_seconds: float
    cores_per_executor: int
    lag: dict[str, int]                          # records not yet in the table, per "topic/partition"
    input_rate: float | None                     # records/s arriving in Kafka (None: not measured yet)
    rate_per_executor: float | None              # records/s one executor processes (None: no busy batch yet)
    trigger_seconds: float = 0.0                 # commit interval: a steady batch holds input_rate × this
    max_records_per_batch: int | None = None
    last_scale_ms: int | None = None
    #: (time, recommendation) of earlier refreshes, oldest first (the stabilization window).
    history: tuple[tuple[int, int], ...] = ()
    #: The driver's last batch (seconds from trigger to commit, rows), when it is recent; None: unknown.
    batch_seconds: float | None = None
    batch_rows: int | None = None


#: Input that grew past this many times the last batch's load (rows per commit interval) since it ran makes
#: that batch no evidence: it kept up with a smaller load.
LOAD_GROWTH = 1.5


def keeping_up(facts: ScalingInput) -> bool:
    """The last batch finished within the commit interval and took all there was (not cut at
    maxRecordsPerBatch): the executors idled until the next trigger. Unless the input has grown by more than
    LOAD_GROWTH since: at a spike the last batch still shows the old load, and waiting for one that overruns
    cost a whole batch plus a refresh (measured: the decision 15 s after a 4x step instead of ~5 s)."""
    if facts.batch_seconds is None or facts.trigger_seconds <= 0:
        return False
    capped = (facts.max_records_per_batch is not None and facts.batch_rows is not None
              and facts.batch_rows >= facts.max_records_per_batch)
    grown = (facts.batch_rows is not None and facts.input_rate is not None
             and facts.input_rate * facts.trigger_seconds > LOAD_GROWTH * max(1, facts.batch_rows))
    return facts.batch_seconds <= facts.trigger_seconds and not capped and not grown


@dataclass(frozen=True)
class ScalingDecision:
    desired: int
    reason: str                                  # CamelCase, for status and Events
    message: str
    recommendation: int                          # before stabilization/steps: goes into the history
    history: tuple[tuple[int, int], ...] = field(default=())


def feedable_executors(lag: dict[str, int], input_rate: float, trigger_seconds: float,
                       max_records_per_batch: int | None, cores_per_executor: int) -> int:
    """Executors the next batches can keep busy: the tasks split_ranges can cut a batch into, / cores."""
    partitions = max(1, len(lag))
    total_lag = sum(lag.values())
    batch = total_lag + input_rate * trigger_seconds
    if max_records_per_batch:
        batch = min(batch, max_records_per_batch)
    tasks = 0
    for part_lag in (lag.values() or [0]):
        share = batch * (part_lag / total_lag if total_lag else 1 / partitions)
        tasks += max(1, int(share // MIN_SPLIT_OFFSETS))
    return max(1, math.ceil(tasks / max(1, cores_per_executor)))


def decide(facts: ScalingInput) -> ScalingDecision:
    """The desired executor count and why (see the module docstring for the rule)."""
    lo, hi = facts.min_executors, max(facts.min_executors, facts.max_executors)
    current = facts.current
    window = facts.cooldown_seconds * 1000
    # Kept for two windows: the oldest entry tells whether a full window has been observed at all.
    history = tuple((t, n) for t, n in facts.history if facts.now_ms - t <= 2 * window)
    in_window = [n for t, n in history if facts.now_ms - t <= window]

    def bounded(n: int) -> int:
        return min(hi, max(lo, n))

    def done(desired: int, reason: str, message: str, recommendation: int) -> ScalingDecision:
        return ScalingDecision(desired, reason, message, recommendation,
                               history + ((facts.now_ms, recommendation),))

    rate, per_exec = facts.input_rate, facts.rate_per_executor
    if rate is None or per_exec is None or per_exec <= 0:
        desired = bounded(current)
        what = "the input rate" if rate is None else "the processing rate of an executor (no busy batch yet)"
        reason = "Bounds" if desired != current else "NoMeasurement"
        return ScalingDecision(desired, reason, f"holding at {desired}: {what} is not measured yet", desired,
                               history)

    rate = max(0.0, rate)
    lag = sum(facts.lag.values())
    catch_up = max(1.0, facts.target_catch_up_seconds)
    required = rate + lag / catch_up
    for_input = math.ceil(rate / (per_exec * TARGET_UTILIZATION)) if rate > 0 else 0
    recommendation = math.ceil(required / (per_exec * TARGET_UTILIZATION)) if required > 0 else 0
    cap = feedable_executors(facts.lag, rate, facts.trigger_seconds, facts.max_records_per_batch,
                             facts.cores_per_executor)
    capped = min(recommendation, cap)
    numbers = (f"lag {lag}, input {rate:.0f}/s, {per_exec:.0f}/s per executor, "
               f"targetCatchUp {facts.target_catch_up_seconds:.0f}s")

    wants_up = current * per_exec < required and capped > current
    kept_up = keeping_up(facts)
    if wants_up and not kept_up:
        desired = bounded(capped)
        if desired > current:
            why = f" (capped: the topic's partitions feed at most {cap})" if capped < recommendation else ""
            return done(desired, "ScaleUp", f"{current} → {desired} executors: {current} × {per_exec:.0f}/s < "
                        f"{required:.0f}/s needed to keep up and clear the lag within targetCatchUp "
                        f"({numbers}){why}", recommendation)

    if bounded(current) != current:
        desired = bounded(current)
        return done(desired, "Bounds", f"{current} → {desired} executors: outside "
                    f"minExecutors..maxExecutors {lo}..{hi}", recommendation)

    if wants_up and kept_up and bounded(capped) > current:
        return done(current, "Steady", f"{current} executors keep up: the last batch took "
                    f"{facts.batch_seconds:.1f}s of the {facts.trigger_seconds:.0f}s commit interval and all there "
                    f"was ({numbers})", recommendation)

    stable = max(in_window + [recommendation])
    floor = max(lo, min(for_input, cap) if rate > 0 else lo, min(stable, cap))
    if floor >= current:
        return done(current, "Steady", f"{current} executors fit ({numbers})", recommendation)
    since = (facts.now_ms - facts.last_scale_ms) / 1000 if facts.last_scale_ms is not None else None
    if since is not None and since < facts.cooldown_seconds:
        return done(current, "Cooldown", f"could go down to {floor}, but the last change was {since:.0f}s "
                    f"ago (cooldown {facts.cooldown_seconds:.0f}s)", recommendation)
    observed = history[0][0] if history else facts.now_ms
    if facts.now_ms - observed < window:
        return done(current, "Stabilizing", f"could go down to {floor}; waiting for a full "
                    f"{facts.cooldown_seconds:.0f}s of lower recommendations", recommendation)
    step = max(1, math.floor(current * MAX_DOWN_FRACTION))
    desired = max(floor, current - step)
    # Never while the smaller count could not clear the backlog within targetCatchUp.
    while desired < current and desired * per_exec < required:
        desired += 1
    if desired >= current:
        return done(current, "Steady", f"{current} executors fit ({numbers})", recommendation)
    return done(desired, "ScaleDown", f"{current} → {desired} executors ({numbers})", recommendation)
