"""`kubectl handoff replay NAME` (pure): the ReplayRequest it writes, and what each newer version of the
request's status means for the person watching (new steps, the plan, the end)."""
from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from handoff_operator.spec.render import GROUP, VERSION

FINAL = ("Succeeded", "Failed")


class BadArgument(ValueError):
    """A flag the user must fix (one line, naming the flag)."""


def target(to_snapshot: str | None, to_time: str | None) -> dict[str, Any]:
    if (to_snapshot is None) == (to_time is None):
        raise BadArgument("give exactly one of --to-snapshot ID or --to-time T")
    if to_snapshot is not None:
        if not to_snapshot.lstrip("-").isdigit():
            raise BadArgument(f"--to-snapshot {to_snapshot!r}: a snapshot id is an integer (see `kubectl handoff "
                              f"ledger NAME`)")
        return {"snapshotId": int(to_snapshot)}
    assert to_time is not None
    try:
        when = dt.datetime.fromisoformat(to_time)
    except ValueError:
        raise BadArgument(f"--to-time {to_time!r}: use an RFC 3339 time such as 2026-11-21T09:00:00Z") from None
    if when.tzinfo is None:
        raise BadArgument(f"--to-time {to_time!r}: add the time zone (Z or +01:00)")
    return {"timestamp": when.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}


def manifest(namespace: str, handoff: str, mode: str, replay_target: Mapping[str, Any], dry_run: bool,
             name: str | None = None) -> dict[str, Any]:
    """The ReplayRequest; without a name the API server makes one (`<handoff>-replay-xxxxx`)."""
    meta: dict[str, Any] = {"namespace": namespace}
    if name:
        meta["name"] = name
    else:
        meta["generateName"] = f"{handoff[:48]}-replay-"
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ReplayRequest", "metadata": meta,
            "spec": {"handoffRef": {"name": handoff}, "mode": mode, "target": dict(replay_target),
                     "dryRun": dry_run}}


def is_final(status: Mapping[str, Any], dry_run: bool) -> bool:
    phase = status.get("phase")
    return phase in FINAL or (dry_run and phase == "Planned")


def _ready(status: Mapping[str, Any]) -> Mapping[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})


def changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """Lines for what is new in `after` compared with `before`: the plan, each new step, a new phase."""
    lines = []
    plan = after.get("plan") or {}
    if plan.get("summary") and plan != (before.get("plan") or {}):
        lines.append(f"plan: {plan['summary']}")
    old_steps = len(before.get("steps") or [])
    for step in (after.get("steps") or [])[old_steps:]:
        lines.append(f"step {step.get('name')}: {step.get('message', '')}".rstrip(": "))
    progress = after.get("progress") or {}
    if progress and progress != (before.get("progress") or {}) and progress.get("total"):
        lines.append(f"replayed {progress.get('records', 0)}/{progress['total']} records")
    if after.get("phase") and after.get("phase") != before.get("phase"):
        ready = _ready(after)
        detail = f" ({ready.get('reason')}: {ready.get('message')})" if ready.get("reason") else ""
        lines.append(f"phase {after['phase']}{detail}")
    return lines
