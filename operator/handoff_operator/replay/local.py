"""`handoff replay -f handoff.yaml -r replay.yaml`: a ReplayRequest for a handoff run locally (`handoff run`),
without Kubernetes: the same plan (`replay_plan`) and the same table steps (`replay_table`) the operator runs.

What the operator does with the driver (stop it at a batch boundary, start it again) is the user's here: stop
`handoff run` first (Ctrl-C / SIGTERM: it finishes its batch), run this, then start `handoff run` again; the
driver resumes from the table's ledger (its checkpoint now disagrees and is discarded).
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from handoff_spark.config import AppConfig

from handoff_operator.replay import cost as replay_cost
from handoff_operator.replay import plan as replay_plan
from handoff_operator.replay import table as replay_table
from handoff_operator.models import ReplayRequestSpec
from handoff_operator.runtime.settings import current_settings
from handoff_operator.truth.reading import kafka_offsets


def replay(config: AppConfig, manifest: dict[str, Any], echo: Callable[[str], None] = print) -> int:
    """Plan the request in `manifest` against the handoff's table and Kafka; unless dryRun, keep the undo point,
    roll back and (mode Rollback) record the gap. Exit code: 0 done/planned, 2 refused."""
    meta = manifest.get("metadata") or {}
    name, namespace = meta.get("name", "replay"), meta.get("namespace", "default")
    try:
        spec = ReplayRequestSpec.model_validate(manifest.get("spec") or {})
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        echo(f"refused: spec.{'.'.join(str(x) for x in first['loc'])}: {first['msg']}")
        return 2
    table = replay_table.open_table(config)
    facts = table.facts() if table is not None else None
    try:
        latest, earliest = kafka_offsets(config)
        kafka: replay_plan.KafkaFacts | None = replay_plan.KafkaFacts(earliest=earliest, latest=latest)
    except Exception as exc:  # noqa: BLE001 - the plan says KafkaUnavailable where it needs Kafka
        echo(f"note: cannot read Kafka's offsets: {exc}")
        kafka = None
    request = replay_plan.request_from_spec(spec, config.handoff_id, config.query_name, config.source.topics,
                                            config.sink.kind, config.source.starting_offsets)
    plan = replay_plan.plan(request, facts, kafka)
    if isinstance(plan, replay_plan.Plan) and table is not None:
        plan = table.refusal(plan) or plan
    if isinstance(plan, replay_plan.Failure):
        echo(f"refused ({plan.reason}): {plan.message}")
        return 2
    assert table is not None
    echo(f"plan: {plan.summary}")
    cost = replay_cost.estimate(table.cost(plan), plan.records, current_settings().bigquery_write_price_per_gib)
    if cost.summary():
        echo(f"cost: {cost.summary()}")
    if spec.dry_run:
        echo("dry run: nothing changed")
        return 0
    if spec.mode == "Backfill":
        echo("run the backfill with: python -m handoff_spark backfill --config <app.json> --query "
             f"backfill-{name} --from '{json.dumps(replay_plan.wire(plan.replay_from))}' "
             f"--to '{json.dumps(replay_plan.wire(plan.replay_to))}'")
        echo("(<app.json>: the output of `handoff run -f <manifest> --print-config`; the stream may keep running)")
        return 0
    assert plan.head_snapshot is not None and plan.target_snapshot is not None
    undo = table.undo_point_name(namespace, name)
    try:
        table.ensure_undo_point(undo, plan.head_snapshot)
    except replay_table.UndoPointTaken as exc:
        echo(f"refused (UndoTagExists): {exc}; nothing was rolled back: remove it or use another request name")
        return 2
    echo(f"kept snapshot {plan.head_snapshot} as {undo} (the undo point)")
    cut = plan.replay_from or {t: {p: r[0] for p, r in parts.items()} for t, parts in (plan.gap or {}).items()}
    try:
        table.rollback(replay_table.RollbackStep(config.handoff_id, config.query_name, plan.head_snapshot,
                                                 plan.target_snapshot, cut))
    except replay_table.RollbackRefused as exc:
        echo(f"not yet: {exc}; run this command again later (the undo point is kept, nothing was deleted)")
        return 2
    echo(f"rolled the table back to snapshot {plan.target_snapshot} ({plan.discarded_snapshots} snapshots discarded)")
    if spec.mode == "Rollback" and plan.gap:
        where = table.record_gap(config.handoff_id, config.query_name, plan.gap,
                                 f"handoff replay {namespace}/{name} (mode Rollback)")
        echo(f"recorded the discarded offsets as a gap ({where}): the stream goes on from where it was")
    else:
        echo(f"start the driver again: it re-reads {plan.records} records from "
             f"{replay_plan.fmt_offsets(plan.replay_from or {})}")
    return 0
