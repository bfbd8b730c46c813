"""What a handoff read and wrote, and what that costs (issue 35): `status.cost` from the driver's running totals
(pure).

Why from running totals: the driver publishes its newest progress record, and the operator reads it once per
status refresh, so batches in between would be missed if each record carried only its own batch. Each record
carries what the driver committed since it started (`handoff_spark.driver.progress.Totals`); the status keeps
the totals this driver last showed (`cost.driver`), and every refresh adds their rise to the handoff's figures
(since counting began, today's, a UTC day, and the DAYS_KEPT days before it). A new driver pod starts from zero; totals that fell in the same
pod (its container restarted) are a new start too. What a driver committed after its last publication and
before it died is not counted (at most one publication interval, ~15 s, of batches).

Re-reads (`rereadRecords`, `rereadBytes`): what finished RollbackAndReplay and Backfill requests re-read from
Kafka (the records their progress counted in the table's ledger, the plan's byte estimate for them), added once
when a request succeeds (`add_reread`, by the ReplayRequest controller); the driver's totals never carry them, so
`accumulate` keeps them as they are and only moves today's to the days' history. A RollbackAndReplay's re-reads
are also inside `records`/`kafkaBytes` (its driver committed them); a Backfill Job's are only here.

The money estimate: Storage Write API bytes (BigQuery's appends) × the operator's price per GiB.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from handoff_operator.conditions import DriverReport
from handoff_operator.truth.driver_report import TOTAL_KEYS

#: The figures summed (status.cost's keys, the driver's `totals` keys, as the operator reads them).
FIGURES = TOTAL_KEYS
#: Figures no driver reports: what finished replays and backfills re-read (`add_reread`).
REREAD = ("rereadRecords", "rereadBytes")
#: Every figure of status.cost, today and each day.
ALL_FIGURES = FIGURES + REREAD
GIB = 1 << 30
#: Past UTC days kept in `status.cost.days` beside `today` (a week: enough to read a daily trend in `kubectl get
#: -o yaml`; longer history is Prometheus's, `delta(handoff_cost_*[1d])`).
DAYS_KEPT = 7


def human_bytes(n: int) -> str:
    """1023B, 1.5KiB, 310MiB, 1.2GiB: short enough for a `kubectl get` column."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            if unit == "B":
                return f"{int(value)}B"
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _figures(doc: Mapping[str, Any] | None, keys: tuple[str, ...] = FIGURES) -> dict[str, int]:
    doc = doc or {}
    return {k: int(doc.get(k) or 0) for k in keys}


def _roll_day(cost: Mapping[str, Any], date: str) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Today's figures as of `date` (zero on a new UTC day) and the past days, the one that ended first."""
    today = cost.get("today") or {}
    days = [dict(d) for d in cost.get("days") or [] if isinstance(d, Mapping) and d.get("date")]
    if today.get("date") == date:
        return _figures(today, ALL_FIGURES), days
    if today.get("date"):
        ended = {"date": today["date"], **_figures(today, ALL_FIGURES)}
        days = [ended] + [d for d in days if d["date"] != today["date"]]
    return _figures(None, ALL_FIGURES), days


def _utc_date(now: dt.datetime) -> str:
    return now.astimezone(dt.timezone.utc).strftime("%Y-%m-%d")


def _utc_stamp(now: dt.datetime) -> str:
    return now.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def add_reread(cost: Mapping[str, Any] | None, records: int, estimated_bytes: int | None,
               now: dt.datetime) -> dict[str, Any]:
    """`status.cost` with one finished replay's or backfill's re-read added (since counting began and today)."""
    cost = dict(cost or {})
    add = {"rereadRecords": max(0, int(records)), "rereadBytes": max(0, int(estimated_bytes or 0))}
    day, days = _roll_day(cost, _utc_date(now))
    out = {**cost, **{k: int(cost.get(k) or 0) + v for k, v in add.items()},
           "since": cost.get("since") or _utc_stamp(now),
           "today": {"date": _utc_date(now), **{k: day[k] + add.get(k, 0) for k in ALL_FIGURES}}}
    if days:
        out["days"] = days[:DAYS_KEPT]
    return out


def accumulate(cost: Mapping[str, Any] | None, report: DriverReport | None, now: dt.datetime,
               price_per_gib: float) -> dict[str, Any] | None:
    """`status.cost` after this report (None: nothing to count, the status keeps what it has)."""
    if report is None or report.totals is None:
        return None
    cost = cost or {}
    pod = report.driver_pod or ""
    latest = _figures(report.totals)
    shown = cost.get("driver") or {}
    base = _figures(shown) if (shown.get("pod") or "") == pod else _figures(None)
    if any(latest[k] < base[k] for k in FIGURES):  # the same pod's driver started again: its totals restarted
        base = _figures(None)
    rise = {k: latest[k] - base[k] if k in FIGURES else 0 for k in ALL_FIGURES}  # no driver reports re-reads
    total = {k: _figures(cost, ALL_FIGURES)[k] + rise[k] for k in ALL_FIGURES}
    date = _utc_date(now)
    day, days = _roll_day(cost, date)  # a new UTC day: the one that ended goes to the history, newest first
    day = {k: day[k] + rise[k] for k in ALL_FIGURES}
    since = cost.get("since") or _utc_stamp(now)
    return {**total, "since": since,
            "writeApiCost": round(total["writeApiBytes"] / GIB * price_per_gib, 6),
            "today": {"date": date, **day},
            **({"days": days[:DAYS_KEPT]} if days else {}),
            "driver": {"pod": pod or None, **latest},
            "summary": f"{human_bytes(total['kafkaBytes'])}→{human_bytes(total['tableBytes'])}"}
