"""ReplayRequest (`replay`): a one-shot request to rewind or re-fill a StreamTableHandoff's table.

Modes:
- Rollback: move the table back to `target`; the stream then goes on from where it was, so the data
  after the target is gone from the table (e.g. it was bad and must not come back).
- RollbackAndReplay: move the table back to `target` and resume the stream from the offsets recorded in
  that snapshot, so the discarded range is re-read from Kafka (e.g. after fixing a transform).
- Backfill: re-read the explicit offset range `from` → `to` into the table, without touching the
  stream's own progress (a Kubernetes Job the operator runs beside the stream's driver).

The spec is immutable once created (a request is a record of what was asked); create a new one to ask
again. `dryRun` computes and shows `status.plan` without changing anything.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from handoff_operator.models.common import (AGE_COLUMN, CONDITIONS_FIELD_SCHEMA, PHASE_COLUMN, Condition, CustomResource, ObjectName,
                     OffsetsMap, SnapshotId, SpecModel, StatusModel)

ReplayMode = Literal["RollbackAndReplay", "Backfill", "Rollback"]


class HandoffRef(SpecModel):
    """The StreamTableHandoff to act on, in the request's own namespace."""

    name: ObjectName = Field(description="Name of the StreamTableHandoff.")


class ReplayTarget(SpecModel):
    """The table state to go back to: exactly one of snapshotId, timestamp or tag."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "[has(self.snapshotId), has(self.timestamp), has(self.tag)].filter(x, x).size() == 1",
         "message": "target needs exactly one of snapshotId, timestamp or tag"},
        {"rule": "!has(self.snapshotId) || type(self.snapshotId) == int || self.snapshotId.matches('^[0-9]+$')",
         "message": "target.snapshotId must be an integer (or a string of digits)"},
    ]})

    snapshot_id: SnapshotId | None = Field(default=None, description="Iceberg snapshot id to go back to; on a "
                                           "BigQuery sink, the key of a ledger entry (its commit time in µs: the "
                                           "first column of `handoff ledger show` / `kubectl handoff ledger`).")
    timestamp: datetime | None = Field(default=None, description="Go back to the table as of this time "
                                                                 "(the newest snapshot at or before it).")
    tag: str | None = Field(default=None, min_length=1, max_length=255,
                            description="Iceberg tag naming the snapshot to go back to (Iceberg sinks only).")

    @model_validator(mode="after")
    def _exactly_one(self) -> "ReplayTarget":
        if sum(v is not None for v in (self.snapshot_id, self.timestamp, self.tag)) != 1:
            raise ValueError("target needs exactly one of snapshotId, timestamp or tag")
        return self


class ReplayRequestSpec(SpecModel):
    """What to replay. Immutable after creation."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "self == oldSelf", "message": "spec is immutable; create a new ReplayRequest"},
        {"rule": "self.mode != 'Backfill' || (has(self.from) && has(self.to))",
         "message": "mode Backfill requires from and to offsets"},
        {"rule": "self.mode != 'Backfill' || !has(self.target)",
         "message": "mode Backfill takes from/to offsets, not target"},
        {"rule": "self.mode == 'Backfill' || has(self.target)",
         "message": "modes Rollback and RollbackAndReplay require target"},
        {"rule": "self.mode == 'Backfill' || (!has(self.from) && !has(self.to))",
         "message": "from/to offsets only apply to mode Backfill"},
        {"rule": "!has(self.from) || !has(self.to) || "
                 "(self.from.all(t, t in self.to) && self.to.all(t, t in self.from))",
         "message": "from and to must name the same topics"},
    ]})

    handoff_ref: HandoffRef = Field(description="The StreamTableHandoff (same namespace).")
    mode: ReplayMode = Field(description="RollbackAndReplay, Backfill or Rollback.")
    target: ReplayTarget | None = Field(default=None, description="Table state to go back to "
                                                                  "(Rollback, RollbackAndReplay).")
    from_: OffsetsMap | None = Field(default=None, alias="from",
                                     description="Backfill start offsets {topic: {partition: offset}} (inclusive).")
    to: OffsetsMap | None = Field(default=None, description="Backfill end offsets {topic: {partition: offset}} "
                                                            "(exclusive).")
    dry_run: bool = Field(default=False, description="Only compute status.plan; change nothing.")

    @model_validator(mode="after")
    def _by_mode(self) -> "ReplayRequestSpec":
        if self.mode == "Backfill":
            if self.from_ is None or self.to is None:
                raise ValueError("mode Backfill requires from and to offsets")
            if self.target is not None:
                raise ValueError("mode Backfill takes from/to offsets, not target")
            if set(self.from_) != set(self.to):
                raise ValueError("from and to must name the same topics")
            for topic, parts in self.from_.items():
                if set(parts) != set(self.to[topic]):
                    raise ValueError(f"from and to must name the same partitions of {topic}")
                for part, start in parts.items():
                    if self.to[topic][part] < start:
                        raise ValueError(f"{topic}[{part}]: to ({self.to[topic][part]}) is before from ({start})")
        else:
            if self.target is None:
                raise ValueError(f"mode {self.mode} requires target")
            if self.from_ is not None or self.to is not None:
                raise ValueError("from/to offsets only apply to mode Backfill")
        return self


ReplayPhase = Literal["Pending", "Planned", "Running", "Succeeded", "Failed"]


class ReplayCost(StatusModel):
    """What the replay weighs, measured before anything changes (docs/operator.md, "What a replay costs")."""

    rows_to_delete: int | None = Field(default=None, ge=0, description="BigQuery: rows the rollback deletes.")
    bytes_to_delete: int | None = Field(default=None, ge=0,
                                        description="BigQuery: their logical bytes (each value sized as BigQuery sizes it).")
    files_to_rewrite: int | None = Field(default=None, ge=0, description="Iceberg: data files the discarded "
                                                                         "snapshots added (written again by a re-read).")
    records_to_reread: int | None = Field(default=None, ge=0, description="Records to re-read from Kafka.")
    bytes_to_reread: int | None = Field(default=None, ge=0, description="Estimated bytes to re-read (records × the "
                                                                        "table's bytes per row of the range).")
    write_api_bytes: int | None = Field(default=None, ge=0,
                                        description="BigQuery: bytes the re-read appends through the Storage Write API.")
    write_api_price_per_gib: float | None = Field(default=None, ge=0, alias="writeApiPricePerGiB",
                                                   description="USD per GiB the estimate uses (operator setting "
                                                               "HANDOFF_BIGQUERY_WRITE_PRICE_PER_GIB).")
    estimated_cost_usd: float | None = Field(default=None, ge=0, alias="estimatedCostUSD",
                                             description="writeApiBytes priced at writeApiPricePerGiB, in USD.")


class ReplayPlan(StatusModel):
    """What the request will do (or did), computed before anything changes."""

    head_snapshot: SnapshotId | None = Field(default=None, description="The table's current snapshot when "
                                                                       "planned (tagged as status.undoTag); on a "
                                                                       "BigQuery sink, its newest ledger entry's "
                                                                       "key (commit time in µs).")
    rollback_to_snapshot: SnapshotId | None = Field(default=None, description="Snapshot the table goes back to "
                                                    "(BigQuery: the ledger entry's key, commit time in µs).")
    discarded_snapshots: int | None = Field(default=None, ge=0,
                                            description="Snapshots (BigQuery: ledger entries) leaving "
                                                        "the table's current history.")
    resume_offsets: OffsetsMap | None = Field(default=None,
                                              description="Offsets the stream resumes from afterwards.")
    replay_from: OffsetsMap | None = Field(default=None, description="Start of the re-read range (inclusive).")
    replay_to: OffsetsMap | None = Field(default=None, description="End of the re-read range (exclusive).")
    gap_from: OffsetsMap | None = Field(default=None, description="Rollback: start of the range recorded in the "
                                                                  "ledger as skipped (inclusive).")
    gap_to: OffsetsMap | None = Field(default=None, description="Rollback: end of the skipped range (exclusive).")
    records: int | None = Field(default=None, ge=0, description="Records (offsets) to re-read.")
    summary: str | None = Field(default=None, max_length=4096, description="The plan in one sentence.")
    cost: ReplayCost | None = Field(default=None, description="What the replay weighs and, on BigQuery, an estimate "
                                                              "in money.")


class ReplayProgress(StatusModel):
    offsets: OffsetsMap | None = Field(default=None, description="Offsets re-read so far (next offset).")
    records: int = Field(default=0, ge=0, description="Records re-read so far.")
    total: int | None = Field(default=None, ge=0, description="Records to re-read in all.")
    snapshot: SnapshotId | None = Field(default=None, description="Newest snapshot the replay committed.")


ReplayStepName = Literal["DriverStopped", "Tagged", "RolledBack", "GapRecorded", "DriverStarted", "Replayed",
                         "JobCreated", "Backfilled"]


class ReplayStep(StatusModel):
    """One completed step of a running request, in order: the audit trail, and what an operator restarted
    mid-replay reads to go on without doing a step twice."""

    name: ReplayStepName = Field(description="DriverStopped, Tagged, RolledBack, GapRecorded, DriverStarted, "
                                             "Replayed (Rollback, RollbackAndReplay); JobCreated, Backfilled "
                                             "(Backfill).")
    at: datetime = Field(description="When the step completed.")
    message: str = Field(default="", max_length=1024, description="What was done.")


class ReplayRequestStatus(StatusModel):
    observed_generation: int | None = Field(default=None, ge=0)
    phase: ReplayPhase | None = None
    conditions: list[Condition] = Field(default_factory=list, max_length=32,
                                        json_schema_extra=CONDITIONS_FIELD_SCHEMA,
                                        description="Ready (finished OK), Progressing, Degraded (failed).")
    plan: ReplayPlan | None = None
    progress: ReplayProgress | None = None
    steps: list[ReplayStep] = Field(default_factory=list, max_length=16,
                                    description="Steps completed so far, in order.")
    undo_tag: str | None = Field(default=None, max_length=255,
                                 description="The undo point: the Iceberg tag on the table's snapshot before the "
                                             "rollback, or the BigQuery snapshot table of the table before it (its "
                                             "ledger's beside it, suffix __handoff_ledger); see docs/operator.md.")
    started_at: datetime | None = None
    completed_at: datetime | None = None


class ReplayRequest(CustomResource):
    """ReplayRequest rewinds or re-fills a StreamTableHandoff's table from Kafka."""

    plural: ClassVar[str] = "replayrequests"
    singular: ClassVar[str] = "replayrequest"
    short_names: ClassVar[list[str]] = ["replay"]
    printer_columns: ClassVar[list[dict[str, Any]]] = [
        PHASE_COLUMN,
        {"name": "Handoff", "type": "string", "jsonPath": ".spec.handoffRef.name"},
        {"name": "Mode", "type": "string", "jsonPath": ".spec.mode"},
        AGE_COLUMN,
    ]

    kind: Literal["ReplayRequest"] = "ReplayRequest"
    spec: ReplayRequestSpec
    status: ReplayRequestStatus | None = None
