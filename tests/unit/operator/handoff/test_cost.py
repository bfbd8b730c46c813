"""status.cost from the driver's running totals (handoff.cost, pure): rises are added, a new driver starts from
zero, a day rolls over, the money estimate and the kubectl column."""
from __future__ import annotations

import datetime as dt

from handoff_operator.conditions import DriverReport
from handoff_operator.handoff import cost

NOW = dt.datetime(2026, 11, 28, 10, 0, tzinfo=dt.timezone.utc)


def report(pod: str | None = "p1", **totals: int) -> DriverReport:
    return DriverReport(published_at_ms=1, driver_pod=pod, totals=totals)


def test_nothing_to_count_keeps_the_status():
    assert cost.accumulate(None, None, NOW, 0.025) is None
    assert cost.accumulate({"kafkaBytes": 5}, DriverReport(published_at_ms=1), NOW, 0.025) is None


def test_the_rise_of_one_drivers_totals_is_added_once():
    first = cost.accumulate(None, report(kafkaBytes=1000, tableBytes=400, records=10, files=2, snapshots=1), NOW, 1)
    assert (first["kafkaBytes"], first["tableBytes"], first["records"], first["files"], first["snapshots"]) == (
        1000, 400, 10, 2, 1)
    assert first["since"] == "2026-11-28T10:00:00Z" and first["driver"]["pod"] == "p1"
    again = cost.accumulate(first, report(kafkaBytes=1000, tableBytes=400, records=10, files=2, snapshots=1), NOW, 1)
    assert again["kafkaBytes"] == 1000  # the same report read twice counts once
    later = cost.accumulate(again, report(kafkaBytes=1500, tableBytes=600, records=15, files=3, snapshots=2), NOW, 1)
    assert (later["kafkaBytes"], later["tableBytes"], later["snapshots"]) == (1500, 600, 2)


def test_a_new_driver_or_a_restarted_container_starts_from_zero():
    base = cost.accumulate(None, report(kafkaBytes=1000), NOW, 1)
    new_pod = cost.accumulate(base, report("p2", kafkaBytes=300), NOW, 1)
    assert new_pod["kafkaBytes"] == 1300 and new_pod["driver"] == {"pod": "p2", **{k: 0 for k in cost.FIGURES},
                                                                  "kafkaBytes": 300}
    restarted = cost.accumulate(new_pod, report("p2", kafkaBytes=100), NOW, 1)  # totals fell: a new start
    assert restarted["kafkaBytes"] == 1400


def test_today_rolls_over_at_midnight_utc():
    day1 = cost.accumulate(None, report(kafkaBytes=1000), NOW, 1)
    assert day1["today"]["date"] == "2026-11-28" and day1["today"]["kafkaBytes"] == 1000
    day2 = cost.accumulate(day1, report(kafkaBytes=1700), NOW + dt.timedelta(days=1), 1)
    assert day2["today"] == {"date": "2026-11-29", **{k: 0 for k in cost.ALL_FIGURES}, "kafkaBytes": 700}
    assert day2["kafkaBytes"] == 1700 and day2["since"] == "2026-11-28T10:00:00Z"


def test_the_write_api_estimate_and_the_summary():
    got = cost.accumulate(None, report(kafkaBytes=3 << 30, tableBytes=3 << 29, writeApiBytes=3 << 29), NOW, 0.025)
    assert got["writeApiCost"] == 0.0375 and got["summary"] == "3.0GiB→1.5GiB"
    assert [cost.human_bytes(n) for n in (0, 1023, 1536, 310 << 20, 12 << 30, 5 << 40)] == [
        "0B", "1023B", "1.5KiB", "310MiB", "12GiB", "5.0TiB"]


def test_ended_days_are_kept_newest_first_for_a_week():
    got = cost.accumulate(None, report(kafkaBytes=100), NOW, 1)
    assert "days" not in got
    total = 100
    for n in range(1, 10):  # nine more days, each reading 10 more bytes
        total += 10
        got = cost.accumulate(got, report(kafkaBytes=total), NOW + dt.timedelta(days=n), 1)
    assert [d["date"] for d in got["days"]] == [f"2026-{m}" for m in (
        "12-06", "12-05", "12-04", "12-03", "12-02", "12-01", "11-30")]
    assert all(d["kafkaBytes"] == 10 for d in got["days"])
    assert got["today"]["date"] == "2026-12-07" and got["kafkaBytes"] == 190
    # A status written back and read again (the typed model) keeps them.
    from handoff_operator.models import StreamTableHandoffStatus
    typed = StreamTableHandoffStatus.model_validate({"cost": got}).model_dump(mode="json", by_alias=True,
                                                                              exclude_unset=True)
    assert typed["cost"]["days"][0] == {"date": "2026-12-06", **{k: 0 for k in cost.ALL_FIGURES}, "kafkaBytes": 10}


def test_maintenance_rewrites_are_summed_beside_what_the_commits_wrote():
    first = cost.accumulate(None, report(tableBytes=400, rewrittenFiles=9, rewrittenBytes=350), NOW, 1)
    later = cost.accumulate(first, report(tableBytes=500, rewrittenFiles=18, rewrittenBytes=700), NOW, 1)
    assert (later["tableBytes"], later["rewrittenFiles"], later["rewrittenBytes"]) == (500, 18, 700)
    assert later["today"]["rewrittenBytes"] == 700
    from handoff_operator.runtime import metrics
    metrics.set_cost("ns", "rewrites", later)
    from prometheus_client import REGISTRY
    assert REGISTRY.get_sample_value("handoff_cost_rewritten_bytes", {"namespace": "ns", "name": "rewrites"}) == 700


def test_a_finished_replays_reread_is_added_since_counting_began_and_today():
    """rereadRecords/rereadBytes come from finished RollbackAndReplay and Backfill requests (add_reread), never from
    a driver's totals: a report keeps them, a new UTC day moves today's to the history."""
    first = cost.add_reread(None, 45, 4500, NOW)
    assert (first["rereadRecords"], first["rereadBytes"]) == (45, 4500)
    assert first["today"] == {"date": "2026-11-28", **{k: 0 for k in cost.ALL_FIGURES},
                              "rereadRecords": 45, "rereadBytes": 4500}
    assert first["since"] == "2026-11-28T10:00:00Z"
    counted = cost.accumulate(first, report(kafkaBytes=1000, records=10), NOW, 1)
    assert (counted["rereadRecords"], counted["today"]["rereadRecords"], counted["kafkaBytes"]) == (45, 45, 1000)
    second = cost.add_reread(counted, 5, None, NOW)  # a plan without a byte estimate adds records only
    assert (second["rereadRecords"], second["rereadBytes"], second["kafkaBytes"]) == (50, 4500, 1000)
    assert second["driver"] == counted["driver"]  # the base of the next report's rise is kept
    tomorrow = cost.accumulate(second, report(kafkaBytes=1000, records=10), NOW + dt.timedelta(days=1), 1)
    assert tomorrow["rereadRecords"] == 50 and tomorrow["today"]["rereadRecords"] == 0
    assert tomorrow["days"][0]["date"] == "2026-11-28" and tomorrow["days"][0]["rereadRecords"] == 50
    later = cost.add_reread(tomorrow, 7, 70, NOW + dt.timedelta(days=2))
    assert [d["date"] for d in later["days"]] == ["2026-11-29", "2026-11-28"]
    assert later["today"]["rereadRecords"] == 7 and later["rereadRecords"] == 57
