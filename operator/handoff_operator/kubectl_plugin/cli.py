"""`kubectl-handoff` entry point: kubectl runs it for `kubectl handoff ...` when it is on PATH (pip installs it
with the package). Flags follow kubectl's: `-n/--namespace`, `--kubeconfig`, `--context` (KUBECONFIG and the
context's namespace otherwise), `-o text|json|yaml`.

  kubectl handoff status NAME
  kubectl handoff ledger NAME [--limit N] [--catalog-property KEY=VALUE ...]
  kubectl handoff replay NAME (--to-snapshot ID | --to-time T) [--mode RollbackAndReplay|Rollback] [--dry-run]
  kubectl handoff timeline NAME [--since 2h] [--limit N] [--catalog-property KEY=VALUE ...]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from handoff_operator.runtime.kube import Kube
from handoff_operator.spec.render import GROUP, PLURAL, VERSION
from handoff_operator.kubectl_plugin import replay, status
from handoff_operator.kubectl_plugin.output import print_document

REPLAY_PLURAL = "replayrequests"


class Failure(Exception):
    """Ends the command with this one line on stderr and exit code 1."""


def _client(args: argparse.Namespace) -> tuple[client.ApiClient, str]:
    path = args.kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    try:
        api = config.new_client_from_config(config_file=path, context=args.context, persist_config=False)
        contexts, active = config.list_kube_config_contexts(config_file=path)
    except (config.ConfigException, OSError) as exc:
        raise Failure(f"cannot use kubeconfig {path}: {exc}; set KUBECONFIG or pass --kubeconfig") from None
    chosen = next((c for c in contexts if c["name"] == args.context), active) if args.context else active
    namespace = args.namespace or (chosen.get("context") or {}).get("namespace") or "default"
    return api, namespace


def _handoff(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    try:
        return kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    except ApiException as exc:
        if exc.status == 404:
            raise Failure(f'streamtablehandoffs.{GROUP} "{name}" not found in namespace {namespace}') from None
        raise Failure(f"reading {namespace}/{name}: {exc.status} {exc.reason}") from None


def _status(args: argparse.Namespace, kube: Kube, namespace: str) -> int:
    obj = _handoff(kube, namespace, args.name)
    report = kube.read_driver_report(namespace, args.name)
    print_document(status.summary(obj, report, int(time.time() * 1000)), args.output, status.format_text)
    return 0


def _ledger(args: argparse.Namespace, kube: Kube, namespace: str) -> int:
    from handoff_spark.ledger import format_entries

    from handoff_operator.kubectl_plugin.ledger import LedgerError, entries

    overrides = _catalog_overrides(args.catalog_property)
    obj = _handoff(kube, namespace, args.name)
    try:
        rows = entries(kube, obj, overrides, args.limit)
    except LedgerError as exc:
        raise Failure(f"{namespace}/{args.name}: {exc}") from None
    print_document(rows, args.output, format_entries)
    return 0


def _catalog_overrides(items: list[str]) -> dict[str, str]:
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise Failure(f"--catalog-property {item!r}: use KEY=VALUE, e.g. uri=http://localhost:8181")
        overrides[key] = value
    return overrides


def _timeline(args: argparse.Namespace, kube: Kube, namespace: str) -> int:
    """The ledger, the handoff's Events and its ReplayRequests merged, newest first (kubectl_plugin.timeline). A
    source that cannot be read is named on stderr; the others are still shown."""
    import json as _json

    from handoff_operator.kubectl_plugin import timeline
    from handoff_operator.kubectl_plugin.ledger import LedgerError, entries

    try:
        since = timeline.parse_since(args.since, int(time.time() * 1000))
    except ValueError:
        raise Failure(f"--since {args.since!r}: use a duration such as 90s, 15m, 2h or 7d") from None
    obj = _handoff(kube, namespace, args.name)
    overrides = _catalog_overrides(args.catalog_property)
    try:
        ledger = entries(kube, obj, overrides, None)
    except (LedgerError, Exception) as exc:  # noqa: BLE001 - the other sources still tell the story
        print(f"warning: the table's ledger was not read ({str(exc).splitlines()[0][:200]}); "
              f"reach the catalog with --catalog-property", file=sys.stderr)
        ledger = []
    events = _json.loads(kube.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.kind=StreamTableHandoff,involvedObject.name={args.name}",
        _preload_content=False).data).get("items") or []
    requests = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, REPLAY_PLURAL).get("items") or []
    record = _timeline_record(kube, namespace, args.name)
    bigquery = bool(((obj.get("spec") or {}).get("sink") or {}).get("bigquery"))
    print_document(timeline.rows(ledger, events, requests, args.name, since, args.limit, record, bigquery), args.output,
           timeline.format_text)
    return 0


def _timeline_record(kube: Kube, namespace: str, name: str) -> list[dict[str, Any]]:
    """The operator's timeline record (`<name>-timeline`); unreadable or absent: none (said on stderr when it
    could not be read)."""
    try:
        text, _version = kube.read_timeline(namespace, name)
    except ApiException as exc:
        print(f"warning: the operator's timeline record was not read ({exc.status} {exc.reason}); only the "
              f"Events the API server still keeps are shown", file=sys.stderr)
        return []
    try:
        doc = json.loads(text) if text else []
    except ValueError:
        return []
    return [e for e in doc if isinstance(e, dict)] if isinstance(doc, list) else []


def _replay(args: argparse.Namespace, kube: Kube, namespace: str) -> int:
    try:
        body = replay.manifest(namespace, args.name, args.mode, replay.target(args.to_snapshot, args.to_time),
                               args.dry_run, args.request_name)
    except replay.BadArgument as exc:
        raise Failure(str(exc)) from None
    _handoff(kube, namespace, args.name)  # a clear "not found" before writing a request for nothing
    try:
        created = kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, REPLAY_PLURAL, body)
    except ApiException as exc:
        raise Failure(f"creating the ReplayRequest: {exc.status} {exc.reason}: {exc.body}") from None
    request = created["metadata"]["name"]
    # Progress goes to stderr when stdout carries a document.
    say = print if args.output == "text" else (lambda line: print(line, file=sys.stderr))
    say(f"replayrequest.{GROUP}/{request} created")
    final = _follow(kube, namespace, request, args.dry_run, args.timeout, say)
    if args.output != "text":
        print_document({"name": request, "namespace": namespace, "spec": final.get("spec"),
                "status": final.get("status")}, args.output, str)
    return 1 if (final.get("status") or {}).get("phase") == "Failed" else 0


def _follow(kube: Kube, namespace: str, request: str, dry_run: bool, timeout: float,
            say: Callable[[str], None]) -> dict[str, Any]:
    """Watch the request (the API server's watch, re-opened when it times out) until it ends."""
    deadline = time.monotonic() + timeout
    seen: dict[str, Any] = {}
    obj = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, REPLAY_PLURAL, request)
    while True:
        current = obj.get("status") or {}
        for line in replay.changes(seen, current):
            say(line)
        seen = current
        if replay.is_final(current, dry_run):
            return obj
        left = deadline - time.monotonic()
        if left <= 0:
            raise Failure(f"replayrequest {request} is still {current.get('phase') or 'Pending'} after "
                          f"{timeout:.0f}s; go on watching with: kubectl get replayrequest {request} -n "
                          f"{namespace} -w")
        w = watch.Watch()
        for event in w.stream(kube.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, REPLAY_PLURAL,
                              field_selector=f"metadata.name={request}",
                              resource_version=obj["metadata"]["resourceVersion"],
                              timeout_seconds=max(1, min(60, int(left)))):
            if event["type"] == "DELETED":
                raise Failure(f"replayrequest {request} was deleted before it ended")
            obj = event["object"]
            break  # handle this version, then watch on from it
        else:
            obj = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, REPLAY_PLURAL, request)
        w.stop()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kubectl handoff", description="Read and rewind StreamTableHandoffs.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-n", "--namespace", help="default: the kubeconfig context's namespace")
    common.add_argument("--kubeconfig", help="default: $KUBECONFIG or ~/.kube/config")
    common.add_argument("--context", help="kubeconfig context (default: the current one)")
    common.add_argument("-o", "--output", choices=["text", "json", "yaml"], default="text")
    sub = p.add_subparsers(dest="command", required=True)
    st = sub.add_parser("status", parents=[common], help="phase, conditions, lag per partition, freshness, executors")
    st.add_argument("name")
    st.set_defaults(func=_status)
    led = sub.add_parser("ledger", parents=[common], help="the snapshot ↔ offsets timeline, newest first, "
                                                          "read from the table")
    led.add_argument("name")
    led.add_argument("--limit", type=int, default=None, help="newest N entries only")
    led.add_argument("--catalog-property", action="append", default=[], metavar="KEY=VALUE",
                     help="override a catalog property (e.g. uri of a port-forwarded catalog); repeatable")
    led.set_defaults(func=_ledger)
    rep = sub.add_parser("replay", parents=[common], help="write a ReplayRequest and follow it to its end")
    rep.add_argument("name")
    rep.add_argument("--to-snapshot", metavar="ID", help="roll the table back to this snapshot")
    rep.add_argument("--to-time", metavar="T", help="roll the table back to how it was at this RFC 3339 time")
    rep.add_argument("--mode", choices=["RollbackAndReplay", "Rollback"], default="RollbackAndReplay",
                     help="RollbackAndReplay (default) re-reads what the rollback removed; Rollback skips it "
                          "(recorded as a gap)")
    rep.add_argument("--dry-run", action="store_true", help="only plan (phase Planned); change nothing")
    rep.add_argument("--request-name", help="name of the ReplayRequest (default: <name>-replay-<random>)")
    rep.add_argument("--timeout", type=float, default=3600, help="seconds to follow before giving up (the "
                                                                 "request goes on)")
    rep.set_defaults(func=_replay)
    tl = sub.add_parser("timeline", parents=[common], help="what happened, newest first: ledger commits, gaps and "
                                                           "epochs, the handoff's Events, its ReplayRequests' steps")
    tl.add_argument("name")
    tl.add_argument("--since", metavar="DURATION", help="only what happened this recently, e.g. 2h")
    tl.add_argument("--limit", type=int, default=None, help="newest N rows only")
    tl.add_argument("--catalog-property", action="append", default=[], metavar="KEY=VALUE",
                    help="override a catalog property (e.g. uri of a port-forwarded catalog); repeatable")
    tl.set_defaults(func=_timeline)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "replay":  # a wrong flag is said before any connection is tried
            replay.target(args.to_snapshot, args.to_time)
        api, namespace = _client(args)
        with api:
            return int(args.func(args, Kube(api), namespace))
    except (Failure, replay.BadArgument) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
