"""How a Rollback / RollbackAndReplay quiets the stream before it touches the table (pure; no I/O).

Two ways, chosen when the request claims the handoff (`mode`):
- `query`: the driver is running and publishing its progress, so it can hold its query itself
  (`handoff_spark.driver.hold`): it stops at a batch boundary, keeps its pod, JVM and Spark session, and starts the
  query again from the table's ledger when the hold is lifted. A replay then costs a query start, not a pod start.
- `pod`: no live driver to ask (none running, one still starting, or one too old to publish): the driver
  Deployment goes to 0 replicas, as before the hold existed.
A `query` hold the driver does not acknowledge within `ack_seconds` (an image whose driver does not know the hold)
falls back to `pod`; a driver that said it is stopping its query for the hold (`queryHolding`: a long batch still
runs, bounded by its stop grace) is waited for. Either way the progress ConfigMap's hold annotation stays until the request ends, so a driver
pod started meanwhile runs no batch; and the ledger's contiguity check refuses any batch that does not start where
the rolled-back ledger ends.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from handoff_operator.conditions import DriverReport

Mode = Literal["query", "pod"]


def mode(report: DriverReport | None, driver_pods: Sequence[str], now_ms: int, max_age_seconds: float) -> Mode:
    """`query` when a driver publishes now (its report is fresh and from a driver pod that exists, or names none:
    a driver outside a pod), else `pod`."""
    if report is None or now_ms - report.published_at_ms > max_age_seconds * 1000:
        return "pod"
    if report.driver_pod is not None and report.driver_pod not in driver_pods:
        return "pod"
    return "query"


@dataclass(frozen=True)
class Stopped:
    """The next move while the request waits for a quiet stream: `done` (the table is quiet), `escalate` (stop the
    pod instead), or neither (wait; `message` says for what)."""

    done: bool = False
    escalate: bool = False
    message: str = ""


def stopped(hold_mode: Mode, request: str, report: DriverReport | None, driver_pods: Sequence[str],
            waited_seconds: float, ack_seconds: float) -> Stopped:
    """Is the stream quiet for `request`? `query`: the driver said its query is held for this request; `pod`: no
    driver pod is left."""
    if hold_mode == "query":
        if report is not None and report.query_held == request:
            return Stopped(done=True, message=f"the driver{_pod(report)} stopped its query at a batch boundary")
        if report is not None and report.query_holding == request:
            # It knows the hold and finishes its batch (at most its stop grace): stopping the pod gains nothing.
            return Stopped(message=f"the driver{_pod(report)} is stopping its query at the end of its batch")
        if waited_seconds >= ack_seconds:
            return Stopped(escalate=True, message=f"the driver did not say its query is held within "
                                                  f"{ack_seconds:.0f}s: stopping the driver pod instead")
        return Stopped(message="waiting for the driver to stop its query at a batch boundary")
    if driver_pods:
        return Stopped(message=f"waiting for driver pod {driver_pods[0]} to stop at a batch boundary")
    return Stopped(done=True, message="the driver pod stopped")


def _pod(report: DriverReport) -> str:
    return f" (pod {report.driver_pod})" if report.driver_pod else ""
