"""`kubectl handoff timeline NAME`: what happened to a handoff's table, in one list, newest first (issue 35).

Why merged when read: each source keeps its own home — the table's ledger (every commit with its snapshot and
Kafka offsets, gaps, epochs), the operator's timeline record (`<name>-timeline`, handoff.journal: every Event it
posted, spec changes, driver starts and restarts, retention checks — kept after the API server drops the Events,
an hour on), the Kubernetes Events of the handoff (kopf's own, and the operator's not yet in an older record), and
the ReplayRequests that name it (each completed step with its time). An Event the record also holds is shown
once. The rows are plain dicts, so `-o json|yaml` is the same data as the text.

Pure: `rows` and `format_text` take what was read.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any


def _ms(value: Any) -> int | None:
    """Epoch ms of an API timestamp (RFC 3339 string or datetime), None when absent."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return int(value.timestamp() * 1000)


def _ranges(offsets: Mapping[str, Mapping[str, list[int]]]) -> str:
    return " ".join(f"{t}[{p}] {se[0]}→{se[1]}" for t, parts in sorted(offsets.items())
                    for p, se in sorted(parts.items(), key=lambda kv: int(kv[0])))


def as_of(snapshot: int | None, bigquery: bool) -> str | None:
    """The SQL clause that reads the table as of a commit (docs/observability.md, "The table as of a row"):
    Iceberg's snapshot (Spark SQL `FOR VERSION AS OF`), BigQuery's commit time, which is the ledger's snapshot
    there, in µs (`FOR SYSTEM_TIME AS OF`, within the dataset's time-travel window)."""
    if snapshot is None:
        return None
    return f"FOR SYSTEM_TIME AS OF TIMESTAMP_MICROS({snapshot})" if bigquery else f"FOR VERSION AS OF {snapshot}"


def ledger_rows(entries: Iterable[Mapping[str, Any]], bigquery: bool = False) -> list[dict[str, Any]]:
    """Ledger entries (`handoff_spark.ledger.entries`) as timeline rows; each names its snapshot (for BigQuery:
    the batch and its commit time) and `asOf`, the clause that reads the table as of that row. An entry whose
    commit changed the table's schema adds a `schema` row saying how: `from` and `to` are Iceberg's schema ids, or
    for BigQuery (no schema ids) the fingerprints of the table's columns its ledger-index rows record."""
    out = []
    for e in entries:
        if e["kind"] == "batch":
            what = f"batch {e['batch']} ({e['query']}): {e['rows']} rows"
            if e.get("deadLetters"):
                what += f", {e['deadLetters']} dead letters"
            if e.get("droppedRows"):
                what += f", {e['droppedRows']} dropped by the transform or dedupe"
            if e.get("lateRows"):
                what += f", {e['lateRows']} late"
            what += f"; {_ranges(e['offsets'])}"
        else:
            what = f"{e['kind']} ({e['query']}): {_ranges(e['offsets'])}" + (f" — {e['reason']}" if e.get("reason")
                                                                               else "")
        change = e.get("schemaChange")
        if change:
            parts = ([f"added {', '.join(change['added'])}"] if change.get("added") else []) + (
                [f"dropped {', '.join(change['dropped'])}"] if change.get("dropped") else []) + (
                [f"changed {', '.join(change['changed'])}"] if change.get("changed") else [])
            # Listed below its commit (rows of one moment: the later-recorded first): the commit wrote it.
            out.append({"timeMs": e["timestampMs"], "source": "ledger", "kind": "schema",
                        "what": f"schema {change['from']} → {change['to']}: " + ("; ".join(parts) or "field ids only"),
                        "snapshot": e["snapshot"], "asOf": as_of(e["snapshot"], bigquery)})
        row = {"timeMs": e["timestampMs"], "source": "ledger", "kind": e["kind"], "what": what,
               "snapshot": e["snapshot"], "asOf": as_of(e["snapshot"], bigquery)}
        if bigquery and e["snapshot"] is not None:
            row["commitTime"] = dt.datetime.fromtimestamp(int(e["snapshot"]) / 1e6, dt.timezone.utc).strftime(
                "%Y-%m-%dT%H:%M:%S.%fZ")
        out.append(row)
    return out


def event_rows(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The handoff's Events (core/v1, as the API returns them) as rows; a repeated Event counts its repeats."""
    out = []
    for ev in events:
        at = _ms(ev.get("lastTimestamp") or ev.get("eventTime") or ev.get("firstTimestamp")
                 or (ev.get("metadata") or {}).get("creationTimestamp"))
        if at is None:
            continue
        count = int(ev.get("count") or 1)
        what = f"{ev.get('type', 'Normal')} {ev.get('reason', '')}: {ev.get('message', '')}".strip()
        out.append({"timeMs": at, "source": "event", "kind": ev.get("reason") or "Event",
                    "what": what + (f" (×{count})" if count > 1 else "")})
    return out


def record_rows(entries: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The operator's timeline record (handoff.journal entries) as rows."""
    return [{"timeMs": int(e["timeMs"]), "source": "operator", "kind": e.get("reason") or "Entry",
             "what": f"{e.get('type', 'Normal')} {e.get('reason', '')}: {e.get('message', '')}".strip()}
            for e in entries if isinstance(e.get("timeMs"), int)]


#: An Event and a record entry of the same reason and message this close in time are one happening.
SAME_HAPPENING_MS = 5_000


def _recorded(event: Mapping[str, Any], recorded: Mapping[str, list[int]]) -> bool:
    times = recorded.get(event["what"].split(" (×")[0])
    return bool(times) and any(abs(t - event["timeMs"]) <= SAME_HAPPENING_MS for t in times)


def replay_rows(requests: Iterable[Mapping[str, Any]], handoff: str) -> list[dict[str, Any]]:
    """ReplayRequests naming `handoff`: when each was made, and each completed step."""
    out = []
    for req in requests:
        spec, status = req.get("spec") or {}, req.get("status") or {}
        if (spec.get("handoffRef") or {}).get("name") != handoff:
            continue
        name = req["metadata"]["name"]
        created = _ms(req["metadata"].get("creationTimestamp"))
        if created is not None:
            target = spec.get("target") or {}
            out.append({"timeMs": created, "source": "replay", "kind": "ReplayRequested",
                        "what": f"ReplayRequest {name}: {spec.get('mode', '')} to "
                                f"{target.get('snapshotId') or target.get('timestamp') or target.get('tag') or 'a range'}"
                                + (" (dry run)" if spec.get("dryRun") else ""), "request": name})
        for step in status.get("steps") or []:
            at = _ms(step.get("at"))
            if at is not None:
                out.append({"timeMs": at, "source": "replay", "kind": step.get("name", "Step"),
                            "what": f"ReplayRequest {name}: {step.get('name')}"
                                    + (f" — {step['message']}" if step.get("message") else ""), "request": name})
        done = _ms(status.get("completedAt"))
        if done is not None:
            out.append({"timeMs": done, "source": "replay", "kind": status.get("phase") or "Ended",
                        "what": f"ReplayRequest {name}: {status.get('phase')}", "request": name})
    return out


def rows(ledger: Iterable[Mapping[str, Any]], events: Iterable[Mapping[str, Any]],
         requests: Iterable[Mapping[str, Any]], handoff: str, since_ms: int | None = None,
         limit: int | None = None, record: Iterable[Mapping[str, Any]] = (), bigquery: bool = False
         ) -> list[dict[str, Any]]:
    """All sources merged, newest first, from `since_ms` on; at most `limit` rows. `record`: the operator's
    timeline record; an Event it also holds (same reason and message, within SAME_HAPPENING_MS) is shown once."""
    kept = record_rows(record)
    recorded: dict[str, list[int]] = {}
    for r in kept:
        recorded.setdefault(r["what"], []).append(r["timeMs"])
    merged = (ledger_rows(ledger, bigquery) + kept + [e for e in event_rows(events) if not _recorded(e, recorded)]
              + replay_rows(requests, handoff))
    merged = [r for r in merged if since_ms is None or r["timeMs"] >= since_ms]
    # Newest first; rows of the same millisecond (one reconcile's entries) newest-recorded first too.
    merged = [r for _, r in sorted(enumerate(merged), key=lambda ir: (ir[1]["timeMs"], ir[0]), reverse=True)]
    for r in merged:
        r["time"] = dt.datetime.fromtimestamp(r["timeMs"] / 1000, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return merged[:limit]


def format_text(timeline: list[dict[str, Any]]) -> str:
    """One line per row: time, source, what (and the snapshot a commit made)."""
    if not timeline:
        return "(nothing in this window)"
    lines = []
    for r in timeline:
        if r.get("commitTime") is not None:
            snap = f"  [BigQuery commit {r['commitTime']}]"
        else:
            snap = f"  [snapshot {r['snapshot']}]" if r.get("snapshot") is not None else ""
        lines.append(f"{r['time'][:23]}Z  {r['source']:<6}  {r['what']}{snap}")
    return "\n".join(lines)


def parse_since(text: str | None, now_ms: int) -> int | None:
    """`--since 2h` → epoch ms (the operator's duration grammar: 90s, 15m, 2h, 7d)."""
    if not text:
        return None
    from handoff_operator.models import parse_duration

    return now_ms - int(parse_duration(text) * 1000)
