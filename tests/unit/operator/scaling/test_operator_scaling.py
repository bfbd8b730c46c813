"""scaling.decide over lag curves: a spike scales up at the first refresh, a steady or noisy load never
flaps, a drain scales down in bounded steps after the cooldown (never while the backlog needs the
executors), and the topic's partitions cap what is worth running.

The curves come from a small deterministic plant: Kafka receives `input(t)` records/s, each executor
processes PER_EXECUTOR records/s, the decision runs every REFRESH seconds and its count applies at once
(the integration test proves the live apply; here only the rule is under test)."""
from __future__ import annotations

import random
from collections.abc import Callable

from handoff_operator.scaling.rule import (MIN_SPLIT_OFFSETS, TARGET_UTILIZATION, ScalingDecision, ScalingInput,
                                      decide, feedable_executors)

PER_EXECUTOR = 1000.0
REFRESH = 10
PARTITIONS = 12


def facts(**over: object) -> ScalingInput:
    base = dict(now_ms=1_000_000, current=2, min_executors=1, max_executors=10, target_catch_up_seconds=300,
                cooldown_seconds=120, cores_per_executor=2, lag={f"t/{p}": 0 for p in range(PARTITIONS)},
                input_rate=1000.0, rate_per_executor=PER_EXECUTOR, trigger_seconds=10)
    base.update(over)
    return ScalingInput(**base)  # type: ignore[arg-type]


def spread(total: float, partitions: int = PARTITIONS) -> dict[str, int]:
    return {f"t/{p}": int(total / partitions) for p in range(partitions)}


def run(input_at: Callable[[int], float], seconds: int, *, start_lag: float = 0.0, start: int = 2,
        last_scale_ms: int | None = None, **over: object) -> list[tuple[int, float, ScalingDecision]]:
    """(time, lag, decision) per refresh."""
    lag, current, history, last_scale = start_lag, start, (), last_scale_ms
    out = []
    for t in range(0, seconds, REFRESH):
        rate = input_at(t)
        decision = decide(facts(now_ms=t * 1000, current=current, lag=spread(lag), input_rate=rate,
                                history=history, last_scale_ms=last_scale, **over))
        out.append((t, lag, decision))
        history = decision.history
        if decision.desired != current:
            current, last_scale = decision.desired, t * 1000
        lag = max(0.0, lag + (rate - current * PER_EXECUTOR) * REFRESH)
    return out


def changes(curve: list[tuple[int, float, ScalingDecision]]) -> list[tuple[int, int]]:
    out, prev = [], None
    for t, _lag, d in curve:
        if prev is not None and d.desired != prev:
            out.append((t, d.desired))
        prev = d.desired
    return out


def test_a_spike_scales_up_at_the_first_refresh_and_the_lag_drains():
    # 1000/s on 2 executors, then 4× at t=60 (inside the cooldown of nothing: up never waits).
    curve = run(lambda t: 4000.0 if t >= 60 else 1000.0, 600, last_scale_ms=50_000)
    ups = [(t, n) for t, n in changes(curve) if t >= 60]
    assert ups and ups[0][0] == 60  # the first refresh that sees the new input rate, inside the cooldown
    peak = max(n for _, _, d in curve for n in [d.desired])
    assert peak >= 4000 / PER_EXECUTOR  # enough to keep up with the input at least
    assert peak * PER_EXECUTOR * TARGET_UTILIZATION <= 4000 + max(lag for _, lag, _ in curve) / 300 + PER_EXECUTOR
    assert curve[-1][1] == 0  # drained
    assert all(d.reason != "ScaleDown" for _, _, d in curve)  # the load stays high: no flap back down


def test_a_steady_load_never_changes_the_count():
    curve = run(lambda t: 1000.0, 1200, start=2)
    assert changes(curve) == []
    assert {d.reason for _, _, d in curve} == {"Steady"}


def test_noisy_input_does_not_flap():
    rng = random.Random(7)
    noise = [rng.uniform(0.6, 1.4) for _ in range(200)]
    curve = run(lambda t: 1000.0 * noise[t // REFRESH], 1800, start=2)
    assert len(changes(curve)) <= 1, changes(curve)


def test_a_drain_scales_down_in_bounded_steps_after_the_cooldown():
    # The spike is over (input back to 1000/s) but 10 executors still run, with a backlog to clear.
    curve = run(lambda t: 1000.0, 1800, start=10, start_lag=600_000, last_scale_ms=0)
    steps = changes(curve)
    assert len(steps) >= 2, steps  # in steps, not one jump
    previous, previous_t = 10, 0
    for t, n in steps:
        assert n < previous and previous - n <= max(1, previous // 2)   # bounded step
        assert t - previous_t >= 120                                   # never inside the cooldown
        assert n >= 1000 / (PER_EXECUTOR * TARGET_UTILIZATION)          # never below what the input needs
        previous, previous_t = n, t
    for t, lag, d in curve:
        if d.reason == "ScaleDown":
            assert d.desired * PER_EXECUTOR >= 1000 + lag / 300  # the backlog still clears in targetCatchUp
    assert curve[-1][2].desired == 2 and curve[-1][1] == 0


def test_no_scale_down_while_the_backlog_needs_the_executors():
    d = decide(facts(current=6, lag=spread(1_200_000), input_rate=1000.0, last_scale_ms=0,
                     history=((0, 6),), now_ms=1_000_000))
    assert d.desired >= 6 and d.reason != "ScaleDown"


def test_partition_cap_limits_a_small_backlog():
    # 2 partitions, 30k lag: split_ranges makes at most 3 tasks (10k offsets each) → 2 executors of 2 cores.
    lag = {"t/0": 15_000, "t/1": 15_000}
    assert feedable_executors(lag, 0.0, 10, None, 2) == 1
    d = decide(facts(current=1, lag=lag, input_rate=5000.0, target_catch_up_seconds=1, trigger_seconds=10))
    cap = feedable_executors(lag, 5000.0, 10, None, 2)
    assert d.reason == "ScaleUp" and d.desired == cap < d.recommendation
    assert "capped" in d.message
    # maxRecordsPerBatch bounds the batch, hence the tasks.
    assert feedable_executors({"t/0": 10**9}, 0.0, 10, 40_000, 1) == 4
    assert feedable_executors({"t/0": 10**9}, 0.0, 10, None, 1) == 10**9 // MIN_SPLIT_OFFSETS


def test_bounds_apply_at_once_and_unknown_rates_hold():
    assert decide(facts(current=8, max_executors=3)).desired == 3
    assert decide(facts(current=0, min_executors=2, input_rate=0.0)).desired == 2
    held = decide(facts(current=3, rate_per_executor=None, lag=spread(10**7)))
    assert held.desired == 3 and held.reason == "NoMeasurement"
    assert decide(facts(current=5, max_executors=4, input_rate=None)).desired == 4


def test_an_operator_restart_does_not_scale_down_before_a_full_window():
    # No history (memory lost): the first refresh after a restart must not shrink the job.
    d = decide(facts(current=6, input_rate=100.0, lag=spread(0), last_scale_ms=0, history=()))
    assert d.desired == 6 and d.reason == "Stabilizing"


def test_refreshes_much_faster_than_the_window_still_scale_down_after_one_window():
    # Refresh every second, cooldown (= stabilization window) 5 s, nothing left to do.
    history, current, changed_at, last = (), 4, [], 0
    for second in range(0, 30):
        d = decide(facts(now_ms=second * 1000, current=current, lag=spread(0), input_rate=0.0, history=history,
                         last_scale_ms=last, cooldown_seconds=5, min_executors=1))
        history = d.history
        if d.desired != current:
            changed_at.append((second, d.desired))
            current, last = d.desired, second * 1000
    assert changed_at[:2] == [(5, 2), (10, 1)], changed_at


def test_measurements_from_consecutive_refreshes():
    from handoff_operator.scaling.step import _Memory, _observe, lag_per_partition
    from handoff_operator.conditions import DriverReport, ProgressFacts

    def progress(end: int, committed: int | None) -> ProgressFacts:
        return ProgressFacts(end_offsets={"t": {"0": end, "1": end}},
                             committed_offsets={"t": {"0": committed, "1": committed}} if committed else None)

    assert lag_per_partition(progress(500, 200)) == {"t/0": 300, "t/1": 300}
    memory = _Memory()
    _observe(memory, progress(1000, None), None, 2, now_ms=10_000)
    assert memory.input_rate is None  # one observation is no rate
    small = DriverReport(published_at_ms=1, batch_id=3, rows=10, duration_ms=1000, input_rows_per_second=10.0)
    _observe(memory, progress(3000, None), small, 2, now_ms=12_000)
    assert memory.input_rate == 2000.0  # 2 × 1000 new offsets in 2 s
    assert memory.rate_per_executor is None  # a 10-row batch says nothing about capacity
    busy = DriverReport(published_at_ms=1, batch_id=4, rows=50_000, duration_ms=10_000,
                        input_rows_per_second=5000.0)
    _observe(memory, progress(3000, None), busy, 2, now_ms=14_000)
    assert memory.rate_per_executor == 2500.0 and memory.input_rate == 0.0


def test_a_reused_offsets_snapshot_is_no_new_measurement():
    """A status refresh may reuse the cluster's shared offsets snapshot (truth.ClusterOffsets): the rate is
    measured between the snapshots' own read times, so a reused one neither reads 0/s nor doubles the next."""
    from handoff_operator.scaling.step import _Memory, _observe
    from handoff_operator.conditions import ProgressFacts

    def read(end: int, at_ms: int) -> ProgressFacts:
        return ProgressFacts(end_offsets={"t": {"0": end}}, end_read_at_ms=at_ms)

    memory = _Memory()
    _observe(memory, read(0, 10_000), None, 1, now_ms=10_000)
    _observe(memory, read(6000, 11_000), None, 1, now_ms=13_000)   # a snapshot 2 s older than the refresh
    assert memory.input_rate == 6000.0                              # 6,000 offsets in the 1 s between reads
    _observe(memory, read(6000, 11_000), None, 1, now_ms=16_000)   # the same snapshot again
    assert memory.input_rate == 6000.0
    _observe(memory, read(30_000, 15_000), None, 1, now_ms=19_000)
    assert memory.input_rate == 6000.0                              # 24,000 in 4 s, not 24,000 in 6 s


def test_the_shared_offsets_are_younger_than_half_a_short_status_interval():
    from handoff_operator.truth.reading import OFFSETS_MAX_AGE, offsets_max_age

    assert offsets_max_age(15.0) == OFFSETS_MAX_AGE == 5.0   # the default interval: as before
    assert offsets_max_age(3.0) == 1.5                        # every 3 s refresh reads a newer snapshot


def test_the_worked_example_in_docs_operator_md():
    # targetCatchUp 5m, cooldown 2m, 1..8 executors of 2 cores, 1 000/s each, 12 partitions, commitInterval 10s.
    example = dict(max_executors=8)
    steady = decide(facts(current=2, input_rate=1000.0, **example))
    assert (steady.desired, steady.reason) == (2, "Steady")
    # The producers step up to 4 000/s: 2 × 1 000 < 4 000 → ⌈4 000 ÷ 700⌉ = 6 at once, inside the cooldown.
    up = decide(facts(current=2, input_rate=4000.0, last_scale_ms=999_000, **example))
    assert (up.desired, up.reason) == (6, "ScaleUp")
    # Back to 1 000/s, no lag: 6 → 3 only after 2 minutes of lower recommendations, 2 minutes later 3 → 2.
    curve = run(lambda t: 1000.0, 600, start=6, last_scale_ms=0, **example)
    assert [n for _, n in changes(curve)] == [3, 2]
    (t3, _), (t2, _) = changes(curve)
    assert t3 >= 120 and t2 - t3 >= 120
    # 600 000 records still waiting: required 1 000 + 600 000 ÷ 300 = 3 000/s → 6 → 5 only.
    held = decide(facts(current=6, input_rate=1000.0, lag=spread(600_000), last_scale_ms=0,
                        history=((850_000, 5),), now_ms=1_000_000, **example))
    assert (held.desired, held.reason) == (5, "ScaleDown")


def test_capacity_is_the_best_recent_batch_so_a_scale_up_does_not_lock_itself_in():
    """Measured on the real node: after a spike scaled 1 → 3, the steady 3,000-row batches took the same ~1 s
    of fixed costs with three executors as with one, so the latest batch said each executor did 1,000/s and
    the 1,500/s input alone 'needed' all three, for good. The best rate of the window remembers what one
    executor did, so the count comes back down; a measurement older than the window is forgotten."""
    from handoff_operator.scaling.step import RATE_WINDOW_MS, _Memory, _observe
    from handoff_operator.conditions import DriverReport

    memory = _Memory()
    one = DriverReport(published_at_ms=1, batch_id=1, rows=20_000, duration_ms=2500, input_rows_per_second=8000.0)
    _observe(memory, None, one, 1, now_ms=0)
    shared = DriverReport(published_at_ms=1, batch_id=2, rows=3000, duration_ms=1000, input_rows_per_second=3000.0)
    _observe(memory, None, shared, 3, now_ms=60_000)
    assert memory.rate_per_executor == 8000.0
    steady = decide(facts(current=3, min_executors=1, max_executors=3, input_rate=1500.0, trigger_seconds=2,
                          rate_per_executor=memory.rate_per_executor, last_scale_ms=None, cooldown_seconds=0))
    assert steady.desired < 3 and steady.reason == "ScaleDown"
    # With the latest batch alone (1,000/s per executor) the input rate seemed to need all three.
    locked = decide(facts(current=3, min_executors=1, max_executors=3, input_rate=1500.0, trigger_seconds=2,
                          rate_per_executor=1000.0, last_scale_ms=None, cooldown_seconds=0))
    assert locked.desired == 3
    _observe(memory, None, None, 3, now_ms=RATE_WINDOW_MS + 30_000)
    assert memory.rate_per_executor == 1000.0  # the 8,000/s batch left the window


def test_the_rate_of_a_batch_is_over_its_parallel_part_when_the_driver_reports_it():
    from handoff_operator.scaling.step import batch_rate
    from handoff_operator.conditions import DriverReport
    from handoff_operator.truth.driver_report import parse

    report = parse('{"publishedAtMs": 1, "batchId": 9, "rows": 5000, "durationMs": 800, "workMs": 400, '
                   '"inputRowsPerSecond": 6250.0}')
    assert report is not None and report.work_ms == 400
    assert batch_rate(report) == 12_500.0  # planning and the commit are not the executors' work
    older = DriverReport(published_at_ms=1, batch_id=9, rows=5000, duration_ms=800, input_rows_per_second=6250.0)
    assert batch_rate(older) == 6250.0


def test_a_drivers_first_batch_is_not_a_capacity_measurement():
    """Measured on the real node: a restarted driver's first batch (fresh Python workers, first connections)
    ran 20,000 rows in ~13 s, one executor 'did' 1,500/s, and the operator scaled 1 → 3 on a quiet topic."""
    from handoff_operator.scaling.step import _Memory, _observe
    from handoff_operator.truth.driver_report import parse

    memory = _Memory()
    cold = parse('{"publishedAtMs": 1, "batchId": 0, "rows": 20000, "durationMs": 13000, "workMs": 12500, '
                 '"inputRowsPerSecond": 1538.0, "firstOfDriver": true}')
    assert cold is not None and cold.first_of_driver
    _observe(memory, None, cold, 1, now_ms=1_000)
    assert memory.rate_per_executor is None  # no measurement: the rule holds, never guesses
    warm = parse('{"publishedAtMs": 2, "batchId": 1, "rows": 5000, "durationMs": 800, "workMs": 500, '
                 '"inputRowsPerSecond": 6250.0, "firstOfDriver": false}')
    _observe(memory, None, warm, 1, now_ms=3_000)
    assert memory.rate_per_executor == 10_000.0


def test_a_batch_that_kept_up_holds_the_count_whatever_the_estimate_says():
    """Measured on the test bed (2026-11-26): 6,000-row batches at 3,000/s rated a 200m executor low (here 3,500/s)
    (per-task fixed costs), the snapshot lag of two batches in flight made 3,600/s 'required', and the rule
    scaled 1 → 3 at base load, while the one executor finished each batch in 1.5 s of its 2 s interval. A
    batch within the interval that took all there was holds the count; one that overran or was cut at
    maxRecordsPerBatch scales up as before."""
    at_base = dict(current=1, min_executors=1, max_executors=3, input_rate=3000.0, rate_per_executor=3500.0,
                   lag=spread(12_000, 3), target_catch_up_seconds=20, trigger_seconds=2,
                   max_records_per_batch=60_000, cores_per_executor=1)
    assert decide(facts(**at_base)).reason == "ScaleUp"  # no batch known: the estimate decides
    kept_up = decide(facts(**at_base, batch_seconds=1.5, batch_rows=6000))
    assert (kept_up.desired, kept_up.reason) == (1, "Steady")
    assert "keep up" in kept_up.message and "1.5s of the 2s" in kept_up.message
    overran = decide(facts(**at_base, batch_seconds=2.6, batch_rows=24_000))
    assert overran.reason == "ScaleUp" and overran.desired > 1
    cut = decide(facts(**at_base, batch_seconds=1.5, batch_rows=60_000))
    assert cut.reason == "ScaleUp"  # fast, but cut at the cap: a backlog is waiting
    # A spike: the input grew past 1.5x the load the last batch kept up with (6,000 rows per 2 s), so that
    # batch says nothing about today's load and the estimate decides at once; a wobble of +20 % does not.
    spike = decide(facts(**{**at_base, "input_rate": 12_000.0}, batch_seconds=1.5, batch_rows=6000))
    assert spike.reason == "ScaleUp" and spike.desired == 3
    wobble = decide(facts(**{**at_base, "input_rate": 3600.0}, batch_seconds=1.5, batch_rows=6000))
    assert (wobble.desired, wobble.reason) == (1, "Steady")
    # Without a commit interval nothing idles between batches: the estimate decides.
    assert decide(facts(**{**at_base, "trigger_seconds": 0}, batch_seconds=0.5, batch_rows=6000)).reason == "ScaleUp"


def test_only_a_recent_batch_that_is_not_the_drivers_first_says_whether_it_keeps_up():
    from handoff_operator.scaling.step import BATCH_MAX_AGE_MS, recent_batch
    from handoff_operator.conditions import DriverReport

    done = DriverReport(published_at_ms=1, batch_id=5, rows=6000, duration_ms=1500, timestamp_ms=100_000)
    assert recent_batch(done, 2, now_ms=101_000) == {"batch_seconds": 1.5, "batch_rows": 6000}
    assert recent_batch(done, 2, now_ms=100_000 + 4000 + BATCH_MAX_AGE_MS + 1) == {}  # a batch may be running long
    first = DriverReport(published_at_ms=1, batch_id=0, rows=6000, duration_ms=1500, timestamp_ms=100_000,
                         first_of_driver=True)
    assert recent_batch(first, 2, now_ms=101_000) == {}
    assert recent_batch(None, 2, now_ms=101_000) == {}


def test_a_change_handler_keeps_the_refreshs_decision_unless_the_bounds_moved_past_it():
    """Without lag and rates (a child event, a spec change) the last decision stands, only `current` is new; a
    bound that excludes it is applied by the rule at once (None here)."""
    from handoff_operator.scaling.step import held_without_truth

    last = {"current": 2, "desired": 3, "reason": "ScaleUp", "message": "2 → 3 executors: ...",
            "lastScaleTime": "2026-11-23T12:00:00Z"}
    assert held_without_truth(last, 1, 5, running=3) == {**last, "current": 3}
    assert held_without_truth(last, 4, 5, running=3) is None       # minExecutors raised past it
    assert held_without_truth(last, 1, 2, running=3) is None       # maxExecutors lowered under it
    assert held_without_truth({"current": 1, "desired": 1}, 1, 5, running=1) is None  # no decision yet
