"""The timeline record: what the operator decided and saw for one handoff, kept where Kubernetes keeps it longer
than an hour (issue 35). Pure: which entries a reconcile owes, and the bounded ring they join.

Why its own record: the handoff's Events say the same things (scaling with its reasons, retention raises, a
rollback, condition changes), but the API server drops Events after an hour, so yesterday's decisions were gone
from `kubectl handoff timeline`. The record is a ConfigMap `<name>-timeline` owned by the handoff (deleted with
it), a ring of the newest `LIMIT` entries (each message cut at `MESSAGE_LIMIT` characters), so it stays far below
a ConfigMap's 1 MiB however long the handoff lives. The reconcile's act step writes it (handlers._act), only
when this reconcile owes an entry; the entries are decided here from plain data.

An entry: `{"timeMs", "type" (Normal|Warning), "reason", "message"}`. Besides every Event the reconcile posts,
it records what no Event says: a spec change (a new generation), the driver pod starting or being replaced (a
kill, an eviction, a restart's new pod), the driver's container restarting in place, a retention check whose verdict
differs from the last one, and a driver that discarded its checkpoint at start (it resumed from the table's ledger;
its published record says why).

Why not every retention check: one runs every HANDOFF_RETENTION_CHECK_INTERVAL (5 min), so the ring of 200 held
nothing else after ~17 quiet hours, and a spec change or a scale-up from the day before was gone; the timeline
drill of issue 35 showed a third of its rows were the same verdict again. The status holds the last check's
numbers; the record holds each change of verdict (Sufficient → RetentionTooShort → RetentionRaised → ...).
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: Entries kept (the newest); ~200 × ≤ 1 KiB stays well under a ConfigMap's 1 MiB.
LIMIT = 200
#: Characters kept of a message.
MESSAGE_LIMIT = 600

Entry = dict[str, Any]
#: Reasons recorded once per message: the driver's report repeats them while the driver lives.
ONCE_REASONS = frozenset({"CheckpointDiscarded"})


def entry(time_ms: int, kind: str, reason: str, message: str) -> Entry:
    return {"timeMs": int(time_ms), "type": kind, "reason": reason, "message": message[:MESSAGE_LIMIT]}


def owed(*, now_ms: int, generation: int, old_status: Mapping[str, Any], new_status: Mapping[str, Any],
         events: Sequence[tuple[str, str, str]], retention_checked: str | None = None,
         retention_before: str | None = None,
         driver_restarts: tuple[int | None, int | None] = (None, None),
         last_termination: str | None = None,
         checkpoint_discarded: tuple[str, str] | None = None,
         seen_pod: str | None = None) -> list[Entry]:
    """The entries one reconcile owes, oldest first: a spec change, the driver's pod starting or being replaced,
    its container restarting, a retention check (`retention_checked`: the check's verdict in a line,
    "<reason>: <message>", None: no check this time) unless its reason is the last check's (`retention_before`:
    the reason of the RetentionSufficient condition before it), then every Event posted (`events`: (type, reason,
    message)).

    `driver_restarts`: the driver container's restart count as last seen by this process and now (None:
    unknown); only a rise in the same pod is a restart. `checkpoint_discarded`: (driver pod, why) from the
    driver's published record. `seen_pod`: the driver pod this reconcile gathered before it acted; when its act
    replaced that pod at once (a rollback's Recreate, read back after the apply), the pod in between still gets
    its entries, so the timeline names the pod a decision was about (the crash-looping one a rollback removed), and
    the pod the act made comes after the act's Events (the rollback, then its pod)."""
    out: list[Entry] = []
    observed = old_status.get("observedGeneration")
    if observed is not None and generation > int(observed):
        out.append(entry(now_ms, "Normal", "SpecChanged",
                         f"generation {generation} of the spec (was {observed})"))
    old_pod = (old_status.get("app") or {}).get("driver")
    new_pod = (new_status.get("app") or {}).get("driver")
    pods = [old_pod]
    for pod in (seen_pod, new_pod):
        if pod and pod not in pods:  # a replaced pod never comes back (names are unique); the status may keep one
            pods.append(pod)
    # A pod first found on the read back after the act came after this reconcile's decisions (a rollback's
    # Recreate made it): its entry follows the Events, so the timeline never shows the pod before its cause.
    transitions = [_pod_entry(now_ms, before_pod, pod) for before_pod, pod in zip(pods, pods[1:])]
    seen_before = len(transitions) - (seen_pod is not None and pods[-1] not in (old_pod, seen_pod))
    out += transitions[:seen_before]
    before, now = driver_restarts
    if new_pod and new_pod == old_pod and before is not None and now is not None and now > before:
        out.append(entry(now_ms, "Warning", "DriverRestarted",
                         f"the driver container of pod {new_pod} restarted ({now} restarts)"
                         + (f"; last termination: {last_termination}" if last_termination else "")))
    if checkpoint_discarded is not None:
        pod, why = checkpoint_discarded
        out.append(entry(now_ms, "Normal", "CheckpointDiscarded",
                         f"driver pod {pod} discarded its checkpoint and resumed from the table's ledger: {why}"))
    if retention_checked is not None and (retention_before is None
                                          or retention_checked.partition(":")[0] != retention_before):
        out.append(entry(now_ms, "Normal", "RetentionChecked", retention_checked))
    out += [entry(now_ms, kind, reason, message) for kind, reason, message in events]
    out += transitions[seen_before:]
    return out


def _pod_entry(now_ms: int, before_pod: str | None, pod: str) -> Entry:
    if before_pod:
        return entry(now_ms, "Normal", "DriverReplaced",
                     f"driver pod {pod} replaced {before_pod} (a restart, a kill or an eviction)")
    return entry(now_ms, "Normal", "DriverStarted", f"driver pod {pod} created")


def appended(existing: Sequence[Entry], new: Iterable[Entry], limit: int = LIMIT) -> list[Entry]:
    """The ring after `new`: the newest `limit` entries, oldest first. An entry of ONCE_REASONS already there
    (the same reason and message) is not added again."""
    there = {(e.get("reason"), e.get("message")) for e in existing if e.get("reason") in ONCE_REASONS}
    merged = [*existing, *(e for e in new if (e.get("reason"), e.get("message")) not in there)]
    return merged[-limit:] if limit > 0 else []


def parse(text: str | None) -> list[Entry]:
    """The record's entries; an unreadable record is empty (it only loses history, never fails a reconcile)."""
    if not text:
        return []
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return []
    if not isinstance(doc, list):
        return []
    return [e for e in doc if isinstance(e, dict) and isinstance(e.get("timeMs"), int)
            and isinstance(e.get("reason"), str)]


def dumps(entries: Sequence[Entry]) -> str:
    return json.dumps(list(entries), separators=(",", ":"))
