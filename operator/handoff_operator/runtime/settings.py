"""Operator settings from the environment (`HANDOFF_*`), via pydantic-settings.

Why env and not flags: the chart, `kopf run -m handoff_operator` and `handoff operator` all end up with
the same settings without each having to forward flags.
"""
from __future__ import annotations

import threading
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class OperatorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HANDOFF_", extra="ignore")

    # Empty = cluster-wide. Comma-separated in HANDOFF_NAMESPACES.
    namespaces: Annotated[list[str], NoDecode] = Field(default_factory=list)
    log_level: str = "INFO"
    # None (HANDOFF_METRICS_PORT=0 or empty) turns the Prometheus endpoint off.
    metrics_port: int | None = Field(default=8080, ge=0, le=65535)
    # Seconds between status refreshes from the truth (driver, ledger, Kafka); each handoff's timer is jittered
    # by ±10% so a bulk apply does not refresh in lockstep.
    status_interval: float = Field(default=15.0, gt=0)
    # Children whose rendered body did not change are re-applied at least this often (±10%), which repairs
    # drift in children the operator does not watch; the driver Deployment is re-applied on its own change.
    children_resync_interval: float = Field(default=600.0, gt=0)
    # A driver's published progress record older than this no longer counts (the driver republishes it
    # every 15 s while it lives): its degradedReason cannot keep Degraded stuck after the driver stopped.
    driver_report_max_age: float = Field(default=60.0, gt=0)
    # How long a Rollback / RollbackAndReplay waits for the running driver to say it is stopping its query for the
    # hold, or has stopped it (the pod kept: driver.hold), before it stops the driver pod instead (a driver too old
    # to know the hold says neither).
    replay_hold_ack_seconds: float = Field(default=60.0, gt=0)
    # How long deletion waits for the driver to stop at a batch boundary before letting go.
    delete_grace_seconds: float = Field(default=180.0, ge=0)
    # Seconds between retention checks of a handoff's topics (DescribeConfigs, a record sample); data loss
    # is checked on every status refresh.
    retention_check_interval: float = Field(default=300.0, gt=0)
    # Where enforce mode looks for Strimzi KafkaTopics (comma-separated); empty = cluster-wide.
    kafka_topic_namespaces: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # A changed spec whose driver neither commits a batch (while records wait) nor becomes ready within this
    # many seconds is rolled back to the last good spec (spec.upgrade.readinessTimeout overrides it).
    upgrade_readiness_timeout: float = Field(default=300.0, gt=0)
    # A changed spec's driver in CrashLoopBackOff with at least this many restarts is rolled back at once.
    upgrade_crash_restarts: int = Field(default=3, ge=1)
    # USD per GiB appended through BigQuery's Storage Write API: status.cost.writeApiCost prices what a handoff
    # appended, and a ReplayRequest's plan (and dryRun) what it re-writes (status.plan.cost). The ONE price
    # setting; default the public list price (before the monthly free tier). Chart value bigqueryWritePricePerGiB.
    bigquery_write_price_per_gib: float = Field(default=0.025, ge=0)
    # Image used when a StreamTableHandoff names none. The chart sets it (its image, or sparkImage); this
    # default is the chart's default image, so both name the same image when run without the chart.
    default_image: str = "ghcr.io/handoff-io/handoff:0.1.0"

    @field_validator("namespaces", "kafka_topic_namespaces", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("metrics_port", mode="before")
    @classmethod
    def _off(cls, value: object) -> object:
        if value in ("", "0", 0, "off", "none"):
            return None
        return value


_current: OperatorSettings | None = None
_current_lock = threading.Lock()


def current_settings() -> OperatorSettings:
    """The running operator's settings, shared by every controller: read from the environment at first use,
    unless `use_settings` gave them (an operator run in-process, as the integration tests do)."""
    global _current
    with _current_lock:
        if _current is None:
            _current = OperatorSettings()
        return _current


def use_settings(settings: OperatorSettings | None) -> None:
    """Run with `settings` from now on (None: read the environment again at the next use)."""
    global _current
    with _current_lock:
        _current = settings
