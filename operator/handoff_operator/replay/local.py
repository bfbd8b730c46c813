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

from handoff_operator.replay import ledger_view
from handoff_operator.replay import plan as replay_plan
from handoff_operator.replay import table as replay_table
from handoff_operator.models import ReplayRequestSpec
from handoff_operator.truth.reading import kafka_offsets


def replay(config: AppConfig, manifest: dict[str, Any], echo: Callable[[str], None] = print) -> int:
    """Plan the request in `manifest` against the handoff's table and Kafka; unless dryRun, tag the head,
    roll back and (mode Rollback) record the gap. Exit code: 0 done/planned, 2 refused."""
    meta = manifest.get("metadata") or {}
    name, namespace = meta.get("name", "replay"), meta.get("namespace", "default")
    try:
        spec = ReplayRequestSpec.model_validate(manifest.get("spec") or {})
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        echo(f"refused: spec.{'.'.join(str(x) for x in first['loc'])}: {first['msg']}")
        return 2
    facts = ledger_view.table_facts(config)
    try:
        latest, earliest = kafka_offsets(config)
        kafka: replay_plan.KafkaFacts | None = replay_plan.KafkaFacts(earliest=earliest, latest=latest)
    except Exception as exc:  # noqa: BLE001 - the plan says KafkaUnavailable where it needs Kafka
        echo(f"note: cannot read Kafka's offsets: {exc}")
        kafka = None
    request = replay_plan.request_from_spec(spec, config.handoff_id, config.query_name, config.source.topics,
                                            config.sink.kind, config.source.starting_offsets)
    plan = replay_plan.plan(request, facts, kafka)
    if isinstance(plan, replay_plan.Failure):
        echo(f"refused ({plan.reason}): {plan.message}")
        return 2
    echo(f"plan: {plan.summary}")
    if spec.dry_run:
        echo("dry run: nothing changed")
        return 0
    if spec.mode == "Backfill":
        echo("run the backfill with: python -m handoff_spark backfill --config <app.json> --query "
             f"backfill-{name} --from '{json.dumps(replay_plan.wire(plan.replay_from))}' "
             f"--to '{json.dumps(replay_plan.wire(plan.replay_to))}'")
        echo("(<app.json>: the output of `handoff run -f <manifest> --print-config`; the stream may keep running)")
        return 0
    table = replay_table.load(config)  # Iceberg: the plan refuses BigQuery's Rollback and RollbackAndReplay
    assert table is not None and plan.head_snapshot is not None and plan.target_snapshot is not None
    tag = replay_table.undo_tag_name(namespace, name)
    replay_table.ensure_tag(table, tag, plan.head_snapshot)
    echo(f"tagged snapshot {plan.head_snapshot} as {tag} (the undo point)")
    replay_table.rollback(table, plan.target_snapshot)
    echo(f"rolled the table back to snapshot {plan.target_snapshot} ({plan.discarded_snapshots} snapshots discarded)")
    if spec.mode == "Rollback" and plan.gap:
        sid = replay_table.record_gap(table, config.handoff_id, config.query_name, plan.gap,
                                      f"handoff replay {namespace}/{name} (mode Rollback)")
        echo(f"recorded the discarded offsets as a gap (snapshot {sid}): the stream goes on from where it was")
    else:
        echo(f"start the driver again: it re-reads {plan.records} records from "
             f"{replay_plan.fmt_offsets(plan.replay_from or {})}")
    return 0
